"""The attention function and hooks: token-by-token decoding through a KVCache equals one forward pass."""

from __future__ import annotations

import pytest
import torch

from kvlab.core import KVCache, rerotate
from kvlab.eval import decode_stepwise
from kvlab.core import MaskPattern, attach, capture_attention, use_pattern
from kvlab.policies import Full, Policy, StreamingLLM


def test_full_stream_equals_parallel(tiny_model, ids):
    with torch.no_grad():
        ref = tiny_model(input_ids=ids, use_cache=False).logits
    got, cache = decode_stepwise(tiny_model, ids, Full())
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)
    assert cache.seen == ids.shape[1]


def test_wide_window_equals_full_exactly(tiny_model, ids):
    full, _ = decode_stepwise(tiny_model, ids, Full())
    wide, _ = decode_stepwise(tiny_model, ids, StreamingLLM(sink=4, window=ids.shape[1]))
    assert torch.equal(full, wide)


def test_streaming_keeps_sink_and_window(tiny_llama, ids):
    cache = KVCache(tiny_llama, StreamingLLM(sink=2, window=6))
    with torch.no_grad():
        for t in range(ids.shape[1]):
            tiny_llama(input_ids=ids[:, t:t + 1], past_key_values=cache, use_cache=True)
            seen = t + 1
            want = list(range(min(2, seen))) + list(range(max(2, seen - 6), seen))
            for layer in cache.layers:
                assert layer.positions[0].tolist() == want
                assert layer.keys.shape[2] == len(want)  # memory really dropped
    assert cache.trace.per_layer[-1] == [8] * 4
    assert cache.trace.nbytes[-1] < cache.trace.nbytes[7] * 2


def test_sink_window_mask_prefill_equals_streaming_original_positions(tiny_llama, ids):
    """StreamingLLM decoded token by token (original positions) is the mask k < sink or q - k <= window."""
    sink, window = 3, 5

    def mask(call):
        diff = call.q_positions[:, None, :, None] - call.k_positions[:, None, None, :]
        return (call.k_positions[:, None, None, :] < sink) | (diff <= window)

    with torch.no_grad(), use_pattern(tiny_llama, MaskPattern(mask)):
        ref = tiny_llama(input_ids=ids, use_cache=False).logits
    got, _ = decode_stepwise(tiny_llama, ids, StreamingLLM(sink=sink, window=window, positions="original"))
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)


def test_cache_positions_match_dynamic_cache_with_shifted_positions(tiny_llama, ids):
    """Positions within the cache: the next step equals a plain transformers DynamicCache holding the same
    entries rotated at 0..n-1 and a query at position n."""
    from transformers import DynamicCache
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    policy = StreamingLLM(sink=2, window=6, positions="cache")
    _, cache = decode_stepwise(tiny_llama, ids[:, :-1], policy)
    n = cache.layers[0].size
    dyn = DynamicCache(config=tiny_llama.config)
    for i, layer in enumerate(cache.layers):
        shift = torch.arange(n)[None] - layer.rot
        dyn.update(rerotate(layer.keys, shift, layer.inv_freq), layer.values.clone(), i)
    with torch.no_grad():
        ref = tiny_llama(input_ids=ids[:, -1:], past_key_values=dyn, position_ids=torch.tensor([[n]])).logits
        got = tiny_llama(input_ids=ids[:, -1:], past_key_values=cache, use_cache=True).logits
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    # and moving keys by a shift equals rotating them there in the first place
    k = torch.randn(1, 2, 5, 16)
    rot = tiny_llama.model.rotary_emb
    cos0, sin0 = rot(k, torch.arange(5)[None])
    cos1, sin1 = rot(k, torch.arange(5)[None] + 7)
    k0, _ = apply_rotary_pos_emb(k, k, cos0, sin0)
    k1, _ = apply_rotary_pos_emb(k, k, cos1, sin1)
    freq = torch.ones(1)
    torch.testing.assert_close(rerotate(k0, torch.full((1, 5), 7), rot.inv_freq), k1, rtol=1e-5, atol=1e-5)


def test_sliding_window_layers_hold_only_the_window(tiny_gemma, ids):
    _, cache = decode_stepwise(tiny_gemma, ids, Full())
    sizes = cache.held()
    assert sizes[2] == ids.shape[1]  # the full-attention layer
    assert all(sizes[i] == 7 for i in (0, 1, 3))  # window 8: the next query sees 7 old entries + itself


def test_batch_rows_match_single_rows(tiny_llama):
    torch.manual_seed(3)
    ids = torch.randint(0, 96, (2, 24))
    both, _ = decode_stepwise(tiny_llama, ids, StreamingLLM(sink=2, window=5))
    for row in range(2):
        one, _ = decode_stepwise(tiny_llama, ids[row:row + 1], StreamingLLM(sink=2, window=5))
        torch.testing.assert_close(both[row:row + 1], one, rtol=1e-5, atol=1e-5)


def test_padded_batch_is_refused(tiny_llama):
    ids = torch.randint(0, 96, (2, 6))
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[1, :2] = 0
    with pytest.raises(NotImplementedError, match="padded"):
        tiny_llama(input_ids=ids, attention_mask=mask, past_key_values=KVCache(tiny_llama, Full()), use_cache=True)


def test_generate_through_policy_cache(tiny_llama, ids):
    prompt = ids[:, :8]
    with torch.no_grad():
        plain = tiny_llama.generate(prompt, max_new_tokens=12, do_sample=False)
        full = tiny_llama.generate(prompt, max_new_tokens=12, do_sample=False,
                                   past_key_values=KVCache(tiny_llama, Full()))
        cache = KVCache(tiny_llama, StreamingLLM(sink=2, window=4))
        tiny_llama.generate(prompt, max_new_tokens=12, do_sample=False, past_key_values=cache)
    assert torch.equal(plain, full)
    assert cache.seen == 8 + 11 and max(cache.held()) == 6


class _Recorder(Policy):
    needs_scores = True

    def __init__(self):
        super().__init__("original")
        self.totals = []

    def keep(self, view):
        self.totals.append(float(view.scores.sum()))
        return None


def test_scores_reach_policies(tiny_llama, ids):
    policy = _Recorder()
    decode_stepwise(tiny_llama, ids[:, :10], policy)
    heads = tiny_llama.config.num_attention_heads
    # every query spreads probability 1 per head over the entries; nothing was evicted
    assert policy.totals[-1] == pytest.approx(heads * 10, rel=1e-4)


def test_capture_attention_is_a_distribution(tiny_llama, ids):
    maps = capture_attention(tiny_llama, ids[:, :12], layers=[0, 3])
    assert maps.shape == (2, 4, 12, 12)
    torch.testing.assert_close(maps.sum(-1), torch.ones(2, 4, 12))
    assert torch.all(maps.triu(1) == 0)


def test_unsupported_architecture_is_named():
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50))
    with pytest.raises(NotImplementedError, match="llama, qwen2, gemma3_text"):
        attach(model)


def test_use_pattern_rejects_missing_layer(tiny_llama):
    with pytest.raises(ValueError, match="layers 0..3"):
        with use_pattern(tiny_llama, MaskPattern(lambda c: c.causal_mask()), layers=[9]):
            pass


def test_eager_models_keep_eager_attention_and_masks():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, attn_implementation="eager")
    plain = LlamaForCausalLM(config).eval()
    attached = LlamaForCausalLM(config).eval()
    attached.load_state_dict(plain.state_dict())
    attach(attached)
    assert attached.config._attn_implementation == "kvlab_eager"
    ids = torch.randint(0, 96, (1, 12))
    with torch.no_grad():
        torch.testing.assert_close(attached(input_ids=ids).logits, plain(input_ids=ids).logits)
    got, _ = decode_stepwise(attached, ids, StreamingLLM(sink=2, window=64))
    torch.testing.assert_close(got, plain(input_ids=ids).logits.detach(), rtol=1e-4, atol=1e-4)
