"""Public entry point of SepLLM attention: checks inputs, picks a backend.

Paper: SepLLM (https://arxiv.org/abs/2412.12094), Sec. 3.1-3.2. The specification is
:mod:`kvlab.sepllm.reference`; the backends are

* ``"torch"``: the eager reference (materialises the ``(seq, seq)`` mask; any device, fp64 too),
* ``"flex"``: FlexAttention with a block mask (the paper's kernel; compiled on CUDA),
* ``"triton"``: :mod:`kvlab.sepllm.triton`, whose work follows the kept keys (CUDA, or CPU under
  ``TRITON_INTERPRET=1`` for small tests). It runs the kernels' default variant
  (:func:`kvlab.sepllm.triton.auto_variant`): ``"tma"`` (far keys from a compacted K/V copy read
  through tensor descriptors) where Triton has tensor descriptors and the GPU is a Hopper or later,
  else ``"gather"``,
* ``"auto"``: ``"triton"`` for CUDA tensors, ``"torch"`` otherwise.

Backends are imported only when used, so ``import kvlab`` needs neither Triton nor a GPU.
"""
from __future__ import annotations

import torch

from kvlab.core import check_choice, check_float, check_int, check_tensor
from kvlab.kernels.triton_utils import check_triton_inputs

__all__ = ["sep_attention", "BACKENDS"]

BACKENDS = ("auto", "torch", "flex", "triton")


def _check(q, k, v, is_sep, init, neighbors, scale, backend):
    check_choice("backend", backend, BACKENDS)
    for name, x in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, x, 4, shape_doc="(batch, heads, seq, dim)")
    if k.shape != v.shape:
        raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must have the same shape")
    bsz, h, n, d = q.shape
    if k.shape[0] != bsz or k.shape[2] != n or k.shape[3] != d:
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} must agree in batch, seq and "
                         "dim (this is prefill/training self-attention; decode over a cache is "
                         "kvlab.kernels.decode.ragged_decode_attention)")
    if h % k.shape[1]:
        raise ValueError(f"query heads ({h}) must be a multiple of key/value heads ({k.shape[1]})")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v dtypes differ ({q.dtype}, {k.dtype}, {v.dtype}): cast them to one")
    if not q.is_floating_point():
        raise ValueError(f"q, k, v must be floating point (float16, bfloat16, float32 or float64), got {q.dtype}: "
                         "attention takes real-valued queries, keys and values; cast them, e.g. q.float()")
    if not isinstance(is_sep, torch.Tensor) or is_sep.dtype != torch.bool or tuple(is_sep.shape) != (bsz, n):
        raise ValueError(f"is_sep must be a bool tensor of shape (batch, seq) = ({bsz}, {n}); got "
                         f"{getattr(is_sep, 'dtype', type(is_sep).__name__)} {tuple(getattr(is_sep, 'shape', ()))}"
                         " (kvlab.sepllm.is_separator(token_ids, separator_ids) makes one)")
    if not (q.device == k.device == v.device == is_sep.device):
        raise ValueError("q, k, v and is_sep must be on the same device")
    check_int("init", init, 0)
    check_int("neighbors", neighbors, 1)  # the window counts the query itself
    if scale is not None:
        check_float("scale", scale, 0.0, low_open=True)


def _resolve(backend: str, q: torch.Tensor) -> str:
    if backend == "auto":
        return "triton" if q.is_cuda else "torch"
    return backend


def sep_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    is_sep: torch.Tensor,
    init: int = 4,
    neighbors: int = 256,
    *,
    scale: float | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """SepLLM attention: each query sees the first ``init`` tokens, every earlier separator, and
    its ``neighbors`` nearest tokens (itself included), causally.

    Args:
        q: ``(batch, heads, seq, dim)``.
        k, v: ``(batch, kv_heads, seq, dim)``, ``heads % kv_heads == 0`` (GQA).
        is_sep: ``(batch, seq)`` bool, one separator pattern per sequence.
        init: initial tokens (attention sinks), ``a`` in the paper.
        neighbors: local window ``n``; key ``k`` is a neighbour of query ``q`` when ``q - k < n``.
        scale: softmax scale, default ``dim ** -0.5``.
        backend: ``"auto" | "torch" | "flex" | "triton"`` (module docstring).

    Returns:
        ``(batch, heads, seq, dim)`` in ``q.dtype`` (under ``torch.autocast``: q, k, v are first cast
        to the autocast dtype, as SDPA does); differentiable in ``q, k, v`` for every backend.
    """
    if torch.is_autocast_enabled(q.device.type):
        # like SDPA under autocast: one low-precision dtype (HF's RoPE leaves q, k in fp32 there)
        dt = torch.get_autocast_dtype(q.device.type)
        q, k, v = q.to(dt), k.to(dt), v.to(dt)
    _check(q, k, v, is_sep, init, neighbors, scale, backend)
    backend = _resolve(backend, q)
    if backend == "torch":
        from .reference import sep_attention_reference

        return sep_attention_reference(q, k, v, is_sep, init, neighbors, scale)
    if backend == "flex":
        if q.dtype == torch.float64 and q.is_cuda:
            raise ValueError("backend='flex' on CUDA takes bf16/fp16/fp32; use backend='torch' for fp64")
        from .flex import sep_attention_flex

        return sep_attention_flex(q, k, v, is_sep, init, neighbors, scale)
    # backend == "triton"
    check_triton_inputs(q, q.shape[-1], fallback="backend='flex' or 'torch'")
    from .triton import sep_attention_triton

    return sep_attention_triton(q, k, v, is_sep, init, neighbors, scale)
