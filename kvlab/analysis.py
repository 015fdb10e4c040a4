"""Small measurements on attention maps (from ``kvlab.core.capture_attention``)."""

from __future__ import annotations

import torch

__all__ = ["attention_mass"]


def attention_mass(maps: torch.Tensor, keys: torch.Tensor, *, skip_queries: int = 0) -> torch.Tensor:
    """Share of attention that goes to the keys selected by ``keys``, per layer.

    maps: ``(layers, heads, q, n)`` attention probabilities; keys: ``(n,)`` bool. Averages over heads and
    over queries ``skip_queries..q-1`` (the first queries can only look at the first keys, so they inflate
    the share of early tokens; StreamingLLM Fig. 2 shows the sink over all queries).
    Returns ``(layers,)``.
    """
    if maps.dim() != 4:
        raise ValueError(f"maps must be (layers, heads, q, n), got shape {tuple(maps.shape)}")
    if keys.shape != (maps.shape[-1],):
        raise ValueError(f"keys must be a ({maps.shape[-1]},) bool mask over the keys, got {tuple(keys.shape)}")
    if not 0 <= skip_queries < maps.shape[2]:
        raise ValueError(f"skip_queries must be in 0..{maps.shape[2] - 1}, got {skip_queries}")
    mass = maps[:, :, skip_queries:, :][..., keys.to(maps.device)].sum(-1)
    return mass.mean(dim=(1, 2))
