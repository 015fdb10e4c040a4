"""How much memory a KV cache takes, for real model shapes.

Per token, every layer stores one key and one value vector per KV head:
``bytes/token = 2 * layers * kv_heads * head_dim * bytes_per_element``. Grouped-query attention (fewer KV
heads than query heads) is why a 1.5B model can need less cache per token than a 1B one without it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["ModelShape", "MODEL_SHAPES", "kv_bytes_per_token", "kv_cache_bytes", "shape_of"]


@dataclass(frozen=True)
class ModelShape:
    name: str
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    context: int  # trained context length (max_position_embeddings of the released config)


# From the released configs (config.json of each model).
MODEL_SHAPES = {
    "smollm2-135m": ModelShape("SmolLM2-135M", 30, 9, 3, 64, 8192),
    "gemma3-270m": ModelShape("Gemma-3-270m", 18, 4, 1, 256, 32768),
    "qwen2.5-coder-0.5b": ModelShape("Qwen2.5-Coder-0.5B", 24, 14, 2, 64, 32768),
    "qwen2.5-coder-1.5b": ModelShape("Qwen2.5-Coder-1.5B", 28, 12, 2, 128, 32768),
    "pythia-160m": ModelShape("Pythia-160M (SepLLM's training model)", 12, 12, 12, 64, 2048),
    "llama-2-7b": ModelShape("Llama-2-7B (StreamingLLM, LaCache)", 32, 32, 32, 128, 4096),
    "llama-3-8b": ModelShape("Llama-3-8B (SepLLM)", 32, 32, 8, 128, 8192),
}


def shape_of(config) -> ModelShape:
    """The :class:`ModelShape` of a transformers config (text part)."""
    cfg = config.get_text_config() if hasattr(config, "get_text_config") else config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return ModelShape(getattr(cfg, "_name_or_path", "") or cfg.model_type, cfg.num_hidden_layers,
                      cfg.num_attention_heads, cfg.num_key_value_heads, head_dim, cfg.max_position_embeddings)


def kv_bytes_per_token(shape: ModelShape | str, dtype: torch.dtype = torch.bfloat16) -> int:
    """Bytes of keys and values one token adds to a full cache."""
    s = MODEL_SHAPES[shape] if isinstance(shape, str) else shape
    return 2 * s.layers * s.kv_heads * s.head_dim * torch.empty((), dtype=dtype).element_size()


def kv_cache_bytes(shape: ModelShape | str, tokens: int, batch: int = 1, dtype: torch.dtype = torch.bfloat16) -> int:
    """Bytes of a full KV cache holding ``tokens`` tokens for ``batch`` sequences."""
    if tokens < 0 or batch < 1:
        raise ValueError(f"tokens must be >= 0 and batch >= 1, got tokens={tokens}, batch={batch}")
    return batch * tokens * kv_bytes_per_token(shape, dtype)
