"""Segmented long-stream perplexity (kvlab.eval.long_stream_perplexity) against one sequential static pass.

Exact when the warm-up covers the whole prefix; exact for StreamingLLM once the warm-up spans ``layers x window``
tokens (layer l's entries depend on l windows back); otherwise an approximation whose size
long_stream_deviation reports. Tiny random Llama in float64, so "exact" means 1e-6 relative.
"""

from __future__ import annotations

import math

import pytest
import torch

from conftest import _tiny
from kvlab.baselines.h2o import H2O
from kvlab.eval import long_stream_deviation, long_stream_perplexity, segment_rows
from kvlab.eval.fast import decode_static
from kvlab.policies import Full, LaCache, SepLLMStreaming, StreamingLLM

pytestmark = pytest.mark.usefixtures("one_thread")

SEPS = list(range(0, 96, 7))  # separator ids of the tiny vocabulary (96 tokens)


@pytest.fixture(scope="module")
def model64():
    return _tiny("llama").double()


def _ids(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 96, (n,), generator=torch.Generator().manual_seed(seed))


def _sequential(model, ids, policy) -> torch.Tensor:
    return decode_static(model, ids[None], policy)["nll"][0]


def test_segment_rows_score_every_token_once():
    ids = torch.arange(100, 200)
    rows, spans = segment_rows(ids, 4, warmup=10, sink=2)
    assert [s[:2] for s in spans] == [(1, 25), (25, 50), (50, 75), (75, 100)]
    assert spans[0][2] == 25 and torch.equal(rows[0, :25], ids[:25])  # the first row is the stream's start
    assert torch.equal(rows[0, 25:], ids[24].expand(rows.shape[1] - 25))  # padded with its last token
    # segment 2 (targets 50..74): sinks, the 10 tokens before its first input ids[49], then ids[49..74]
    assert torch.equal(rows[2, :spans[2][2]], torch.cat([ids[:2], ids[39:75]]))
    assert rows.shape == (4, max(s[2] for s in spans))
    _, covered = segment_rows(ids, 4, warmup=100, sink=2)  # a warm-up back to the sinks: every row is a prefix
    assert all(length == end for _, end, length in covered)


@pytest.mark.parametrize("policy", [StreamingLLM(2, cache_size=6), SepLLMStreaming(2, 3, 4, 12, separators=SEPS),
                                    LaCache(12, 2, 1, 2), LaCache.official(10, 2, 0, 2)], ids=repr)
def test_warmup_over_the_whole_prefix_is_one_sequential_pass(model64, policy):
    ids = _ids(90, 1)
    result = long_stream_perplexity(model64, ids, policy, segments=4, warmup=90, sink=2, progress=False)
    sequential = decode_static(model64, ids[None], policy)
    torch.testing.assert_close(result.nll, sequential["nll"][0], rtol=1e-6, atol=0)
    torch.testing.assert_close(result.kv_trace, sequential["trace"][:, 0].float().mean(dim=1))
    assert result.tokens == 90 and result.segments == 4
    assert math.isclose(result.ppl, math.exp(float(sequential["nll"].mean())), rel_tol=1e-9)


def test_streamingllm_is_exact_once_the_warmup_spans_layers_times_window(model64):
    """Layer l's keys of a token depend on l windows of tokens before it: after layers x window tokens of warm-up
    nothing from before the warm-up is left, so the segmented result equals the sequential one."""
    policy, layers, window = StreamingLLM(2, cache_size=6), 4, 4
    ids = _ids(200, 2)
    sequential = _sequential(model64, ids, policy)
    exact = long_stream_perplexity(model64, ids, policy, segments=4, warmup=layers * window, sink=2, progress=False)
    torch.testing.assert_close(exact.nll, sequential, rtol=1e-6, atol=0)
    short = long_stream_perplexity(model64, ids, policy, segments=4, warmup=window, sink=2, progress=False)
    assert float((short.nll - sequential).abs().max()) > 1e-3  # a short warm-up is an approximation


def test_deviation_reports_the_error_and_check_tokens_stores_it(model64):
    policy = SepLLMStreaming(2, 3, 4, 12, separators=SEPS)
    ids = _ids(160, 3)
    covered = long_stream_deviation(model64, ids, policy, segments=2, warmup=200, sink=2)
    assert covered["approximated_tokens"] == 0 and covered["max_abs_nll_diff"] < 1e-9
    dev = long_stream_deviation(model64, ids, policy, segments=2, warmup=8, sink=2)
    assert dev["approximated_tokens"] == 80 and dev["max_abs_nll_diff"] > 1e-3
    segmented = long_stream_perplexity(model64, ids, policy, segments=2, warmup=8, sink=2, progress=False)
    sequential = _sequential(model64, ids, policy)
    assert math.isclose(dev["ppl_rel_diff"], math.exp(float(segmented.nll.mean() - sequential.mean())) - 1,
                        rel_tol=1e-9)
    assert math.isclose(dev["mean_abs_nll_diff"], float((segmented.nll - sequential).abs().mean()), rel_tol=1e-9)
    # check_tokens: the same comparison on a prefix, segments as long as the run's
    run = long_stream_perplexity(model64, _ids(321, 3), policy, segments=4, warmup=8, sink=2, check_tokens=160,
                                 progress=False)
    assert run.deviation == dev
    assert run.summary()["deviation"] == dev


def test_cumulative_and_window_perplexity(model64):
    ids = _ids(101, 4)
    result = long_stream_perplexity(model64, ids, StreamingLLM(2, cache_size=6), segments=2, warmup=16, sink=2,
                                    report_every=40, progress=False)
    nll = result.nll
    assert list(result.cumulative_ppl()) == [40, 80, 101]
    assert math.isclose(result.cumulative_ppl()[80], math.exp(float(nll[:79].mean())), rel_tol=1e-12)
    assert math.isclose(result.window_ppl()[80], math.exp(float(nll[39:79].mean())), rel_tol=1e-12)
    assert math.isclose(result.window_ppl()[101], math.exp(float(nll[79:].mean())), rel_tol=1e-12)
    assert result.cumulative_ppl()[101] == pytest.approx(result.ppl)
    assert 2 < result.mean_kv <= 7


def test_bad_inputs_name_the_fix(model64):
    ids = _ids(40)
    policy = StreamingLLM(2, cache_size=6)
    with pytest.raises(ValueError, match=r"segments must be >= 1 \(1 is one sequential pass\)"):
        long_stream_perplexity(model64, ids, policy, segments=0, warmup=8, progress=False)
    with pytest.raises(ValueError, match="warmup must be >= 0"):
        long_stream_perplexity(model64, ids, policy, segments=2, warmup=-1, progress=False)
    with pytest.raises(ValueError, match="too short for 40 segments.*pass segments <= 39"):
        long_stream_perplexity(model64, ids, policy, segments=40, warmup=8, progress=False)
    with pytest.raises(ValueError, match="cannot run H2O.*engine='hooks'"):
        long_stream_perplexity(model64, ids, H2O(6, 3), segments=2, warmup=8, progress=False)
    with pytest.raises(ValueError, match="positions='original'.*use positions='cache'"):
        long_stream_perplexity(model64, ids, Full(), segments=2, warmup=8, progress=False)
    with pytest.raises(ValueError, match="one stream"):
        long_stream_perplexity(model64, ids.view(2, 20), policy, segments=2, warmup=8, progress=False)
