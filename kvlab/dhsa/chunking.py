"""DHSA's learned chunking, fast: the boundary predictor restructured, NMS as one Triton kernel.

Paper: Xiong et al., "Long-Context Modeling with Dynamic Hierarchical Sparse Attention for On-Device
LLMs" (arXiv:2510.24606), Sec. 2.2 (Eq. 1-3) and App. B ("Inference": threshold, sort, NMS, top
``N_c``). Specification: :func:`kvlab.dhsa.boundary_predictor.predict_boundaries` (predictor, then
:func:`~kvlab.dhsa.boundary_predictor.select_boundaries`' greedy NMS, then
:func:`~kvlab.dhsa.reference.split_long_chunks`). This module computes the same offsets with less work
and fewer kernel launches; the reference stays the readable version and the oracle of the tests.

The predictor, with the same weights, in fewer operations
---------------------------------------------------------
With the ``"separate"`` encoder the right window of position ``t`` (keys ``t+1 .. t+w``) is the left
window of position ``t + w``, so ``r_t = l_{t+w}``: the encoder (window attention, pooling, output
projection, LayerNorm) runs once over ``n + w`` windows instead of twice over ``n``. The MLP's first
layer splits over the fused features of Eq. 2::

    W1 f_t = W_l l_t + W_r r_t + W_d |l_t - r_t| + W_p (l_t * r_t) + w_c cos(l_t, r_t)

and ``W_l l`` / ``W_r l`` are one product over the ``n + w`` encoder outputs (then shifted by ``w``),
so only the ``|l - r|`` and ``l * r`` halves need the ``(n, 2C)`` feature tensor (written with the
cosine in one Triton pass, :func:`fusion_features`). The window attention itself (``w x w`` scores per
head and position, softmax, column means, weighted sum of values) is one Triton kernel of tensor-core
products over 64-row tiles that reads the ``qkv`` projection once (:func:`window_pool`); the reference
builds it from ``2 w^2`` shifted products. :class:`GraphedLogits` replays the whole forward from a CUDA
graph (one launch; for small channel counts, where launches cost more than the work).

NMS in parallel, exactly
------------------------
The reference's greedy NMS visits candidates in rank order (sure positions by index, then score
descending, ties to the lower index) and keeps one unless a kept one lies within ``nms_window``. So
a live position ``t`` is kept iff no *kept* live position ranked before it lies within the window.
That definition is recursive only through better-ranked neighbours, which gives a three-valued
fixed point anyone can evaluate locally::

    status(t) = suppressed  if some better-ranked live neighbour is kept
              = kept        if every better-ranked live neighbour is suppressed (or there is none)
              = unknown     otherwise

Every rule is sound given sound neighbours, so iterating it from "all unknown" only ever decides
positions correctly. The kernel gives each program a block of ``B`` positions plus a halo of ``H``
on each side (``H >= nms_window``), iterates the rules there until nothing changes (neighbours
outside the halo count as unknown) and writes its own block's statuses. A position whose
dependency chain runs past the halo stays unknown; then the kernel runs again, reading what the
first pass decided (the best-ranked unknown position always decides in the next pass, so this
ends; on predictor outputs one pass decides everything). The cap (at most ``N_c - 1`` boundaries)
keeps the best-ranked kept positions: greedy keeps positions in rank order, so its cap is a prefix
of that order (a sort of the few kept positions). Chunk cuts (``max_len``) need the previous boundary of
every offset, a running maximum: one Triton scan kernel writes the offsets mask, and one ``nonzero``
(the only synchronisation besides the convergence check) turns it into offsets.

Entry point: :func:`predict_boundaries_fast` (what ``predict_boundaries(..., backend="triton")`` and
``backend="auto"`` on a GPU call). Tests: ``tests/test_dhsa_chunking.py`` (exact offsets against the
reference on random, tied and edge-case scores, a property test over many seeded random cases; the
predictor against a float64 evaluation of the reference); benchmark: ``python -m kvlab run dhsa-predictor-time``.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .boundary_predictor import BoundaryPredictor, label_valid

__all__ = ["predictor_logits", "GraphedLogits", "window_pool", "fusion_features", "nms_status", "nms_boundaries_fast",
           "predict_boundaries_fast", "MAX_NMS_WINDOW"]

MAX_NMS_WINDOW = 1024  # the kernel's halo must cover the window; wider windows: backend="torch"

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - kvlab without the triton extra
    triton = tl = None


def _interpreting() -> bool:
    import os

    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _check_device(x: torch.Tensor, what: str) -> None:
    if triton is None:
        raise ValueError(f"{what} needs Triton (pip install triton), or use backend='torch'")
    if not x.is_cuda and not _interpreting():
        raise ValueError(f"{what} runs on CUDA tensors; on a CPU set TRITON_INTERPRET=1 before importing triton "
                         "(slow: small shapes only) or use backend='torch'")


# ================================================================================================
# Window attention with pooling (Eq. 1), one program per (block of windows, batch x head)
# ================================================================================================
if triton is not None:
    from kvlab.kernels.triton_utils import dot as _dot

    @triton.jit
    def _window_pool_kernel(QKV, OUT, T, P, DH, stride_b, stride_p, stride_c, stride_h, out_b, out_t, out_g, out_h,
                            scale, S: tl.constexpr, G: tl.constexpr, NUM_H: tl.constexpr, R: tl.constexpr,
                            BLOCK_D: tl.constexpr, FP32_DOT: tl.constexpr):
        # One program: windows a = 0 .. R-S of this tile (window t = r0 + a holds padded rows t .. t+S-1), all
        # inside the tile's R rows r0 .. r0+R-1, so every key and value row is loaded once per tile.
        #   M_i[a, c] = q_{r0+a+i} . k_{r0+c} * scale     (row i of window a against every key row c: a tl.dot)
        #   P_i[a, :] = softmax over c in [a, a+S) of M_i[a, :]          (zero elsewhere)
        #   B_g[a, c] = mean over the group's rows i of P_i[a, c]         (band matrix: column means abar)
        #   out_g[a]  = B_g[a, :] @ V                                       (a tl.dot)
        pid = tl.program_id(0)
        pid_bh = tl.program_id(1)
        b = pid_bh // NUM_H
        h = pid_bh % NUM_H
        A_EFF: tl.constexpr = R - S + 1
        r0 = pid * A_EFF
        a = tl.arange(0, R)
        c = tl.arange(0, R)
        d = tl.arange(0, BLOCK_D)
        base = QKV + b * stride_b + h * stride_h
        row_ok = (r0 + c) < P
        band = (c[None, :] >= a[:, None]) & (c[None, :] < a[:, None] + S) & row_ok[None, :]
        rows: tl.constexpr = S // G
        b0 = tl.zeros([R, R], dtype=tl.float32)
        b1 = tl.zeros([R, R], dtype=tl.float32)
        for i in tl.static_range(S):
            # -- scores of query row i of every window against the tile's keys, over head-dim slices --
            m = tl.zeros([R, R], dtype=tl.float32)
            q_ok = (r0 + a + i) < P
            for d0 in range(0, DH, BLOCK_D):
                dd = d0 + d
                qi = tl.load(base + (r0 + a + i)[:, None] * stride_p + dd[None, :],
                             mask=q_ok[:, None] & (dd < DH)[None, :], other=0.0)
                kc = tl.load(base + stride_c + (r0 + c)[:, None] * stride_p + dd[None, :],
                             mask=row_ok[:, None] & (dd < DH)[None, :], other=0.0)
                m = _dot(qi, tl.trans(kc), m, FP32_DOT)
            # -- softmax inside the window's band; rows without a band (past the tile) give 0, not NaN --
            m = tl.where(band, m * scale, float("-inf"))
            mx = tl.max(m, axis=1)
            mx = tl.where(mx == float("-inf"), 0.0, mx)
            e = tl.exp(m - mx[:, None])
            den = tl.sum(e, axis=1)
            pr = e / tl.where(den == 0.0, 1.0, den)[:, None]
            if G == 1 or i < rows:
                b0 += pr
            else:
                b1 += pr
        b0 = b0 / rows
        b1 = b1 / rows

        # -- epilogue: the pooled outputs of the windows a < A_EFF that exist (t < T), slice by slice --
        t = r0 + a
        t_ok = (a < A_EFF) & (t < T)
        obase = OUT + b * out_b + h * out_h + t[:, None] * out_t
        for d0 in range(0, DH, BLOCK_D):
            dd = d0 + d
            vc = tl.load(base + 2 * stride_c + (r0 + c)[:, None] * stride_p + dd[None, :],
                         mask=row_ok[:, None] & (dd < DH)[None, :], other=0.0)
            mo = t_ok[:, None] & (dd < DH)[None, :]
            o0 = _dot(b0.to(vc.dtype), vc, tl.zeros([R, BLOCK_D], dtype=tl.float32), FP32_DOT)
            tl.store(obase + dd[None, :], o0.to(OUT.dtype.element_ty), mask=mo)
            if G == 2:
                o1 = _dot(b1.to(vc.dtype), vc, tl.zeros([R, BLOCK_D], dtype=tl.float32), FP32_DOT)
                tl.store(obase + out_g + dd[None, :], o1.to(OUT.dtype.element_ty), mask=mo)


if triton is not None:

    @triton.jit
    def _fusion_kernel(ENC, FEAT, COS, C, SHIFT, stride_eb, stride_et, stride_fb, stride_ft, stride_cb, eps,
                       BLOCK_C: tl.constexpr):
        # Eq. 2's non-linear features of position t in one pass over l_t = enc[t], r_t = enc[t + SHIFT]:
        # FEAT[t] = [|l - r|, l * r] and COS[t] = l.r / (max(|l|, eps) max(|r|, eps)) (float32 sums).
        t = tl.program_id(0)
        b = tl.program_id(1)
        lp = ENC + b * stride_eb + t * stride_et
        rp = lp + SHIFT * stride_et
        fp = FEAT + b * stride_fb + t * stride_ft
        dot = tl.zeros([BLOCK_C], dtype=tl.float32)
        nl = tl.zeros([BLOCK_C], dtype=tl.float32)
        nr = tl.zeros([BLOCK_C], dtype=tl.float32)
        for c0 in range(0, C, BLOCK_C):
            cc = c0 + tl.arange(0, BLOCK_C)
            m = cc < C
            l32 = tl.load(lp + cc, mask=m, other=0.0).to(tl.float32)
            r32 = tl.load(rp + cc, mask=m, other=0.0).to(tl.float32)
            # float32 then one rounding: what PyTorch's bf16 elementwise ops give
            tl.store(fp + cc, tl.abs(l32 - r32).to(FEAT.dtype.element_ty), mask=m)
            tl.store(fp + C + cc, (l32 * r32).to(FEAT.dtype.element_ty), mask=m)
            dot += l32 * r32
            nl += l32 * l32
            nr += r32 * r32
        den = tl.maximum(tl.sqrt(tl.sum(nl, 0)), eps) * tl.maximum(tl.sqrt(tl.sum(nr, 0)), eps)
        tl.store(COS + b * stride_cb + t, tl.sum(dot, 0) / den)


def fusion_features(enc: torch.Tensor, n: int, shift: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 2's non-linear features from the encoder outputs, one Triton pass: ``l_t = enc[:, t]``,
    ``r_t = enc[:, t + shift]`` for ``t < n``; returns ``([|l - r|, l * r]`` as ``(batch, n, 2C)`` in
    ``enc.dtype``, ``cos(l, r)`` as ``(batch, n)`` float32, ``eps = 1e-6`` on each norm as
    ``F.cosine_similarity``). ``enc``: ``(batch, >= n + shift, C)``."""
    _check_device(enc, "fusion_features")
    if enc.dim() != 3 or enc.shape[1] < n + shift:
        raise ValueError(f"enc must be (batch, >= {n + shift}, C), got {tuple(enc.shape)}")
    if enc.stride(-1) != 1:
        enc = enc.contiguous()
    b, _, c = enc.shape
    feat = torch.empty(b, n, 2 * c, dtype=enc.dtype, device=enc.device)
    cos = torch.empty(b, n, dtype=torch.float32, device=enc.device)
    _fusion_kernel[(n, b)](enc, feat, cos, c, shift, enc.stride(0), enc.stride(1), feat.stride(0), feat.stride(1),
                           cos.stride(0), 1e-6, BLOCK_C=min(1024, triton.next_power_of_2(c)),
                           num_warps=4 if c >= 512 else 1)
    return feat, cos


def window_pool(qkv: torch.Tensor, size: int, groups: int, count: int) -> torch.Tensor:
    """Pooled window self-attention of every window of ``size`` consecutive positions (Eq. 1).

    Args:
        qkv: ``(batch, P, 3, heads, head_dim)`` query/key/value projections of the padded sequence.
        size: window length ``S`` (``w`` for the separate encoder, ``2w`` for the joint one).
        groups: 1 (pool all ``S`` rows) or 2 (pool the first and the last ``S / 2`` rows apart).
        count: number of windows ``T`` (window ``t`` holds positions ``t .. t + S - 1``; ``T + S - 1 <= P``).

    Returns:
        ``(batch, T, groups, heads, head_dim)`` in ``qkv.dtype``:
        ``out[b, t, g, h] = sum_j abar_g[j] v[b, t + j, h]`` with ``abar_g`` the column means over the
        group's rows of ``softmax_j(q_{t+i} . k_{t+j} / sqrt(head_dim))``. One program per tile of 64 rows
        and (batch, head): the scores are tensor-core products of the tile's rows (``q`` shifted by each
        window row ``i`` against all 64 keys, masked to the window's band), the pooled outputs one more
        product of the band matrix of ``abar`` with the tile's values; every row is read from memory once.
        Scores and softmax in float32; the band weights meet the values in the values' dtype (as the
        eager reference's ``att @ v`` does in bf16); float32 inputs get true float32 products.
    """
    _check_device(qkv, "window_pool")
    if qkv.dim() != 5 or qkv.shape[2] != 3:
        raise ValueError(f"qkv must be (batch, P, 3, heads, head_dim), got {tuple(qkv.shape)}")
    bsz, plen, _, heads, dh = qkv.shape
    if groups not in (1, 2) or size % groups or size < 1:
        raise ValueError(f"groups must be 1 or 2 and divide size={size}, got {groups}")
    if count + size - 1 > plen:
        raise ValueError(f"count={count} windows of size {size} need {count + size - 1} positions, qkv has {plen}")
    if qkv.stride(-1) != 1:
        qkv = qkv.contiguous()
    out = torch.empty(bsz, count, groups, heads, dh, dtype=qkv.dtype, device=qkv.device)
    r = 64 if size <= 16 else triton.next_power_of_2(4 * size)  # tile rows: R - size + 1 windows per program
    block_d = max(16, min(triton.next_power_of_2(dh), 64))
    fp32_dot = qkv.dtype == torch.float32 or _interpreting()
    grid = (triton.cdiv(count, r - size + 1), bsz * heads)
    _window_pool_kernel[grid](qkv, out, count, plen, dh, qkv.stride(0), qkv.stride(1), qkv.stride(2), qkv.stride(3),
                              out.stride(0), out.stride(1), out.stride(2), out.stride(3), 1.0 / math.sqrt(dh),
                              S=size, G=groups, NUM_H=heads, R=r, BLOCK_D=block_d, FP32_DOT=fp32_dot,
                              num_warps=4)
    return out


def _window_pool_torch(qkv: torch.Tensor, size: int, groups: int, count: int) -> torch.Tensor:
    """:func:`window_pool` in PyTorch (any device, the input dtype): ``size^2`` shifted products."""
    q, k, v = qkv.unbind(2)  # (b, P, h, dh)
    dh = q.shape[-1]
    s = torch.stack([torch.stack([(q[:, i:i + count] * k[:, j:j + count]).sum(-1) for j in range(size)], -1)
                     for i in range(size)], -2)  # (b, T, h, S i, S j)
    att = (s / math.sqrt(dh)).softmax(-1)
    rows = size // groups
    outs = []
    for g in range(groups):
        abar = att[..., g * rows:(g + 1) * rows, :].mean(-2)  # (b, T, h, S)
        outs.append(sum(abar[..., j, None] * v[:, j:j + count] for j in range(size)))
    return torch.stack(outs, 2)


# ================================================================================================
# The predictor's forward, restructured (Eq. 1-3)
# ================================================================================================
def predictor_logits(predictor: BoundaryPredictor, x: torch.Tensor, *, pool: str = "auto") -> torch.Tensor:
    """The logits of ``predictor(x)`` (``(batch, seq)``) computed as the module docstring says.

    Args:
        predictor: a :class:`~kvlab.dhsa.boundary_predictor.BoundaryPredictor` (or ``torch.compile`` of one: its
            weights are used). Arithmetic in the predictor's dtype (``predictor.to(torch.bfloat16)`` is
            the fast path on a GPU), the window attention in float32.
        x: ``(batch, seq, channels)`` key features (:func:`~kvlab.dhsa.boundary_predictor.key_features`).
        pool: ``"triton"`` (:func:`window_pool`), ``"torch"`` (shifted products) or ``"auto"`` (Triton on
            CUDA tensors, PyTorch elsewhere).
    """
    m = getattr(predictor, "_orig_mod", predictor)
    if not isinstance(m, BoundaryPredictor):
        raise TypeError(f"predictor must be a BoundaryPredictor (or torch.compile of one), got {type(m).__name__}")
    if x.dim() != 3 or x.shape[-1] != m.channels:
        raise ValueError(f"x must be (batch, seq, {m.channels}) key features, got {tuple(x.shape)}")
    if pool not in ("auto", "triton", "torch"):
        raise ValueError(f"pool must be 'auto', 'triton' or 'torch', got {pool!r}")
    use_triton = pool == "triton" or (pool == "auto" and x.is_cuda and triton is not None)
    dt = m.qkv.weight.dtype
    x = x.to(dt)
    b, n, c = x.shape
    w, h = m.window, m.heads
    if m.input_norm:
        x = F.layer_norm(x, (c,))
    xp = F.pad(x, (0, 0, w - 1, w))  # as the reference: zero rows at both ends (their projections are the bias)
    qkv = F.linear(xp, m.qkv.weight, m.qkv.bias).view(b, n + 2 * w - 1, 3, h, c // h)
    pool_fn = window_pool if use_triton else _window_pool_torch
    if m.encoder == "separate":
        pooled = pool_fn(qkv, w, 1, n + w)[:, :, 0].reshape(b, n + w, c)  # l_t for t < n + w; r_t = l_{t+w}
        enc = F.layer_norm(F.linear(pooled, m.proj.weight, m.proj.bias), (c,), m.norm.weight, m.norm.bias,
                           m.norm.eps)
        l, r = enc[:, :n], enc[:, w:]
    else:
        pooled = pool_fn(qkv, 2 * w, 2, n).reshape(b, n, 2, c)
        enc = F.layer_norm(F.linear(pooled, m.proj.weight, m.proj.bias), (c,), m.norm.weight, m.norm.bias,
                           m.norm.eps)
        l, r = enc[:, :, 0], enc[:, :, 1]
    w1, b1 = m.mlp[0].weight, m.mlp[0].bias  # (hidden, 4C + 1)
    hid = w1.shape[0]
    if m.encoder == "separate":  # W_l l_t + W_r l_{t+w}: one product over the n + w outputs
        lr = F.linear(enc, torch.cat([w1[:, :c], w1[:, c:2 * c]], 0))  # (b, n + w, 2 hidden)
        z = lr[:, :n, :hid] + lr[:, w:, hid:]
    else:
        z = F.linear(l, w1[:, :c]) + F.linear(r, w1[:, c:2 * c])
    if use_triton and m.encoder == "separate":  # [|l - r|, l * r] and cos in one pass over enc
        feat, cos = fusion_features(enc, n, w)
        cos = cos.to(dt)[..., None]
    else:
        feat = torch.cat([(l - r).abs(), l * r], -1)
        cos = F.cosine_similarity(l, r, dim=-1, eps=1e-6)[..., None]
    # a contiguous copy of the column slice (hidden x 2C, small): the slice's leading dimension 4C + 1 is odd,
    # which sent cuBLAS to a slow kernel (0.32 ms of 1.57 at Gemma2-2b's 32k in the H200 profile)
    z = z + F.linear(feat, w1[:, 2 * c:4 * c].contiguous(), b1)
    z = torch.relu(z + cos * w1[:, 4 * c])
    return F.linear(z, m.mlp[2].weight, m.mlp[2].bias).squeeze(-1)


class GraphedLogits:
    """:func:`predictor_logits` replayed from a CUDA graph: one launch instead of ~25 for a fixed input shape.

    ``GraphedLogits(predictor)(x)`` captures a graph per ``(shape, dtype, device)`` of ``x`` on first use (after
    one warm-up call that compiles the Triton kernel) and replays it afterwards: ``x`` is copied into the graph's
    input buffer and the logits are copied out. The graph reads the predictor's parameters in place, so updating
    them in place (an optimiser step) is seen; replacing them (``load_state_dict`` with ``assign=True``,
    ``.to()`` to another dtype) needs a new ``GraphedLogits``. CUDA tensors only.
    """

    def __init__(self, predictor):
        m = getattr(predictor, "_orig_mod", predictor)
        if not isinstance(m, BoundaryPredictor):
            raise TypeError(f"predictor must be a BoundaryPredictor, got {type(m).__name__}")
        self.module = m
        self.graphs: dict = {}

    @torch.no_grad()
    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if not x.is_cuda:
            raise ValueError("GraphedLogits needs CUDA tensors; call predictor_logits on other devices")
        key = (tuple(x.shape), x.dtype, x.device)
        if key not in self.graphs:
            static_x = x.clone()
            side = torch.cuda.Stream(x.device)
            side.wait_stream(torch.cuda.current_stream(x.device))
            with torch.cuda.stream(side):
                predictor_logits(self.module, static_x)  # warm-up: compiles the kernels outside the capture
            torch.cuda.current_stream(x.device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                static_out = predictor_logits(self.module, static_x)
            self.graphs[key] = (graph, static_x, static_out)
        graph, static_x, static_out = self.graphs[key]
        static_x.copy_(x)
        graph.replay()
        return static_out.clone()


# ================================================================================================
# NMS: the three-valued fixed point, one program per (block + halo, sequence)
# ================================================================================================
UNKNOWN, KEPT, SUPPRESSED, DEAD = 0, 1, 2, 3

if triton is not None:

    @triton.jit
    def _better(sc_a, sure_a, pos_a, sc_b, sure_b, pos_b):
        # rank of a before rank of b: sure positions first (by index), then score descending, ties by index
        both_sure = (sure_a != 0) & (sure_b != 0)
        neither = (sure_a == 0) & (sure_b == 0)
        by_score = (sc_a > sc_b) | ((sc_a == sc_b) & (pos_a < pos_b))
        return ((sure_a != 0) & (sure_b == 0)) | (both_sure & (pos_a < pos_b)) | (neither & by_score)

    @triton.jit
    def _nms_pass_kernel(SC, SURE, STATUS, SCRATCH, UNDECIDED, n, W, stride_sc, stride_st, B: tl.constexpr,
                         HALO: tl.constexpr):
        # Region = [start - HALO, start + B + HALO); statuses live in SCRATCH (this program's slice) so that
        # threads can read their neighbours' values of the previous iteration (barriers around the updates).
        pid = tl.program_id(0)
        row = tl.program_id(1)
        T: tl.constexpr = B + 2 * HALO
        start = pid * B
        idx = tl.arange(0, T)
        pos = start - HALO + idx
        inseq = (pos >= 0) & (pos < n)
        sc = tl.load(SC + row * stride_sc + pos, mask=inseq, other=0.0)
        sure = tl.load(SURE + row * stride_st + pos, mask=inseq, other=0)
        st = tl.load(STATUS + row * stride_st + pos, mask=inseq, other=3).to(tl.int32)  # outside: dead
        scr = SCRATCH + (row * tl.num_programs(0) + pid) * T
        tl.store(scr + idx, st.to(tl.int8))
        changed = 1
        while changed > 0:
            tl.debug_barrier()  # the previous iteration's statuses are visible to every thread
            any_kept = tl.zeros([T], dtype=tl.int1)
            all_supp = tl.full([T], 1, dtype=tl.int1)
            for dist in range(1, W + 1):
                for side in tl.static_range(2):
                    step = dist * (1 - 2 * side)  # right neighbour, then left
                    nb = idx + step
                    npos = pos + step
                    in_region = (nb >= 0) & (nb < T)
                    n_inseq = (npos >= 0) & (npos < n)
                    # outside the region: unknown if in the sequence (a later pass knows more), dead outside it
                    st_nb = tl.load(scr + nb, mask=in_region, other=0).to(tl.int32)
                    st_nb = tl.where(n_inseq, st_nb, 3)
                    sc_nb = tl.load(SC + row * stride_sc + npos, mask=n_inseq, other=0.0)
                    sure_nb = tl.load(SURE + row * stride_st + npos, mask=n_inseq, other=0)
                    rel = (st_nb != 3) & _better(sc_nb, sure_nb, npos, sc, sure, pos)
                    any_kept = any_kept | (rel & (st_nb == 1))
                    all_supp = all_supp & ((~rel) | (st_nb == 2))
            new = tl.where((st == 0) & any_kept, 2, tl.where((st == 0) & all_supp, 1, st))
            changed = tl.sum((new != st).to(tl.int32), axis=0)
            st = new
            tl.debug_barrier()  # every thread has read the old statuses before they are overwritten
            tl.store(scr + idx, st.to(tl.int8))
        own = (idx >= HALO) & (idx < HALO + B) & inseq
        tl.store(STATUS + row * stride_st + pos, st.to(tl.int8), mask=own)
        tl.atomic_add(UNDECIDED + row, tl.sum((own & (st == 0)).to(tl.int32), axis=0))

    @triton.jit
    def _max_combine(x, y):
        return tl.maximum(x, y)

    @triton.jit
    def _ends_kernel(KEPT, ENDS, n, max_len, stride_k, stride_e, BLOCK: tl.constexpr, CUT: tl.constexpr):
        # Offsets e in [0, n] of one row: 0, n, every kept t + 1, and (CUT) the cuts of split_long_chunks:
        # e - prev(e) a multiple of max_len, prev(e) = the last real boundary <= e (a running maximum; the
        # carry brings it across slices of BLOCK offsets).
        row = tl.program_id(0)
        carry = 0
        for start in range(0, n + 1, BLOCK):
            e = start + tl.arange(0, BLOCK)
            inr = e <= n
            kept_prev = tl.load(KEPT + row * stride_k + e - 1, mask=(e >= 1) & inr, other=0)
            is_b = ((e == 0) | (e == n) | (kept_prev != 0)) & inr
            if CUT:
                mark = tl.where(is_b, e, 0)
                prev = tl.maximum(tl.associative_scan(mark, 0, _max_combine), carry)
                is_b = is_b | ((~is_b) & inr & ((e - prev) % max_len == 0))
                carry = tl.maximum(carry, tl.max(mark, axis=0))
            tl.store(ENDS + row * stride_e + e, is_b.to(tl.int8), mask=inr)


def _rank_keys(sc: torch.Tensor, sure: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """Sort keys (smaller = ranked first; exact and unique) of the positions ``pos`` of one row with scores
    ``sc`` and sure flags ``sure`` (all 1-d, same length): sure positions by index, then score descending,
    ties to the lower index."""
    if sc.dtype == torch.float64:
        # the rank among these positions by a stable sort (pos ascending, so ties keep the lower index first)
        order = torch.sort(sc, descending=True, stable=True).indices
        r = torch.empty_like(order)
        r[order] = torch.arange(order.numel(), device=sc.device)
        return torch.where(sure, pos - (1 << 62), r)
    bits = sc.float().view(torch.int32).long()
    ordered = torch.where(bits < 0, (1 << 31) - 1 - (bits & 0x7FFFFFFF), bits + (1 << 31))  # monotone in score
    score_key = -(ordered << 30) + pos  # higher score first, then lower index (n < 2^30)
    return torch.where(sure, pos - (1 << 62) - (1 << 31), score_key)


def nms_status(scores: torch.Tensor, live: torch.Tensor, sure: torch.Tensor, nms_window: int,
               *, cap: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy NMS of ``live`` positions in rank order, in parallel.

    Args:
        scores: ``(batch, n)`` float32 or float64; live: ``(batch, n)`` bool (positions that may be kept:
            candidates and sure positions); sure: ``(batch, n)`` bool (ranked before every score, by index).
        nms_window: a kept position suppresses live positions within this distance (0: none).
        cap: if given, the host also learns whether a row keeps more than ``cap`` positions, in the same
            synchronisation as the kernel's convergence check.

    Returns:
        ``(kept, over)``: ``(batch, n)`` bool, True where greedy keeps the position (no cap applied), and a
        Python bool, True when some row keeps more than ``cap`` (False without ``cap``).
    """
    _check_device(scores, "nms_status")
    if nms_window > MAX_NMS_WINDOW:
        raise ValueError(f"nms_window must be <= {MAX_NMS_WINDOW} for the Triton NMS (its halo), got {nms_window}; "
                         "use backend='torch'")
    bsz, n = scores.shape
    halo = max(64 if _interpreting() else 256, triton.next_power_of_2(max(nms_window, 1)))
    block = 2 * halo
    sc = scores.contiguous()
    sure8 = sure.to(torch.int8).contiguous()
    status = torch.where(live, UNKNOWN, DEAD).to(torch.int8).contiguous()
    progs = triton.cdiv(n, block)
    scratch = torch.empty(bsz * progs * (block + 2 * halo), dtype=torch.int8, device=scores.device)
    while True:
        undecided = torch.zeros(bsz, dtype=torch.int32, device=scores.device)
        _nms_pass_kernel[(progs, bsz)](sc, sure8, status, scratch, undecided, n, nms_window, sc.stride(0),
                                       status.stride(0), B=block, HALO=halo, num_warps=4)
        kept = status == KEPT
        flags = undecided.sum()[None]
        if cap is not None:
            flags = torch.cat([flags, (kept.sum(-1).max() > cap)[None].int()])
        flags = flags.tolist()  # one sync; on predictor outputs the first pass decides everything
        if flags[0] == 0:
            return kept, bool(cap is not None and flags[1])


def _check_nms_args(scores: torch.Tensor, max_chunks, nms_window, max_len) -> None:
    if scores.dim() != 2:
        raise ValueError(f"scores must be (batch, n), got {tuple(scores.shape)}")
    if isinstance(max_chunks, bool) or not isinstance(max_chunks, int) or max_chunks < 1:
        raise ValueError(f"max_chunks must be an int >= 1, got {max_chunks!r}")
    if isinstance(nms_window, bool) or not isinstance(nms_window, int) or nms_window < 0:
        raise ValueError(f"nms_window must be an int >= 0, got {nms_window!r}")
    if max_len is not None and (isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 1):
        raise ValueError(f"max_len must be None or an int >= 1 (longest chunk in tokens), got {max_len!r}")


def _keep_best_ranked(kept: torch.Tensor, sc: torch.Tensor, firsts: torch.Tensor, cap: int) -> torch.Tensor:
    """Rows with more than ``cap`` kept positions keep the best-ranked ``cap`` (a prefix of greedy's order)."""
    capped = torch.zeros_like(kept)
    for b in range(kept.shape[0]):
        t = kept[b].nonzero().squeeze(1)  # increasing positions, at most n / (nms_window + 1) of them
        if t.numel() > cap:
            t = t[torch.sort(_rank_keys(sc[b, t], firsts[b, t], t)).indices[:cap]]
        capped[b, t] = True
    return capped


def nms_boundaries_fast(scores: torch.Tensor, *, max_chunks: int, threshold: float | None, nms_window: int = 8,
                        valid: torch.Tensor | None = None, sure: torch.Tensor | None = None,
                        max_len: int | None = None) -> list[torch.Tensor]:
    """:func:`kvlab.dhsa.boundary_predictor.nms_boundaries` (then ``split_long_chunks(., max_len)`` when ``max_len`` is
    given): the same offsets, one tensor per sequence, from the Triton NMS (:func:`nms_status`).

    ``scores``: ``(batch, n)``, float32 or float64 (other float dtypes are promoted to float32); NaN is never
    a candidate (the reference's order of NaN scores is unspecified).
    """
    _check_nms_args(scores, max_chunks, nms_window, max_len)
    bsz, n = scores.shape
    dev = scores.device
    sc = scores.detach()
    if sc.dtype != torch.float64:
        sc = sc.float()
    sc = sc + 0.0  # -0.0 -> +0.0: equal scores, one sort key
    ok = torch.ones(bsz, n, dtype=torch.bool, device=dev) if valid is None else valid.to(dev).bool().expand(bsz, n)
    ok = ok.clone()
    ok[:, n - 1] = False  # the sequence end is a boundary anyway
    cand = ok & (sc == sc) if threshold is None else ok & (sc > threshold)
    firsts = torch.zeros_like(cand) if sure is None else sure.to(dev).bool().expand(bsz, n) & ok
    live = cand | firsts
    cap = max_chunks - 1
    kept, over = nms_status(sc, live, firsts, nms_window, cap=cap)
    if over:
        kept = _keep_best_ranked(kept, sc, firsts, cap)
    # offsets e in [0, n]: 0, n, every kept t + 1, and the cuts of chunks longer than max_len (one kernel)
    ends = torch.empty(bsz, n + 1, dtype=torch.int8, device=dev)
    kept8 = kept.to(torch.int8).contiguous()
    _ends_kernel[(bsz,)](kept8, ends, n, max_len or 1, kept8.stride(0), ends.stride(0),
                         BLOCK=1024 if _interpreting() else 4096, CUT=bool(max_len), num_warps=8)
    nz = ends.nonzero()  # the one synchronisation of the output (its size)
    if bsz == 1:
        return [nz[:, 1]]
    sizes = torch.bincount(nz[:, 0], minlength=bsz).tolist()
    return list(torch.split(nz[:, 1], sizes))


# ================================================================================================
# The whole chunking
# ================================================================================================
@torch.no_grad()
def predict_boundaries_fast(predictor, k: torch.Tensor, *, max_chunks: int, threshold: float = 0.5,
                            nms_window: int = 8, max_len: int | None = None) -> list[torch.Tensor]:
    """:func:`kvlab.dhsa.boundary_predictor.predict_boundaries` on the fast path: :func:`predictor_logits` (Triton window
    attention on CUDA), sigmoid in float32, :func:`nms_boundaries_fast`. Same arguments and result (one offsets
    tensor per sequence); the offsets equal the reference's for the same probabilities."""
    from .boundary_predictor import _check_prediction_args

    _check_prediction_args(threshold, max_chunks, nms_window, max_len)
    m = getattr(predictor, "_orig_mod", predictor)
    if not isinstance(m, BoundaryPredictor):
        raise TypeError(f"predictor must be a BoundaryPredictor (or torch.compile of one), got "
                        f"{type(predictor).__name__}")
    x = m.features(k)
    p = torch.sigmoid(predictor_logits(m, x).float())
    valid = label_valid(x.shape[1], m.window, x.device)
    return nms_boundaries_fast(p, max_chunks=max_chunks, threshold=threshold, nms_window=nms_window, valid=valid,
                               max_len=max_len)


if __name__ == "__main__":  # the timing lives in python -m kvlab run dhsa-predictor-time
    import sys

    sys.exit("python -m kvlab run dhsa-predictor-time --out DIR  (times this module beside the reference)")
