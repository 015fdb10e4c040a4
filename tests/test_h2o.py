"""H2O: heavy hitters + recent window, from accumulated attention scores."""

from __future__ import annotations

import pytest
import torch

from kvlab.eval import decode_stepwise

from kvlab.core import KVCache, LayerView
from kvlab.policies import Full
from kvlab.baselines.h2o import H2O


def view(scores: torch.Tensor) -> LayerView:
    b, n = scores.shape
    pos = torch.arange(n).expand(b, -1)
    return LayerView(0, 1, n, pos, pos, scores, None, {})


def test_keep_rule_picks_heavy_hitters_and_recent():
    scores = torch.tensor([[5.0, 0.1, 3.0, 0.2, 4.0, 0.0, 0.0, 0.0]])
    p = H2O(budget=5, recent=2)
    assert p.keep(view(scores[:, :5])) is None
    assert p.keep(view(scores)).tolist() == [[0, 2, 4, 6, 7]]
    assert H2O(budget=3, recent=0).keep(view(scores)).tolist() == [[0, 2, 4]]
    assert H2O(budget=3, recent=3).keep(view(scores)).tolist() == [[5, 6, 7]]


def test_keep_rule_is_per_row():
    scores = torch.tensor([[9.0, 0.0, 1.0, 0.0, 0.0], [0.0, 9.0, 1.0, 0.0, 0.0]])
    assert H2O(budget=3, recent=1).keep(view(scores)).tolist() == [[0, 2, 4], [1, 2, 4]]


def test_default_recent_is_half_and_budget_property():
    p = H2O(64)
    assert (p.recent, p.budget, p.needs_scores) == (32, 64, True)


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(budget=8, recent=9), ValueError, r"recent \(9\) must be <= budget \(8\)"),
    (dict(budget=0), ValueError, "budget must be >= 1"),
    (dict(budget=8, recent=-1), ValueError, "recent must be >= 0"),
    (dict(budget=8.5), TypeError, "budget must be an int"),
    (dict(budget=8, positions="absolute"), ValueError, "positions must be one of"),
])
def test_bad_parameters_rejected(kwargs, error, message):
    with pytest.raises(error, match=message):
        H2O(**kwargs)


def test_needs_scores_message():
    pos = torch.arange(10)[None]
    with pytest.raises(RuntimeError, match="needs attention scores"):
        H2O(budget=4).keep(LayerView(0, 1, 10, pos, pos, None, None, {}))




def test_in_model_budget_recent_and_scores(tiny_llama, ids):
    policy = H2O(budget=10, recent=4)
    _, cache = decode_stepwise(tiny_llama, ids, policy)
    assert max(max(h) for h in cache.trace.per_layer) == 10
    seen = ids.shape[1]
    for layer in cache.layers:
        assert layer.positions[0, -4:].tolist() == list(range(seen - 4, seen))
        assert layer.scores is not None and layer.scores.shape == (1, 10)
    # the kept older entries are the ones with the largest accumulated attention (the first token, a sink,
    # gathers a lot of attention even in a random model)
    assert any(int(layer.positions[0, 0]) == 0 for layer in cache.layers)


def test_large_budget_matches_full(tiny_llama, ids):
    full, _ = decode_stepwise(tiny_llama, ids, Full())
    h2o, _ = decode_stepwise(tiny_llama, ids, H2O(budget=ids.shape[1], recent=4))
    torch.testing.assert_close(h2o, full, rtol=1e-4, atol=1e-4)  # eager softmax vs SDPA: not bit-equal
