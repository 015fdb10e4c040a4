"""Decode attention over ragged, compacted KV caches: the PyTorch specification and baselines.

Context: KV-cache policies (SepLLM Sec. 3.3, LaCache, ...) keep a different number of entries per
sequence. Stored back to back, a batch's cache is *packed*: ``k_packed[cu_seqlens[b]:
cu_seqlens[b+1]]`` are the entries of sequence ``b``. One decode step attends one query token
per sequence to all of its kept entries (no mask: the policy already chose them)::

    for b in batch:
        K_b, V_b = k_packed[cu[b]:cu[b+1]], v_packed[cu[b]:cu[b+1]]     # (len_b, kv_heads, dim)
        out[b, h] = softmax(q[b, h] @ K_b[:, h // group].T * scale) @ V_b[:, h // group]

A sequence with no entries gets a zero output. The usual alternative pads every cache to the
longest one and runs SDPA with a key mask (:func:`ragged_decode_padded_sdpa`); the Triton kernel
(:mod:`kvlab.kernels.decode.triton`) reads only the packed bytes.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

__all__ = ["ragged_decode_reference", "pad_packed", "ragged_decode_padded_sdpa"]


def ragged_decode_reference(q, k_packed, v_packed, cu_seqlens, scale: float | None = None):
    """Eager loop over the batch, in the dtype of the inputs (pass float64 for the oracle).

    Args:
        q: ``(batch, heads, dim)``, one query token per sequence.
        k_packed, v_packed: ``(total, kv_heads, dim)``.
        cu_seqlens: ``(batch + 1,)`` integer offsets, ``cu_seqlens[0] = 0``, non-decreasing.

    Returns:
        ``(batch, heads, dim)``.
    """
    bsz, h, d = q.shape
    group = h // k_packed.shape[1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    cu = cu_seqlens.tolist()
    out = torch.zeros_like(q)
    for b in range(bsz):
        if cu[b + 1] == cu[b]:
            continue
        kb = k_packed[cu[b]:cu[b + 1]].transpose(0, 1).repeat_interleave(group, 0)  # (h, len, d)
        vb = v_packed[cu[b]:cu[b + 1]].transpose(0, 1).repeat_interleave(group, 0)
        scores = (kb @ q[b, :, :, None]).squeeze(-1) * scale  # (h, len)
        out[b] = (torch.softmax(scores, dim=-1)[:, None, :] @ vb).squeeze(1)
    return out


def pad_packed(k_packed, v_packed, cu_seqlens, max_seqlen: int | None = None):
    """Packed ``(total, kv_heads, dim)`` to padded ``(batch, kv_heads, max_len, dim)`` plus a
    ``(batch, max_len)`` bool key mask (``True`` = real entry)."""
    lens = cu_seqlens[1:] - cu_seqlens[:-1]
    bsz = lens.numel()
    max_len = int(lens.max()) if max_seqlen is None else max_seqlen
    pos = torch.arange(max_len, device=k_packed.device)
    valid = pos[None, :] < lens[:, None]
    src = (cu_seqlens[:-1, None] + pos[None, :]).clamp(max=k_packed.shape[0] - 1)
    kp = k_packed[src].permute(0, 2, 1, 3)  # (batch, kv_heads, max_len, dim)
    vp = v_packed[src].permute(0, 2, 1, 3)
    return kp, vp, valid


def ragged_decode_padded_sdpa(q, k_pad, v_pad, valid, scale: float | None = None,
                              repeat_kv: bool = False):
    """Baseline: SDPA over padded caches with a key mask. ``repeat_kv`` expands the KV heads to the
    query heads first (what models without ``enable_gqa`` do); otherwise SDPA's ``enable_gqa``."""
    h = q.shape[1]
    hk = k_pad.shape[1]
    mask = valid[:, None, None, :]  # (batch, 1, 1, max_len)
    if repeat_kv and h != hk:
        k_pad = k_pad.repeat_interleave(h // hk, 1)
        v_pad = v_pad.repeat_interleave(h // hk, 1)
    out = F.scaled_dot_product_attention(q[:, :, None, :], k_pad, v_pad, attn_mask=mask, scale=scale,
                                         enable_gqa=(h != k_pad.shape[1]))
    return out[:, :, 0, :]
