"""kvlab.eval on the default model: the evaluator's equalities of the foundation issue."""

from __future__ import annotations

import math

import pytest
import torch

import kvlab
from kvlab.eval import needle_in_haystack, parallel_nll, passkey, streaming_perplexity
from kvlab.policies import Full, StreamingLLM


@pytest.fixture(scope="module")
def smollm():
    torch.manual_seed(0)
    model, tokenizer = kvlab.load_model("smollm2-135m", dtype=torch.float32, device="cpu")
    return model, tokenizer


@pytest.fixture(scope="module")
def text():
    return kvlab.datasets.load_text("wikitext")


def test_full_streaming_equals_parallel_forward(smollm, text):
    model, tok = smollm
    stream = streaming_perplexity(model, tok, text, Full(), max_tokens=256, progress=False)
    ref = parallel_nll(model, tok, text, max_tokens=256)
    assert stream.nll.shape == ref.shape == (255,)
    ppl_ref = math.exp(float(ref.mean()))
    assert abs(stream.ppl - ppl_ref) / ppl_ref < 1e-3
    assert stream.kv_trace_per_layer.shape == (255, 30)
    assert stream.kv_trace[-1] == 255 and stream.peak_memory > 0 and stream.seconds > 0


def test_wide_streaming_window_equals_full_exactly(smollm, text):
    model, tok = smollm
    full = streaming_perplexity(model, tok, text, Full(), max_tokens=64, progress=False)
    wide = streaming_perplexity(model, tok, text, StreamingLLM(sink=4, window=80), max_tokens=64, progress=False)
    assert torch.equal(full.nll, wide.nll)


def test_bounded_cache_bounds_kv_and_memory(smollm, text):
    model, tok = smollm
    full = streaming_perplexity(model, tok, text, Full(), max_tokens=96, progress=False)
    small = streaming_perplexity(model, tok, text, StreamingLLM(sink=4, window=28), max_tokens=96, progress=False)
    assert int(small.kv_trace_per_layer.max()) == 32
    # held entries grow 1, 2, ..., 32 then stay at 32
    expected = sum(min(t, 32) for t in range(1, 96)) / 95
    assert small.mean_kv == pytest.approx(expected)
    assert small.peak_memory / full.peak_memory == pytest.approx(32 / 95)  # memory really drops
    assert small.ppl > full.ppl * 0.9  # evicting context cannot help much on natural text


def test_too_short_text_is_refused(smollm):
    model, tok = smollm
    with pytest.raises(ValueError, match="at least 2 tokens"):
        streaming_perplexity(model, tok, torch.tensor([1]), Full(), progress=False)


def test_passkey_separates_full_from_a_window_that_drops_the_key(smollm):
    model, tok = smollm
    full = passkey(model, tok, Full(), lengths=[512], depths=[0.5], progress=False)
    tiny = passkey(model, tok, StreamingLLM(sink=4, window=60), lengths=[512], depths=[0.5], progress=False)
    assert full.accuracy.shape == (1, 1) and torch.isfinite(full.answer_nll).all()
    # the 5-digit key sits ~250 tokens back: the window forgot it, the full cache did not
    assert float(full.answer_nll[0, 0]) < float(tiny.answer_nll[0, 0])


def test_needle_grid_shape_and_validation(smollm):
    model, tok = smollm
    r = needle_in_haystack(model, tok, Full(), lengths=[256], depths=[0.0, 1.0], progress=False)
    assert r.accuracy.shape == (1, 2) and ((r.accuracy >= 0) & (r.accuracy <= 1)).all()
    with pytest.raises(ValueError, match="depths are fractions"):
        needle_in_haystack(model, tok, Full(), lengths=[256], depths=[50], progress=False)
