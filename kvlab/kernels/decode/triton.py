"""Decode attention over ragged packed KV caches in Triton (balanced split-KV, GQA-packed).

Context: after a KV-cache policy (SepLLM, LaCache, ...) compacts each sequence's cache, the
batch's caches have different lengths. Padding them to the longest and calling SDPA reads (and
first writes) the padding; this kernel reads each kept entry exactly once. Specification:
:func:`kvlab.kernels.decode.reference.ragged_decode_reference`.

Decode is memory-bound: per key/value head, ``group = heads / kv_heads`` queries meet each
``(dim,)`` key and value row, ``4 * group * dim`` flops against ``4 * dim`` bytes (bf16). The
floor is ``bytes read / memory bandwidth``. Three things matter:

1. **Read K/V once per kv head (GQA packing).** One program owns a kv head and all ``group`` query
   heads that read it: the queries form the rows of a ``(GROUP_PAD, dim)`` tile (padded to 16
   rows for ``tl.dot``), so a key tile is loaded once for all of them.
2. **Every multiprocessor busy until the end (balanced split-KV).** Cutting each sequence into
   pieces sized from the longest one ("flash-decoding") leaves multiprocessors idle when the
   lengths differ a lot: one 64k cache among fifteen 1k ones measured 1.8x the bandwidth floor
   that way. Instead the packed token axis ``[0, total)`` itself is cut into ``chunks`` equal
   ranges per kv head, about as many programs as the GPU holds at once; a range may cover the end
   of one sequence and the start of the next, and the program stores one partial result (base-2
   log-sum-exp and normalised output) per sequence it touches. All programs read the same number
   of bytes and finish together (GPU time 1.3x the floor on that batch, 1.06x on 16 caches of
   6k-8k entries).
3. **One cheap merge.** A second, tiny kernel merges the partials of each (sequence, kv head)::

       lse = log2(sum_j 2^lse_j);   out = sum_j 2^(lse_j - lse) * out_j

   Sequence ``b`` has partials from chunks ``cu[b] // chunk`` to ``(cu[b+1] - 1) // chunk``, so the
   merge knows where they are without any bookkeeping written by the first kernel.

Launch cost: the kernels' GPU time is close to the floor, but one eager call also spends 60-80 us
of host time (Python and two Triton launches) before and between the launches; decode loops
should capture the step in a CUDA graph (``benchmarks/README.md``, run 7).

Layout: ``q (batch, heads, dim)``, ``k_packed, v_packed (total, kv_heads, dim)`` with
``cu_seqlens (batch + 1,)`` offsets (the varlen layout of FlashAttention's API).
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kvlab.kernels.triton_utils import dot as _dot  # fp32 inputs get ieee products, the interpreter fp32 operands
from kvlab.kernels.triton_utils import interpreting as _interpreting

__all__ = ["ragged_decode_triton"]


# ---------------------------------------------------------------------------------------------
# Kernel 1: one program per (equal range of the packed token axis, kv head)
# ---------------------------------------------------------------------------------------------
@triton.jit
def _ragged_decode_chunk_kernel(
    Q, K, V, CU, OPART, LPART,
    stride_qb, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
    qk_scale, B, T, CHUNK, MAXP,
    HK: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr, FP32_DOT: tl.constexpr,
):
    # -- which range: kv head fastest, so that programs running side by side read the HK adjacent
    #    (dim,) slices of the same cache rows, i.e. whole rows of memory between them
    pid = tl.program_id(0)
    hk = pid % HK
    c = pid // HK
    c0 = c * CHUNK
    c1 = tl.minimum(c0 + CHUNK, T)

    # -- the first sequence that ends after c0: count the sequence ends <= c0 (cu is sorted)
    b = 0
    for b0 in range(0, B, BLOCK_B):
        offs_b = b0 + tl.arange(0, BLOCK_B)
        ends = tl.load(CU + 1 + offs_b, mask=offs_b < B, other=0)
        b += tl.sum(((offs_b < B) & (ends <= c0)).to(tl.int32), axis=0)

    offs_g = tl.arange(0, GROUP_PAD)
    offs_d = tl.arange(0, HEAD_DIM)
    g_ok = offs_g < GROUP
    seq_start = tl.load(CU + b)  # b <= B: cu has B + 1 entries
    # -- every sequence that starts before c1 gets one partial result from this range
    while (b < B) & (seq_start < c1):
        seq_end = tl.load(CU + b + 1)
        lo = tl.maximum(seq_start, c0)
        hi = tl.minimum(seq_end, c1)  # lo >= hi only for an empty sequence (its merge reads nothing)

        # -- load the group's queries as the rows of one tile (rows >= GROUP are padding)
        q = tl.load(Q + b * stride_qb + (hk * GROUP + offs_g)[:, None] * stride_qh + offs_d[None, :],
                    mask=g_ok[:, None], other=0.0)
        m_i = tl.full([GROUP_PAD], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([GROUP_PAD], dtype=tl.float32)
        acc = tl.zeros([GROUP_PAD, HEAD_DIM], dtype=tl.float32)

        # -- stream the keys and values of [lo, hi) once, online softmax in base 2
        for t0 in range(lo, hi, BLOCK_N):
            t = t0 + tl.arange(0, BLOCK_N)
            ok = t < hi
            k = tl.load(K + t[:, None] * stride_kt + hk * stride_kh + offs_d[None, :], mask=ok[:, None], other=0.0)
            v = tl.load(V + t[:, None] * stride_vt + hk * stride_vh + offs_d[None, :], mask=ok[:, None], other=0.0)
            s = _dot(q, tl.trans(k), tl.zeros([GROUP_PAD, BLOCK_N], dtype=tl.float32), FP32_DOT)
            s = tl.where(ok[None, :], s * qk_scale, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))  # the first tile always has a live key: finite
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = _dot(p.to(v.dtype), v, acc * alpha[:, None], FP32_DOT)
            m_i = m_new

        # -- epilogue: partial output (normalised) and its log-sum-exp, in slot j of sequence b
        has = l_i > 0
        out = tl.where(has[:, None], acc / tl.where(has, l_i, 1.0)[:, None], 0.0)
        lse = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("-inf"))
        j = c - seq_start // CHUNK
        row = ((b * HK + hk) * MAXP + j) * GROUP + offs_g
        tl.store(LPART + row, lse, mask=g_ok)
        tl.store(OPART + row[:, None] * HEAD_DIM + offs_d[None, :], out, mask=g_ok[:, None])
        b += 1
        seq_start = seq_end


# ---------------------------------------------------------------------------------------------
# Kernel 2: merge the partials of one (sequence, kv head)
# ---------------------------------------------------------------------------------------------
@triton.jit
def _ragged_decode_merge_kernel(
    OPART, LPART, O, CU, stride_ob, stride_oh, CHUNK, MAXP,
    HK: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
):
    pid_bk = tl.program_id(0)
    b = pid_bk // HK
    hk = pid_bk % HK
    offs_g = tl.arange(0, GROUP_PAD)
    offs_d = tl.arange(0, HEAD_DIM)
    g_ok = offs_g < GROUP
    seq_start = tl.load(CU + b)
    seq_end = tl.load(CU + b + 1)
    # the ranges [c * CHUNK, (c + 1) * CHUNK) that overlap [seq_start, seq_end); none if empty
    n_parts = tl.where(seq_end > seq_start, (seq_end - 1) // CHUNK - seq_start // CHUNK + 1, 0)
    base = (pid_bk * MAXP) * GROUP
    # -- online merge: running max m, running weight sum, rescaled accumulator
    m = tl.full([GROUP_PAD], float("-inf"), dtype=tl.float32)
    denom = tl.zeros([GROUP_PAD], dtype=tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], dtype=tl.float32)
    for j in range(0, n_parts):
        row = base + j * GROUP + offs_g
        lse = tl.load(LPART + row, mask=g_ok, other=float("-inf"))
        part = tl.load(OPART + row[:, None] * HEAD_DIM + offs_d[None, :], mask=g_ok[:, None], other=0.0)
        m_new = tl.maximum(m, lse)
        m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)  # padding rows stay -inf: weights 0
        alpha = tl.exp2(m - m_sub)
        w = tl.exp2(lse - m_sub)
        denom = denom * alpha + w
        acc = acc * alpha[:, None] + w[:, None] * part
        m = m_new
    # -- epilogue: an empty sequence (no partials) gets zeros
    out = acc / tl.where(denom > 0, denom, 1.0)[:, None]
    tl.store(O + b * stride_ob + (hk * GROUP + offs_g)[:, None] * stride_oh + offs_d[None, :],
             out.to(O.dtype.element_ty), mask=g_ok[:, None])


def default_config(interpret: bool | None = None) -> dict:
    """Tile sizes and the grid: ``programs_per_sm`` programs per multiprocessor in all (they share
    the packed entries equally), or ``chunks`` ranges per kv head when given (tests, sweeps)."""
    interpret = _interpreting() if interpret is None else interpret
    if interpret:
        return dict(BLOCK_N=16, chunks=3, programs_per_sm=None, num_warps=4, num_stages=1)
    # chosen on an H200 by GPU time (CUDA graph replay) and eager time: benchmarks/results/kernels/profile_h200_run7b.log
    return dict(BLOCK_N=64, chunks=None, programs_per_sm=4, num_warps=4, num_stages=2)


_SM_COUNT: dict = {}


def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 4
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SM_COUNT:
        _SM_COUNT[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _SM_COUNT[idx]


def ragged_decode_triton(q, k_packed, v_packed, cu_seqlens, scale: float | None = None,
                         max_seqlen: int | None = None, config: dict | None = None) -> torch.Tensor:
    """Triton backend of :func:`kvlab.kernels.decode.ragged_decode_attention` (inputs assumed valid)."""
    bsz, h, d = q.shape
    hk = k_packed.shape[1]
    group = h // hk
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    cfg = default_config() if config is None else config
    if q.stride(-1) != 1:
        q = q.contiguous()
    if k_packed.stride(-1) != 1:
        k_packed = k_packed.contiguous()
    if v_packed.stride(-1) != 1:
        v_packed = v_packed.contiguous()
    cu = cu_seqlens.to(torch.int32) if cu_seqlens.dtype != torch.int32 else cu_seqlens
    out = torch.empty_like(q)
    if bsz == 0:
        return out
    # Cut [0, total) into equal ranges; total = the packed rows (>= cu[-1]; no device read).
    total = k_packed.shape[0]
    chunks = cfg.get("chunks") or max(1, round(cfg["programs_per_sm"] * _sm_count(q.device) / hk))
    chunk = max(1, triton.cdiv(total, chunks))
    n_chunks = max(1, triton.cdiv(total, chunk))
    # partial slots per sequence: a sequence of length L overlaps at most cdiv(L, chunk) + 1 ranges
    max_parts = n_chunks if max_seqlen is None else min(n_chunks, triton.cdiv(max_seqlen, chunk) + 1)
    group_pad = max(16, triton.next_power_of_2(group))
    fp32_dot = q.dtype == torch.float32 or _interpreting()

    opart = torch.empty(bsz * hk * max_parts * group, d, dtype=torch.float32, device=q.device)
    lpart = torch.empty(bsz * hk * max_parts * group, dtype=torch.float32, device=q.device)
    _ragged_decode_chunk_kernel[(hk * n_chunks,)](
        q, k_packed, v_packed, cu, opart, lpart,
        q.stride(0), q.stride(1), k_packed.stride(0), k_packed.stride(1),
        v_packed.stride(0), v_packed.stride(1),
        scale * 1.4426950408889634, bsz, total, chunk, max_parts,
        HK=hk, GROUP=group, GROUP_PAD=group_pad, HEAD_DIM=d, BLOCK_N=cfg["BLOCK_N"],
        BLOCK_B=min(1024, triton.next_power_of_2(bsz)), FP32_DOT=fp32_dot,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )
    _ragged_decode_merge_kernel[(bsz * hk,)](
        opart, lpart, out, cu, out.stride(0), out.stride(1), chunk, max_parts,
        HK=hk, GROUP=group, GROUP_PAD=group_pad, HEAD_DIM=d, num_warps=4,
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
