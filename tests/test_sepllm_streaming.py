"""SepLLM's tailored streaming design: the four-block reference, its invariants, Eq. 3-4, and the policy."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kvlab.core import KVCache
from kvlab.eval import decode_stepwise
from kvlab.policies import Full, StreamingLLM
from kvlab.sepllm.policy import SepLLMStreaming
from kvlab.sepllm.streaming import FourBlockCache, check_sizes, eq3_limit, eq4_limit, simulate

SEPS = list(range(0, 96, 7))

pytestmark = pytest.mark.usefixtures("one_thread")



def random_flags(m, p, seed=0):
    return np.random.default_rng(seed).random(m) < p


def test_block_invariants_on_a_random_stream():
    a, s, w, c = 3, 5, 8, 30
    flags = random_flags(2000, 0.15)
    fb = FourBlockCache(a, s, w, c)
    for t, f in enumerate(flags):
        fb.push(t, bool(f))
        held = fb.positions()
        assert fb.size <= c  # total never above c
        assert held == sorted(held)  # order preserved: initial < separators < past < local
        assert fb.initial == list(range(min(a, t + 1)))
        assert all(flags[p] for p in fb.separators)  # the separator block holds only separators
        assert len(fb.separators) <= s and len(fb.window) <= w
        assert list(fb.window) == list(range(max(a, t + 1 - w), t + 1))  # the newest w tokens
    assert fb.compressions > 50
    # FIFO: the separator block holds the newest of all separators that went through a compression
    start = fb.past[0] if fb.past else fb.window[0]
    compressed = [p for p in range(a, start) if flags[p]]
    assert list(fb.separators) == compressed[-s:]


def test_eq4_on_a_long_synthetic_stream():
    """Eq. 3-4 hold in the limit: after 200k tokens the running means are within 0.5% of them."""
    a, s, w, c = 4, 64, 224, 512
    tr = simulate(random_flags(200_000, 0.12, seed=1), a, s, w, c)
    assert tr.size.max() == c and tr.size[tr.m0:].min() == a + s + w
    assert tr.neighbors[tr.m0:].min() == w and tr.neighbors[tr.m0:].max() == c - a - s
    assert tr.period() == c - a - s - w + 1
    assert tr.running_mean("size")[-1] == pytest.approx(eq4_limit(a, s, w, c), rel=5e-3)
    assert tr.running_mean("neighbors")[-1] == pytest.approx(eq3_limit(a, s, w, c), rel=5e-3)
    # the periodic part alone gives Eq. 4 exactly, whole periods after m0
    per = tr.period()
    tail = tr.size[tr.m0 - 1:]
    start = int(np.nonzero(np.diff(tail) < 0)[0][0]) + 1
    whole = tail[start:start + 10 * per]
    assert whole.mean() == pytest.approx(eq4_limit(a, s, w, c))


def test_without_separators_the_separator_block_stays_empty():
    tr = simulate(np.zeros(3000, dtype=bool), 4, 16, 32, 100)
    assert tr.separators.max() == 0 and tr.m0 is None
    assert tr.size.max() == 100 and tr.size[200:].min() == 4 + 32


def test_policy_matches_the_reference_step_by_step(tiny_llama, ids):
    a, s, w, c = 2, 3, 4, 12
    for positions in ("cache", "original"):
        cache = KVCache(tiny_llama, SepLLMStreaming(a, s, w, c, separators=SEPS, positions=positions))
        fb = FourBlockCache(a, s, w, c)
        with torch.no_grad():
            for t in range(ids.shape[1]):
                tiny_llama(input_ids=ids[:, t:t + 1], past_key_values=cache, use_cache=True)
                fb.push(t, int(ids[0, t]) in SEPS)
                for layer in cache.layers:
                    assert layer.positions[0].tolist() == fb.positions()
        assert fb.compressions >= 3


def test_streaming_policy_degenerates_to_streamingllm_without_separators(tiny_llama, ids):
    """No separators: after each compression only initial + local remain, so every kept set is a subset of
    StreamingLLM's with the same capacity, and equals it right after the cache fills."""
    a, w, c = 2, 4, 10
    cache = KVCache(tiny_llama, SepLLMStreaming(a, 3, w, c, separators=[]))
    with torch.no_grad():
        for t in range(ids.shape[1]):
            tiny_llama(input_ids=ids[:, t:t + 1], past_key_values=cache, use_cache=True)
            pos = cache.layers[0].positions[0].tolist()
            window = [p for p in pos if p >= a]
            assert pos[:min(a, t + 1)] == list(range(min(a, t + 1)))
            assert window == list(range(t + 1 - len(window), t + 1))  # contiguous newest tokens
            assert len(pos) <= c


@pytest.mark.parametrize("make", [lambda p: Full(positions=p),
                                  lambda p: SepLLMStreaming(2, 3, 4, 1000, separators=SEPS, positions=p)])
def test_insertion_positions_without_eviction_equal_original(tiny_llama, ids, make):
    """Nothing evicted: the cache length is the stream length, so "insertion" is "original"."""
    ref, _ = decode_stepwise(tiny_llama, ids, make("original"))
    got, cache = decode_stepwise(tiny_llama, ids, make("insertion"))
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    assert cache.layers[0].rot[0].tolist() == list(range(ids.shape[1]))


@pytest.mark.parametrize("policy", [StreamingLLM(sink=2, window=6, positions="insertion"),
                                    SepLLMStreaming(2, 3, 4, 12, separators=SEPS, positions="insertion")])
def test_insertion_positions_after_eviction(tiny_llama, ids, policy):
    """Each new token is rotated at the cache length when it arrives; cached keys keep that rotation (their
    stored keys never change), and the next step equals a plain DynamicCache fed the same keys with
    ``position_ids = cache length``: transformers 4.33 without position ids, as the official code runs."""
    from transformers import DynamicCache

    cache = KVCache(tiny_llama, policy)
    first_rot, first_key, evicted = {}, {}, 0
    with torch.no_grad():
        for t in range(ids.shape[1] - 1):
            held = cache.layers[0].size
            tiny_llama(input_ids=ids[:, t:t + 1], past_key_values=cache, use_cache=True)
            layer = cache.layers[0]
            evicted += held + 1 - layer.size
            pos = layer.positions[0].tolist()
            if t in pos:  # the new token sits at the length the cache had before this step
                assert int(layer.rot[0, pos.index(t)]) == held
            for i, p in enumerate(pos):
                first_rot.setdefault(p, int(layer.rot[0, i]))
                first_key.setdefault(p, layer.keys[0, :, i].clone())
                assert int(layer.rot[0, i]) == first_rot[p]
                assert torch.equal(layer.keys[0, :, i], first_key[p])  # never re-rotated
        assert evicted > 0 and max(first_rot.values()) <= policy.budget  # positions never pass the capacity
        n = cache.layers[0].size
        dyn = DynamicCache(config=tiny_llama.config)
        for i, layer in enumerate(cache.layers):
            dyn.update(layer.keys.clone(), layer.values.clone(), i)
        ref = tiny_llama(input_ids=ids[:, -1:], past_key_values=dyn, position_ids=torch.tensor([[n]])).logits
        got = tiny_llama(input_ids=ids[:, -1:], past_key_values=cache, use_cache=True).logits
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    shifted, _ = decode_stepwise(tiny_llama, ids, StreamingLLM(sink=2, window=6, positions="cache"))
    inserted, _ = decode_stepwise(tiny_llama, ids, StreamingLLM(sink=2, window=6, positions="insertion"))
    assert not torch.allclose(shifted[:, 9:], inserted[:, 9:], atol=1e-3)  # after the first eviction they part


@pytest.mark.parametrize("sizes, message", [
    ((4, 64, 256, 324), r"a \+ s \+ w < c"),
    ((4, 0, 320, 324), r"a \+ s \+ w < c"),
    ((-1, 4, 8, 100), "init must be >= 0"),
    ((1, -2, 8, 100), "sep must be >= 0"),
])
def test_check_sizes(sizes, message):
    with pytest.raises(ValueError, match=message):
        check_sizes(*sizes)
    with pytest.raises(ValueError, match=message):
        FourBlockCache(*sizes)


def test_runtime_kv_of_policy_follows_eq4_on_tiny_model(tiny_llama):
    """The trace of a real cache has the reference's sizes (same rule, same stream)."""
    ids = torch.randint(0, 96, (1, 120), generator=torch.Generator().manual_seed(5))
    a, s, w, c = 2, 4, 6, 20
    cache = KVCache(tiny_llama, SepLLMStreaming(a, s, w, c, separators=SEPS))
    with torch.no_grad():
        for t in range(ids.shape[1]):
            tiny_llama(input_ids=ids[:, t:t + 1], past_key_values=cache, use_cache=True)
    tr = simulate([int(x) in SEPS for x in ids[0]], a, s, w, c)
    assert [row[0] for row in cache.trace.per_layer] == tr.size.tolist()
    strm = KVCache(tiny_llama, StreamingLLM(sink=a, cache_size=c))
    assert strm.policy.budget == cache.policy.budget == c
