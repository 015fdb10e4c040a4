"""Bad or edge inputs, tried as a hostile user would (issue "No silent wrong results").

Each case asserts the error type and a key phrase of its message, or the correct result. The asset and
model-loading cases (damaged cache files, offline hub ids, KVLAB_CACHE) are in test_robustness_assets.py.
"""

from __future__ import annotations

import time

import pytest
import torch

from conftest import IdTokenizer
from kvlab.core import KVCache, MaskPattern, use_pattern
from kvlab.core.checks import check_parameters
from kvlab.eval import chunked_perplexity, decode_stepwise, parallel_nll, streaming_perplexity
from kvlab.policies import Full, SepLLM, SepLLMStreaming, StreamingLLM
from kvlab.sepllm import SeparatorSet, sep_attention

pytestmark = pytest.mark.usefixtures("one_thread")
TOK = IdTokenizer()


# --------------------------------------------------------------------------- silent wrong results
def test_two_rows_are_refused_not_summed(tiny_llama):
    ids = torch.randint(0, 96, (2, 20))
    for fn in (lambda: streaming_perplexity(tiny_llama, TOK, ids, Full(), progress=False),
               lambda: parallel_nll(tiny_llama, TOK, ids),
               lambda: chunked_perplexity(tiny_llama, TOK, ids, Full())):
        with pytest.raises(ValueError, match="scores one stream: call it once per row"):
            fn()


def test_one_row_in_any_form_gives_the_same_result(tiny_llama):
    ids = torch.randint(0, 96, (1, 20))
    a = parallel_nll(tiny_llama, TOK, ids)
    b = parallel_nll(tiny_llama, TOK, ids[0])
    torch.testing.assert_close(a, b)


@pytest.mark.parametrize("max_tokens", [-1, -20, -3, 0, 1])
def test_max_tokens_must_be_at_least_two(tiny_llama, max_tokens):
    ids = torch.randint(0, 96, (1, 30))
    with pytest.raises(ValueError, match="max_tokens must be >= 2"):
        streaming_perplexity(tiny_llama, TOK, ids, Full(), max_tokens=max_tokens, progress=False)


def test_max_tokens_none_streams_everything(tiny_llama):
    ids = torch.randint(0, 96, (1, 12))
    r = streaming_perplexity(tiny_llama, TOK, ids, Full(), max_tokens=None, progress=False)
    assert r.nll.numel() == 11


@pytest.mark.parametrize("value", [2.5, "10", True])
def test_max_tokens_must_be_an_int(tiny_llama, value):
    with pytest.raises(TypeError, match="max_tokens must be an int"):
        streaming_perplexity(tiny_llama, TOK, torch.randint(0, 96, (1, 30)), Full(), max_tokens=value, progress=False)


def _attention_inputs():
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 8, 16) for _ in range(3))
    return q, k, v, torch.zeros(1, 8, dtype=torch.bool)


@pytest.mark.parametrize("name, value", [("init", 2.7), ("neighbors", 3.0), ("init", "2")])
def test_sep_attention_sizes_must_be_ints(name, value):
    q, k, v, is_sep = _attention_inputs()
    kw = dict(init=2, neighbors=3) | {name: value}
    with pytest.raises(TypeError, match=f"{name} must be an int"):
        sep_attention(q, k, v, is_sep, backend="torch", **kw)


# --------------------------------------------------------------------------- unclear errors made clear
def test_policy_none_or_wrong_type(tiny_llama):
    ids = torch.randint(0, 96, (1, 10))
    with pytest.raises(TypeError, match="policy must be a kvlab Policy"):
        streaming_perplexity(tiny_llama, TOK, ids, None, progress=False)
    with pytest.raises(TypeError, match="policy must be a kvlab Policy"):
        KVCache(tiny_llama, "streaming")


@pytest.mark.parametrize("text, error, phrase", [
    (None, TypeError, "text must be a str or a tensor of token ids"),
    (12345, TypeError, "text must be a str or a tensor of token ids"),
    (torch.rand(1, 10), ValueError, "integer token ids"),
    (torch.randint(0, 96, (1, 1, 10)), ValueError, r"shape \(seq,\) or \(batch, seq\)"),
    (torch.tensor([[1, 2, 500, 3]]), ValueError, r"token ids in \[0, 96\)"),
    (torch.tensor([[1, -4, 2]]), ValueError, r"token ids in \[0, 96\)"),
    (torch.tensor([[7]]), ValueError, "at least 2 tokens"),
])
def test_bad_texts(tiny_llama, text, error, phrase):
    with pytest.raises(error, match=phrase):
        streaming_perplexity(tiny_llama, TOK, text, Full(), progress=False)


def test_decode_stepwise_checks_ids(tiny_llama):
    with pytest.raises(ValueError, match="vocabulary"):
        decode_stepwise(tiny_llama, torch.tensor([[3, 99]]), Full())


@pytest.mark.parametrize("separators, error, phrase", [
    (".,", TypeError, "token ids or a tokenizer"),
    (None, ValueError, "separators is required"),
    ([1.5, 2], TypeError, "integer token ids"),
    ([-1], ValueError, ">= 0"),
])
def test_bad_separators(separators, error, phrase):
    with pytest.raises(error, match=phrase):
        SepLLM(3, 8, separators=separators)


def test_separators_beyond_the_vocabulary_are_caught_without_a_huge_table(tiny_llama):
    start = time.perf_counter()
    policy = SepLLMStreaming(2, 4, 8, 20, separators=[3, 10**9])
    assert time.perf_counter() - start < 1.0  # no vocabulary-sized table is allocated
    with pytest.raises(ValueError, match="outside the model's vocabulary of 96"):
        KVCache(tiny_llama, policy)
    assert len(SeparatorSet([5, 5, 3])) == 2


@pytest.mark.parametrize("is_sep", [[0, 1, 0, 0, 0, 0, 0, 0], None, "seps"])
def test_is_sep_must_be_a_bool_tensor(is_sep):
    q, k, v, _ = _attention_inputs()
    with pytest.raises(ValueError, match="is_sep must be a bool tensor of shape"):
        sep_attention(q, k, v, is_sep, 2, 3, backend="torch")


@pytest.mark.parametrize("scale, error", [("x", TypeError), (-1.0, ValueError), (float("nan"), ValueError)])
def test_sep_attention_scale(scale, error):
    q, k, v, is_sep = _attention_inputs()
    with pytest.raises(error, match="scale must be"):
        sep_attention(q, k, v, is_sep, 2, 3, scale=scale, backend="torch")


def test_cache_reused_with_another_batch_size(tiny_llama):
    cache = KVCache(tiny_llama, StreamingLLM(2, 6))
    with torch.no_grad():
        tiny_llama(input_ids=torch.randint(0, 96, (1, 5)), past_key_values=cache, use_cache=True)
        with pytest.raises(ValueError, match="create a new KVCache"):
            tiny_llama(input_ids=torch.randint(0, 96, (2, 1)), past_key_values=cache, use_cache=True)


def test_a_failed_step_leaves_nothing_half_written(tiny_llama):
    """A forward pass that raises in layer 2 has already appended keys in layers 0-2: they are rolled back
    at once, so the cache equals one that never saw the failed step."""
    ids = torch.randint(0, 96, (1, 12))
    cache, clean = KVCache(tiny_llama, Full()), KVCache(tiny_llama, Full())

    def boom(call):
        raise RuntimeError("boom")

    with torch.no_grad():
        for c in (cache, clean):
            tiny_llama(input_ids=ids[:, :6], past_key_values=c, use_cache=True)
        with use_pattern(tiny_llama, MaskPattern(boom), layers=[2]), pytest.raises(RuntimeError, match="boom"):
            tiny_llama(input_ids=ids[:, 6:9], past_key_values=cache, use_cache=True)
        assert cache.held() == clean.held() == [6] * 4 and cache.seen == 6
        a = tiny_llama(input_ids=ids[:, 6:], past_key_values=cache, use_cache=True).logits
        b = tiny_llama(input_ids=ids[:, 6:], past_key_values=clean, use_cache=True).logits
    assert cache.held() == clean.held() == [12] * 4
    torch.testing.assert_close(a, b)


def test_notebook_parameters_are_type_checked():
    namespace = {"__annotations__": {"max_tokens": int, "lr": float, "name": str, "limit": "int | None"},
                 "max_tokens": "abc", "lr": 1, "name": "x", "limit": None}
    with pytest.raises(TypeError, match=r"max_tokens: expected int, got str 'abc'"):
        check_parameters(namespace)
    namespace["max_tokens"] = 10
    check_parameters(namespace)  # an int for a float and None for "int | None" are fine
    namespace["limit"] = 2.5
    with pytest.raises(TypeError, match="limit"):
        check_parameters(namespace)
