"""OrthoRank's claims as paired experiments (kvlab.experiments.orthorank): the sink alignment per window
(Figs. 2-3, 6-7) against the batch profile, Fig. 4's single-layer plans, pooled records, Table 4's plans from
known greedy orders, and the paired difference."""

from __future__ import annotations

import pytest
import torch

from kvlab.orthorank.api import sink_profile
from kvlab.experiments.orthorank.studies import (ALIGNMENT_PAIRS, layerwise_plans, paired_difference, pooled_records,
                                         sink_alignment, table4_plans)

pytestmark = pytest.mark.usefixtures("one_thread")


def test_sink_alignment_per_window_averages_to_the_batch_profile(tiny_llama):
    """Each window's values, averaged over windows, are the batch profile's curves at the same layers."""
    g = torch.Generator().manual_seed(0)
    windows = torch.randint(0, 96, (3, 20), generator=g)
    out = sink_alignment(tiny_llama, windows, ["a", "b", "c"], sink_layer=0)
    assert (out["first"], out["last"], out["other"]) == (1, 3, 10)
    prof = sink_profile(tiny_llama, windows, attention=False)
    means = out["means"]
    assert means["to sink at first"] == pytest.approx(float(prof.cos_to_sink[1]), abs=1e-5)
    assert means["to sink at last"] == pytest.approx(float(prof.cos_to_sink[3]), abs=1e-5)
    box = prof.sink_self_cos[1:, 1:]
    off = ~torch.eye(3, dtype=torch.bool)
    assert means["sink across layers"] == pytest.approx(float(box[off].mean()), abs=1e-5)
    assert means["other tokens across layers"] == pytest.approx(float(prof.token_self_cos[1:, 1:][off].mean()),
                                                                abs=1e-5)
    assert means["rise to sink"] == pytest.approx(means["to sink at last"] - means["to sink at first"], abs=1e-6)
    recs = out["examples"]
    assert len(recs) == 8 * 3 and {r["example"] for r in recs} == {"a:0-20", "b:0-20", "c:0-20"}
    assert all(a in means and b in means for a, b in ALIGNMENT_PAIRS)
    with pytest.raises(ValueError, match="sink_layer"):
        sink_alignment(tiny_llama, windows, ["a", "b", "c"], sink_layer=3)
    with pytest.raises(ValueError, match="names"):
        sink_alignment(tiny_llama, windows, ["a"], sink_layer=0)


def test_layerwise_plans_route_one_layer_with_each_criterion():
    plans, pairs = layerwise_plans([2, 3], 0.5)
    assert pairs == [("Fig4 L2 orthogonal", "Fig4 L2 least orthogonal"),
                     ("Fig4 L3 orthogonal", "Fig4 L3 least orthogonal")]
    assert plans["Fig4 L3 orthogonal"].routed == (3,) and "criterion" not in plans["Fig4 L3 orthogonal"].router
    assert plans["Fig4 L2 least orthogonal"].router == {"token_ratio": 0.5, "criterion": "least_orthogonal"}
    with pytest.raises(ValueError, match="layers"):
        layerwise_plans([])


def test_pooled_records_average_per_example_and_refuse_gaps():
    recs = [{"example": e, "method": m, "metric": "nll", "value": v, "config": {}}
            for e, m, v in (("x", "A", 1.0), ("x", "B", 3.0), ("y", "A", 2.0), ("y", "B", 6.0), ("y", "C", 9.0))]
    pooled = pooled_records(recs, ["A", "B"], "A+B")
    assert {r["example"]: r["value"] for r in pooled} == {"x": 2.0, "y": 4.0}
    assert all(r["method"] == "A+B" and r["config"]["pooled"] == ["A", "B"] for r in pooled)
    with pytest.raises(ValueError, match="every example"):
        pooled_records(recs, ["A", "C"], "A+C")


def test_table4_plans_reach_the_sparsity_from_known_orders(tiny_llama):
    g = torch.Generator().manual_seed(0)
    calib = torch.randint(0, 96, (2, 16), generator=g)
    plans = table4_plans(tiny_llama, calib, [1, 2, 3], sparsity=0.25, token_ratios=(0.0, 0.5),
                         known={0.0: [3, 1, 2], 0.5: [2, 1, 3]})
    assert list(plans) == ["T4 layers 0.25 / tokens 0.00", "T4 layers 0.50 / tokens 0.50"]
    removed, routed = plans.values()
    assert removed.removed == (3,) and routed.routed == (1, 2) and routed.router == {"token_ratio": 0.5}
    assert routed.sparsity(4) == pytest.approx(0.25)


def test_paired_difference_signs():
    d = paired_difference([1.0, 2.0, 3.0], [0.0, 2.0, 4.0])
    assert (d["a_above"], d["b_above"], d["ties"], d["n"]) == (1, 1, 1, 3) and d["mean_diff"] == pytest.approx(0.0)
