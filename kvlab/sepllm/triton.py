"""SepLLM attention in Triton: forward and backward whose work follows the kept keys.

Paper: SepLLM (Chen et al., ICML 2025, https://arxiv.org/abs/2412.12094), Sec. 3.1-3.2 (Eq. 1-2)
and App. C (training acceleration). Specification: :mod:`kvlab.sepllm.reference`. Query ``q``
sees key ``k`` when::

    k <= q  and  (k < init  or  q - k < neighbors  or  is_sep[k])

Why not a block mask
--------------------
The paper's kernel is FlexAttention with a block mask. Separators are scattered (about one token
in ten in real text), so nearly every 128 x 128 tile of the causal triangle holds one: the block
mask is as dense as causal and the kernel does causal's work while only ~10% of the entries count.

What this kernel does instead
-----------------------------
Split the keys of one query tile ``[q0, q0 + BLOCK_M)`` into two disjoint sets:

1. **The window region** ``[lo, q0 + BLOCK_M)`` with ``lo = floor(max(q0 - n + 1, 0) / BLOCK_N) *
   BLOCK_N``: every key any query of the tile could see as a neighbour. Dense tiles, element mask
   ``k <= q and (q - k < n or kept[k])``. About ``(BLOCK_M + n) / BLOCK_N + 1`` tiles.
2. **The far keys** ``k < lo``: there ``q - k >= n`` for every query of the tile, so a far key is
   visible exactly when it is kept (initial or separator), for *all* queries of the tile. Before
   the kernel we compact the kept positions of each sequence into a sorted list ``idx`` and count
   them, ``cnt[p] = #kept keys at positions < p``; the far keys of the tile are then
   ``idx[0 : cnt[lo]]``, which the kernel gathers ``BLOCK_N`` rows at a time. No mask but the list
   tail, and no wasted products.

Two variants read the far keys differently (``default_config(variant=...)``, ``auto_variant``):

* ``"gather"`` (the first release): ``BLOCK_F`` rows at a time gathered from ``K, V`` through ``idx``;
* ``"tma"`` (issue 28, the default on Hopper for bf16/fp16): the kept rows are copied once per call into a
  compacted ``kc, vc`` (:func:`compact_kv`), so a tile's far keys are the contiguous rows ``[0, cnt[lo])``, read
  through tensor descriptors (TMA), full tiles with no mask; its backward splits the dK/dV pairs per element
  (far: a kept key with ``q - k >= n``) so the far and window kernels are tiled independently, and stores dK, dV
  once. On an H200 at 32k it runs the forward 7-10 % faster than ``"gather"`` and forward + backward 13-15 %
  (benchmarks/results/kernels/README.md, "Issue 28", with the measured bound: the window loop).

Both sets go through the same online softmax (FlashAttention's running max ``m``, running sum
``l``, rescaled accumulator), computed in base 2: scores are multiplied by ``scale * log2(e)``
so that ``exp2`` replaces ``exp``; the saved log-sum-exp ``lse`` is in the same base-2 units.

Backward (FlashAttention-2 style, recomputing ``P`` from ``lse``; ``delta = rowsum(dO * O)``):

* ``dQ``: one program per query tile walks the same two key sets as the forward pass.
* ``dK, dV`` of the window: one program per key tile walks the query tiles whose window region
  contains it (about ``(BLOCK_N + n) / BLOCK_M + 1`` of them), for every query head of its
  key/value head (GQA), and stores fp32 results.
* ``dK, dV`` of the far keys: one program per chunk of ``BLOCK_F`` compacted kept keys walks every
  later query tile that sees the chunk as far keys (split over ``n_splits`` programs along the
  queries), and adds into the fp32 results with atomics (gather, compute, scatter-add).

Files and numbers: tests in ``tests/test_sep_attention.py`` (CPU with ``TRITON_INTERPRET=1``, GPU
for large shapes), timings in ``benchmarks/`` and ``notebooks/13_kernels_sep_attention.ipynb``.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kvlab.kernels.triton_utils import dot as _dot
from kvlab.kernels.triton_utils import gathered_tile as _gathered_tile
from kvlab.kernels.triton_utils import interpreting as _interpreting
from kvlab.kernels.triton_utils import online_softmax_step as _online_softmax_step

__all__ = ["VARIANTS", "auto_variant", "compact_kept_keys", "compact_kept_keys_torch", "compact_kv", "default_config",
           "sep_attention_triton", "tma_supported"]


# ---------------------------------------------------------------------------------------------
# Step 0 (PyTorch, once per batch): kept flags, the compacted list of kept keys, prefix counts
# ---------------------------------------------------------------------------------------------
@triton.jit
def _compact_kernel(SEP, KEPT, IDX, CNT, N, INIT, BLOCK: tl.constexpr):
    # One program per sequence walks it in blocks: kept flags, running count, and each kept
    # position written to its slot in the compact list (a stream compaction by prefix sum).
    b = tl.program_id(0)
    carry = 0
    tl.store(CNT + b * (N + 1), carry)
    for start in range(0, N, BLOCK):
        pos = start + tl.arange(0, BLOCK)
        ok = pos < N
        sep = tl.load(SEP + b * N + pos, mask=ok, other=0)
        kept = ((sep != 0) | (pos < INIT)) & ok
        k32 = kept.to(tl.int32)
        incl = tl.cumsum(k32, axis=0) + carry  # kept positions <= pos
        tl.store(CNT + b * (N + 1) + pos + 1, incl, mask=ok)
        tl.store(KEPT + b * N + pos, k32.to(tl.int8), mask=ok)
        tl.store(IDX + b * N + incl - 1, pos, mask=kept)
        carry += tl.sum(k32, axis=0)


def compact_kept_keys(is_sep: torch.Tensor, init: int):
    """Kept-key bookkeeping shared by all kernels (one small Triton launch, no host sync).

    Args:
        is_sep: ``(batch, seq)`` bool.
        init: number of initial tokens (always kept).

    Returns:
        ``kept`` ``(batch, seq)`` int8 (1 for initial or separator), ``idx`` ``(batch, seq)``
        int32 with the kept positions first, ascending (the rest is unspecified), and ``cnt``
        ``(batch, seq + 1)`` int32 with ``cnt[:, p]`` = number of kept positions ``< p``.
    """
    b, n = is_sep.shape
    sep = is_sep.contiguous().view(torch.uint8)
    kept = torch.empty(b, n, dtype=torch.int8, device=is_sep.device)
    idx = torch.empty(b, n, dtype=torch.int32, device=is_sep.device)
    cnt = torch.empty(b, n + 1, dtype=torch.int32, device=is_sep.device)
    # One program per sequence; 4096-wide blocks (8 serial steps at 32k) measured 0.045 ms against
    # 0.060 ms for 1024 on an H200 (benchmarks/results/kernels/profile_h200_run7a.log).
    interp = _interpreting()
    _compact_kernel[(b,)](sep, kept, idx, cnt, n, init, BLOCK=256 if interp else 4096, num_warps=4 if interp else 8)
    return kept, idx, cnt


def compact_kept_keys_torch(is_sep: torch.Tensor, init: int):
    """The same bookkeeping in plain PyTorch (the specification of :func:`compact_kept_keys`)."""
    b, n = is_sep.shape
    kept = is_sep.bool().clone()
    kept[:, :init] = True
    csum = torch.cumsum(kept, dim=1, dtype=torch.int32)
    cnt = torch.zeros(b, n + 1, dtype=torch.int32, device=is_sep.device)
    cnt[:, 1:] = csum
    # Scatter position p to slot csum[p]-1 when kept; everything else lands in a spare column n.
    slot = torch.where(kept, csum - 1, n).long()
    pos = torch.arange(n, dtype=torch.int32, device=is_sep.device).expand(b, n).contiguous()
    idx = torch.zeros(b, n + 1, dtype=torch.int32, device=is_sep.device)
    idx.scatter_(1, slot, pos)
    return kept.to(torch.int8).contiguous(), idx[:, :n].contiguous(), cnt


# ---------------------------------------------------------------------------------------------
# Small helpers used by every kernel
# ---------------------------------------------------------------------------------------------
@triton.jit
def _window_start(q0, NEIGH, BLOCK_N: tl.constexpr):
    # First key of the window region of the query tile starting at q0, aligned down to BLOCK_N.
    lo = tl.maximum(q0 - NEIGH + 1, 0)
    return (lo // BLOCK_N) * BLOCK_N


# ---------------------------------------------------------------------------------------------
# Forward: one program per (query tile, batch x head)
# ---------------------------------------------------------------------------------------------
@triton.jit
def _query_tile_setup(K, V, KEPT, IDX, CNT, stride_kb, stride_kh, stride_vb, stride_vh, N, NEIGH, H: tl.constexpr,
                      GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # Which query tile this program owns (late tiles have the most far keys, so they start first), its
    # batch row and head, the base pointers of the key/value head it reads (GQA) and of the row's kept
    # flags and compacted kept positions, where its window region starts (lo) and how many kept keys lie
    # before it (n_far: the far keys, stage 1).
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    hk = h // GROUP
    q0 = pid_m * BLOCK_M
    offs_m = q0 + tl.arange(0, BLOCK_M)
    Kbh = K + b * stride_kb + hk * stride_kh
    Vbh = V + b * stride_vb + hk * stride_vh
    lo = _window_start(q0, NEIGH, BLOCK_N)
    n_far = tl.load(CNT + b * (N + 1) + lo)
    return pid_bh, b, h, q0, offs_m, Kbh, Vbh, KEPT + b * N, IDX + b * N, lo, n_far


@triton.jit
def _backward_rows(Q, DO, LSE, DELTA, b, h, bh, q0, offs_d, stride_qb, stride_qh, stride_qn, N,
                   BLOCK_M: tl.constexpr):
    # A query tile as every backward kernel needs it: its rows, the query and output-gradient tiles (dO, dQ
    # share q's layout: the wrapper makes them so), the base-2 log-sum-exp (+inf on padding rows, so P = 0
    # there) and delta = rowsum(dO * O).
    offs_m = q0 + tl.arange(0, BLOCK_M)
    row_ok = offs_m < N
    q_ptrs = b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qn + offs_d[None, :]
    q = tl.load(Q + q_ptrs, mask=row_ok[:, None], other=0.0)
    do = tl.load(DO + q_ptrs, mask=row_ok[:, None], other=0.0)
    lse = tl.load(LSE + bh * N + offs_m, mask=row_ok, other=float("inf"))
    delta = tl.load(DELTA + bh * N + offs_m, mask=row_ok, other=0.0)
    return offs_m, row_ok, q_ptrs, q, do, lse, delta


@triton.jit
def _window_tile(q, Kbh, Vbh, KEPTb, start, N, NEIGH, offs_m, stride_kn, stride_vn, offs_d, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, FP32_DOT: tl.constexpr):
    # Keys and values of window tile `start`, the element mask (causal, and a neighbour or kept key) and
    # the raw scores q k^T of the query tile against it.
    kpos = start + tl.arange(0, BLOCK_N)
    in_seq = kpos < N
    k = tl.load(Kbh + kpos[:, None] * stride_kn + offs_d[None, :], mask=in_seq[:, None], other=0.0)
    v = tl.load(Vbh + kpos[:, None] * stride_vn + offs_d[None, :], mask=in_seq[:, None], other=0.0)
    kept = tl.load(KEPTb + kpos, mask=in_seq, other=0)
    dist = offs_m[:, None] - kpos[None, :]
    visible = (dist >= 0) & ((dist < NEIGH) | (kept[None, :] != 0))
    s = _dot(q, tl.trans(k), tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), FP32_DOT)
    return k, v, s, visible


@triton.jit
def _sep_fwd_kernel(
    Q, K, V, O, LSE, KEPT, IDX, CNT,
    stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
    stride_ob, stride_oh, stride_on,
    N, NEIGH, qk_scale, H: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_F: tl.constexpr, FP32_DOT: tl.constexpr,
):
    # BLOCK_N: window tiles (masked, small to waste little); BLOCK_F: far tiles (unmasked, larger)
    pid_bh, b, h, q0, offs_m, Kbh, Vbh, KEPTb, IDXb, lo, n_far = _query_tile_setup(
        K, V, KEPT, IDX, CNT, stride_kb, stride_kh, stride_vb, stride_vh, N, NEIGH, H, GROUP, BLOCK_M, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)

    # -- load the query tile once
    q = tl.load(Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qn + offs_d[None, :],
                mask=offs_m[:, None] < N, other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)

    # -- stage 1: far keys = kept keys before the window region, gathered from the compact list
    for start in range(0, n_far, BLOCK_F):
        k, v, s, live, _, _ = _gathered_tile(q, IDXb, Kbh, Vbh, start, n_far, stride_kn, stride_vn, offs_d, BLOCK_M,
                                             BLOCK_F, FP32_DOT)
        s = tl.where(live[None, :], s * qk_scale, float("-inf"))
        m_i, l_i, acc = _online_softmax_step(s, v, m_i, l_i, acc, FP32_DOT)

    # -- stage 2: the window region, dense tiles with the element mask. One loop of small tiles is
    #    the fastest form measured (H200, triton 3.6): splitting it into unmasked inner tiles and
    #    masked edge tiles, wider tiles, or a cheaper mask expression all ran slower, as each extra
    #    loop or live tensor costs pipeline fill or register spills at the 255-register limit
    #    (benchmarks/README.md, "Issue 5").
    hi = tl.minimum(q0 + BLOCK_M, N)
    for start in range(lo, hi, BLOCK_N):
        k, v, s, visible = _window_tile(q, Kbh, Vbh, KEPTb, start, N, NEIGH, offs_m, stride_kn, stride_vn, offs_d,
                                        BLOCK_M, BLOCK_N, FP32_DOT)
        s = tl.where(visible, s * qk_scale, float("-inf"))
        m_i, l_i, acc = _online_softmax_step(s, v, m_i, l_i, acc, FP32_DOT)

    # -- epilogue: normalise, store the output and the base-2 log-sum-exp for the backward pass
    acc = acc / l_i[:, None]
    row_ok = offs_m < N
    tl.store(LSE + pid_bh * N + offs_m, m_i + tl.log2(l_i), mask=row_ok)
    tl.store(O + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_on + offs_d[None, :],
             acc.to(O.dtype.element_ty), mask=row_ok[:, None])


# ---------------------------------------------------------------------------------------------
# Backward 1/3: dQ, one program per (query tile, batch x head); same walk as the forward pass
# ---------------------------------------------------------------------------------------------
@triton.jit
def _sep_bwd_dq_kernel(
    Q, K, V, DO, DQ, LSE, DELTA, KEPT, IDX, CNT,
    stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
    N, NEIGH, qk_scale, sm_scale, H: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_F: tl.constexpr, FP32_DOT: tl.constexpr,
):
    pid_bh, b, h, q0, offs_m, Kbh, Vbh, KEPTb, IDXb, lo, n_far = _query_tile_setup(
        K, V, KEPT, IDX, CNT, stride_kb, stride_kh, stride_vb, stride_vh, N, NEIGH, H, GROUP, BLOCK_M, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    # -- load the query tile, its output gradient, lse and delta
    offs_m, row_ok, q_ptrs, q, do, lse, delta = _backward_rows(
        Q, DO, LSE, DELTA, b, h, pid_bh, q0, offs_d, stride_qb, stride_qh, stride_qn, N, BLOCK_M)
    dq = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)

    # -- stage 1: far keys
    for start in range(0, n_far, BLOCK_F):
        k, v, s, live, _, _ = _gathered_tile(q, IDXb, Kbh, Vbh, start, n_far, stride_kn, stride_vn, offs_d, BLOCK_M,
                                             BLOCK_F, FP32_DOT)
        p = tl.where(live[None, :], tl.exp2(s * qk_scale - lse[:, None]), 0.0)
        dp = _dot(do, tl.trans(v), tl.zeros([BLOCK_M, BLOCK_F], dtype=tl.float32), FP32_DOT)
        ds = p * (dp - delta[:, None])
        dq = _dot(ds.to(k.dtype), k, dq, FP32_DOT)

    # -- stage 2: window region
    hi = tl.minimum(q0 + BLOCK_M, N)
    for start in range(lo, hi, BLOCK_N):
        k, v, s, visible = _window_tile(q, Kbh, Vbh, KEPTb, start, N, NEIGH, offs_m, stride_kn, stride_vn, offs_d,
                                        BLOCK_M, BLOCK_N, FP32_DOT)
        p = tl.where(visible, tl.exp2(s * qk_scale - lse[:, None]), 0.0)
        dp = _dot(do, tl.trans(v), tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), FP32_DOT)
        ds = p * (dp - delta[:, None])
        dq = _dot(ds.to(k.dtype), k, dq, FP32_DOT)

    # -- epilogue: d(scores)/dq = sm_scale * k (the log2(e) factor lives only inside exp2)
    tl.store(DQ + q_ptrs, (dq * sm_scale).to(DQ.dtype.element_ty), mask=row_ok[:, None])


# ---------------------------------------------------------------------------------------------
# Backward 2/3: dK, dV of the window region, one program per (key tile, batch x kv head)
# ---------------------------------------------------------------------------------------------
@triton.jit
def _sep_bwd_dkdv_window_kernel(
    Q, K, V, DO, DK, DV, LSE, DELTA, KEPT,
    stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
    N, NEIGH, qk_scale, sm_scale, H: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_F: tl.constexpr, FP32_DOT: tl.constexpr,
):
    # BLOCK_F (far chunk size) is the far kernel's; it is accepted here so both share one config.
    pid_n = tl.program_id(0)
    pid_bk = tl.program_id(1)
    HK: tl.constexpr = H // GROUP
    b = pid_bk // HK
    hk = pid_bk % HK
    k0 = pid_n * BLOCK_N
    kpos = k0 + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    in_seq = kpos < N

    # -- load the key/value tile and its kept flags once
    k = tl.load(K + b * stride_kb + hk * stride_kh + kpos[:, None] * stride_kn + offs_d[None, :],
                mask=in_seq[:, None], other=0.0)
    v = tl.load(V + b * stride_vb + hk * stride_vh + kpos[:, None] * stride_vn + offs_d[None, :],
                mask=in_seq[:, None], other=0.0)
    kept = tl.load(KEPT + b * N + kpos, mask=in_seq, other=0)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)

    # -- query tiles whose window region [lo(q0), q0 + BLOCK_M) holds this key tile:
    #    q0 + BLOCK_M > k0  and  lo(q0) <= k0  <=>  q0 < k0 + BLOCK_N + NEIGH - 1
    q_first = (k0 // BLOCK_M) * BLOCK_M
    q_end = tl.minimum(k0 + BLOCK_N + NEIGH - 1, N)
    for g in range(GROUP):
        h = hk * GROUP + g
        bh = b * H + h
        for q0 in range(q_first, q_end, BLOCK_M):
            offs_m, row_ok, q_ptrs, q, do, lse, delta = _backward_rows(
                Q, DO, LSE, DELTA, b, h, bh, q0, offs_d, stride_qb, stride_qh, stride_qn, N, BLOCK_M)
            # transposed tile: rows are keys, columns are queries
            sT = _dot(k, tl.trans(q), tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32), FP32_DOT)
            dist = offs_m[None, :] - kpos[:, None]
            visible = (dist >= 0) & ((dist < NEIGH) | (kept[:, None] != 0))
            pT = tl.where(visible, tl.exp2(sT * qk_scale - lse[None, :]), 0.0)
            dv = _dot(pT.to(do.dtype), do, dv, FP32_DOT)
            dpT = _dot(v, tl.trans(do), tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32), FP32_DOT)
            dsT = pT * (dpT - delta[None, :])
            dk = _dot(dsT.to(q.dtype), q, dk, FP32_DOT)

    # -- epilogue: plain fp32 stores (every key row gets written); far keys are added later
    out = b * (HK * N * HEAD_DIM) + hk * (N * HEAD_DIM) + kpos[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(DK + out, dk * sm_scale, mask=in_seq[:, None])
    tl.store(DV + out, dv, mask=in_seq[:, None])


# ---------------------------------------------------------------------------------------------
# Backward 3/3: dK, dV of the far keys, one program per (chunk of compacted kept keys, query
# split, batch x kv head); scatter-add with atomics into the fp32 results of step 2/3
# ---------------------------------------------------------------------------------------------
@triton.jit
def _sep_bwd_dkdv_far_kernel(
    Q, K, V, DO, DK, DV, LSE, DELTA, IDX, CNT,
    stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
    N, NEIGH, qk_scale, sm_scale, H: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_F: tl.constexpr, N_SPLITS: tl.constexpr, FP32_DOT: tl.constexpr,
):
    # BLOCK_M, BLOCK_N: the query tiling and window alignment of the window kernel (must match it);
    # BLOCK_F: kept keys per chunk.
    pid_c = tl.program_id(0)
    split = tl.program_id(1)
    pid_bk = tl.program_id(2)
    HK: tl.constexpr = H // GROUP
    b = pid_bk // HK
    hk = pid_bk % HK
    total = tl.load(CNT + b * (N + 1) + N)
    c0 = pid_c * BLOCK_F
    if c0 < total:  # the grid is sized for the worst case (every key kept): most chunks are empty
        offs_j = c0 + tl.arange(0, BLOCK_F)
        offs_d = tl.arange(0, HEAD_DIM)
        live = offs_j < total
        kpos = tl.load(IDX + b * N + offs_j, mask=live, other=0)
        k = tl.load(K + b * stride_kb + hk * stride_kh + kpos[:, None] * stride_kn + offs_d[None, :])
        v = tl.load(V + b * stride_vb + hk * stride_vh + kpos[:, None] * stride_vn + offs_d[None, :])
        dk = tl.zeros([BLOCK_F, HEAD_DIM], dtype=tl.float32)
        dv = tl.zeros([BLOCK_F, HEAD_DIM], dtype=tl.float32)

        # -- first query tile that sees the chunk's first key as a far key: lo(q0) > p_first
        p_first = tl.load(IDX + b * N + c0)
        q_start = (p_first // BLOCK_N + 1) * BLOCK_N + NEIGH - 1
        qb_first = (q_start + BLOCK_M - 1) // BLOCK_M
        n_qb = (N + BLOCK_M - 1) // BLOCK_M
        for g in range(GROUP):
            h = hk * GROUP + g
            bh = b * H + h
            for qb in range(qb_first + split, n_qb, N_SPLITS):
                q0 = qb * BLOCK_M
                lo = _window_start(q0, NEIGH, BLOCK_N)
                offs_m, row_ok, q_ptrs, q, do, lse, delta = _backward_rows(
                    Q, DO, LSE, DELTA, b, h, bh, q0, offs_d, stride_qb, stride_qh, stride_qn, N, BLOCK_M)
                sT = _dot(k, tl.trans(q), tl.zeros([BLOCK_F, BLOCK_M], dtype=tl.float32), FP32_DOT)
                far = live & (kpos < lo)  # later keys of the chunk may still be in this tile's window
                pT = tl.where(far[:, None], tl.exp2(sT * qk_scale - lse[None, :]), 0.0)
                dv = _dot(pT.to(do.dtype), do, dv, FP32_DOT)
                dpT = _dot(v, tl.trans(do), tl.zeros([BLOCK_F, BLOCK_M], dtype=tl.float32), FP32_DOT)
                dsT = pT * (dpT - delta[None, :])
                dk = _dot(dsT.to(q.dtype), q, dk, FP32_DOT)

        out = b * (HK * N * HEAD_DIM) + hk * (N * HEAD_DIM) + kpos[:, None] * HEAD_DIM + offs_d[None, :]
        tl.atomic_add(DK + out, dk * sm_scale, mask=live[:, None], sem="relaxed")
        tl.atomic_add(DV + out, dv, mask=live[:, None], sem="relaxed")


# ---------------------------------------------------------------------------------------------
# The "tma" variant (issue 28): far keys from a compacted K/V, read with tensor descriptors
# ---------------------------------------------------------------------------------------------
# The gathered far loop above spends registers on row addresses and cannot use Hopper's bulk tensor
# copies (TMA): each row of a tile comes from a different place. Separators are shared by every query
# tile of a sequence, so we gather the kept keys once per call into a compacted copy ``kc, vc``
# (row j of head hk = K[idx[j]]): the far keys of a query tile are then the contiguous rows
# ``[0, cnt[lo])`` of that copy, read with plain block loads through tensor descriptors (TMA on
# Hopper; on CPU the interpreter emulates them). The gather moves ``2 * kept keys * dim`` elements
# per key/value head, a few tens of microseconds at 32k, against milliseconds of attention.
@triton.jit
def _compact_kv_kernel(K, V, KC, VC, IDX, CNT, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
                       N, HK: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr):
    # One program per (chunk of BLOCK compacted slots, batch row), for every kv head: rows K[idx[j]] -> KC[j].
    pid = tl.program_id(0)
    b = tl.program_id(1)
    total = tl.load(CNT + b * (N + 1) + N)
    j0 = pid * BLOCK
    if j0 < total:  # the grid is sized for the worst case (every key kept)
        slot = j0 + tl.arange(0, BLOCK)
        live = slot < total
        offs_d = tl.arange(0, HEAD_DIM)
        kpos = tl.load(IDX + b * N + slot, mask=live, other=0)
        for hk in range(HK):
            k = tl.load(K + b * stride_kb + hk * stride_kh + kpos[:, None] * stride_kn + offs_d[None, :],
                        mask=live[:, None], other=0.0)
            v = tl.load(V + b * stride_vb + hk * stride_vh + kpos[:, None] * stride_vn + offs_d[None, :],
                        mask=live[:, None], other=0.0)
            out = (b * HK + hk).to(tl.int64) * N * HEAD_DIM + slot[:, None] * HEAD_DIM + offs_d[None, :]
            tl.store(KC + out, k, mask=live[:, None])
            tl.store(VC + out, v, mask=live[:, None])


def compact_kv(k: torch.Tensor, v: torch.Tensor, idx: torch.Tensor, cnt: torch.Tensor):
    """The kept keys and values of each sequence, in order, as contiguous rows.

    Args:
        k, v: ``(batch, kv_heads, seq, dim)``.
        idx, cnt: from :func:`compact_kept_keys`.

    Returns:
        ``kc, vc`` ``(batch, kv_heads, seq, dim)``: row ``j < cnt[b, -1]`` of ``kc[b, hk]`` is
        ``k[b, hk, idx[b, j]]``; later rows are unspecified (never read: tensor descriptors are sized to
        the kept count, and zero-fill past it).
    """
    bsz, hk, n, d = k.shape
    kc = torch.empty(bsz, hk, n, d, dtype=k.dtype, device=k.device)
    vc = torch.empty_like(kc)
    block = 16 if _interpreting() else 64
    _compact_kv_kernel[(triton.cdiv(n, block), bsz)](
        k, v, kc, vc, idx, cnt, k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2),
        n, HK=hk, HEAD_DIM=d, BLOCK=block, num_warps=4)
    return kc, vc


@triton.jit
def _desc(base, rows, stride_row, BLOCK_R: tl.constexpr, HEAD_DIM: tl.constexpr):
    # A (rows, HEAD_DIM) tensor descriptor with BLOCK_R-row tiles; loads past `rows` read zeros.
    return tl.make_tensor_descriptor(base, shape=[rows, HEAD_DIM], strides=[stride_row, 1],
                                     block_shape=[BLOCK_R, HEAD_DIM])


@triton.jit
def _far_step_unmasked(q, k, v, m_i, l_i, acc, qk_scale, BLOCK_M: tl.constexpr, BLOCK_F: tl.constexpr,
                       FP32_DOT: tl.constexpr):
    # One online-softmax step over a full tile of far keys: every entry is visible, so no mask and no -inf
    # guard (scores are finite, so the new running max is too; exp2(-inf - m) = 0 on the first step).
    s = _dot(q, tl.trans(k), tl.zeros([BLOCK_M, BLOCK_F], dtype=tl.float32), FP32_DOT)
    m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
    p = tl.exp2(s * qk_scale - m_new[:, None])
    alpha = tl.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = _dot(p.to(v.dtype), v, acc * alpha[:, None], FP32_DOT)
    return m_new, l_i, acc


@triton.jit
def _window_step(q, k_desc, v_desc, KEPTb, start, N, NEIGH, offs_m, m_i, l_i, acc, qk_scale, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, FP32_DOT: tl.constexpr, MASK: tl.constexpr):
    # One masked window tile. MASK 0: the whole rule, causal and a neighbour (q - k < NEIGH) or a kept key;
    # 1: a tile of keys before the query tile (k < q0: causal holds, only the neighbour-or-kept test);
    # 2: a tile on the diagonal (k >= q0) with BLOCK_M <= NEIGH: every causal key is a neighbour, so the
    # causal test alone (no kept flags read).
    kpos = start + tl.arange(0, BLOCK_N)
    k = k_desc.load([start, 0])
    v = v_desc.load([start, 0])
    dist = offs_m[:, None] - kpos[None, :]
    if MASK == 2:
        visible = dist >= 0
    else:
        kept = tl.load(KEPTb + kpos, mask=kpos < N, other=0)
        visible = (dist < NEIGH) | (kept[None, :] != 0)
        if MASK == 0:
            visible = visible & (dist >= 0)
    s = _dot(q, tl.trans(k), tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), FP32_DOT)
    s = tl.where(visible, s * qk_scale, float("-inf"))
    return _online_softmax_step(s, v, m_i, l_i, acc, FP32_DOT)


@triton.jit
def _sep_fwd_tma_kernel(
    Q, K, V, KC, VC, O, LSE, KEPT, CNT,
    stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
    stride_ob, stride_oh, stride_on,
    N, NEIGH, qk_scale, H: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_F: tl.constexpr, FP32_DOT: tl.constexpr,
    WARP_SPEC: tl.constexpr, PARTS: tl.constexpr, WINDOW_SPLIT: tl.constexpr, WINDOW_DIAG: tl.constexpr,
    WINDOW_STAGES: tl.constexpr,
):
    # PARTS: 3 runs both stages; 1 (far keys only) or 2 (window only) time them apart (wrong results).
    # WINDOW_SPLIT, WINDOW_DIAG, WINDOW_STAGES: options of the window loop (stage 2 below); WINDOW_STAGES None
    # pipelines it like the rest of the kernel (num_stages).
    # -- which tile, which heads; descriptors of this (batch, head)'s rows
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)  # late tiles (most far keys) first
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    hk = h // GROUP
    HK: tl.constexpr = H // GROUP
    q0 = pid_m * BLOCK_M
    offs_m = q0 + tl.arange(0, BLOCK_M)
    total = tl.load(CNT + b * (N + 1) + N)
    lo = _window_start(q0, NEIGH, BLOCK_N)
    n_far = tl.load(CNT + b * (N + 1) + lo)
    kc_base = (b * HK + hk).to(tl.int64) * N * HEAD_DIM
    kc_desc = _desc(KC + kc_base, total, HEAD_DIM, BLOCK_F, HEAD_DIM)
    vc_desc = _desc(VC + kc_base, total, HEAD_DIM, BLOCK_F, HEAD_DIM)
    k_desc = _desc(K + b * stride_kb + hk * stride_kh, N, stride_kn, BLOCK_N, HEAD_DIM)
    v_desc = _desc(V + b * stride_vb + hk * stride_vh, N, stride_vn, BLOCK_N, HEAD_DIM)
    q = _desc(Q + b * stride_qb + h * stride_qh, N, stride_qn, BLOCK_M, HEAD_DIM).load([q0, 0])
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)

    # -- stage 1a: far keys, full tiles of the compacted copy (contiguous rows, no mask)
    n_full = (n_far // BLOCK_F) * BLOCK_F
    if PARTS & 1 == 0:
        n_far = 0
        n_full = 0
    for start in tl.range(0, n_full, BLOCK_F, warp_specialize=WARP_SPEC):
        k = kc_desc.load([start, 0])
        v = vc_desc.load([start, 0])
        m_i, l_i, acc = _far_step_unmasked(q, k, v, m_i, l_i, acc, qk_scale, BLOCK_M, BLOCK_F, FP32_DOT)

    # -- stage 1b: the last, partial far tile (its later rows are kept keys of the window: masked)
    if n_full < n_far:
        k = kc_desc.load([n_full, 0])
        v = vc_desc.load([n_full, 0])
        live = (n_full + tl.arange(0, BLOCK_F)) < n_far
        s = _dot(q, tl.trans(k), tl.zeros([BLOCK_M, BLOCK_F], dtype=tl.float32), FP32_DOT)
        s = tl.where(live[None, :], s * qk_scale, float("-inf"))
        m_i, l_i, acc = _online_softmax_step(s, v, m_i, l_i, acc, FP32_DOT)

    # -- stage 2: the window region [lo, hi), dense tiles with the element mask, in up to three loops:
    #    [lo, mid_lo) masked, [mid_lo, mid_hi) unmasked, [mid_hi, hi) masked. WINDOW_SPLIT: the tiles every query
    #    of the tile sees whole (k <= q0 and q0 + BLOCK_M - 1 - k < NEIGH) form the unmasked loop. WINDOW_DIAG:
    #    the first loop holds only keys before q0 and the last one only the diagonal (mid_hi = q0), each with the
    #    cheaper mask that holds there (the host turns it on only where BLOCK_M <= NEIGH). Both need BLOCK_N to
    #    divide BLOCK_M, so that q0 starts a tile (the host checks).
    hi = tl.minimum(q0 + BLOCK_M, N)
    KEPTb = KEPT + b * N
    mid_lo = hi
    mid_hi = hi
    if WINDOW_SPLIT:
        mid_lo = tl.minimum(tl.maximum((q0 + BLOCK_M - NEIGH + BLOCK_N - 1) // BLOCK_N * BLOCK_N, lo), q0)
        mid_hi = tl.maximum(q0, mid_lo)
    if WINDOW_DIAG:
        mid_lo = tl.minimum(mid_lo, q0)
        mid_hi = tl.maximum(q0, mid_lo)
    if PARTS & 2 == 0:
        hi = lo
        mid_lo = lo
        mid_hi = lo
    for start in tl.range(lo, mid_lo, BLOCK_N, num_stages=WINDOW_STAGES):
        m_i, l_i, acc = _window_step(q, k_desc, v_desc, KEPTb, start, N, NEIGH, offs_m, m_i, l_i, acc, qk_scale,
                                     BLOCK_M, BLOCK_N, FP32_DOT, 1 if WINDOW_DIAG else 0)
    for start in tl.range(mid_lo, mid_hi, BLOCK_N, num_stages=WINDOW_STAGES):
        k = k_desc.load([start, 0])
        v = v_desc.load([start, 0])
        m_i, l_i, acc = _far_step_unmasked(q, k, v, m_i, l_i, acc, qk_scale, BLOCK_M, BLOCK_N, FP32_DOT)
    for start in tl.range(mid_hi, hi, BLOCK_N, num_stages=WINDOW_STAGES):
        m_i, l_i, acc = _window_step(q, k_desc, v_desc, KEPTb, start, N, NEIGH, offs_m, m_i, l_i, acc, qk_scale,
                                     BLOCK_M, BLOCK_N, FP32_DOT, 2 if WINDOW_DIAG else 0)

    # -- epilogue: normalise, store the output and the base-2 log-sum-exp for the backward pass
    acc = acc / l_i[:, None]
    row_ok = offs_m < N
    tl.store(LSE + pid_bh * N + offs_m, m_i + tl.log2(l_i), mask=row_ok)
    tl.store(O + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_on + tl.arange(0, HEAD_DIM)[None, :],
             acc.to(O.dtype.element_ty), mask=row_ok[:, None])


@triton.jit
def _dq_step(q, k, v, do, lse, delta, dq, visible, qk_scale, MASKED: tl.constexpr, BLOCK_M: tl.constexpr,
             BLOCK_F: tl.constexpr, FP32_DOT: tl.constexpr):
    # dQ += dS K for one key tile, P recomputed from the saved log-sum-exp (no mask on full far tiles)
    s = _dot(q, tl.trans(k), tl.zeros([BLOCK_M, BLOCK_F], dtype=tl.float32), FP32_DOT)
    p = tl.exp2(s * qk_scale - lse[:, None])
    if MASKED:
        p = tl.where(visible, p, 0.0)
    dp = _dot(do, tl.trans(v), tl.zeros([BLOCK_M, BLOCK_F], dtype=tl.float32), FP32_DOT)
    ds = p * (dp - delta[:, None])
    return _dot(ds.to(k.dtype), k, dq, FP32_DOT)


@triton.jit
def _sep_bwd_dq_tma_kernel(
    Q, K, V, KC, VC, DO, DQ, LSE, DELTA, KEPT, CNT,
    stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
    N, NEIGH, qk_scale, sm_scale, H: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_F: tl.constexpr, FP32_DOT: tl.constexpr,
    WARP_SPEC: tl.constexpr,
):
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    hk = h // GROUP
    HK: tl.constexpr = H // GROUP
    q0 = pid_m * BLOCK_M
    offs_d = tl.arange(0, HEAD_DIM)
    total = tl.load(CNT + b * (N + 1) + N)
    lo = _window_start(q0, NEIGH, BLOCK_N)
    n_far = tl.load(CNT + b * (N + 1) + lo)
    kc_base = (b * HK + hk).to(tl.int64) * N * HEAD_DIM
    kc_desc = _desc(KC + kc_base, total, HEAD_DIM, BLOCK_F, HEAD_DIM)
    vc_desc = _desc(VC + kc_base, total, HEAD_DIM, BLOCK_F, HEAD_DIM)
    k_desc = _desc(K + b * stride_kb + hk * stride_kh, N, stride_kn, BLOCK_N, HEAD_DIM)
    v_desc = _desc(V + b * stride_vb + hk * stride_vh, N, stride_vn, BLOCK_N, HEAD_DIM)
    # -- the query tile, its output gradient, lse and delta
    offs_m, row_ok, q_ptrs, q, do, lse, delta = _backward_rows(
        Q, DO, LSE, DELTA, b, h, pid_bh, q0, offs_d, stride_qb, stride_qh, stride_qn, N, BLOCK_M)
    dq = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)

    # -- stage 1: far keys from the compacted copy: full tiles unmasked, then the partial one
    n_full = (n_far // BLOCK_F) * BLOCK_F
    for start in tl.range(0, n_full, BLOCK_F, warp_specialize=WARP_SPEC):
        k = kc_desc.load([start, 0])
        v = vc_desc.load([start, 0])
        dq = _dq_step(q, k, v, do, lse, delta, dq, None, qk_scale, False, BLOCK_M, BLOCK_F, FP32_DOT)
    if n_full < n_far:
        k = kc_desc.load([n_full, 0])
        v = vc_desc.load([n_full, 0])
        live = (n_full + tl.arange(0, BLOCK_F)) < n_far
        dq = _dq_step(q, k, v, do, lse, delta, dq, live[None, :], qk_scale, True, BLOCK_M, BLOCK_F, FP32_DOT)

    # -- stage 2: window region
    hi = tl.minimum(q0 + BLOCK_M, N)
    for start in range(lo, hi, BLOCK_N):
        kpos = start + tl.arange(0, BLOCK_N)
        k = k_desc.load([start, 0])
        v = v_desc.load([start, 0])
        kept = tl.load(KEPT + b * N + kpos, mask=kpos < N, other=0)
        dist = offs_m[:, None] - kpos[None, :]
        visible = (dist >= 0) & ((dist < NEIGH) | (kept[None, :] != 0))
        dq = _dq_step(q, k, v, do, lse, delta, dq, visible, qk_scale, True, BLOCK_M, BLOCK_N, FP32_DOT)

    # -- epilogue: d(scores)/dq = sm_scale * k (the log2(e) factor lives only inside exp2)
    tl.store(DQ + q_ptrs, (dq * sm_scale).to(DQ.dtype.element_ty), mask=row_ok[:, None])


@triton.jit
def _row_dot_kernel(O, DO, DELTA, stride_ob, stride_oh, stride_on, N, H: tl.constexpr, HEAD_DIM: tl.constexpr,
                    BLOCK: tl.constexpr):
    # delta = rowsum(dO * O) in fp32, read once from the low-precision tensors (dO has O's layout)
    pid = tl.program_id(0)
    bh = tl.program_id(1)
    rows = pid * BLOCK + tl.arange(0, BLOCK)
    ok = rows < N
    ptrs = (bh // H) * stride_ob + (bh % H) * stride_oh + rows[:, None] * stride_on + tl.arange(0, HEAD_DIM)[None, :]
    o = tl.load(O + ptrs, mask=ok[:, None], other=0.0).to(tl.float32)
    do = tl.load(DO + ptrs, mask=ok[:, None], other=0.0).to(tl.float32)
    tl.store(DELTA + bh * N + rows, tl.sum(o * do, 1), mask=ok)


@triton.jit
def _dkdv_step(k, v, q, do, lse, delta, dk, dv, visible, qk_scale, MASKED: tl.constexpr, BLOCK_K: tl.constexpr,
               BLOCK_M: tl.constexpr, FP32_DOT: tl.constexpr):
    # dV += P^T dO and dK += dS^T Q for one query tile (transposed tiles: rows are keys)
    sT = _dot(k, tl.trans(q), tl.zeros([BLOCK_K, BLOCK_M], dtype=tl.float32), FP32_DOT)
    pT = tl.exp2(sT * qk_scale - lse[None, :])
    if MASKED:
        pT = tl.where(visible, pT, 0.0)
    dv = _dot(pT.to(do.dtype), do, dv, FP32_DOT)
    dpT = _dot(v, tl.trans(do), tl.zeros([BLOCK_K, BLOCK_M], dtype=tl.float32), FP32_DOT)
    dsT = pT * (dpT - delta[None, :])
    dk = _dot(dsT.to(q.dtype), q, dk, FP32_DOT)
    return dk, dv


@triton.jit
def _sep_bwd_dkdv_far_tma_kernel(
    Q, DO, KC, VC, DKC, DVC, LSE, DELTA, IDX, CNT, stride_qb, stride_qh, stride_qn,
    N, NEIGH, qk_scale, sm_scale, H: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_F: tl.constexpr, N_SPLITS: tl.constexpr,
    FP32_DOT: tl.constexpr,
):
    # dK, dV of the far pairs into the compacted fp32 rows DKC, DVC: one program per (chunk of BLOCK_F kept
    # keys, query split, batch x kv head). Here a pair is far when q - k >= NEIGH (the kept key is no
    # neighbour of that query), decided per element, so this kernel's tiles need not match the window
    # kernel's (which takes every pair with 0 <= q - k < NEIGH). The query tiles that hold both kinds come
    # first, masked; from the first tile with q0 >= (last key of the chunk) + NEIGH, every pair is far.
    pid_c = tl.program_id(0)
    split = tl.program_id(1)
    pid_bk = tl.program_id(2)
    HK: tl.constexpr = H // GROUP
    b = pid_bk // HK
    hk = pid_bk % HK
    total = tl.load(CNT + b * (N + 1) + N)
    c0 = pid_c * BLOCK_F
    if c0 < total:  # the grid is sized for the worst case (every key kept): most chunks are empty
        slots = c0 + tl.arange(0, BLOCK_F)
        offs_d = tl.arange(0, HEAD_DIM)
        live = slots < total
        kpos = tl.load(IDX + b * N + slots, mask=live, other=0)
        rows = pid_bk.to(tl.int64) * N * HEAD_DIM + slots[:, None] * HEAD_DIM + offs_d[None, :]
        k = tl.load(KC + rows, mask=live[:, None], other=0.0)
        v = tl.load(VC + rows, mask=live[:, None], other=0.0)
        dk = tl.zeros([BLOCK_F, HEAD_DIM], dtype=tl.float32)
        dv = tl.zeros([BLOCK_F, HEAD_DIM], dtype=tl.float32)
        p_first = tl.load(IDX + b * N + c0)
        p_last = tl.load(IDX + b * N + tl.minimum(c0 + BLOCK_F, total) - 1)
        qb_first = (p_first + NEIGH) // BLOCK_M + split
        qb_full = (p_last + NEIGH + BLOCK_M - 1) // BLOCK_M
        n_qb = (N + BLOCK_M - 1) // BLOCK_M
        qb_mid = tl.minimum(qb_full, n_qb)
        # first tile of this split's stride at or after qb_full
        qb_unmasked = qb_first + tl.maximum((qb_full - qb_first + N_SPLITS - 1) // N_SPLITS, 0) * N_SPLITS
        for g in range(GROUP):
            h = hk * GROUP + g
            bh = b * H + h
            q_desc = _desc(Q + b * stride_qb + h * stride_qh, N, stride_qn, BLOCK_M, HEAD_DIM)
            do_desc = _desc(DO + b * stride_qb + h * stride_qh, N, stride_qn, BLOCK_M, HEAD_DIM)
            for qb in range(qb_first, qb_mid, N_SPLITS):
                q0 = qb * BLOCK_M
                offs_m = q0 + tl.arange(0, BLOCK_M)
                q = q_desc.load([q0, 0])
                do = do_desc.load([q0, 0])
                lse = tl.load(LSE + bh * N + offs_m, mask=offs_m < N, other=float("inf"))
                delta = tl.load(DELTA + bh * N + offs_m, mask=offs_m < N, other=0.0)
                far = (offs_m[None, :] - kpos[:, None]) >= NEIGH
                dk, dv = _dkdv_step(k, v, q, do, lse, delta, dk, dv, far, qk_scale, True, BLOCK_F, BLOCK_M, FP32_DOT)
            for qb in range(qb_unmasked, n_qb, N_SPLITS):
                q0 = qb * BLOCK_M
                offs_m = q0 + tl.arange(0, BLOCK_M)
                q = q_desc.load([q0, 0])
                do = do_desc.load([q0, 0])
                lse = tl.load(LSE + bh * N + offs_m, mask=offs_m < N, other=float("inf"))
                delta = tl.load(DELTA + bh * N + offs_m, mask=offs_m < N, other=0.0)
                dk, dv = _dkdv_step(k, v, q, do, lse, delta, dk, dv, None, qk_scale, False, BLOCK_F, BLOCK_M,
                                    FP32_DOT)
        # -- epilogue: one split owns its rows (plain stores); several add into a zeroed buffer
        if N_SPLITS == 1:
            tl.store(DKC + rows, dk * sm_scale, mask=live[:, None])
            tl.store(DVC + rows, dv, mask=live[:, None])
        else:
            tl.atomic_add(DKC + rows, dk * sm_scale, mask=live[:, None], sem="relaxed")
            tl.atomic_add(DVC + rows, dv, mask=live[:, None], sem="relaxed")


@triton.jit
def _sep_bwd_dkdv_window_tma_kernel(
    Q, K, V, DO, DK, DV, DKC, DVC, LSE, DELTA, KEPT, CNT,
    stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
    N, NEIGH, qk_scale, sm_scale, H: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_F: tl.constexpr, FP32_DOT: tl.constexpr,
):
    # dK, dV of one key tile: every pair with 0 <= q - k < NEIGH (neighbours, kept or not; the far kernel
    # takes the kept keys' pairs with q - k >= NEIGH), plus, for kept keys, the far part the far kernel left
    # in the compacted rows DKC, DVC (slot of a kept key at p = cnt[p]); the sum is stored once, in the
    # inputs' dtype.
    pid_n = tl.program_id(0)
    pid_bk = tl.program_id(1)
    HK: tl.constexpr = H // GROUP
    b = pid_bk // HK
    hk = pid_bk % HK
    k0 = pid_n * BLOCK_N
    kpos = k0 + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    in_seq = kpos < N
    k = tl.load(K + b * stride_kb + hk * stride_kh + kpos[:, None] * stride_kn + offs_d[None, :],
                mask=in_seq[:, None], other=0.0)
    v = tl.load(V + b * stride_vb + hk * stride_vh + kpos[:, None] * stride_vn + offs_d[None, :],
                mask=in_seq[:, None], other=0.0)
    kept = tl.load(KEPT + b * N + kpos, mask=in_seq, other=0)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    q_first = (k0 // BLOCK_M) * BLOCK_M
    q_end = tl.minimum(k0 + BLOCK_N + NEIGH - 1, N)
    for g in range(GROUP):
        h = hk * GROUP + g
        bh = b * H + h
        q_desc = _desc(Q + b * stride_qb + h * stride_qh, N, stride_qn, BLOCK_M, HEAD_DIM)
        do_desc = _desc(DO + b * stride_qb + h * stride_qh, N, stride_qn, BLOCK_M, HEAD_DIM)
        for q0 in range(q_first, q_end, BLOCK_M):
            offs_m = q0 + tl.arange(0, BLOCK_M)
            q = q_desc.load([q0, 0])
            do = do_desc.load([q0, 0])
            lse = tl.load(LSE + bh * N + offs_m, mask=offs_m < N, other=float("inf"))
            delta = tl.load(DELTA + bh * N + offs_m, mask=offs_m < N, other=0.0)
            dist = offs_m[None, :] - kpos[:, None]
            visible = (dist >= 0) & (dist < NEIGH)
            dk, dv = _dkdv_step(k, v, q, do, lse, delta, dk, dv, visible, qk_scale, True, BLOCK_N, BLOCK_M, FP32_DOT)
    # -- epilogue: add the far part of kept keys, store in the inputs' dtype
    is_kept = in_seq & (kept != 0)
    slot = tl.load(CNT + b * (N + 1) + kpos, mask=in_seq, other=0)
    far_rows = pid_bk.to(tl.int64) * N * HEAD_DIM + slot[:, None] * HEAD_DIM + offs_d[None, :]
    dk = dk * sm_scale + tl.load(DKC + far_rows, mask=is_kept[:, None], other=0.0)
    dv = dv + tl.load(DVC + far_rows, mask=is_kept[:, None], other=0.0)
    out = pid_bk.to(tl.int64) * N * HEAD_DIM + kpos[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(DK + out, dk.to(DK.dtype.element_ty), mask=in_seq[:, None])
    tl.store(DV + out, dv.to(DV.dtype.element_ty), mask=in_seq[:, None])


# ---------------------------------------------------------------------------------------------
# Launch configuration
# ---------------------------------------------------------------------------------------------
VARIANTS = ("tma", "gather")


def tma_supported() -> bool:
    """Whether this Triton builds tensor descriptors inside kernels (the ``"tma"`` variant)."""
    return hasattr(tl, "make_tensor_descriptor")


def auto_variant(x: torch.Tensor) -> str:
    """The variant ``backend="triton"`` runs on ``x``: ``"tma"`` where Triton has tensor descriptors and the GPU
    has the bulk tensor copy engine (Hopper, compute capability 9.0, and later) or the interpreter emulates it,
    for the inputs it was checked on there (bf16/fp16, head dim <= 128: GPU tests and benchmarks of
    2026-11-25, benchmarks/results/kernels/README.md); ``"gather"`` otherwise (fp32 and dim 256 run the tma
    kernels correctly in the interpreter and fit in shared memory, but have not passed a GPU test yet)."""
    if not tma_supported():
        return "gather"
    if x.is_cuda and (torch.cuda.get_device_capability(x.device)[0] < 9 or x.dtype == torch.float32
                      or x.shape[-1] > 128):
        return "gather"
    return "tma"


def default_config(head_dim: int, dtype: torch.dtype, interpret: bool | None = None,
                   variant: str | None = None) -> dict:
    """Tile sizes per kernel (``kvlab bench sepllm tune`` sweeps them); one small config on CPU.

    ``variant``: ``"tma"`` (far keys from a compacted K/V copy through tensor descriptors; the default
    where Triton has them) or ``"gather"`` (far keys gathered row by row from K/V, the kernel of the
    first release). Per kernel: ``BLOCK_M`` queries per tile, ``BLOCK_N`` keys per window tile (also the
    window alignment), ``BLOCK_F`` far keys per tile, warps, pipeline stages and (``"tma"``) whether
    the far loop is warp-specialised (``warp_spec``); options of the ``"tma"`` forward's window loop, all off
    by default: whole window tiles through an unmasked loop (``window_split``), the masked tiles split at the
    diagonal so that each gets the cheaper mask that holds there (``window_diag``: keys before the query tile
    need no causal test, the diagonal's need only it where ``BLOCK_M <= neighbors``), and the window loop's own
    pipeline depth (``window_stages``, an int; unset: ``num_stages``). The forward's ``BLOCK_N`` is its window
    tile size. ``"gather"``: the two dK/dV kernels share ``"dkdv"``'s
    ``BLOCK_M``, ``BLOCK_N`` (they split the pairs by tile). ``"tma"``: the far dK/dV kernel has its own
    tiles, ``"far"`` (it splits the pairs per element).
    """
    interpret = _interpreting() if interpret is None else interpret
    variant = variant or ("tma" if tma_supported() else "gather")
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    if interpret:
        small = dict(BLOCK_M=16, BLOCK_N=16, BLOCK_F=16, num_warps=4, num_stages=1, warp_spec=False)
        cfg = {"variant": variant, "fwd": small, "dq": dict(small), "dkdv": dict(small), "far_splits_per": 4}
        return cfg | ({"far": dict(small, BLOCK_M=32)} if variant == "tma" else {})
    # Chosen on an H200 at N = 32k, 32 heads, dim 128, bf16 (benchmarks/results/kernels/tune_*.log). Larger rows
    # (dim 256, or 4-byte fp32 elements) are untuned: the query and far-key tiles shrink by the same factor
    # so that a tile's bytes in shared memory stay those of the tuned case; smaller rows keep the tuned tiles.
    grow = max(1, (head_dim * torch.finfo(dtype).bits // 8) // (128 * 2))

    def tiles(m, n, f, warps, stages, shrink_n=False):
        return dict(BLOCK_M=max(16, m // grow), BLOCK_N=max(16, n // grow) if shrink_n else n,
                    BLOCK_F=max(16, f // grow), num_warps=warps, num_stages=stages, warp_spec=False)
    if variant == "gather":
        return {"variant": variant, "fwd": tiles(128, 32, 64, 4, 2), "dq": tiles(64, 32, 64, 4, 3),
                "dkdv": tiles(32, 64, 64, 4, 3),
                # split the far dK/dV walk so that one program handles about this many query tiles
                "far_splits_per": 128}
    # "tma": from the sweep of 2026-11-25 (benchmarks/results/kernels/sepllm_tune_h200_round1_2026_11_25.log).
    # "far" tiles the far dK/dV kernel on its own (its pairs are q - k >= n, decided per element); its walk is
    # unsplit, so each chunk's program stores its rows once (no zeroed buffer, no atomics).
    # Its window tiles are multi-buffered through shared memory too, so BLOCK_N shrinks with the rows as well
    # (fp32 or dim 256 with dQ's 64-key window tiles asked 262 KB of an H200's 227 KB: tests/test_sep_attention.py
    # compiles every default for sm_90 and checks).
    # The forward's window tiles of 64 keys: 0.85x the time of tiles of 32 on random 8 % separators at 32k and
    # 0.96x on Paradise Lost's, in one H200 call beside the other window-loop options
    # (benchmarks/results/kernels/sepllm_window_options_h200/).
    return {"variant": variant, "fwd": tiles(128, 64, 64, 4, 2, True), "dq": tiles(128, 64, 64, 8, 3, True),
            "dkdv": tiles(32, 64, 64, 4, 3, True), "far": tiles(64, 64, 128, 8, 3, True), "far_splits_per": 1 << 20}


def _check_config(cfg: dict) -> None:
    if cfg.get("variant", "gather") not in VARIANTS:
        raise ValueError(f"config['variant'] = {cfg.get('variant')!r}: use one of {VARIANTS}")
    if cfg.get("variant") == "tma" and not tma_supported():
        raise ValueError(f"config['variant'] = 'tma' needs tensor descriptors (Triton >= 3.4, this is "
                         f"{triton.__version__}): use variant 'gather'")
    for key in ("fwd", "dq", "dkdv", "far"):
        if key not in cfg:
            continue
        for blk in ("BLOCK_M", "BLOCK_N", "BLOCK_F"):
            val = cfg[key][blk]
            if val < 16 or val & (val - 1):
                raise ValueError(f"config[{key!r}][{blk!r}] = {val}: use a power of two >= 16")


# ---------------------------------------------------------------------------------------------
# Host wrappers and autograd
# ---------------------------------------------------------------------------------------------
def _lastdim_contiguous(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def _tma_ready(x: torch.Tensor) -> torch.Tensor:
    # Tensor descriptors need a 16-byte aligned base and 16-byte multiples for every stride but the last.
    size = x.element_size()
    ok = x.stride(-1) == 1 and x.data_ptr() % 16 == 0 and all((st * size) % 16 == 0 for st in x.stride()[:-1])
    return x if ok else x.contiguous()


def _ensure_allocator() -> None:
    # Descriptors made inside a kernel need a little global scratch memory per program, which Triton asks
    # of the allocator set with triton.set_allocator; install one backed by torch where none is set.
    from triton.runtime import _allocation

    if isinstance(_allocation._allocator.get(), _allocation.NullAllocator):
        triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))


def _launch(kernel, grid, c, *args, **meta):
    if "WARP_SPEC" in kernel.arg_names:
        meta["WARP_SPEC"] = bool(c.get("warp_spec", False))
    if "PARTS" in kernel.arg_names:
        meta["PARTS"] = int(c.get("parts", 3))
    if "WINDOW_SPLIT" in kernel.arg_names:
        meta["WINDOW_SPLIT"] = bool(c.get("window_split", False)) and c["BLOCK_M"] % c["BLOCK_N"] == 0
    if "WINDOW_DIAG" in kernel.arg_names:  # the caller also checks BLOCK_M <= neighbors (_forward)
        meta["WINDOW_DIAG"] = bool(c.get("window_diag", False)) and c["BLOCK_M"] % c["BLOCK_N"] == 0
    if "WINDOW_STAGES" in kernel.arg_names:
        meta["WINDOW_STAGES"] = c.get("window_stages")
    kernel[grid](*args, **meta, BLOCK_M=c["BLOCK_M"], BLOCK_N=c["BLOCK_N"], BLOCK_F=c["BLOCK_F"],
                 num_warps=c["num_warps"], num_stages=c["num_stages"])


def _forward(q, k, v, kept, idx, cnt, neighbors, scale, cfg, fp32_dot):
    bsz, h, n, d = q.shape
    group = h // k.shape[1]
    o = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty(bsz, h, n, dtype=torch.float32, device=q.device)
    c = cfg["fwd"]
    strides = (q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
               v.stride(0), v.stride(1), v.stride(2), o.stride(0), o.stride(1), o.stride(2))
    meta = dict(H=h, GROUP=group, HEAD_DIM=d, FP32_DOT=fp32_dot)
    grid = (triton.cdiv(n, c["BLOCK_M"]), bsz * h)
    if cfg.get("variant", "gather") == "tma":
        if not _interpreting():
            _ensure_allocator()
        kc, vc = compact_kv(k, v, idx, cnt)
        # the diagonal's causal-only mask holds when every causal key of a diagonal tile is a neighbour
        c = dict(c, window_diag=bool(c.get("window_diag", False)) and c["BLOCK_M"] <= neighbors)
        _launch(_sep_fwd_tma_kernel, grid, c, q, k, v, kc, vc, o, lse, kept, cnt, *strides,
                n, neighbors, scale * 1.4426950408889634, **meta)
    else:
        _launch(_sep_fwd_kernel, grid, c, q, k, v, o, lse, kept, idx, cnt, *strides,
                n, neighbors, scale * 1.4426950408889634, **meta)
    return o, lse


def _backward(do, q, k, v, o, lse, kept, idx, cnt, neighbors, scale, cfg, fp32_dot,
              parts=("dq", "window", "far")):
    """Gradients of q, k, v. ``parts`` leaves kernels out, for timing them one by one."""
    if cfg.get("variant", "gather") == "tma":
        return _backward_tma(do, q, k, v, o, lse, kept, idx, cnt, neighbors, scale, cfg, fp32_dot, parts)
    bsz, h, n, d = q.shape
    hk = k.shape[1]
    group = h // hk
    # dO and dQ get q's (contiguous) layout so that the kernels share one set of strides
    do = do.contiguous()
    q = q.contiguous()
    delta = (o.float() * do.float()).sum(-1)  # (batch, heads, seq): rowsum(dO * O)
    dq = torch.empty_like(q)
    alloc = torch.empty if "window" in parts else torch.zeros  # the window kernel writes every row
    dk32 = alloc(bsz, hk, n, d, dtype=torch.float32, device=q.device)
    dv32 = alloc(bsz, hk, n, d, dtype=torch.float32, device=q.device)
    qk_scale = scale * 1.4426950408889634
    strides = (q.stride(0), q.stride(1), q.stride(2),
               k.stride(0), k.stride(1), k.stride(2),
               v.stride(0), v.stride(1), v.stride(2))
    meta = dict(H=h, GROUP=group, HEAD_DIM=d, FP32_DOT=fp32_dot)

    if "dq" in parts:
        c = cfg["dq"]
        _launch(_sep_bwd_dq_kernel, (triton.cdiv(n, c["BLOCK_M"]), bsz * h), c, q, k, v, do, dq, lse, delta, kept,
                idx, cnt, *strides, n, neighbors, qk_scale, scale, **meta)
    c = cfg["dkdv"]
    if "window" in parts:
        _launch(_sep_bwd_dkdv_window_kernel, (triton.cdiv(n, c["BLOCK_N"]), bsz * hk), c,
                q, k, v, do, dk32, dv32, lse, delta, kept, *strides, n, neighbors, qk_scale, scale, **meta)
    if "far" in parts:
        n_qb = triton.cdiv(n, c["BLOCK_M"])
        splits = max(1, min(64, triton.cdiv(n_qb, cfg["far_splits_per"])))
        _launch(_sep_bwd_dkdv_far_kernel, (triton.cdiv(n, c["BLOCK_F"]), splits, bsz * hk), c,
                q, k, v, do, dk32, dv32, lse, delta, idx, cnt, *strides, n, neighbors, qk_scale, scale,
                N_SPLITS=splits, **meta)
    return dq, dk32.to(k.dtype), dv32.to(v.dtype)


def _backward_tma(do, q, k, v, o, lse, kept, idx, cnt, neighbors, scale, cfg, fp32_dot, parts):
    # The "tma" variant's backward: delta by a small kernel; dQ as the forward walk; the far dK/dV into
    # compacted fp32 rows first, then the window kernel adds them to kept keys and stores dK, dV once, in
    # the inputs' dtype (no fp32 copy of the whole dK, dV to zero or convert).
    bsz, h, n, d = q.shape
    hk = k.shape[1]
    group = h // hk
    if not _interpreting():
        _ensure_allocator()
    do = _tma_ready(do.contiguous())
    q = _tma_ready(q.contiguous())
    o = o.contiguous()
    delta = torch.empty(bsz, h, n, dtype=torch.float32, device=q.device)
    blk = 16 if _interpreting() else 64
    _row_dot_kernel[(triton.cdiv(n, blk), bsz * h)](o, do, delta, o.stride(0), o.stride(1), o.stride(2), n, H=h,
                                                    HEAD_DIM=d, BLOCK=blk)
    kc, vc = compact_kv(k, v, idx, cnt)
    qk_scale = scale * 1.4426950408889634
    strides = (q.stride(0), q.stride(1), q.stride(2),
               k.stride(0), k.stride(1), k.stride(2),
               v.stride(0), v.stride(1), v.stride(2))
    meta = dict(H=h, GROUP=group, HEAD_DIM=d, FP32_DOT=fp32_dot)
    dq = torch.empty_like(q)
    if "dq" in parts:
        c = cfg["dq"]
        _launch(_sep_bwd_dq_tma_kernel, (triton.cdiv(n, c["BLOCK_M"]), bsz * h), c, q, k, v, kc, vc, do, dq, lse,
                delta, kept, cnt, *strides, n, neighbors, qk_scale, scale, **meta)
    c = cfg.get("far", cfg["dkdv"])
    n_qb = triton.cdiv(n, c["BLOCK_M"])
    splits = max(1, min(64, triton.cdiv(n_qb, cfg["far_splits_per"]))) if "far" in parts else 0
    alloc = torch.empty if splits == 1 else torch.zeros  # one split stores every kept row; several add
    dkc32 = alloc(bsz, hk, n, d, dtype=torch.float32, device=q.device)
    dvc32 = alloc(bsz, hk, n, d, dtype=torch.float32, device=q.device)
    if splits:
        _launch(_sep_bwd_dkdv_far_tma_kernel, (triton.cdiv(n, c["BLOCK_F"]), splits, bsz * hk), c,
                q, do, kc, vc, dkc32, dvc32, lse, delta, idx, cnt, q.stride(0), q.stride(1), q.stride(2),
                n, neighbors, qk_scale, scale, N_SPLITS=splits, **meta)
    dk = torch.empty(bsz, hk, n, d, dtype=k.dtype, device=q.device)
    dv = torch.empty(bsz, hk, n, d, dtype=v.dtype, device=q.device)
    c = cfg["dkdv"]
    if "window" in parts:
        _launch(_sep_bwd_dkdv_window_tma_kernel, (triton.cdiv(n, c["BLOCK_N"]), bsz * hk), c,
                q, k, v, do, dk, dv, dkc32, dvc32, lse, delta, kept, cnt, *strides, n, neighbors, qk_scale, scale,
                **meta)
    return dq, dk, dv


class _SepAttentionFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, is_sep, init, neighbors, scale, cfg):
        fp32_dot = q.dtype == torch.float32 or _interpreting()
        kept, idx, cnt = compact_kept_keys(is_sep, init)
        o, lse = _forward(q, k, v, kept, idx, cnt, neighbors, scale, cfg, fp32_dot)
        ctx.save_for_backward(q, k, v, o, lse, kept, idx, cnt)
        ctx.args = (neighbors, scale, cfg, fp32_dot)
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse, kept, idx, cnt = ctx.saved_tensors
        neighbors, scale, cfg, fp32_dot = ctx.args
        dq, dk, dv = _backward(do, q, k, v, o, lse, kept, idx, cnt, neighbors, scale, cfg, fp32_dot)
        return dq, dk, dv, None, None, None, None, None


def sep_attention_triton(q, k, v, is_sep, init: int, neighbors: int, scale: float | None = None,
                         config: dict | None = None) -> torch.Tensor:
    """SepLLM attention with the Triton kernels (differentiable in q, k, v).

    Shapes as in :func:`kvlab.sepllm.reference.sep_attention_reference`; inputs are assumed
    valid (``kvlab.sepllm.sep_attention`` checks them). ``config`` overrides
    :func:`default_config` (tile sizes, warps, stages) for tuning.
    """
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    cfg = default_config(q.shape[-1], q.dtype, variant=auto_variant(q)) if config is None else config
    _check_config(cfg)
    prep = _tma_ready if cfg.get("variant") == "tma" else _lastdim_contiguous
    q, k, v = (prep(x) for x in (q, k, v))
    return _SepAttentionFn.apply(q, k, v, is_sep, int(init), int(neighbors), scale, cfg)


# ---------------------------------------------------------------------------------------------
# Benchmark: python -m kvlab.sepllm.triton (GPU). The full suite is `kvlab bench`.
# ---------------------------------------------------------------------------------------------
if __name__ == "__main__":
    from kvlab.kernels.benchmarking import perf_report_against_sdpa

    def _sepllm(q, k, v):
        is_sep = torch.rand(1, q.shape[2], device=q.device) < 0.08
        return lambda: sep_attention_triton(q, k, v, is_sep, 4, 256)

    perf_report_against_sdpa("sep_attention_fwd", "SepLLM Triton", _sepllm).run(print_data=True)
