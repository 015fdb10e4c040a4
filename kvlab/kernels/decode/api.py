"""Public entry point of ragged decode attention: checks inputs, picks a backend.

Backends (imported only when used):

* ``"torch"``: eager loop over the batch (:func:`kvlab.kernels.decode.reference.ragged_decode_reference`),
* ``"sdpa"``: pad to the longest cache, SDPA with a key mask (the usual approach; baseline),
* ``"triton"``: :mod:`kvlab.kernels.decode.triton`, split-KV kernel that reads only the packed entries,
* ``"auto"``: ``"triton"`` for CUDA tensors, ``"torch"`` otherwise.
"""
from __future__ import annotations

import torch

from kvlab.kernels.triton_utils import check_triton_inputs

__all__ = ["ragged_decode_attention", "BACKENDS"]

BACKENDS = ("auto", "torch", "sdpa", "triton")


def ragged_decode_attention(
    q: torch.Tensor,
    k_packed: torch.Tensor,
    v_packed: torch.Tensor,
    cu_seqlens: torch.Tensor,
    *,
    scale: float | None = None,
    max_seqlen: int | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """One decode step over a batch of packed caches of different lengths.

    Args:
        q: ``(batch, heads, dim)``, the new token's query per sequence.
        k_packed, v_packed: ``(total, kv_heads, dim)``; sequence ``b`` owns rows
            ``cu_seqlens[b]:cu_seqlens[b+1]``. ``heads % kv_heads == 0`` (GQA).
        cu_seqlens: ``(batch + 1,)`` int32/int64 offsets, ``0`` first, non-decreasing, last
            ``<= total``. Not checked on the device (that would synchronise).
        scale: softmax scale, default ``dim ** -0.5``.
        max_seqlen: longest cache; pass it to avoid a device-to-host read (Triton, SDPA).
        backend: ``"auto" | "torch" | "sdpa" | "triton"``.

    Returns:
        ``(batch, heads, dim)`` in ``q.dtype``; zeros for a sequence with no entries. Forward only.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} is not one of {BACKENDS}")
    if q.dim() != 3:
        raise ValueError(f"q must be (batch, heads, dim); got shape {tuple(q.shape)}")
    if k_packed.dim() != 3 or k_packed.shape != v_packed.shape:
        raise ValueError(f"k_packed and v_packed must both be (total, kv_heads, dim); got "
                         f"{tuple(k_packed.shape)} and {tuple(v_packed.shape)}")
    bsz, h, d = q.shape
    if k_packed.shape[2] != d:
        raise ValueError(f"head dim of q ({d}) and of the cache ({k_packed.shape[2]}) differ")
    if h % k_packed.shape[1]:
        raise ValueError(f"query heads ({h}) must be a multiple of kv heads ({k_packed.shape[1]})")
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() != bsz + 1 or cu_seqlens.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"cu_seqlens must be an int32/int64 vector of batch + 1 = {bsz + 1} offsets; "
                         f"got {cu_seqlens.dtype} {tuple(cu_seqlens.shape)}")
    if not (q.dtype == k_packed.dtype == v_packed.dtype):
        raise ValueError(f"q, k_packed, v_packed dtypes differ ({q.dtype}, {k_packed.dtype}, {v_packed.dtype})")
    if not (q.device == k_packed.device == v_packed.device == cu_seqlens.device):
        raise ValueError("q, k_packed, v_packed and cu_seqlens must be on the same device")
    if backend == "auto":
        backend = "triton" if q.is_cuda else "torch"

    if backend == "torch":
        from .reference import ragged_decode_reference

        return ragged_decode_reference(q, k_packed, v_packed, cu_seqlens, scale)
    if backend == "sdpa":
        from .reference import pad_packed, ragged_decode_padded_sdpa

        kp, vp, valid = pad_packed(k_packed, v_packed, cu_seqlens, max_seqlen)
        return ragged_decode_padded_sdpa(q, kp, vp, valid, scale)
    # backend == "triton"
    check_triton_inputs(q, d)
    from .triton import ragged_decode_triton

    return ragged_decode_triton(q, k_packed, v_packed, cu_seqlens, scale=scale, max_seqlen=max_seqlen)
