"""RoPE arithmetic on cached keys: rotating keys already rotated at one position to another position."""
from __future__ import annotations

import torch

__all__ = ["rotate_half", "rerotate"]


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """The RoPE pairing used by Llama, Qwen2 and Gemma3: (x1, x2) -> (-x2, x1) on the two halves."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rerotate(keys: torch.Tensor, delta: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """Move RoPE-rotated keys by ``delta`` positions.

    keys: ``(batch, kv_heads, n, dim)``; delta: ``(batch, n)`` integer shift; inv_freq: ``(dim/2,)``.
    RoPE is a rotation per frequency pair, so R(p + delta) k = R(delta) R(p) k: one more rotation by the
    shift is enough, whatever scaling the model applied when it first rotated the key. The angles are
    computed in float64 for the few distinct shifts only.
    """
    if keys.device.type == "cpu":
        shifts, where = torch.unique(delta, return_inverse=True)  # few distinct shifts: little trigonometry
    else:
        shifts, where = delta, None  # on a GPU, trigonometry for every entry is cheaper than a host sync
    angles = shifts.to(torch.float64)[..., None] * inv_freq.to(device=keys.device, dtype=torch.float64)
    emb = torch.cat((angles, angles), dim=-1)
    cos, sin = emb.cos().to(keys.dtype), emb.sin().to(keys.dtype)
    if where is not None:
        cos, sin = cos[where], sin[where]
    return keys * cos[:, None] + rotate_half(keys) * sin[:, None]  # (batch, 1, n, dim) broadcast over heads
