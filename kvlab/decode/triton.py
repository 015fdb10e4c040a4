"""Decode attention over ragged packed KV caches in Triton (split-KV, GQA-packed).

Context: after a KV-cache policy (SepLLM, LaCache, ...) compacts each sequence's cache, the
batch's caches have different lengths. Padding them to the longest and calling SDPA reads (and
first writes) the padding; this kernel reads each kept entry exactly once. Specification:
:func:`kvlab.decode.reference.ragged_decode_reference`.

Decode is memory-bound: per key/value head, ``group = heads / kv_heads`` queries meet each
``(dim,)`` key and value row, ``4 * group * dim`` flops against ``4 * dim`` bytes (bf16). The
floor is ``bytes read / memory bandwidth``. Two things matter:

1. **Read K/V once per kv head (GQA packing).** One program owns a kv head and all ``group`` query
   heads that read it: the queries form the rows of a ``(GROUP_PAD, dim)`` tile (padded to 16
   rows for ``tl.dot``), so a key tile is loaded once for all of them.
2. **Enough programs in flight (split-KV, "flash-decoding").** ``batch * kv_heads`` programs are
   too few to fill the GPU; each sequence's cache is cut into ``SPLIT`` -entry pieces, each piece is
   one program that stores an unnormalised partial result (its base-2 log-sum-exp and its
   normalised output). A second, tiny kernel merges the pieces of each (sequence, kv head)::

       lse = log2(sum_s 2^lse_s);   out = sum_s 2^(lse_s - lse) * out_s

Layout: ``q (batch, heads, dim)``, ``k_packed, v_packed (total, kv_heads, dim)`` with
``cu_seqlens (batch + 1,)`` offsets (the varlen layout of FlashAttention's API).
"""
from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl

__all__ = ["ragged_decode_triton"]


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@triton.jit
def _dot(a, b, acc, FP32_DOT: tl.constexpr):
    # See kvlab.sepllm.triton._dot: fp32 inputs get ieee products, the CPU interpreter fp32 operands.
    if FP32_DOT:
        out = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:
        out = tl.dot(a, b, acc)
    return out


# ---------------------------------------------------------------------------------------------
# Kernel 1: one program per (batch, split of the sequence's cache, kv head)
# ---------------------------------------------------------------------------------------------
@triton.jit
def _ragged_decode_split_kernel(
    Q, K, V, CU, OPART, LPART,
    stride_qb, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
    qk_scale, n_splits,
    HK: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr, SPLIT: tl.constexpr, FP32_DOT: tl.constexpr,
):
    # -- which piece: kv head fastest, so that programs running side by side read the HK adjacent
    #    (dim,) slices of the same cache rows, i.e. whole rows of memory between them
    pid = tl.program_id(0)
    hk = pid % HK
    pid_s = (pid // HK) % n_splits
    b = pid // (HK * n_splits)
    pid_bk = b * HK + hk
    start = tl.load(CU + b)
    end = tl.load(CU + b + 1)
    lo = start + pid_s * SPLIT
    hi = tl.minimum(lo + SPLIT, end)  # lo >= hi: an empty split (short sequence) stores lse = -inf

    # -- load the group's queries as the rows of one tile (rows >= GROUP are padding)
    offs_g = tl.arange(0, GROUP_PAD)
    offs_d = tl.arange(0, HEAD_DIM)
    g_ok = offs_g < GROUP
    q = tl.load(Q + b * stride_qb + (hk * GROUP + offs_g)[:, None] * stride_qh + offs_d[None, :],
                mask=g_ok[:, None], other=0.0)
    m_i = tl.full([GROUP_PAD], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([GROUP_PAD], dtype=tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], dtype=tl.float32)

    # -- stream this split's keys and values once, online softmax in base 2
    for t0 in range(lo, hi, BLOCK_N):
        t = t0 + tl.arange(0, BLOCK_N)
        ok = t < hi
        k = tl.load(K + t[:, None] * stride_kt + hk * stride_kh + offs_d[None, :], mask=ok[:, None], other=0.0)
        v = tl.load(V + t[:, None] * stride_vt + hk * stride_vh + offs_d[None, :], mask=ok[:, None], other=0.0)
        s = _dot(q, tl.trans(k), tl.zeros([GROUP_PAD, BLOCK_N], dtype=tl.float32), FP32_DOT)
        s = tl.where(ok[None, :], s * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)  # the first tile always has a live key, so m_new is finite
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = _dot(p.to(v.dtype), v, acc * alpha[:, None], FP32_DOT)
        m_i = m_new

    # -- epilogue: partial output (normalised) and its log-sum-exp; -inf marks an empty split
    has = l_i > 0
    out = tl.where(has[:, None], acc / tl.where(has, l_i, 1.0)[:, None], 0.0)
    lse = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("-inf"))
    row = (pid_bk * n_splits + pid_s) * GROUP + offs_g
    tl.store(LPART + row, lse, mask=g_ok)
    tl.store(OPART + row[:, None] * HEAD_DIM + offs_d[None, :], out, mask=g_ok[:, None])


# ---------------------------------------------------------------------------------------------
# Kernel 2: merge the splits of one (batch x kv head)
# ---------------------------------------------------------------------------------------------
@triton.jit
def _ragged_decode_combine_kernel(
    OPART, LPART, O, stride_ob, stride_oh, n_splits,
    HK: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
):
    pid_bk = tl.program_id(0)
    b = pid_bk // HK
    hk = pid_bk % HK
    offs_g = tl.arange(0, GROUP_PAD)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_s = tl.arange(0, SPLITS_PAD)
    g_ok = offs_g < GROUP
    base = pid_bk * n_splits * GROUP
    # -- pass 1: the largest lse over splits, per query head
    lse_all = tl.load(LPART + base + offs_s[:, None] * GROUP + offs_g[None, :],
                      mask=(offs_s[:, None] < n_splits) & g_ok[None, :], other=float("-inf"))
    m = tl.max(lse_all, 0)
    m_sub = tl.where(m == float("-inf"), 0.0, m)  # all splits empty: weights 0, output 0
    # -- pass 2: weighted sum of the partial outputs
    denom = tl.zeros([GROUP_PAD], dtype=tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], dtype=tl.float32)
    for s in range(0, n_splits):
        row = base + s * GROUP + offs_g
        w = tl.exp2(tl.load(LPART + row, mask=g_ok, other=float("-inf")) - m_sub)
        part = tl.load(OPART + row[:, None] * HEAD_DIM + offs_d[None, :], mask=g_ok[:, None], other=0.0)
        denom += w
        acc += w[:, None] * part
    out = acc / tl.where(denom > 0, denom, 1.0)[:, None]
    tl.store(O + b * stride_ob + (hk * GROUP + offs_g)[:, None] * stride_oh + offs_d[None, :],
             out.to(O.dtype.element_ty), mask=g_ok[:, None])


def default_config(interpret: bool | None = None) -> dict:
    """Tile sizes; ``split`` is the number of cache entries per program (power of two)."""
    interpret = _interpreting() if interpret is None else interpret
    if interpret:
        return dict(BLOCK_N=16, split=32, num_warps=4, num_stages=1)
    return dict(BLOCK_N=64, split=None, num_warps=4, num_stages=3)


def _pick_split(max_len: int, programs_per_split: int, block_n: int) -> int:
    # About two programs per multiprocessor (132 on an H100/H200), pieces of at least 4 tiles: more,
    # shorter pieces measured slower (pipeline fill per piece; benchmarks/results/tune_*.log).
    target_splits = max(1, triton.cdiv(2 * 132, programs_per_split))
    split = triton.next_power_of_2(max(1, triton.cdiv(max_len, target_splits)))
    return max(4 * block_n, min(split, 8192))


def ragged_decode_triton(q, k_packed, v_packed, cu_seqlens, scale: float | None = None,
                         max_seqlen: int | None = None, config: dict | None = None) -> torch.Tensor:
    """Triton backend of :func:`kvlab.decode.ragged_decode_attention` (inputs assumed valid)."""
    bsz, h, d = q.shape
    hk = k_packed.shape[1]
    group = h // hk
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    cfg = default_config() if config is None else config
    if max_seqlen is None:
        max_seqlen = int((cu_seqlens[1:] - cu_seqlens[:-1]).max()) if bsz else 0
    if q.stride(-1) != 1:
        q = q.contiguous()
    if k_packed.stride(-1) != 1:
        k_packed = k_packed.contiguous()
    if v_packed.stride(-1) != 1:
        v_packed = v_packed.contiguous()
    cu = cu_seqlens.to(torch.int32) if cu_seqlens.dtype != torch.int32 else cu_seqlens
    split = cfg["split"] or _pick_split(max_seqlen, bsz * hk, cfg["BLOCK_N"])
    n_splits = max(1, triton.cdiv(max_seqlen, split))
    group_pad = max(16, triton.next_power_of_2(group))
    fp32_dot = q.dtype == torch.float32 or _interpreting()

    opart = torch.empty(bsz * hk * n_splits * group, d, dtype=torch.float32, device=q.device)
    lpart = torch.empty(bsz * hk * n_splits * group, dtype=torch.float32, device=q.device)
    out = torch.empty_like(q)
    _ragged_decode_split_kernel[(bsz * hk * n_splits,)](
        q, k_packed, v_packed, cu, opart, lpart,
        q.stride(0), q.stride(1), k_packed.stride(0), k_packed.stride(1),
        v_packed.stride(0), v_packed.stride(1),
        scale * 1.4426950408889634, n_splits,
        HK=hk, GROUP=group, GROUP_PAD=group_pad, HEAD_DIM=d, BLOCK_N=cfg["BLOCK_N"], SPLIT=split,
        FP32_DOT=fp32_dot, num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )
    _ragged_decode_combine_kernel[(bsz * hk,)](
        opart, lpart, out, out.stride(0), out.stride(1), n_splits,
        HK=hk, GROUP=group, GROUP_PAD=group_pad, HEAD_DIM=d,
        SPLITS_PAD=triton.next_power_of_2(n_splits), num_warps=4,
    )
    return out


if __name__ == "__main__":
    if not torch.cuda.is_available():
        raise SystemExit("the benchmark needs a CUDA GPU; tests run on CPU with TRITON_INTERPRET=1")
    from .reference import pad_packed, ragged_decode_padded_sdpa

    @triton.testing.perf_report(triton.testing.Benchmark(
        x_names=["B"], x_vals=[1, 4, 16, 32], line_arg="provider", line_vals=["sdpa_padded", "triton"],
        line_names=["pad + SDPA (enable_gqa)", "Triton ragged"], ylabel="ms",
        plot_name="ragged_decode", args={"H": 32, "HK": 8, "D": 128}))
    def bench(B, H, HK, D, provider):
        dev = torch.device("cuda")
        lens = torch.randint(6144, 8193, (B,), device=dev)
        cu = torch.zeros(B + 1, dtype=torch.int32, device=dev)
        cu[1:] = torch.cumsum(lens, 0)
        total = int(cu[-1])
        q = torch.randn(B, H, D, device=dev, dtype=torch.bfloat16)
        k, v = (torch.randn(total, HK, D, device=dev, dtype=torch.bfloat16) for _ in range(2))
        if provider == "triton":
            fn = lambda: ragged_decode_triton(q, k, v, cu, max_seqlen=8192)  # noqa: E731
        else:
            kp, vp, valid = pad_packed(k, v, cu, 8192)
            fn = lambda: ragged_decode_padded_sdpa(q, kp, vp, valid)  # noqa: E731
        return triton.testing.do_bench(fn, return_mode="median")

    bench.run(print_data=True)
