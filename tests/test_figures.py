"""The concept figures (``kvlab.figures``) draw the library's mechanism, not a sketch of it: each layout's kept
cells are the reference's mask on the same small example."""

from __future__ import annotations

import matplotlib
import pytest
import torch

matplotlib.use("Agg")

from kvlab import figures  # noqa: E402


@pytest.fixture(autouse=True)
def _close():
    import matplotlib.pyplot as plt

    yield
    plt.close("all")


def test_streamingllm_layout_is_the_keep_rule():
    _, layout = figures.streamingllm_layout(n=12, sink=2, window=4)
    q, k = torch.arange(12)[:, None], torch.arange(12)[None, :]
    rule = (k <= q) & ((k < 2) | (q - k < 4))
    assert torch.equal(layout[2] >= 2, rule)
    assert torch.equal(layout[0] >= 2, k <= q)  # dense: every causal key
    assert not bool((layout[1] == 3).any())  # a plain window keeps no sink


def test_sepllm_layout_is_the_reference_mask():
    from kvlab.sepllm.reference import sepllm_mask

    words = "a b , c d e . f g h , i".split()
    _, layout = figures.sepllm_layout(words, init=2, neighbors=3)
    is_sep = torch.tensor([[w in {",", "."} for w in words]])
    assert torch.equal(layout >= 2, sepllm_mask(is_sep, 2, 3)[0])
    assert bool((layout[:, 2][3:] == 3).any()) and bool((layout[:, :2][2:] == 4).all())


@pytest.mark.parametrize("panel, name", [(0, "bands"), (1, "interleaved")])
def test_lacache_layout_is_the_ladder(panel, name):
    from kvlab.lacache.reference import LadderGeometry, ladder_mask

    _, layout = figures.lacache_layout(num_layers=8, length=30, span=4, overlap=2, sink=2)
    assert torch.equal(layout[panel] != 0, ladder_mask(LadderGeometry(8, 4, 2), 30, name, sink=2))


def test_dhsa_layout_is_the_reference_mask_under_its_budget():
    from kvlab.dhsa.reference import dhsa_mask

    _, layout = figures.dhsa_layout(n=26, budget=9, initial=1, seed=0)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 1, 26, 8, generator=g), torch.randn(1, 1, 26, 8, generator=g)
    bd = torch.tensor([0, 3, 5, 11, 14, 20, 23, 26])
    assert torch.equal(layout >= 2, dhsa_mask(q, k, bd, 9, initial=1)[0, 0])
    assert (layout >= 2).sum(1).tolist() == [min(9, r + 1) for r in range(26)]


def test_reform_layout_runs_nothing_above_the_exit_and_recomputes_its_budget():
    _, layout = figures.reform_layout(num_layers=10, length=48, exit_layer=6, recompute=14)
    assert bool((layout[0, 6:] == 1).all()) and not bool((layout[0, :6] == 1).any())
    assert (layout[1] == 4).sum(1).tolist() == [14] * 10


def test_orthorank_layout_selects_its_share_and_never_the_sink():
    _, layout = figures.orthorank_layout(num_layers=10, n=16, routed=(5, 6, 7, 8), token_ratio=0.33)
    for layer in range(10):
        if layer in (5, 6, 7, 8):
            assert int((layout[layer] == 3).sum()) == int(0.33 * 16) and int(layout[layer, 0]) == 4
        else:
            assert bool((layout[layer] == 1).all())
