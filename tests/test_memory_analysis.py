from __future__ import annotations

import pytest
import torch

from kvlab.analysis import attention_mass
from kvlab.core import capture_attention
from kvlab.memory import MODEL_SHAPES, kv_bytes_per_token, kv_cache_bytes, shape_of


def test_llama3_8b_bytes_per_token():
    # 2 (K and V) * 32 layers * 8 KV heads * 128 dims * 2 bytes = 128 KiB
    assert kv_bytes_per_token("llama-3-8b") == 131072
    assert kv_cache_bytes("llama-3-8b", 8192) == 1 << 30  # 1 GiB for an 8K context


def test_smollm2_bytes_per_token_fp32():
    assert kv_bytes_per_token("smollm2-135m", torch.float32) == 2 * 30 * 3 * 64 * 4


def test_shape_of_config_matches_measured_cache(tiny_llama):
    from kvlab.core import KVCache
    from kvlab.policies import Full

    cache = KVCache(tiny_llama, Full())
    with torch.no_grad():
        tiny_llama(input_ids=torch.arange(10)[None], past_key_values=cache, use_cache=True)
    assert cache.trace.nbytes[-1] == kv_cache_bytes(shape_of(tiny_llama.config), 10, dtype=torch.float32)


def test_bad_sizes():
    with pytest.raises(ValueError, match="tokens must be >= 0"):
        kv_cache_bytes("llama-3-8b", -1)
    assert set(MODEL_SHAPES) >= {"smollm2-135m", "llama-3-8b"}


def test_attention_mass(tiny_llama):
    maps = capture_attention(tiny_llama, torch.arange(16)[None] % 96)
    every = attention_mass(maps, torch.ones(16, dtype=torch.bool))
    torch.testing.assert_close(every, torch.ones(maps.shape[0]))
    first = attention_mass(maps, torch.arange(16) == 0)
    assert torch.all((first > 0) & (first < 1))
    with pytest.raises(ValueError, match="bool mask over the keys"):
        attention_mass(maps, torch.ones(3, dtype=torch.bool))
