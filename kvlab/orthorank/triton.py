"""OrthoRank's routed layer with Triton kernels for everything but the layer's own matrix products.

Paper: OrthoRank (Shin, Oh and Oh, ICML 2025, https://arxiv.org/abs/2507.03865), Eq. 4 and Algorithm 1.
Specification: :func:`kvlab.orthorank.reference.routed_layer` (and ``alignment``, ``select_topk``); this file
computes the same numbers with fewer passes over the hidden states.

What a routed layer does besides the dense layer's work, and the kernel that does it here
----------------------------------------------------------------------------------------
1. **Normalise and score** every token, ``|h_bar_0 . h_bar_i|`` (Eq. 4) on the normalised states: for a Llama /
   Qwen2 / Gemma3 RMSNorm, ``_norm_scores_kernel`` reads each row once, writes ``h_bar`` with the module's own
   roundings and the fp32 dot product with the sink's ``h_bar`` (recomputed per program from row 0) in the same
   pass (the eager RMSNorm alone makes five passes over an fp32 copy: 3.4 ms of a 65,536-token 8B layer on an
   H200, against 0.42 ms for norm and scores here). Other norms: the module, then ``_scores_kernel``.
2. **Select** the ``k`` smallest scores per sequence, in their original order (Algorithm 1, the sink's score set
   to +inf or -inf, ties to the earlier token): ``_topk_kernel``, one program per sequence, no sort. Scores are
   mapped to int32 keys with the same order; the k-th smallest key ``T`` is found bit by bit (32 counting passes
   over the row); then one pass keeps ``key < T`` and the first ``k - #(key < T)`` tokens with ``key == T``, and
   writes their indices in order by a prefix sum (a stream compaction).
3. **Gather** the selected rows of the normalised states (queries) and, fused with the attention block's
   residual add, of the layer input: ``_gather_rows_kernel`` (``out[j] = x[sel[j]] (+ add[j])``).
3b. **Project** with the model's own ``q_proj`` / ``k_proj`` / ``v_proj``; RoPE of the selected queries (at their
   gathered positions) and of every key in one pass each (``_rope_kernel``; the eager rotation is five kernels).
4. **Attend** with the selected queries over *all* keys, causal on the *original* positions (a query at
   position ``p`` sees the keys at positions ``<= p``, and ``> p - window`` for Gemma3's sliding layers):
   ``_selected_attention_kernel``, FlashAttention's online softmax over key tiles, GQA by indexing the key/value
   head. A query tile walks only the key index range its queries can see: ``[lo, hi)`` per query comes from a
   binary search in the running min/max of the key positions (:func:`key_ranges`), which is tight when the key
   positions ascend and stays correct when a cache holds them in another order; inside the range the mask is
   the position rule itself, and key tiles every query of the tile sees whole (``[0, full)``, from the running
   maximum of the key positions) run without it. No ``(k, n)`` mask and no copies of the key/value heads (the
   PyTorch path builds both for SDPA).
4b. **Post-attention**: the residual add fused with the post-attention RMSNorm (``_gather_add_norm_kernel``:
   ``a = h[sel] + o_proj(out)`` and ``RMSNorm(a)`` from one read of each row), then the model's MLP projections
   with SiLU(gate) * up in one pass (``_silu_mul_kernel``, the module's two roundings).
5. **Scatter** the new rows into the residual stream, fused with the MLP's residual add:
   ``_scatter_rows_kernel`` (``out[sel[j]] = a[j] + mlp[j]``), into a copy of the layer input or, with
   ``inplace=True``, into the input itself (no copy of the hidden states at all).

The matrix products are the model's own modules; norms, RoPE and SiLU * up are recomputed in kernels with the
modules' roundings where the layer is a Llama / Qwen2 one (Gemma3's sandwich norms and q/k norms go through
:func:`~kvlab.orthorank.reference.project_qkv`, ``attention_update``, ``mlp_update``), so the routed layer differs
from the reference only in the order of floating-point sums (the attention, the scores, the RMS of a row).
Inference only: no backward kernels.

Tests: ``tests/test_orthorank.py`` (``-m triton``; CPU with ``TRITON_INTERPRET=1``, GPU on CUDA). Timings:
``python -m kvlab bench orthorank throughput|layer``.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kvlab.kernels.triton_utils import check_triton_inputs, dot, interpreting, online_softmax_step

from .reference import (_cached_positions, take_rows, _heads, attention_update, layer_kind, logit_softcap,
                        mlp_update, project_qkv)

__all__ = ["orthogonal_scores", "rmsnorm", "rmsnorm_form", "normalized_scores", "gather_add_rmsnorm", "silu_mul",
           "mlp", "rope_heads", "topk_in_order", "gather_rows", "scatter_rows", "key_ranges", "selected_attention",
           "routed_layer_triton", "check_routed_layer_triton"]


# ---------------------------------------------------------------------------------------------
# 1. Eq. 4 scores: |h_bar_0 . h_bar_i| in fp32, one program per (sequence, block of tokens)
# ---------------------------------------------------------------------------------------------
@triton.jit
def _scores_kernel(X, S, stride_xb, stride_xn, N, D, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr):
    b = tl.program_id(0)
    offs_t = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
    row_ok = offs_t < N
    Xb = X + b.to(tl.int64) * stride_xb
    acc = tl.zeros([BLOCK_T], dtype=tl.float32)
    for d0 in range(0, D, BLOCK_D):
        offs_d = d0 + tl.arange(0, BLOCK_D)
        d_ok = offs_d < D
        # -- load the sink's chunk (row 0 of the sequence) and this block's chunks
        h0 = tl.load(Xb + offs_d, mask=d_ok, other=0.0).to(tl.float32)
        x = tl.load(Xb + offs_t[:, None] * stride_xn + offs_d[None, :], mask=row_ok[:, None] & d_ok[None, :],
                    other=0.0).to(tl.float32)
        acc += tl.sum(x * h0[None, :], axis=1)
    tl.store(S + b * N + offs_t, tl.abs(acc), mask=row_ok)


def orthogonal_scores(states: torch.Tensor) -> torch.Tensor:
    """Eq. 4 on ``states (batch, seq, hidden)``: ``|h_0 . h_i|`` as float32 ``(batch, seq)`` (smaller = more
    orthogonal), as :func:`kvlab.orthorank.reference.alignment` with ``score="dot"``."""
    x = states if states.stride(-1) == 1 else states.contiguous()
    batch, seq, hidden = x.shape
    out = torch.empty(batch, seq, dtype=torch.float32, device=x.device)
    block_t, block_d = (16, 32) if interpreting() else (32, 128)
    _scores_kernel[(batch, triton.cdiv(seq, block_t))](x, out, x.stride(0), x.stride(1), seq, hidden,
                                                       BLOCK_T=block_t, BLOCK_D=block_d)
    return out


# ---------------------------------------------------------------------------------------------
# 1b. The layer's RMSNorm fused with the scores (and with the post-attention residual add)
# ---------------------------------------------------------------------------------------------
@triton.jit
def _rms_apply(x, rstd, w, X, Y, GEMMA: tl.constexpr):
    # The model's own rounding (X, Y: the input and output pointers, for their dtypes): Llama/Qwen2
    # ``w * (x * rstd).to(input dtype)``; Gemma3 ``(x * rstd * (1 + w))`` in fp32, then cast.
    if GEMMA:
        y = (x * rstd * (1.0 + w)).to(Y.dtype.element_ty)
    else:
        y = ((x * rstd).to(X.dtype.element_ty).to(tl.float32) * w).to(Y.dtype.element_ty)
    return y


@triton.jit
def _norm_scores_kernel(X, W, Y, S, stride_xb, stride_xn, N, D, eps, GEMMA: tl.constexpr, SCORE: tl.constexpr,
                        BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr, ONE_CHUNK: tl.constexpr):
    b = tl.program_id(0)
    offs_t = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
    row_ok = offs_t < N
    Xb = X + b.to(tl.int64) * stride_xb
    Yb = Y + b.to(tl.int64) * N * D
    if ONE_CHUNK:  # whole rows in registers: the states are read once
        offs_d = tl.arange(0, BLOCK_D)
        d_ok = offs_d < D
        m2 = row_ok[:, None] & d_ok[None, :]
        x = tl.load(Xb + offs_t[:, None] * stride_xn + offs_d[None, :], mask=m2, other=0.0).to(tl.float32)
        w = tl.load(W + offs_d, mask=d_ok, other=0.0).to(tl.float32)
        rstd = tl.math.rsqrt(tl.sum(x * x, axis=1) / D + eps)
        y = _rms_apply(x, rstd[:, None], w[None, :], X, Y, GEMMA)
        tl.store(Yb + offs_t[:, None] * D + offs_d[None, :], y, mask=m2)
        if SCORE:
            x0 = tl.load(Xb + offs_d, mask=d_ok, other=0.0).to(tl.float32)
            y0 = _rms_apply(x0, tl.math.rsqrt(tl.sum(x0 * x0, axis=0) / D + eps), w, X, Y, GEMMA).to(tl.float32)
            tl.store(S + b * N + offs_t, tl.abs(tl.sum(y.to(tl.float32) * y0[None, :], axis=1)), mask=row_ok)
        return
    # -- pass 1: sums of squares of this block's rows and of the sink row (token 0 of the sequence)
    ss = tl.zeros([BLOCK_T], dtype=tl.float32)
    ss0 = tl.zeros([BLOCK_D], dtype=tl.float32)
    for d0 in range(0, D, BLOCK_D):
        offs_d = d0 + tl.arange(0, BLOCK_D)
        d_ok = offs_d < D
        x = tl.load(Xb + offs_t[:, None] * stride_xn + offs_d[None, :], mask=row_ok[:, None] & d_ok[None, :],
                    other=0.0).to(tl.float32)
        ss += tl.sum(x * x, axis=1)
        if SCORE:
            x0 = tl.load(Xb + offs_d, mask=d_ok, other=0.0).to(tl.float32)
            ss0 += x0 * x0
    rstd = tl.math.rsqrt(ss / D + eps)
    rstd0 = tl.math.rsqrt(tl.sum(ss0, axis=0) / D + eps)
    # -- pass 2: normalise, store, and dot each normalised row with the normalised sink (Eq. 4)
    acc = tl.zeros([BLOCK_T], dtype=tl.float32)
    for d0 in range(0, D, BLOCK_D):
        offs_d = d0 + tl.arange(0, BLOCK_D)
        d_ok = offs_d < D
        m2 = row_ok[:, None] & d_ok[None, :]
        x = tl.load(Xb + offs_t[:, None] * stride_xn + offs_d[None, :], mask=m2, other=0.0).to(tl.float32)
        w = tl.load(W + offs_d, mask=d_ok, other=0.0).to(tl.float32)
        y = _rms_apply(x, rstd[:, None], w[None, :], X, Y, GEMMA)
        tl.store(Yb + offs_t[:, None] * D + offs_d[None, :], y, mask=m2)
        if SCORE:
            x0 = tl.load(Xb + offs_d, mask=d_ok, other=0.0).to(tl.float32)
            y0 = _rms_apply(x0, rstd0, w, X, Y, GEMMA).to(tl.float32)
            acc += tl.sum(y.to(tl.float32) * y0[None, :], axis=1)
    if SCORE:
        tl.store(S + b * N + offs_t, tl.abs(acc), mask=row_ok)


@triton.jit
def _gather_add_norm_kernel(X, IDX, ADD, W, A, Y, N, K, D, eps, GEMMA: tl.constexpr, BLOCK_D: tl.constexpr,
                            ONE_CHUNK: tl.constexpr):
    # a = x[sel[j]] + add[j] (rounded to x's dtype, as PyTorch's bf16 + bf16), y = RMSNorm(a); one row each
    row = tl.program_id(0)  # b * K + j
    b = row // K
    src = tl.load(IDX + row)
    Xr = X + (b.to(tl.int64) * N + src) * D
    Ar = ADD + row.to(tl.int64) * D
    if ONE_CHUNK:  # the whole row in registers: read once
        offs = tl.arange(0, BLOCK_D)
        ok = offs < D
        a = (tl.load(Xr + offs, mask=ok, other=0.0).to(tl.float32)
             + tl.load(Ar + offs, mask=ok, other=0.0).to(tl.float32)).to(X.dtype.element_ty)
        tl.store(A + row.to(tl.int64) * D + offs, a, mask=ok)
        a = a.to(tl.float32)
        rstd = tl.math.rsqrt(tl.sum(a * a, axis=0) / D + eps)
        w = tl.load(W + offs, mask=ok, other=0.0).to(tl.float32)
        tl.store(Y + row.to(tl.int64) * D + offs, _rms_apply(a, rstd, w, X, Y, GEMMA), mask=ok)
        return
    ss = tl.zeros([BLOCK_D], dtype=tl.float32)
    for d0 in range(0, D, BLOCK_D):
        offs = d0 + tl.arange(0, BLOCK_D)
        ok = offs < D
        a = (tl.load(Xr + offs, mask=ok, other=0.0).to(tl.float32)
             + tl.load(Ar + offs, mask=ok, other=0.0).to(tl.float32)).to(X.dtype.element_ty)
        tl.store(A + row.to(tl.int64) * D + offs, a, mask=ok)
        a = a.to(tl.float32)
        ss += a * a
    rstd = tl.math.rsqrt(tl.sum(ss, axis=0) / D + eps)
    for d0 in range(0, D, BLOCK_D):  # the sum is recomputed, not read back: no barrier needed
        offs = d0 + tl.arange(0, BLOCK_D)
        ok = offs < D
        a = (tl.load(Xr + offs, mask=ok, other=0.0).to(tl.float32)
             + tl.load(Ar + offs, mask=ok, other=0.0).to(tl.float32)).to(X.dtype.element_ty).to(tl.float32)
        w = tl.load(W + offs, mask=ok, other=0.0).to(tl.float32)
        tl.store(Y + row.to(tl.int64) * D + offs, _rms_apply(a, rstd, w, X, Y, GEMMA), mask=ok)


@triton.jit
def _silu_mul_kernel(G, U, OUT, numel, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < numel
    g = tl.load(G + offs, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(U + offs, mask=ok, other=0.0).to(tl.float32)
    act = (g / (1.0 + tl.exp(-g))).to(G.dtype.element_ty)  # SiLU rounded to the gate's dtype, as the module
    tl.store(OUT + offs, (act.to(tl.float32) * u).to(OUT.dtype.element_ty), mask=ok)


@triton.jit
def _round_sum(a, b, OUT):
    # a and b rounded to OUT's dtype, then their sum: PyTorch's ``a + b`` of two low-precision products
    ty = OUT.dtype.element_ty
    return (a.to(ty).to(tl.float32) + b.to(ty).to(tl.float32)).to(ty)


@triton.jit
def _rope_kernel(X, COS, SIN, IDX, OUT, stride_xr, stride_cb, stride_cn, K, H, HALF: tl.constexpr,
                 HAS_IDX: tl.constexpr, BLOCK_H: tl.constexpr):
    # One row (b, j) of a projection ``(batch, k, heads * dim)``, BLOCK_H heads of it: x * cos + rotate_half(x)
    # * sin with cos/sin of the row's own position (or of position IDX[b, j]), PyTorch's three roundings.
    row = tl.program_id(0)  # b * K + j
    b = row // K
    pos = row % K
    if HAS_IDX:
        pos = tl.load(IDX + row)
    offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, HALF)
    h_ok = offs_h < H
    cs = COS + b.to(tl.int64) * stride_cb + pos.to(tl.int64) * stride_cn
    sn = SIN + b.to(tl.int64) * stride_cb + pos.to(tl.int64) * stride_cn
    c1 = tl.load(cs + offs_d).to(tl.float32)[None, :]
    c2 = tl.load(cs + HALF + offs_d).to(tl.float32)[None, :]
    s1 = tl.load(sn + offs_d).to(tl.float32)[None, :]
    s2 = tl.load(sn + HALF + offs_d).to(tl.float32)[None, :]
    src = X + row.to(tl.int64) * stride_xr + offs_h[:, None] * (2 * HALF) + offs_d[None, :]
    x1 = tl.load(src, mask=h_ok[:, None], other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF, mask=h_ok[:, None], other=0.0).to(tl.float32)
    # rotate_half(x) = (-x2, x1); each product rounded, then the sum, as the eager x * cos + rotate_half(x) * sin
    o1 = _round_sum(x1 * c1, -x2 * s1, OUT)
    o2 = _round_sum(x2 * c2, x1 * s2, OUT)
    dst = OUT + row.to(tl.int64) * H * (2 * HALF) + offs_h[:, None] * (2 * HALF) + offs_d[None, :]
    tl.store(dst, o1, mask=h_ok[:, None])
    tl.store(dst + HALF, o2, mask=h_ok[:, None])


def rope_heads(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, head_dim: int,
               index: torch.Tensor | None = None) -> torch.Tensor:
    """RoPE of a projection ``x (batch, k, heads * head_dim)`` split into heads, in one pass: returns
    ``(batch, heads, k, head_dim)`` (a transposed view of a ``(batch, k, heads, head_dim)`` buffer), what
    ``_rope(_heads(x), cos_rows, sin_rows)`` of :mod:`kvlab.orthorank.reference` gives. cos/sin ``(batch or 1,
    seq, head_dim)``; row ``j`` takes position ``index[b, j]`` (``(batch, k)``) or, without ``index``, ``j``."""
    batch, k, width = x.shape
    heads = width // head_dim
    x = x if x.stride(-1) == 1 and x.stride(1) == width and x.stride(0) == k * width else x.contiguous()
    cos, sin = cos.expand(batch, *cos.shape[1:]), sin.expand(batch, *sin.shape[1:])
    if cos.stride(-1) != 1 or sin.stride() != cos.stride():
        cos, sin = cos.contiguous(), sin.contiguous()
    out = torch.empty(batch, k, heads, head_dim, dtype=torch.result_type(x, cos), device=x.device)
    if batch * k:
        block_h = min(triton.next_power_of_2(heads), 4 if interpreting() else 8)
        idx = index.to(torch.int64).contiguous() if index is not None else x
        _rope_kernel[(batch * k, triton.cdiv(heads, block_h))](
            x, cos, sin, idx, out, width, cos.stride(0), cos.stride(1), k, heads, HALF=head_dim // 2,
            HAS_IDX=index is not None, BLOCK_H=block_h, num_warps=2)
    return out.transpose(1, 2)


_LLAMA_NORMS = ("LlamaRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm", "MistralRMSNorm")
_GEMMA_NORMS = ("Gemma3RMSNorm",)


def rmsnorm_form(norm: torch.nn.Module):
    """``(gemma, weight, eps)`` of an RMSNorm module whose forward the kernels reproduce (Llama/Qwen2:
    ``w * (x * rstd).to(dtype)``; Gemma3: ``(x * rstd * (1 + w)).to(dtype)``), or None (another module: the
    routed layer then calls the module itself)."""
    name = type(norm).__name__
    weight = getattr(norm, "weight", None)
    if name in _LLAMA_NORMS and isinstance(getattr(norm, "variance_epsilon", None), float):
        return False, weight, norm.variance_epsilon
    if name in _GEMMA_NORMS and isinstance(getattr(norm, "eps", None), float):
        return True, weight, norm.eps
    return None


def _norm_out_dtype(form, x: torch.Tensor) -> torch.dtype:
    gemma, weight, _ = form
    return x.dtype if gemma else torch.promote_types(weight.dtype, x.dtype)


def _norm_blocks(d: int) -> dict:
    """Rows per program, chunk of the hidden size, whole rows in registers or two passes (hidden sizes past
    8192 on the GPU; past 64 in the interpreter, so that both paths meet the tests), warps."""
    whole = triton.next_power_of_2(d)
    if interpreting():
        return dict(BLOCK_T=4, BLOCK_D=whole if whole <= 64 else 32, ONE_CHUNK=whole <= 64, num_warps=4)
    if whole <= 8192:
        return dict(BLOCK_T=max(1, 16384 // whole), BLOCK_D=whole, ONE_CHUNK=True, num_warps=8)
    return dict(BLOCK_T=8, BLOCK_D=512, ONE_CHUNK=False, num_warps=4)


def rmsnorm(norm: torch.nn.Module, x: torch.Tensor, scores: bool = False):
    """``norm(x)`` for ``x (batch, seq, hidden)`` in one kernel (an RMSNorm that :func:`rmsnorm_form` knows;
    otherwise the module itself). ``scores=True``: also Eq. 4 on the result, ``|y_0 . y_i|`` float32 ``(batch,
    seq)`` (:func:`orthogonal_scores` of it), from the same pass; returns ``(y, scores)`` then."""
    form = rmsnorm_form(norm)
    if form is None:
        y = norm(x)
        return (y, orthogonal_scores(y)) if scores else y
    x = x if x.stride(-1) == 1 else x.contiguous()
    batch, seq, hidden = x.shape
    y = torch.empty(batch, seq, hidden, dtype=_norm_out_dtype(form, x), device=x.device)
    s = torch.empty(batch, seq, dtype=torch.float32, device=x.device) if scores else y
    cfg = _norm_blocks(hidden)
    gemma, weight, eps = form
    if batch * seq:
        _norm_scores_kernel[(batch, triton.cdiv(seq, cfg["BLOCK_T"]))](
            x, weight.detach(), y, s, x.stride(0), x.stride(1), seq, hidden, float(eps), GEMMA=gemma, SCORE=scores,
            **cfg)
    return (y, s) if scores else y


def normalized_scores(layer: torch.nn.Module, hidden_states: torch.Tensor):
    """The router's first step in one pass: ``(input_layernorm(h), Eq. 4 scores)``."""
    return rmsnorm(layer.input_layernorm, hidden_states, scores=True)


def gather_add_rmsnorm(x: torch.Tensor, selected: torch.Tensor, add: torch.Tensor, norm: torch.nn.Module):
    """``a = x[b, selected[b, j]] + add[b, j]`` and ``norm(a)``, each ``(batch, k, d)``, in one kernel (the
    attention block's residual add fused with the post-attention RMSNorm). ``norm`` must be one
    :func:`rmsnorm_form` knows."""
    form = rmsnorm_form(norm)
    if form is None:
        raise ValueError(f"gather_add_rmsnorm has no kernel for {type(norm).__name__}; call gather_rows and the "
                         "module")
    x = x.contiguous()
    batch, n, d = x.shape
    k = selected.shape[1]
    a = torch.empty(batch, k, d, dtype=x.dtype, device=x.device)
    y = torch.empty(batch, k, d, dtype=_norm_out_dtype(form, x), device=x.device)
    if batch * k:
        gemma, weight, eps = form
        _gather_add_norm_kernel[(batch * k,)](x, selected.to(torch.int64).contiguous(), add.to(x.dtype).contiguous(),
                                               weight.detach(), a, y, n, k, d, float(eps), GEMMA=gemma,
                                               **{key: v for key, v in _norm_blocks(d).items() if key != "BLOCK_T"})
    return a, y


def _is_silu(act) -> bool:
    return isinstance(act, torch.nn.SiLU) or type(act).__name__ == "SiLUActivation"


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` with the modules' two roundings (SiLU to gate's dtype, then the product), one pass."""
    gate, up = gate.contiguous(), up.contiguous()
    out = torch.empty(gate.shape, dtype=torch.promote_types(gate.dtype, up.dtype), device=gate.device)
    block = 1024 if interpreting() else 4096
    if gate.numel():
        _silu_mul_kernel[(triton.cdiv(gate.numel(), block),)](gate, up, out, gate.numel(), BLOCK=block, num_warps=8)
    return out


def mlp(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``module(x)``; a Llama/Qwen2 SiLU MLP (``down(silu(gate(x)) * up(x))``) with the activation and product
    fused (:func:`silu_mul`), the projections the module's own."""
    if type(module).__name__ in ("LlamaMLP", "Qwen2MLP") and _is_silu(getattr(module, "act_fn", None)):
        return module.down_proj(silu_mul(module.gate_proj(x), module.up_proj(x)))
    return module(x)


# ---------------------------------------------------------------------------------------------
# 2. Algorithm 1's top-k in original order: one program per sequence
# ---------------------------------------------------------------------------------------------
@triton.jit
def _order_keys(Sb, start, N, SINK_SELECT: tl.constexpr, BLOCK: tl.constexpr):
    # int32 keys with the order of the fp32 scores at tokens [start, start + BLOCK): non-negative floats keep
    # their bits, negative ones get their magnitude bits flipped; -0.0 counts as +0.0. The sink (token 0) gets
    # the key of +inf (Algorithm 1) or, with sink="select", of -inf.
    pos = start + tl.arange(0, BLOCK)
    ok = pos < N
    s = tl.load(Sb + pos, mask=ok, other=0.0)
    if SINK_SELECT:
        s = tl.where(pos == 0, float("-inf"), s)
    else:
        s = tl.where(pos == 0, float("inf"), s)
    bits = s.to(tl.int32, bitcast=True)
    bits = tl.where(s == 0.0, 0, bits)
    key = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
    return key, pos, ok


@triton.jit
def _count_below(Sb, T, N, SINK_SELECT: tl.constexpr, BLOCK: tl.constexpr):
    # number of tokens of the sequence whose key is < T
    cnt = 0
    for start in range(0, N, BLOCK):
        key, pos, ok = _order_keys(Sb, start, N, SINK_SELECT, BLOCK)
        cnt += tl.sum((ok & (key < T)).to(tl.int32), axis=0)
    return cnt


@triton.jit
def _topk_kernel(S, IDX, N, K, SINK_SELECT: tl.constexpr, BLOCK: tl.constexpr):
    b = tl.program_id(0)
    Sb = S + b * N
    # -- the k-th smallest key T: the largest T with #(key < T) < K, built from the sign bit down
    #    (int32 order = unsigned order with the sign bit flipped, so setting bit 30..0 of T only raises it)
    T = tl.where(_count_below(Sb, 0, N, SINK_SELECT, BLOCK) < K, 0, -2147483648)
    for i in range(31):
        cand = T | (1 << (30 - i))
        T = tl.where(_count_below(Sb, cand, N, SINK_SELECT, BLOCK) < K, cand, T)
    # -- keep key < T, and of the tokens with key == T the earliest ones; write indices in order
    need = K - _count_below(Sb, T, N, SINK_SELECT, BLOCK)
    ties = 0
    taken = 0
    for start in range(0, N, BLOCK):
        key, pos, ok = _order_keys(Sb, start, N, SINK_SELECT, BLOCK)
        tie = (ok & (key == T)).to(tl.int32)
        tie_rank = tl.cumsum(tie, axis=0) + ties  # 1-based rank among the ties so far
        keep = ok & ((key < T) | ((tie != 0) & (tie_rank <= need)))
        slot = tl.cumsum(keep.to(tl.int32), axis=0) + taken - 1
        tl.store(IDX + b.to(tl.int64) * K + slot, pos.to(tl.int64), mask=keep)
        ties += tl.sum(tie, axis=0)
        taken += tl.sum(keep.to(tl.int32), axis=0)


def topk_in_order(scores: torch.Tensor, k: int, sink: str = "skip") -> torch.Tensor:
    """Algorithm 1 as :func:`kvlab.orthorank.reference.select_topk`: sorted indices ``(batch, k)`` (int64) of
    the ``k`` smallest ``scores (batch, seq)`` (float32), the sink by ``sink`` ("skip" | "select"), ties to the
    earlier token."""
    if sink not in ("skip", "select"):
        raise ValueError(f"sink must be 'skip' or 'select', got {sink!r}")
    batch, seq = scores.shape
    if not 0 <= k <= seq:
        raise ValueError(f"k must be in 0..{seq} (the number of tokens), got {k}")
    out = torch.empty(batch, k, dtype=torch.int64, device=scores.device)
    if k == 0 or batch == 0:
        return out
    s = scores.to(torch.float32).contiguous()
    block = min(triton.next_power_of_2(seq), 64 if interpreting() else 4096)
    _topk_kernel[(batch,)](s, out, seq, k, SINK_SELECT=sink == "select", BLOCK=block,
                           num_warps=1 if interpreting() else 8)
    return out


# ---------------------------------------------------------------------------------------------
# 3 and 5. Row gather (with an optional residual add) and row scatter (fused with the last add)
# ---------------------------------------------------------------------------------------------
@triton.jit
def _gather_rows_kernel(X, IDX, ADD, OUT, N, K, D, HAS_ADD: tl.constexpr, BLOCK_D: tl.constexpr):
    row = tl.program_id(0)  # b * K + j
    b = row // K
    offs = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    ok = offs < D
    src = tl.load(IDX + row)
    x = tl.load(X + (b * N + src) * D + offs, mask=ok)
    if HAS_ADD:  # one rounding of the fp32 sum, as PyTorch's bf16 + bf16
        x = (x.to(tl.float32) + tl.load(ADD + row.to(tl.int64) * D + offs, mask=ok).to(tl.float32)).to(x.dtype)
    tl.store(OUT + row.to(tl.int64) * D + offs, x, mask=ok)


@triton.jit
def _scatter_rows_kernel(OUT, IDX, A, M, VALID, N, K, D, HAS_VALID: tl.constexpr, BLOCK_D: tl.constexpr):
    row = tl.program_id(0)
    b = row // K
    offs = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    ok = offs < D
    if HAS_VALID:  # padding entries of `selected` are not written back
        ok = ok & (tl.load(VALID + row) != 0)
    dst = tl.load(IDX + row)
    a = tl.load(A + row.to(tl.int64) * D + offs, mask=ok).to(tl.float32)
    m = tl.load(M + row.to(tl.int64) * D + offs, mask=ok).to(tl.float32)
    tl.store(OUT + (b * N + dst) * D + offs, (a + m).to(OUT.dtype.element_ty), mask=ok)


def _row_grid(batch: int, k: int, d: int):
    block_d = min(triton.next_power_of_2(d), 64 if interpreting() else 1024)
    return (batch * k, triton.cdiv(d, block_d)), block_d


def gather_rows(x: torch.Tensor, selected: torch.Tensor, add: torch.Tensor | None = None) -> torch.Tensor:
    """``x[b, selected[b, j]] (+ add[b, j])``: x ``(batch, n, d)``, selected ``(batch, k)``, add ``(batch, k, d)``
    of x's dtype; returns ``(batch, k, d)``."""
    x = x.contiguous()
    batch, n, d = x.shape
    k = selected.shape[1]
    out = torch.empty(batch, k, d, dtype=x.dtype, device=x.device)
    if batch * k == 0:
        return out
    idx = selected.to(torch.int64).contiguous()
    extra = x if add is None else add.to(x.dtype).contiguous()
    grid, block_d = _row_grid(batch, k, d)
    _gather_rows_kernel[grid](x, idx, extra, out, n, k, d, HAS_ADD=add is not None, BLOCK_D=block_d)
    return out


def scatter_rows(hidden_states: torch.Tensor, selected: torch.Tensor, a: torch.Tensor, m: torch.Tensor,
                 valid: torch.Tensor | None = None, inplace: bool = False) -> torch.Tensor:
    """``out[b, selected[b, j]] = a[b, j] + m[b, j]`` where ``valid`` (default all), ``out`` = ``hidden_states``
    itself (``inplace``) or a copy of it. hidden_states ``(batch, n, d)``; a, m ``(batch, k, d)``."""
    out = hidden_states if inplace else hidden_states.clone(memory_format=torch.contiguous_format)
    if not out.is_contiguous():
        raise ValueError("scatter_rows(inplace=True) needs contiguous hidden states; pass inplace=False")
    batch, n, d = out.shape
    k = selected.shape[1]
    if batch * k == 0:
        return out
    idx = selected.to(torch.int64).contiguous()
    flags = idx if valid is None else valid.to(torch.int8).contiguous()
    grid, block_d = _row_grid(batch, k, d)
    _scatter_rows_kernel[grid](out, idx, a.contiguous(), m.to(a.dtype).contiguous(), flags, n, k, d,
                               HAS_VALID=valid is not None, BLOCK_D=block_d)
    return out


# ---------------------------------------------------------------------------------------------
# 4. Attention of the selected queries over all keys, causal on original positions
# ---------------------------------------------------------------------------------------------
@triton.jit
def _selected_attention_kernel(
    Q, K, V, O, QPOS, KPOS, LO, HI, FULL,
    stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
    stride_ob, stride_oh, stride_om, NQ, NK, WINDOW, qk_scale,
    H: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    FP32_DOT: tl.constexpr, HAS_FULL: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    hk = h // GROUP
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < NQ

    # -- the query tile, its positions and the key index range its queries can see
    qpos = tl.load(QPOS + b * NQ + offs_m, mask=row_ok, other=0)
    lo = tl.load(LO + b * NQ + offs_m, mask=row_ok, other=NK)  # padding rows: an empty range
    hi = tl.load(HI + b * NQ + offs_m, mask=row_ok, other=0)
    start = (tl.min(lo, axis=0) // BLOCK_N) * BLOCK_N
    end = tl.max(hi, axis=0)
    b64 = b.to(tl.int64)  # batch offsets can pass 2**31 elements
    q = tl.load(Q + b64 * stride_qb + h * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :],
                mask=row_ok[:, None], other=0.0)
    Kbh = K + b64 * stride_kb + hk * stride_kh
    Vbh = V + b64 * stride_vb + hk * stride_vh
    KPOSb = KPOS + b * NK
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)

    # -- key tiles every query of the tile sees whole (no window; keys [0, full) lie at or before the query):
    #    no mask, no bounds checks
    full_end = start
    if HAS_FULL:
        full = tl.load(FULL + b * NQ + offs_m, mask=row_ok, other=NK)
        full_end = tl.maximum((tl.min(full, axis=0) // BLOCK_N) * BLOCK_N, start)
        for s0 in range(start, full_end, BLOCK_N):
            offs_n = s0 + tl.arange(0, BLOCK_N)
            k = tl.load(Kbh + offs_n[:, None] * stride_kn + offs_d[None, :])
            v = tl.load(Vbh + offs_n[:, None] * stride_vn + offs_d[None, :])
            s = dot(q, tl.trans(k), tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), FP32_DOT) * qk_scale
            m_i, l_i, acc = online_softmax_step(s, v, m_i, l_i, acc, FP32_DOT)

    # -- the other key tiles of [start, end): scores, the position rule, one online-softmax step each
    for s0 in range(full_end, end, BLOCK_N):
        offs_n = s0 + tl.arange(0, BLOCK_N)
        in_k = offs_n < end
        k = tl.load(Kbh + offs_n[:, None] * stride_kn + offs_d[None, :], mask=in_k[:, None], other=0.0)
        v = tl.load(Vbh + offs_n[:, None] * stride_vn + offs_d[None, :], mask=in_k[:, None], other=0.0)
        kpos = tl.load(KPOSb + offs_n, mask=in_k, other=0)
        s = dot(q, tl.trans(k), tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), FP32_DOT)
        dist = qpos[:, None] - kpos[None, :]
        visible = in_k[None, :] & (dist >= 0) & (dist < WINDOW)
        s = tl.where(visible, s * qk_scale, float("-inf"))
        m_i, l_i, acc = online_softmax_step(s, v, m_i, l_i, acc, FP32_DOT)

    # -- epilogue: normalise (every real query sees at least its own key) and store
    acc = acc / l_i[:, None]
    tl.store(O + b64 * stride_ob + h * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :],
             acc.to(O.dtype.element_ty), mask=row_ok[:, None])


def key_ranges(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int | None = None):
    """Index range ``[lo, hi)`` of the keys each query may see, int32 ``(batch, k)`` each.

    q_pos ``(batch, k)``, k_pos ``(batch, n)`` original positions. ``hi``: keys from ``hi`` on all lie after the
    query (binary search in the running minimum of the key positions from the right); ``lo``: keys before ``lo``
    all lie at least ``window`` behind it (running maximum from the left). Exact when positions ascend.
    """
    later_min = k_pos.flip(-1).cummin(-1).values.flip(-1).contiguous()
    hi = torch.searchsorted(later_min, q_pos.contiguous(), right=True)
    if window is None:
        lo = torch.zeros_like(hi)
    else:
        earlier_max = k_pos.cummax(-1).values.contiguous()
        lo = torch.searchsorted(earlier_max, (q_pos - window).contiguous(), right=True)
    return lo.to(torch.int32), hi.to(torch.int32)


def _attention_config(head_dim: int) -> dict:
    if interpreting():
        return dict(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=1)
    if head_dim <= 64:
        return dict(BLOCK_M=128, BLOCK_N=64, num_warps=4, num_stages=3)
    if head_dim <= 128:  # H200, 8B shape, a third of 2048 queries selected: 64 x 64 tiles, 4 warps were fastest
        return dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3)
    return dict(BLOCK_M=64, BLOCK_N=32, num_warps=8, num_stages=2)


def selected_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, q_pos: torch.Tensor,
                       k_pos: torch.Tensor, scaling: float, window: int | None = None,
                       config: dict | None = None) -> torch.Tensor:
    """``softmax(q k^T * scaling, keys at positions <= q's [and > q's - window]) v`` for selected queries.

    query ``(batch, heads, k, dim)``, key/value ``(batch, kv_heads, n, dim)``, q_pos ``(batch, k)``, k_pos
    ``(batch, n)``: original positions (every query must see at least one key). Returns ``(batch, k, heads *
    dim)``, the layout ``o_proj`` takes.
    """
    batch, heads, nq, dim = query.shape
    nk = key.shape[2]
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (query, key, value))
    out = torch.empty(batch, nq, heads, dim, dtype=query.dtype, device=query.device)
    if batch * nq == 0:
        return out.view(batch, nq, heads * dim)
    lo, hi = key_ranges(q_pos, k_pos, window)
    # keys [0, full) all lie at or before the query (the running maximum of their positions): no mask needed
    full = None if window is not None else torch.searchsorted(k_pos.cummax(-1).values.contiguous(),
                                                              q_pos.contiguous(), right=True).to(torch.int32)
    qp = q_pos.to(torch.int32).contiguous()
    kp = k_pos.to(torch.int32).contiguous()
    c = _attention_config(dim) if config is None else config
    fp32_dot = query.dtype == torch.float32 or interpreting()
    grid = (triton.cdiv(nq, c["BLOCK_M"]), batch * heads)
    _selected_attention_kernel[grid](
        q, k, v, out, qp, kp, lo, hi, hi if full is None else full,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), out.stride(0), out.stride(2), out.stride(1),
        nq, nk, 2**30 if window is None else int(window), float(scaling) * 1.4426950408889634,
        H=heads, GROUP=heads // key.shape[1], HEAD_DIM=dim, BLOCK_M=c["BLOCK_M"], BLOCK_N=c["BLOCK_N"],
        FP32_DOT=fp32_dot, HAS_FULL=full is not None, num_warps=c["num_warps"], num_stages=c["num_stages"])
    return out.view(batch, nq, heads * dim)


# ---------------------------------------------------------------------------------------------
# The routed layer
# ---------------------------------------------------------------------------------------------
def check_routed_layer_triton(layer: torch.nn.Module, hidden_states: torch.Tensor, kv: str = "all") -> None:
    """Raise ValueError naming the fix when the Triton routed layer cannot run this layer / input."""
    layer_kind(layer)
    if kv != "all":
        raise ValueError(f"backend='triton' runs the paper's kv='all' only; kv={kv!r} (Table 3's ablation) "
                         "needs backend='torch'")
    if logit_softcap(layer) is not None:
        raise ValueError("backend='triton' has no attention logit soft-capping; use backend='torch'")
    if torch.is_grad_enabled() and (hidden_states.requires_grad or any(p.requires_grad for p in layer.parameters())):
        raise ValueError("backend='triton' is inference only (no backward kernels): run under torch.no_grad() "
                         "or use backend='torch'")
    check_triton_inputs(hidden_states, layer.self_attn.head_dim)


def routed_layer_triton(layer: torch.nn.Module, hidden_states: torch.Tensor, selected: torch.Tensor, *,
                        position_embeddings: tuple[torch.Tensor, torch.Tensor], positions: torch.Tensor,
                        past_key_values=None, valid: torch.Tensor | None = None, normed: torch.Tensor | None = None,
                        inplace: bool = False) -> torch.Tensor:
    """:func:`kvlab.orthorank.reference.routed_layer` (``kv="all"``) with the gathers, the attention and the
    scatter in Triton; same arguments. ``inplace``: write the new rows into ``hidden_states`` itself (saves a
    copy of the hidden states; only where nothing else reads the layer's input afterwards)."""
    check_routed_layer_triton(layer, hidden_states)
    attn = layer.self_attn
    batch, seq, _ = hidden_states.shape
    cos, sin = (t.expand(batch, *t.shape[1:]) for t in position_embeddings)
    positions = positions.expand(batch, seq)
    normed = rmsnorm(layer.input_layernorm, hidden_states) if normed is None else normed

    # -- queries of the selected tokens, keys and values of every token (the model's own projections; RoPE in
    #    one pass each for a pre-norm layer, Gemma3's q/k norms through the reference's code)
    x_sel = gather_rows(normed, selected)
    if layer_kind(layer) == "pre" and cos.shape[-1] == attn.head_dim:
        query = rope_heads(attn.q_proj(x_sel), cos, sin, attn.head_dim, index=selected)
        key = rope_heads(attn.k_proj(normed), cos, sin, attn.head_dim)
        value = _heads(attn.v_proj(normed), attn.head_dim)
    else:
        query, key, value = project_qkv(layer, x_sel, take_rows(cos, selected), take_rows(sin, selected),
                                        normed, cos, sin)
    k_pos = positions
    if past_key_values is not None:
        key, value = past_key_values.update(key, value, attn.layer_idx)
        k_pos = _cached_positions(past_key_values, attn.layer_idx, positions, key.shape[2])
    if selected.shape[1] == 0:
        return hidden_states

    # -- attention by original position, the residual adds fused into the gather and the scatter
    out = selected_attention(query, key, value, positions.gather(1, selected), k_pos, attn.scaling,
                             getattr(attn, "sliding_window", None))
    update = attn.o_proj(out)
    if layer_kind(layer) == "pre" and rmsnorm_form(layer.post_attention_layernorm) is not None:
        # the residual add, the post-attention RMSNorm, and the MLP's SiLU * up in fused kernels
        a, x_mlp = gather_add_rmsnorm(hidden_states, selected, update, layer.post_attention_layernorm)
        return scatter_rows(hidden_states, selected, a, mlp(layer.mlp, x_mlp), valid, inplace)
    a = gather_rows(hidden_states, selected, add=attention_update(layer, update))
    return scatter_rows(hidden_states, selected, a, mlp_update(layer, a), valid, inplace)


# ---------------------------------------------------------------------------------------------
# Benchmark: python -m kvlab.orthorank.triton (GPU): the attention of a third of the queries (Algorithm 1's
# share) against dense causal SDPA. The routed layer and the model are `kvlab bench orthorank`.
# ---------------------------------------------------------------------------------------------
if __name__ == "__main__":
    from kvlab.kernels.benchmarking import perf_report_against_sdpa

    def _a_third(q, k, v):
        n = q.shape[2]
        picked = torch.sort(torch.randperm(n, device=q.device)[: n // 3]).values[None]
        q_sel = q[:, :, picked[0]]
        positions = torch.arange(n, device=q.device)[None]
        return lambda: selected_attention(q_sel, k, v, picked, positions, q.shape[-1] ** -0.5)

    perf_report_against_sdpa("orthorank_selected_attention", "selected 1/3 (Triton)", _a_third).run(print_data=True)
