import pytest
import torch

from kvlab.lessons import check


def test_check_passes_and_prints(capsys):
    check("same", [1, 2, 3], torch.tensor([1, 2, 3]))
    check("close", 1.0 + 1e-9, 1.0)
    assert capsys.readouterr().out == "✓ same\n✓ close\n"


@pytest.mark.parametrize("got, expected, message", [
    (None, 1, "forget `return`"),
    ([1, 2], [1, 2, 3], r"shape \(2,\), expected \(3,\)"),
    ([1, 2, 4], [1, 2, 3], "1 entries differ"),
    (1.5, 1.0, "max difference 0.5"),
])
def test_check_explains_failures(got, expected, message):
    with pytest.raises(AssertionError, match=message):
        check("x", got, expected)
