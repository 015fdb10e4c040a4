"""Public entry points of DHSA attention: check inputs, pick a backend.

Paper: DHSA (Xiong et al., arXiv:2508.02124), Sec. 2.1-2.3 and App. A. The specification is
:mod:`kvlab.dhsa.reference`; the prefill backends are

* ``"torch"``: the eager reference (materialises ``(seq, seq)``; any device, float64 too),
* ``"flex"``: FlexAttention with a block mask built from the ranked chunk lists and an exact
  ``mask_mod`` (:mod:`kvlab.dhsa.flex`; compiled on CUDA, eager and slow on CPU),
* ``"triton"``: :mod:`kvlab.dhsa.triton`, whose work follows the kept keys (CUDA, or CPU under
  ``TRITON_INTERPRET=1`` for small tests; forward only),
* ``"auto"``: ``"triton"`` for CUDA tensors, ``"torch"`` otherwise.

All backends keep the same keys: the selection (chunk similarity, ranking) is computed by the same
PyTorch code in float32 before any attention. Backends are imported only when used.
"""
from __future__ import annotations

from typing import Sequence

import torch

from kvlab.core import check_int

from .reference import (AGGREGATIONS, dhsa_attention_reference, dhsa_decode_reference, fixed_boundaries,
                        max_forced)

__all__ = ["dhsa_attention", "dhsa_decode", "resolve_chunks", "BACKENDS"]

BACKENDS = ("auto", "torch", "flex", "triton")


def _int(name, value, minimum):
    return check_int(name, value, minimum)


def resolve_chunks(chunks, bsz: int, n: int, device=None) -> list[torch.Tensor]:
    """One offsets tensor per sequence from ``chunks``.

    ``chunks`` is an int (fixed chunks of that many tokens: the block-sparse baseline), a 1-d
    LongTensor of offsets ``[0, ..., seq]`` shared by the batch, or a list with one per sequence
    (e.g. from :func:`kvlab.dhsa.reference.predict_boundaries` or ``oracle_boundaries``).
    """
    from .reference import _per_batch

    if isinstance(chunks, bool):
        raise TypeError("chunks must be an int chunk size or offsets, got a bool")
    if isinstance(chunks, int):
        _int("chunks", chunks, 1)
        return [fixed_boundaries(n, chunks, device=device)] * bsz
    if isinstance(chunks, torch.Tensor) or isinstance(chunks, (list, tuple)):
        if isinstance(chunks, (list, tuple)) and chunks and isinstance(chunks[0], int):
            chunks = torch.tensor(chunks)
        return [b.to(device) for b in _per_batch(chunks, bsz, n)]
    raise TypeError(f"chunks must be an int (fixed chunk size), an offsets tensor or a list of them, "
                    f"got {type(chunks).__name__}")


def _check_qkv(q, k, v, same_len=True):
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor) or x.dim() != 4:
            raise ValueError(f"{name} must be a 4-d tensor (batch, heads, seq, dim); got "
                             f"{getattr(x, 'shape', type(x))}")
    if k.shape != v.shape:
        raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must have the same shape")
    bsz, h, n, d = q.shape
    if k.shape[0] != bsz or k.shape[3] != d or (same_len and k.shape[2] != n):
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} must agree in batch"
                         f"{', seq' if same_len else ''} and dim")
    if h % k.shape[1]:
        raise ValueError(f"query heads ({h}) must be a multiple of key/value heads ({k.shape[1]}) (GQA)")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v dtypes differ ({q.dtype}, {k.dtype}, {v.dtype}): cast them to one")
    if not (q.device == k.device == v.device):
        raise ValueError("q, k and v must be on the same device")


def _check_budget(budget, initial, per, keep_diagonal):
    if budget is not None:
        _int("budget", budget, 1)
    _int("initial", initial, 0)
    if budget is None:
        return
    n = int(per[0][-1])
    if budget >= n:
        return
    for i, bd in enumerate(per):
        need = max_forced(bd, initial, keep_diagonal)
        if need > budget:
            longest = int((bd[1:] - bd[:-1]).max())
            raise ValueError(
                f"budget={budget} must be >= the always-kept keys of every query: initial ({initial}) + the "
                f"longest chunk ({longest}) = {need} for sequence {i}. Raise budget, lower initial, or use "
                "shorter chunks (kvlab.dhsa.reference.split_long_chunks)")


def dhsa_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    chunks: int | torch.Tensor | Sequence[torch.Tensor],
    budget: int | None,
    initial: int = 0,
    keep_diagonal: bool = True,
    aggregation: str = "eq4",
    share_heads: bool = False,
    scale: float | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """DHSA prefill attention: each query keeps its ``budget`` best keys by chunk similarity.

    Args:
        q: ``(batch, heads, seq, dim)``.
        k, v: ``(batch, kv_heads, seq, dim)``, ``heads % kv_heads == 0`` (GQA).
        chunks: an int chunk size (fixed chunks), or offsets ``[0, ..., seq]`` (one tensor, or a
            list with one per sequence) from the oracle or the predictor.
        budget: ``N_b`` keys per query, the always-kept ones included; ``None`` keeps every causal
            key (dense). Must be at least ``initial`` + the longest chunk (ValueError otherwise).
        initial: first tokens every query keeps (attention sinks).
        keep_diagonal: keep the query's own chunk up to the query (the ``"flex"`` and ``"triton"``
            backends need True).
        aggregation: chunk representation, ``"eq4"`` (DHSA) | ``"mean"`` (block-sparse) |
            ``"padded_mean"`` | ``"sum"`` (:func:`kvlab.dhsa.reference.chunk_representation`).
        share_heads: one selection for all heads (query and key heads averaged), as the authors' code.
        scale: softmax scale, default ``dim ** -0.5``.
        backend: ``"auto" | "torch" | "flex" | "triton"`` (module docstring).

    Returns:
        ``(batch, heads, seq, dim)`` in ``q.dtype``.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    _check_qkv(q, k, v)
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")
    bsz, h, n, d = q.shape
    per = resolve_chunks(chunks, bsz, n, q.device)
    _check_budget(budget, initial, per, keep_diagonal)
    if backend == "auto":
        backend = "triton" if q.is_cuda else "torch"
    kw = dict(initial=initial, aggregation=aggregation, share_heads=share_heads, scale=scale)
    if backend == "torch":
        return dhsa_attention_reference(q, k, v, per, budget, keep_diagonal=keep_diagonal, **kw)
    if not keep_diagonal:
        raise ValueError(f"backend={backend!r} needs keep_diagonal=True (its kept set is a ranked list per "
                         "chunk plus the diagonal); use backend='torch'")
    if backend == "flex":
        if q.dtype == torch.float64 and q.is_cuda:
            raise ValueError("backend='flex' on CUDA takes bf16/fp16/fp32; use backend='torch' for float64")
        from .flex import dhsa_attention_flex

        return dhsa_attention_flex(q, k, v, per, budget, **kw)
    # backend == "triton"
    from kvlab.kernels.triton_utils import check_triton_inputs

    check_triton_inputs(q, d, fallback="backend='flex' or 'torch'")
    if torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v)):
        raise ValueError("backend='triton' is forward only (no backward kernel yet); use backend='torch' or "
                         "'flex' to train, or call it under torch.no_grad()")
    from .triton import dhsa_attention_triton

    return dhsa_attention_triton(q, k, v, per, budget, **kw)


def dhsa_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    prompt_chunks: torch.Tensor,
    budget: int | None,
    initial: int = 0, keep_diagonal: bool = True, aggregation: str = "eq4",  # as in dhsa_attention
    share_heads: bool = False, scale: float | None = None,
) -> torch.Tensor:
    """One DHSA decode step (App. A): the new token's query against the whole cache, sparsely.

    Args:
        q: ``(batch, heads, 1, dim)``; k, v: ``(batch, kv_heads, total, dim)``, the new token last.
        prompt_chunks: offsets ``[0, ..., prompt_len]`` of the prompt's chunks (shared by the batch);
            the tokens generated before this one form one chunk, the new token its own.
        budget, initial, keep_diagonal, aggregation, share_heads, scale: as :func:`dhsa_attention`.

    Returns:
        ``(batch, heads, 1, dim)``.
    """
    _check_qkv(q, k, v, same_len=False)
    if q.shape[2] != 1:
        raise ValueError(f"q must hold one query (batch, heads, 1, dim) per step, got seq={q.shape[2]}")
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")
    total = k.shape[2]
    from .reference import check_boundaries

    if not isinstance(prompt_chunks, torch.Tensor):
        prompt_chunks = torch.as_tensor(prompt_chunks)
    n0 = int(prompt_chunks[-1]) if prompt_chunks.numel() else 0
    prompt_chunks = check_boundaries(prompt_chunks, n0, "prompt_chunks")
    if n0 >= total:
        raise ValueError(f"prompt_chunks end at {n0} but the cache holds {total} keys: the prompt must be shorter "
                         "than the cache (the new token is the last key)")
    if budget is not None:
        _int("budget", budget, 1)
    _int("initial", initial, 0)
    if budget is not None and budget < total and budget < min(initial, total - 1) + int(keep_diagonal):
        raise ValueError(f"budget={budget} must be >= initial ({initial}) + 1 (the new token's own chunk) at decode")
    return dhsa_decode_reference(q, k, v, prompt_chunks.to(q.device), budget, initial=initial,
                                 keep_diagonal=keep_diagonal, aggregation=aggregation, share_heads=share_heads,
                                 scale=scale)

