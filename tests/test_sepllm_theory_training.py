"""Reachability under SepLLM's mask (App. J-K), training with masks, and the GSM8K answer handling."""

from __future__ import annotations

import math

import pytest
import torch

from kvlab.eval.gsm8k import cot_prompt, extract_answers, reference_solution
from kvlab.sepllm.theory import (hop_distance, hop_distance_formula, keep_mask, layers_to_see_everything,
                                 longest_gap, sliding_window_layers)
from kvlab.sepllm.training import CompactVocab, TinyConfig, Variant, VARIANTS, evaluate_loss, step_flops, tiny_llama, train

pytestmark = pytest.mark.usefixtures("one_thread")



@pytest.mark.parametrize("t, n, init, p", [(60, 4, 2, 0.15), (80, 2, 0, 0.1), (50, 1, 1, 0.2), (70, 6, 3, 0.0)])
def test_breadth_first_hops_equal_the_closed_form(t, n, init, p):
    far = torch.rand(t, generator=torch.Generator().manual_seed(t)) < p
    assert torch.equal(hop_distance(keep_mask(far, init, n)), hop_distance_formula(far, init, n))


def test_sliding_window_needs_linear_depth_separators_constant():
    t, n = 200, 9
    window = layers_to_see_everything(hop_distance(keep_mask(torch.zeros(t, dtype=torch.bool), 0, n)))
    assert int(window[-1]) == sliding_window_layers(t - 1, n) == math.ceil(199 / 8)
    far = torch.zeros(t, dtype=torch.bool)
    far[::20] = True  # a separator every 20 tokens: segments of s = 19
    sep = layers_to_see_everything(hop_distance(keep_mask(far, 0, n)))
    s = longest_gap(far)
    assert s == 19
    assert int(sep.max()) <= math.ceil(s / (n - 1)) + 1 < int(window[-1])


def test_tiny_training_learns_and_counts_flops():
    data = torch.arange(3000) % 13 + 3  # a cyclic "text": the previous token tells the next
    data[::9] = 2  # separators
    cfg = TinyConfig(vocab=64, hidden=32, layers=2, heads=2, kv_heads=1, intermediate=64)
    results = {}
    for v in VARIANTS(8, 16):
        model = tiny_llama(cfg, seed=0)
        r = train(model, v, data, [2], steps=20, batch=4, seq_len=64, lr=1e-2, warmup=5)
        results[v.name] = r
        assert sum(r.losses[-5:]) / 5 < r.losses[0] - 0.5
    flops = {k: r.flops[-1] for k, r in results.items()}
    ratio = {k: r.attention_ratio for k, r in results.items()}
    assert ratio["Vanilla"] == 1.0
    assert ratio["StrmLLM(n=8)"] < ratio["SepLLM(n=8)"] < ratio["SepLLM(n=16)"] < 1.0
    assert ratio["SepLLM(n=8)"] < ratio["SepLLM(n=8,H/T)"] == 1.0  # 2 layers, both full
    assert flops["StrmLLM(n=8)"] < flops["SepLLM(n=8)"] < flops["Vanilla"]


def test_step_flops_formula():
    cfg = TinyConfig(vocab=50, hidden=16, layers=3, heads=2, kv_heads=1, intermediate=32)
    model = tiny_llama(cfg)
    ids = torch.randint(0, 50, (2, 10))
    params = sum(p.numel() for p in model.parameters())
    dense = 2 * params * 20
    full, r = step_flops(model, Variant("v", "vanilla"), ids, [])
    assert r == 1.0 and full == pytest.approx(3 * (dense + 4 * 16 * 3 * 2 * 55))
    one, r1 = step_flops(model, Variant("w", "streaming", 0, 1), ids, [])
    assert r1 == pytest.approx(20 / 110) and one == pytest.approx(3 * (dense + 4 * 16 * 3 * 20))


def test_masked_loss_is_higher_than_dense_before_training():
    cfg = TinyConfig(vocab=64, hidden=32, layers=2, heads=2, kv_heads=1, intermediate=64)
    model = tiny_llama(cfg)
    data = torch.arange(300) % 50
    base = evaluate_loss(model, data, seq_len=64, max_windows=2)
    masked = evaluate_loss(model, data, pattern=Variant("s", "streaming", 0, 1).pattern([]), seq_len=64, max_windows=2)
    assert masked != pytest.approx(base)


def test_compact_vocab_keeps_separators_and_frequent_ids():
    ids = torch.tensor([5, 5, 5, 7, 7, 900, 3, 11])
    cv = CompactVocab(ids, size=4, separators=[900, 12345])
    enc = cv.encode(torch.tensor([900, 5, 7, 3, 11, 99999]))
    assert enc[0] == 0 and cv.separators.tolist() == [0]
    assert enc[1] != cv.unk and enc[2] != cv.unk and enc[-1] == cv.unk
    assert cv.coverage(ids) == pytest.approx(6 / 8)


def test_gsm8k_answer_extraction():
    flexible, strict = extract_answers(" She sold 48/2 = 24 clips. So 48 + 24 = 72. The answer is 72.")
    assert (flexible, strict) == ("72", "72")
    assert extract_answers("The total is $1,200.00 dollars") == ("1200.00", None)  # lm-eval's normalisation
    assert extract_answers("I think 5 or maybe 6") == ("6", None)
    assert extract_answers("no numbers") == (None, None)
    sol = reference_solution("Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nIn total 48+24 = <<48+24=72>>72\n#### 72")
    assert sol == " Natalia sold 48/2 = 24 clips in May. In total 48+24 = 72. The answer is 72."
    prompt = cot_prompt("How many?", [dict(question="q1", target="t1.")])
    assert prompt == "Q: q1\nA: t1.\n\nQ: How many?\nA:"
