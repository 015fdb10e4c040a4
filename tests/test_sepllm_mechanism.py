"""SepLLM's fundamental design: separator ids, prefill masks, and the decoding policies that match them."""

from __future__ import annotations

import pytest
import torch

from kvlab.core import KVCache, LayerView
from kvlab.core import use_pattern
from kvlab.policies import Full, StreamingLLM
from kvlab.sepllm.policy import FixLLM, SepLLM, SepLLMStreaming
from kvlab.sepllm.pattern import (FixLLMPattern, HeadwisePattern, SepLLMPattern, StreamingPattern, kv_ratio,
                                   pattern_nll)
from kvlab.sepllm.reference import sepllm_mask
from kvlab.sepllm.separators import SEPARATOR_SETS, is_separator, separator_ids

SEPS = list(range(0, 96, 7))  # the tiny models' "separators"

pytestmark = pytest.mark.usefixtures("one_thread")



class WordTokenizer:
    """A vocabulary of strings standing in for a BPE tokenizer."""

    vocab = ["<s>", "Hello", ".", " .", ".\n", "\n\n", ",", " ,", "etc.", "):", "...)", " ", "  ", "\t", "\n",
             "?", "!", ";", ":", " world", "a.b", "7"]
    all_special_ids = [0]
    name_or_path = "word-tokenizer"

    def __len__(self):
        return len(self.vocab)

    def decode(self, ids):
        return "".join(self.vocab[i] for i in ids)

    def batch_decode(self, batch):
        return [self.decode(ids) for ids in batch]


def texts(ids):
    return {WordTokenizer.vocab[i] for i in ids}


def test_separator_ids_exact_and_suffix():
    tok = WordTokenizer()
    exact = separator_ids(tok, match="exact")
    assert texts(exact) == {".", " .", ".\n", "\n\n", ",", " ,", " ", "  ", "\t", "\n", "?", "!", ";", ":"}
    suffix = separator_ids(tok, match="suffix")
    assert texts(suffix) - texts(exact) == {"etc.", "):"}  # "...)" ends in ")" and "a.b" in "b"
    assert 0 not in suffix  # special tokens never count


def test_official_separators_are_bare_marks_and_leading_space_variants():
    """The default reading lists what the authors' code lists: each mark alone or after one space."""
    tok = WordTokenizer()
    official = separator_ids(tok)
    assert official == separator_ids(tok, match="official")
    assert texts(official) == {".", " .", ",", " ,", " ", "  ", "\t", "\n", "?", "!", ";", ":"}
    assert set(official) < set(separator_ids(tok, match="exact"))  # ".\n", "\n\n" are only in the broad sets
    assert texts(separator_ids(tok, "2")) == {".", " .", "?"}
    with pytest.raises(ValueError, match="match must be one of"):
        separator_ids(tok, match="prefix")


def test_separator_sets_of_the_ablation():
    tok = WordTokenizer()
    assert separator_ids(tok, "none") == []
    two = texts(separator_ids(tok, "2", match="exact"))
    assert two == {".", " .", ".\n", "?"}  # whitespace variants of "." count, lone whitespace does not
    four = texts(separator_ids(tok, "4", match="exact"))
    assert {",", " ,", ";"} <= four and "!" not in four and "\n\n" not in four
    assert SEPARATOR_SETS["9"] == (".", ",", "?", "!", ";", ":", " ", "\t", "\n")
    with pytest.raises(ValueError, match="not SepLLM separators"):
        separator_ids(tok, ["x"])
    with pytest.raises(ValueError, match="not a key"):
        separator_ids(tok, "7")


def test_is_separator_ignores_embedding_inputs():
    ids = torch.tensor([[2, 5, -1, 1]])
    assert is_separator(ids, [2, 5]).tolist() == [[True, True, False, False]]


def stream_logits(model, ids, policy):
    cache = KVCache(model, policy)
    with torch.no_grad():
        out = [model(input_ids=ids[:, t:t + 1], past_key_values=cache, use_cache=True).logits
               for t in range(ids.shape[1])]
    return torch.cat(out, dim=1), cache


def prefill_logits(model, ids, pattern):
    with torch.no_grad(), use_pattern(model, pattern):
        return model(input_ids=ids, use_cache=False).logits


@pytest.mark.parametrize("init, neighbors", [(2, 5), (0, 1), (3, 12)])
def test_mask_prefill_equals_policy_decoding(tiny_model, ids, init, neighbors):
    """The property of Sec. 3.2: prefill with Eq. 1-2's mask == decode token by token keeping init,
    separators and neighbours (original positions). Holds on Llama, Qwen2 and Gemma3 (sliding layers)."""
    ref = prefill_logits(tiny_model, ids, SepLLMPattern(SEPS, init, neighbors))
    got, cache = stream_logits(tiny_model, ids, SepLLM(init, neighbors, separators=SEPS))
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)
    # and the cache physically holds only init + separators + the n - 1 newest entries
    pos = cache.layers[0].positions[0]
    tok = cache.layers[0].token_ids[0]
    seen = ids.shape[1]
    expect = [p for p in range(seen) if p < init or seen - p < neighbors or int(ids[0, p]) in SEPS]
    if cache.layers[0].sliding_window is None:
        assert pos.tolist() == expect
    assert all(int(t) in SEPS or int(p) < init or seen - int(p) < neighbors for p, t in zip(pos, tok))


def test_chunked_and_kernel_paths_agree(tiny_llama, ids):
    pat = SepLLMPattern(SEPS, 2, 6)
    one = pattern_nll(tiny_llama, ids, pat)
    chunked = pattern_nll(tiny_llama, ids, pat, chunk_size=7, policy=SepLLM(2, 6, separators=SEPS))
    kernel = pattern_nll(tiny_llama, ids, SepLLMPattern(SEPS, 2, 6, backend="torch"))
    torch.testing.assert_close(chunked, one, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(kernel, one, rtol=1e-5, atol=1e-5)
    dense = pattern_nll(tiny_llama, ids)
    assert float((dense - one).abs().max()) > 1e-3  # the mask really changes the model's predictions


def test_position_general_mask_is_the_reference_mask(tiny_llama, ids):
    from kvlab.core import AttentionCall

    pat = SepLLMPattern(SEPS, 3, 4)
    pos = torch.arange(ids.shape[1])[None]
    call = AttentionCall(0, 4, pos, pos, ids, ids, 0.1, None, 2)
    assert torch.equal(pat.mask(call)[:, 0], sepllm_mask(is_separator(ids, SEPS), 3, 4))


def test_streaming_llm_is_sepllm_without_separators(tiny_llama, ids):
    a, n = 3, 6
    ref = prefill_logits(tiny_llama, ids, StreamingPattern(a, n))
    got, _ = stream_logits(tiny_llama, ids, StreamingLLM(sink=a, window=n - 1, positions="original"))
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)
    no_sep, _ = stream_logits(tiny_llama, ids, SepLLM(a, n, separators=[]))
    torch.testing.assert_close(no_sep, got, rtol=1e-6, atol=1e-6)


def test_fixllm_degenerate_cases_and_mask(tiny_llama, ids):
    full, _ = stream_logits(tiny_llama, ids, Full())
    every, cache = stream_logits(tiny_llama, ids, FixLLM(2, 4, interval=1))
    assert torch.equal(every, full) and cache.held()[0] == ids.shape[1]
    never, _ = stream_logits(tiny_llama, ids, FixLLM(2, 4, interval=1000))
    strm, _ = stream_logits(tiny_llama, ids, StreamingLLM(sink=2, window=3, positions="original"))
    torch.testing.assert_close(never, strm, rtol=1e-6, atol=1e-6)
    ref = prefill_logits(tiny_llama, ids, FixLLMPattern(2, 4, interval=5))
    got, cache = stream_logits(tiny_llama, ids, FixLLM(2, 4, interval=5))
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)
    far = [p for p in cache.layers[0].positions[0].tolist() if p >= 2 and ids.shape[1] - p >= 4]
    assert far and all(p % 5 == 4 for p in far)


def test_full_layers_keep_everything_and_the_others_follow_sepllm(tiny_llama, ids):
    """The paper's H/T variants: the listed layers keep every entry, the others keep SepLLM's set."""
    _, plain = stream_logits(tiny_llama, ids, SepLLM(2, 5, separators=SEPS))
    _, ht = stream_logits(tiny_llama, ids, SepLLM(2, 5, separators=SEPS, full_layers=(0, -1)))
    n = ids.shape[1]
    assert [layer.size for layer in ht.layers] == [n, plain.layers[1].size, plain.layers[2].size, n]
    assert torch.equal(ht.layers[1].positions, plain.layers[1].positions) and plain.layers[1].size < n
    with pytest.raises(ValueError, match="outside the model's 4 layers"):
        KVCache(tiny_llama, SepLLM(2, 5, separators=SEPS, full_layers=(4,)))


def test_fixllm_runs_batched(tiny_llama):
    ids = torch.randint(0, 96, (2, 20), generator=torch.Generator().manual_seed(4))
    both, _ = stream_logits(tiny_llama, ids, FixLLM(1, 3, interval=4))
    one, _ = stream_logits(tiny_llama, ids[1:], FixLLM(1, 3, interval=4))
    torch.testing.assert_close(both[1:], one, rtol=1e-5, atol=1e-5)


def test_content_policies_refuse_batches(tiny_llama):
    ids = torch.randint(0, 96, (2, 12))
    with pytest.raises(NotImplementedError, match="batch size 1"):
        stream_logits(tiny_llama, ids, SepLLM(1, 2, separators=SEPS))


def test_headwise_baseline_extremes(tiny_llama, ids):
    heads = tiny_llama.config.num_attention_heads
    with torch.no_grad():
        full = tiny_llama(input_ids=ids, use_cache=False).logits
    none_slide = prefill_logits(tiny_llama, ids, HeadwisePattern(0, heads, 4))
    torch.testing.assert_close(none_slide, full, rtol=1e-4, atol=1e-4)
    all_slide = prefill_logits(tiny_llama, ids, HeadwisePattern(heads, heads, 4, init=2))
    torch.testing.assert_close(all_slide, prefill_logits(tiny_llama, ids, StreamingPattern(2, 4)), rtol=1e-5, atol=1e-5)
    half = HeadwisePattern(heads // 2, heads, 4)
    assert kv_ratio(half, ids) == pytest.approx(0.5 * (1 + StreamingPattern(0, 4).kept_fraction(ids)))


def test_kv_ratio_counts_the_mask(ids):
    pat = SepLLMPattern(SEPS, 2, 5)
    mask = sepllm_mask(is_separator(ids, SEPS), 2, 5)
    t = ids.shape[1]
    assert kv_ratio(pat, ids) == pytest.approx(float(mask.sum()) / (t * (t + 1) / 2))
    assert kv_ratio(None, ids) == 1.0
    assert kv_ratio(SepLLMPattern(SEPS, 0, t), ids) == pytest.approx(1.0)


def view(positions, token_ids, seen):
    return LayerView(0, 1, seen, torch.tensor([positions]), torch.tensor([token_ids]), None, None, {})


def test_sepllm_keep_rule_without_a_model():
    p = SepLLM(init=1, neighbors=3, separators=[9])
    v = view(list(range(8)), [5, 9, 5, 5, 9, 5, 5, 5], seen=8)
    assert p.keep(v).tolist() == [0, 1, 4, 6, 7]
    assert SepLLM(init=0, neighbors=100, separators=[9]).keep(v) is None


@pytest.mark.parametrize("make, message", [
    (lambda: SepLLM(init=-1, neighbors=4, separators=[1]), "init must be >= 0"),
    (lambda: SepLLM(init=1, neighbors=0, separators=[1]), "neighbors must be >= 1"),
    (lambda: SepLLM(init=1, neighbors=4), "separators is required"),
    (lambda: SepLLM(init=1, neighbors=4, separators=[-3]), "must be >= 0"),
    (lambda: FixLLM(init=1, neighbors=4, interval=0), "interval must be >= 1"),
    (lambda: SepLLMPattern([1], 1, 4, backend="cuda"), "backend must be one of"),
    (lambda: HeadwisePattern(5, 4, 8), r"window_heads \(5\) must be <= num_heads \(4\)"),
    (lambda: SepLLMStreaming(4, 64, 256, 300, separators=[1]), r"a \+ s \+ w < c"),
    (lambda: SepLLMStreaming(4, 64, 0, 300, separators=[1]), "local must be >= 1"),
])
def test_bad_sizes_rejected(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_non_integer_sizes_rejected():
    with pytest.raises(TypeError, match="neighbors must be an int"):
        SepLLM(init=1, neighbors=2.5, separators=[1])
    with pytest.raises(TypeError, match="cache must be an int"):
        SepLLMStreaming(4, 8, 16, 100.0, separators=[1])


def test_match_neighbors_equalises_runtime_kv(ids):
    from kvlab.sepllm.pattern import match_neighbors

    target = SepLLMPattern(SEPS, 2, 5).kept_fraction(ids)
    n = match_neighbors(lambda k: StreamingPattern(2, k), target, ids)
    assert StreamingPattern(2, n).kept_fraction(ids) >= target > StreamingPattern(2, n - 1).kept_fraction(ids)


class CharTokenizer:
    """Characters as ids (mod the tiny models' vocabulary): enough to run MMLU prompts through a tiny model."""

    def __call__(self, text, return_tensors=None, add_special_tokens=True):
        from types import SimpleNamespace

        ids = [ord(c) % 95 + 1 for c in text]
        return SimpleNamespace(input_ids=torch.tensor([ids]) if return_tensors == "pt" else ids)


def test_mmlu_prompts_and_accuracy(tiny_llama):
    from kvlab.experiments.sepllm.mmlu import mmlu_accuracy, mmlu_prompts

    records = [dict(question=f"q{s}{i}?", answer_a="x", answer_b="y", answer_c="z", answer_d="w",
                    correct_answer="ABCD"[i % 4], topic=f"subject {s}") for s in range(3) for i in range(6)]
    prompts = mmlu_prompts(subjects=2, questions=3, shots=2, records=records)
    assert [p.subject for p in prompts] == ["subject 0"] * 3 + ["subject 1"] * 3
    first = prompts[0].text
    assert first.startswith("The following are multiple choice questions (with answers) about subject 0.")
    assert "q00?" in first and "q01?" in first and first.endswith("q02?\nA. x\nB. y\nC. z\nD. w\nAnswer:")
    assert [p.gold for p in prompts[:3]] == [2, 3, 0]  # exemplars (questions 0 and 1) are never scored
    tok = CharTokenizer()
    acc, kv, preds = mmlu_accuracy(tiny_llama, tok, prompts)
    wide_acc, wide_kv, wide_preds = mmlu_accuracy(tiny_llama, tok, prompts, SepLLMPattern(SEPS, 2, 10_000))
    assert kv == 1.0 and wide_kv == pytest.approx(1.0) and preds == wide_preds  # a mask that keeps all is Vanilla
    assert 0.0 <= acc <= 1.0 and len(preds) == 6
    _, small_kv, _ = mmlu_accuracy(tiny_llama, tok, prompts, SepLLMPattern(SEPS, 2, 8))
    assert small_kv < 1.0
