"""Prefill attention patterns: replace attention in chosen layers during a forward pass or training.

A pattern receives the layer's queries, keys and values (RoPE already applied, GQA not expanded) and an
:class:`AttentionCall` with positions and token ids, and returns the attention output. SepLLM's mask,
DHSA's chunk-sparse attention and the Triton kernels plug in this way::

    with use_pattern(model, MaskPattern(lambda call: call.k_positions[:, None, None, :] < 4)):
        logits = model(input_ids).logits
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, Iterable

import torch

from kvlab.core.state import in_layers

__all__ = ["AttentionCall", "AttentionPattern", "MaskPattern", "attend", "causal_mask", "kv_ratio", "use_pattern"]


def causal_mask(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int | None = None) -> torch.Tensor:
    """``(batch, 1, q, n)`` bool: key visible to query by original position (and within ``window``)."""
    diff = q_pos[:, None, :, None] - k_pos[:, None, None, :]
    mask = diff >= 0
    if window is not None:
        mask = mask & (diff < window)
    return mask


def attend(query, key, value, mask, scaling, want_probs=False):
    """Softmax attention with GQA; returns ``(out, probs)`` (``probs`` None unless ``want_probs``).

    query ``(batch, heads, q, dim)``, key/value ``(batch, kv_heads, n, dim)``, mask bool
    ``(batch, 1|heads, q, n)`` or None (all visible). ``want_probs`` computes eagerly (full softmax).
    """
    groups = query.shape[1] // key.shape[1]
    if want_probs:
        k = key.repeat_interleave(groups, dim=1)
        v = value.repeat_interleave(groups, dim=1)
        scores = torch.matmul(query, k.transpose(-1, -2)).float() * scaling
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        return torch.matmul(probs.to(v.dtype), v), probs
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, scale=scaling, enable_gqa=groups > 1
    )
    return out, None


@dataclass
class AttentionCall:
    """Everything a prefill attention pattern may need besides the tensors.

    Shapes: positions and token ids are ``(batch, q)`` for queries and ``(batch, n)`` for keys; query ``q``
    is the newest part of the keys (``k_positions[:, -q:] == q_positions`` when no cache drops entries).
    """

    layer_idx: int
    num_layers: int
    q_positions: torch.Tensor
    k_positions: torch.Tensor
    q_token_ids: torch.Tensor
    k_token_ids: torch.Tensor
    scaling: float
    sliding_window: int | None
    num_key_value_groups: int
    fresh: bool = False  # keys are exactly positions 0..n-1 of this forward (a prefill from scratch)

    def causal_mask(self) -> torch.Tensor:
        """``(batch, 1, q, n)`` bool: key visible to query (causal by original position, sliding window)."""
        return causal_mask(self.q_positions, self.k_positions, self.sliding_window)


class AttentionPattern:
    """Replaces attention in chosen layers. Subclass and implement ``__call__``.

    ``__call__(query, key, value, call) -> output``: query ``(batch, heads, q, dim)``, key/value
    ``(batch, kv_heads, n, dim)`` (already RoPE-rotated, GQA not expanded), output ``(batch, heads, q, dim)``.
    Differentiable patterns can be used for training.
    """

    def __call__(self, query, key, value, call: AttentionCall) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError


class MaskPattern(AttentionPattern):
    """A pattern given as a boolean mask: ``mask_fn(call) -> (batch, 1 | heads, q, n)`` bool, True = visible.

    The mask is intersected with the causal (and sliding-window) mask, then attention runs through SDPA.
    """

    def __init__(self, mask_fn: Callable[[AttentionCall], torch.Tensor], name: str | None = None):
        self.mask_fn = mask_fn
        self.name = name or getattr(mask_fn, "__name__", "mask")

    def __call__(self, query, key, value, call: AttentionCall) -> torch.Tensor:
        mask = self.mask_fn(call) & call.causal_mask()
        out, _ = attend(query, key, value, mask, call.scaling)
        return out

    def __repr__(self) -> str:
        return f"MaskPattern({self.name})"


def use_pattern(model: torch.nn.Module, pattern: AttentionPattern | None,
                layers: Iterable[int] | None = None) -> contextlib.AbstractContextManager:
    """Within the block, ``pattern`` computes attention in ``layers`` (default: all layers).

    ``pattern=None`` is allowed and changes nothing (handy in code that may or may not use one).
    """
    return in_layers(model, "patterns", pattern, layers, "pattern must be an AttentionPattern")


def kv_ratio(pattern: AttentionPattern | None, token_ids: torch.Tensor) -> float:
    """Kept share of the causal attention entries of ``token_ids`` under ``pattern`` (None: 1.0).

    Patterns that can count what they keep define ``kept_fraction(token_ids) -> float``.

    Summed over queries this is (mean runtime KV) / (vanilla's mean runtime KV): the paper's r.KV (%) / 100.
    """
    if pattern is None:
        return 1.0
    if not hasattr(pattern, "kept_fraction"):
        raise TypeError(f"{pattern!r} cannot count its kept entries")
    return pattern.kept_fraction(token_ids)
