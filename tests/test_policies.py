"""Policy arguments and the keep() rule, without a model."""

from __future__ import annotations

import pytest
import torch

from kvlab.core import LayerView
from kvlab.policies import Full, StreamingLLM


def view(n: int) -> LayerView:
    pos = torch.arange(n)[None]
    return LayerView(0, 1, n, pos, pos, None, None, {})


@pytest.mark.parametrize("kwargs, message", [
    (dict(sink=-1, window=4), "sink must be >= 0"),
    (dict(sink=4, window=0), "window must be >= 1"),
    (dict(sink=4), "needs window= .* or cache_size="),
    (dict(sink=4, window=100, cache_size=64), r"sink \+ window \(4 \+ 100 = 104\) must be <= cache_size \(64\)"),
    (dict(sink=8, cache_size=8), "must exceed sink"),
    (dict(sink=4, window=8, positions="absolute"), "positions must be one of"),
])
def test_streaming_rejects_bad_sizes(kwargs, message):
    with pytest.raises(ValueError, match=message):
        StreamingLLM(**kwargs)


def test_streaming_rejects_non_integers():
    with pytest.raises(TypeError, match="window must be an int"):
        StreamingLLM(sink=4, window=2.5)


def test_streaming_cache_size_sets_window():
    p = StreamingLLM(sink=4, cache_size=64)
    assert (p.sink, p.window, p.budget) == (4, 60, 64)


def test_streaming_keep_rule():
    p = StreamingLLM(sink=2, window=3)
    assert p.keep(view(5)) is None
    assert p.keep(view(9)).tolist() == [0, 1, 6, 7, 8]
    assert StreamingLLM(sink=0, window=3).keep(view(9)).tolist() == [6, 7, 8]


def test_full_keeps_everything():
    assert Full().keep(view(1000)) is None and Full().budget is None
