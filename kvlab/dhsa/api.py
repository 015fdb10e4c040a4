"""Public entry points of DHSA attention: check inputs, pick a backend.

Paper: DHSA (Xiong et al., arXiv:2510.24606), Sec. 2.1-2.3 and App. A. The specification is
:mod:`kvlab.dhsa.reference`; the prefill backends are

* ``"torch"``: the eager reference (materialises ``(seq, seq)``; any device, float64 too),
* ``"flex"``: FlexAttention with a block mask built from the ranked chunk lists and an exact
  ``mask_mod`` (:mod:`kvlab.dhsa.flex`; compiled on CUDA, eager and slow on CPU),
* ``"triton"``: :mod:`kvlab.dhsa.triton`, whose work follows the kept keys (CUDA, or CPU under
  ``TRITON_INTERPRET=1`` for small tests; forward only),
* ``"auto"``: ``"triton"`` for CUDA tensors, ``"torch"`` otherwise.

All backends keep the same keys: the selection (chunk similarity, ranking) is computed in float32 before any
attention, by :func:`kvlab.dhsa.reference.chunk_plan` on a CPU and by :func:`kvlab.dhsa.triton.chunk_plan_fast` and
:func:`~kvlab.dhsa.triton.launch_tables_fast` (the same plan and tables, without host synchronisations) for the
``"flex"`` and ``"triton"`` backends on a GPU. Backends are imported only when used.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Sequence

import torch

from kvlab.core import check_int

from .boundary_predictor import on_device_of
from .boundary_predictor import predict_boundaries as _reference_predict_boundaries
from .reference import (AGGREGATIONS, _masked_attention, dhsa_attention_reference, dhsa_decode_reference, dhsa_mask,
                        fixed_boundaries, max_forced)

__all__ = ["dhsa_attention", "dhsa_decode", "dhsa_selection", "Selection", "resolve_chunks", "BACKENDS"]

BACKENDS = ("auto", "torch", "flex", "triton")

# The Triton kernel variant dhsa_selection builds its launch tables for (kvlab.dhsa.triton.VARIANTS). "packed"
# runs query tiles of >= 64 rows and packs the query heads of one key/value head when the selection is shared;
# benchmarks set it to "lists" to time the earlier kernel in the same run.
TRITON_VARIANT = "packed"


def _int(name, value, minimum):
    return check_int(name, value, minimum)


def check_flag(name: str, value) -> bool:
    """``value`` if it is a bool, else TypeError (a string such as ``'no'`` is truthy and would pass silently)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {type(value).__name__} {value!r}; pass a bool")
    return value


def check_scale(scale) -> float | None:
    """``scale`` as a float, or None (the default ``dim ** -0.5``); TypeError / ValueError otherwise."""
    if scale is None:
        return None
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(f"scale must be a positive finite number (the softmax scale) or None for dim ** -0.5, "
                        f"got {type(scale).__name__} {scale!r}")
    if not math.isfinite(float(scale)) or float(scale) <= 0:
        raise ValueError(f"scale must be a positive finite number (the softmax scale), got {scale!r}: a NaN or "
                         "non-positive scale gives NaN or inverted attention; pass None for dim ** -0.5")
    return float(scale)


@dataclass
class Selection:
    """The kept set of one DHSA prefill, built once by :func:`dhsa_selection` and reusable by
    :func:`dhsa_attention` (``selection=``) in other layers of the same forward pass (the authors share one
    mask across layers). ``mask`` (``"torch"``: ``(batch, heads | 1, seq, seq)`` bool), ``plan``
    (``"flex"`` / ``"triton"``: :class:`~kvlab.dhsa.reference.ChunkPlan`), ``tables`` (``"triton"``) and
    ``block_mask`` (``"flex"``) hold what the backend consumes."""

    backend: str
    n: int
    heads: int
    mask: torch.Tensor | None = None
    batch: int | None = None  # sequences it was made for
    plan: object = None
    tables: object = None
    block_mask: object = None


def resolve_chunks(chunks, bsz: int, n: int, device=None) -> list[torch.Tensor]:
    """One offsets tensor per sequence from ``chunks``.

    ``chunks`` is an int (fixed chunks of that many tokens: the block-sparse baseline), a 1-d
    LongTensor of offsets ``[0, ..., seq]`` shared by the batch, or a list with one per sequence
    (e.g. from :func:`kvlab.dhsa.boundary_predictor.predict_boundaries` or ``oracle_boundaries``).
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
    if not q.is_floating_point():
        raise ValueError(f"q, k, v must be floating point (float16, bfloat16, float32 or float64), got {q.dtype}: "
                         "attention takes real-valued queries, keys and values; cast them, e.g. q.float()")
    if not (q.device == k.device == v.device):
        raise ValueError("q, k and v must be on the same device")


def _check_budget(budget, initial, per, keep_diagonal, local=0):
    if budget is not None:
        _int("budget", budget, 1)
    _int("initial", initial, 0)
    _int("local", local, 0)
    if budget is None:
        return
    n = int(per[0][-1])
    if budget >= n:
        return
    for i, bd in enumerate(per):
        need = max_forced(bd, initial, keep_diagonal, local)
        if need > budget:
            longest = int((bd[1:] - bd[:-1]).max())
            raise ValueError(
                f"budget={budget} must be >= the always-kept keys of every query: initial ({initial}) + local "
                f"({local}) + the longest chunk ({longest}), {need} for sequence {i}. Raise budget, lower initial "
                "or local, or use shorter chunks (kvlab.dhsa.reference.split_long_chunks)")


def _resolve_backend(backend, q, *, rowwise: bool = False):
    """``"auto"``: Triton on a GPU, torch elsewhere, and torch wherever the kept set is ranked per query row
    (``rowwise``: ``causal_query=True`` or ``keep_diagonal=False``), which only the torch path expresses."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend != "auto":
        return backend
    return "triton" if q.is_cuda and not rowwise else "torch"


def dhsa_selection(q: torch.Tensor, k: torch.Tensor, *, chunks, budget: int | None, initial: int = 0, local: int = 0,
                   keep_diagonal: bool = True, aggregation: str = "eq4", share_heads: bool = False,
                   causal_query: bool = False, backend: str = "auto") -> Selection:
    """The kept set of :func:`dhsa_attention` (same arguments) without the attention: pass it as
    ``selection=`` to attend with it, e.g. in every layer of a forward pass (masks shared across layers)."""
    _check_qkv(q, k, k)
    backend = _resolve_backend(backend, q, rowwise=causal_query is True or keep_diagonal is False)
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")
    check_flag("share_heads", share_heads)
    check_flag("keep_diagonal", keep_diagonal)
    check_flag("causal_query", causal_query)
    bsz, h, n, _ = q.shape
    fast = backend != "torch" and q.is_cuda  # the selection as GPU work: offsets checked and tabled on the host
    per = resolve_chunks(chunks, bsz, n, "cpu" if fast else q.device)
    _check_budget(budget, initial, per, keep_diagonal, local)
    kw = dict(initial=initial, aggregation=aggregation, share_heads=share_heads)
    if backend == "torch":
        return Selection("torch", n, h, mask=dhsa_mask(q, k, per, budget, keep_diagonal=keep_diagonal, local=local,
                                                       causal_query=causal_query, **kw), batch=bsz)
    if not keep_diagonal:
        raise ValueError(f"backend={backend!r} needs keep_diagonal=True (its kept set is a ranked list per "
                         "chunk plus the diagonal); use backend='torch'")
    if causal_query:
        raise ValueError(f"causal_query=True ranks keys per query row, which backend={backend!r} (one ranked list "
                         "per query chunk) cannot express; use backend='torch' (perplexity evaluation)")
    if fast:  # the same plan and tables without host synchronisations (kvlab.dhsa.triton, issue 53)
        from .triton import chunk_plan_fast as chunk_plan
        from .triton import launch_tables_fast as launch_tables
    else:
        from .reference import chunk_plan
        from .triton import launch_tables

    if backend == "flex":
        if local:
            raise ValueError("local > 0 is not supported by backend='flex' (its mask_mod has no local range); use "
                             "backend='triton' or 'torch'")
        from .flex import dhsa_block_mask

        plan = chunk_plan(q, k, per, budget, **kw)
        return Selection("flex", n, h, plan=plan, block_mask=dhsa_block_mask(plan), batch=bsz)
    plan = chunk_plan(q, k, per, budget, local=local, **kw)
    return Selection("triton", n, h, plan=plan, tables=launch_tables(plan, TRITON_VARIANT, dtype=q.dtype,
                                                                     head_dim=q.shape[-1], group=h // k.shape[1]),
                     batch=bsz)


def _dense_rows(q_tail, k, v, scale):
    """Dense causal attention of the last ``q_tail.shape[2]`` queries over all ``n`` keys."""
    t, n = q_tail.shape[2], k.shape[2]
    visible = torch.arange(n, device=k.device)[None, :] <= torch.arange(n - t, n, device=k.device)[:, None]
    return _masked_attention(q_tail, k, v, visible[None, None], scale)


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
    local: int = 0,
    dense_tail: int = 0,
    causal_query: bool = False,
    selection: Selection | None = None,
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
        local: also keep the ``local`` keys before each query's chunk, inside the budget (the authors keep
            128 "recent" keys; :func:`kvlab.dhsa.reference.local_starts`). Not with ``"flex"``.
        dense_tail: the last ``dense_tail`` queries attend to every causal key (the authors keep the
            question / instruction tokens dense at prefill); computed densely beside the sparse rows.
        causal_query: each row's chunk query from its chunk's queries up to the row (no later query
            enters the selection; :func:`kvlab.dhsa.reference.dhsa_mask`): for teacher-forced perplexity.
            ``"torch"`` only.
        selection: a :func:`dhsa_selection` of this sequence to reuse (e.g. from an earlier layer); the
            selection arguments are then taken from it.

    Returns:
        ``(batch, heads, seq, dim)`` in ``q.dtype``.
    """
    _check_qkv(q, k, v)
    backend = _resolve_backend(backend, q, rowwise=causal_query is True or keep_diagonal is False)
    scale = check_scale(scale)
    _int("dense_tail", dense_tail, 0)
    bsz, h, n, d = q.shape
    if selection is None:
        selection = dhsa_selection(q, k, chunks=chunks, budget=budget, initial=initial, local=local,
                                   keep_diagonal=keep_diagonal, aggregation=aggregation, share_heads=share_heads,
                                   causal_query=causal_query, backend=backend)
    elif not isinstance(selection, Selection) or selection.n != n or selection.heads != h:
        raise ValueError(f"selection must be a dhsa_selection(...) of a sequence of {n} tokens and {h} heads; "
                         f"got {selection!r:.120}")
    elif selection.batch != bsz:
        raise ValueError(f"selection was made for a batch of {selection.batch} sequences, q holds {bsz}: a kept set "
                         "is per sequence; build it with dhsa_selection(q, k, ...) on this batch")
    if selection.backend == "torch":
        out = _masked_attention(q, k, v, selection.mask, scale)
    elif selection.backend == "flex":
        if q.dtype == torch.float64 and q.is_cuda:
            raise ValueError("backend='flex' on CUDA takes bf16/fp16/fp32; use backend='torch' for float64")
        from .flex import dhsa_attention_flex

        out = dhsa_attention_flex(q, k, v, None, None, scale=scale, block_mask=selection.block_mask)
    else:
        from kvlab.kernels.triton_utils import check_triton_inputs

        check_triton_inputs(q, d, fallback="backend='flex' or 'torch'")
        if torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v)):
            raise ValueError("backend='triton' is forward only (no backward kernel yet); use backend='torch' or "
                             "'flex' to train, or call it under torch.no_grad()")
        from .triton import dhsa_attention_triton

        out = dhsa_attention_triton(q, k, v, None, None, scale=scale, tables=selection.tables)
    if dense_tail:
        t = min(dense_tail, n)
        out = out.clone() if out.requires_grad else out
        out[:, :, n - t:] = _dense_rows(q[:, :, n - t:], k, v, scale).to(out.dtype)
    return out


def dhsa_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    prompt_chunks: torch.Tensor,
    budget: int | None,
    initial: int = 0, keep_diagonal: bool = True, aggregation: str = "eq4",  # as in dhsa_attention
    share_heads: bool = False, scale: float | None = None, local: int = 0,
) -> torch.Tensor:
    """One DHSA decode step (App. A): the new token's query against the whole cache, sparsely.

    Args:
        q: ``(batch, heads, 1, dim)``; k, v: ``(batch, kv_heads, total, dim)``, the new token last.
        prompt_chunks: offsets ``[0, ..., prompt_len]`` of the prompt's chunks (shared by the batch);
            the tokens generated before this one form one chunk, the new token its own.
        budget, initial, keep_diagonal, aggregation, share_heads, scale, local: as :func:`dhsa_attention`
            (``local``: the ``local`` keys before the new token are always kept).

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
    if prompt_chunks.dim() != 1:
        raise ValueError(f"prompt_chunks must be one 1-d tensor of offsets [0, ..., prompt_len] shared by the batch, "
                         f"got shape {tuple(prompt_chunks.shape)}; decode one sequence at a time if their chunks "
                         "differ")
    n0 = int(prompt_chunks[-1]) if prompt_chunks.numel() else 0
    prompt_chunks = check_boundaries(prompt_chunks, n0, "prompt_chunks")
    if n0 >= total:
        raise ValueError(f"prompt_chunks end at {n0} but the cache holds {total} keys: the prompt must be shorter "
                         "than the cache (the new token is the last key)")
    if budget is not None:
        _int("budget", budget, 1)
    _int("initial", initial, 0)
    _int("local", local, 0)
    check_flag("share_heads", share_heads)
    check_flag("keep_diagonal", keep_diagonal)
    scale = check_scale(scale)
    if local and not keep_diagonal:
        raise ValueError("local > 0 needs keep_diagonal=True; set keep_diagonal=True or local=0")
    need = min(initial, total - 1) + (min(local, max(total - 1 - initial, 0)) + 1 if keep_diagonal else 0)
    if budget is not None and budget < total and budget < need:
        raise ValueError(f"budget={budget} must be >= initial ({initial}) + local ({local}) + 1 (the new token) at "
                         "decode; raise budget or lower initial / local")
    return dhsa_decode_reference(q, k, v, prompt_chunks.to(q.device), budget, initial=initial,
                                 keep_diagonal=keep_diagonal, aggregation=aggregation, share_heads=share_heads,
                                 scale=scale, local=local)


@torch.no_grad()
def predict_boundaries(predictor, k: torch.Tensor, *, max_chunks: int, threshold: float = 0.5, nms_window: int = 8,
                       max_len: int | None = None, backend: str = "auto") -> list[torch.Tensor]:
    """The learned chunking of a batch from its keys, on the chosen path (the same offsets on both).

    Args:
        predictor, k, max_chunks, threshold, nms_window, max_len: as
            :func:`kvlab.dhsa.boundary_predictor.predict_boundaries` (the specification).
        backend: ``"torch"`` (the specification), ``"triton"`` (:func:`kvlab.dhsa.chunking.predict_boundaries_fast`:
            the predictor as a few fused kernels and the NMS as one Triton kernel) or ``"auto"`` (``"triton"`` for
            CUDA keys when Triton is installed and ``nms_window`` fits its kernel, else ``"torch"``).
    """
    if backend not in ("auto", "torch", "triton"):
        raise ValueError(f"backend must be 'auto', 'torch' or 'triton', got {backend!r}")
    if backend == "auto":
        import importlib.util

        fits = nms_window <= 1024 if isinstance(nms_window, int) else False
        backend = "triton" if k.is_cuda and fits and importlib.util.find_spec("triton") is not None else "torch"
    predictor = on_device_of(predictor, k)  # a predictor loaded on the CPU runs on CUDA keys, and back
    if backend == "triton":
        from .chunking import predict_boundaries_fast  # imports Triton: only when chosen

        return predict_boundaries_fast(predictor, k, max_chunks=max_chunks, threshold=threshold,
                                       nms_window=nms_window, max_len=max_len)
    return _reference_predict_boundaries(predictor, k, max_chunks=max_chunks, threshold=threshold,
                                         nms_window=nms_window, max_len=max_len)

