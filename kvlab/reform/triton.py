"""REFORM's compression step in Triton: heavy-hitter scores and the kept-entry gather.

Paper: Song et al., "Compress, Gather, and Recompute: REFORMing Long-Context Processing in Transformers"
(2025, https://arxiv.org/abs/2506.01215), Sec. 2.1 and App. C ("restrict attention score computations to
the last 128 tokens of each chunk"). Specification: :func:`kvlab.reform.reference.h2o_scores` and
:meth:`kvlab.reform.reference.CompressedCache.compress`. Why a kernel: the profile of a 1M-token run
(SmolLM2-135M, one H100) spent 21 % of the time scoring and 15 % compressing, both above the issue's 15 %
bar; neither is a matmul of the model.

1. Heavy-hitter scores (:func:`h2o_scores_triton`)
--------------------------------------------------
After each chunk, every layer below the exit scores its ``n`` cached entries by the attention the chunk's
last ``w`` (128) queries give them, summed over query heads and queries::

    score[j] = sum_{h, i} softmax_j(q[h, i] . k[h // group, j] * scale   masked causally)

The eager reference builds the ``(heads, w, n)`` logits, masks, softmaxes and sums them: several passes
over a matrix of 9 x 128 x 10k floats per layer and chunk. Here nothing of that size leaves the chip. At the
sizes REFORM scores (a cache budget plus a chunk: 4096 keys for SmolLM2) the eager path is only ~0.1 ms of GPU
work, so what decides is the number of launches and PyTorch ops per call: this path makes two launches and one
PyTorch op (the sum over key/value heads). Both passes run one program per (span of keys, key/value head): a span
is a run of ``BLOCK_N`` tiles, as many spans as fill the GPU twice over (at most 64); each program walks the
query heads of its group (GQA) and the ``w`` queries in tiles of ``BLOCK_M``:

* pass 1 (``_h2o_stats_kernel``): for every query row the span's max ``m`` and sum ``l = sum exp2(s - m)``
  (FlashAttention's online-softmax statistics, base 2, ``s`` already multiplied by ``scale * log2(e)``),
  written per span: ``(spans, batch, heads, w)``.
* pass 2 (``_h2o_scores_kernel``): each program first combines every span's statistics of its rows into
  ``lse = M + log2(sum_t l_t * 2^(m_t - M))``, ``M = max_t m_t`` (``_lse_rows``; the same fixed order in
  every program), then recomputes ``s`` for its keys, ``p = exp2(s - lse)`` where visible, summed over rows
  and over the group's heads: one float per key and key/value head, summed over the key/value heads in
  PyTorch (a fixed order: no atomics, the result does not vary run to run).

float32 inputs take the dot products as three tf32 tensor-core products (``input_precision="tf32x3"``:
``hi*hi + hi*lo + lo*hi``, close to fp32 and checked against the float64 oracle like the rest); plain fp32
FMA products (``config={"fp32_precision": "ieee"}``, and the CPU interpreter) took 221 ms against 5.9 ms at 256k
keys on an H200. Measured there (``benchmarks/results/reform/scoring_h200_2026_11_25.md``): bf16 2.3x the eager
path at 256k keys, fp32 0.93x (the kernels' device time 5.6 ms against 5.4: 192 programs are 1.45 waves on 132
SMs and each walks 64 key tiles in turn); at the 4096 keys a REFORM run scores a call is host-bound (about
0.29 ms of launches for 0.06-0.13 ms of device work), so ``backend="auto"`` stays eager.

The mask reads the query and key positions from tensors (causal and, for Gemma3's local layers, the
sliding window), so the kernel takes exactly the reference's arguments.

2. Compression gather (:func:`compress_kv_triton`)
--------------------------------------------------
Kept entry ``j`` (ascending source indices ``idx``) moves to position ``j``: its key is re-rotated by
``delta = j - idx[j]`` (RoPE is a rotation per frequency pair, so one more rotation by the shift is
enough), its value copied. The eager path runs ~20 small kernels per layer (gather, angles, cos, sin,
rotate-half, casts) plus a host sync; here it is one launch. The cosines and sines come from a table of
every shift ``0..n-1``, computed in float64 as :func:`kvlab.core.rerotate` does and kept across layers and
chunks (same frequencies, same cache length), and are applied in float32. The result goes to fresh buffers,
not in place: entry ``j`` reads row ``idx[j] >= j``, which a parallel program writing row ``idx[j]`` may
already have overwritten; the next chunk's ``torch.cat`` allocates anyway. The choice of ``idx`` (top-k by
score, initial and recent kept) stays :func:`kvlab.reform.reference.h2o_keep` (``torch.topk``).

Tests: ``tests/test_reform.py`` (``-k triton``; the fp64 reference, CPU with ``TRITON_INTERPRET=1``, GPU for
real shapes); timings: ``python -m kvlab bench reform scoring`` and ``profile``.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kvlab.kernels.triton_utils import dot as _dot
from kvlab.kernels.triton_utils import interpreting as _interpreting

__all__ = ["h2o_scores_triton", "compress_kv_triton", "default_config"]

_LOG2E = 1.4426950408889634


# ---------------------------------------------------------------------------------------------
# Heavy-hitter scores: one score tile of a (key tile, query head, query tile)
# ---------------------------------------------------------------------------------------------
@triton.jit
def _score_tile(Q, QPOS, k, kpos, k_ok, b, h, m0, W, WINDOW, qk_scale, stride_qb, stride_qh, stride_qn,
                HAS_WINDOW: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                FP32_DOT: tl.constexpr):
    # Base-2 scores s = q k^T * scale * log2(e) of query rows [m0, m0 + BLOCK_M) of head h against the key
    # tile, and which entries count: the query sees the key (causal, within the window) and both exist.
    offs_m = m0 + tl.arange(0, BLOCK_M)
    q_ok = offs_m < W
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qn + offs_d[None, :],
                mask=q_ok[:, None], other=0.0)
    qpos = tl.load(QPOS + offs_m, mask=q_ok, other=0)
    if FP32_DOT == 2:  # float32 on the GPU: three tf32 tensor-core products (hi*hi + hi*lo + lo*hi), ~fp32
        s = tl.dot(q, tl.trans(k), input_precision="tf32x3") * qk_scale
    else:  # 1: true fp32 products (float32 with fp32_precision="ieee", the CPU interpreter); 0: bf16/fp16
        s = _dot(q, tl.trans(k), tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), FP32_DOT == 1) * qk_scale
    diff = qpos[:, None] - kpos[None, :]
    visible = (diff >= 0) & q_ok[:, None] & k_ok[None, :]
    if HAS_WINDOW:  # Gemma3's local layers
        visible = visible & (diff < WINDOW)
    return s, visible, offs_m, q_ok


@triton.jit
def _key_tile(K, KPOS, b, hk, t, N, stride_kb, stride_kh, stride_kn, HEAD_DIM: tl.constexpr,
              BLOCK_N: tl.constexpr):
    # Keys [t * BLOCK_N, (t + 1) * BLOCK_N) of key/value head hk, their positions, which exist.
    offs_n = t * BLOCK_N + tl.arange(0, BLOCK_N)
    k_ok = offs_n < N
    offs_d = tl.arange(0, HEAD_DIM)
    k = tl.load(K + b * stride_kb + hk * stride_kh + offs_n[:, None] * stride_kn + offs_d[None, :],
                mask=k_ok[:, None], other=0.0)
    kpos = tl.load(KPOS + offs_n, mask=k_ok, other=0)
    return k, kpos, k_ok, offs_n


@triton.jit
def _h2o_stats_kernel(
    Q, K, QPOS, KPOS, MAX, SUM,
    stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn,
    B, N, W, WINDOW, SPAN, qk_scale, H: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
    HAS_WINDOW: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, FP32_DOT: tl.constexpr,
):
    # Pass 1: per query row, the max and the sum of exp2(s - max) over this program's span of keys.
    sp = tl.program_id(0)
    HK: tl.constexpr = H // GROUP
    b = tl.program_id(1) // HK
    hk = tl.program_id(1) % HK
    k_lo = sp * SPAN
    k_hi = tl.minimum(k_lo + SPAN, N)

    for g in range(GROUP):
        h = hk * GROUP + g
        for m0 in range(0, W, BLOCK_M):
            m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
            l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
            for t0 in range(k_lo, k_hi, BLOCK_N):
                # -- load a key tile (from L2 after the first head), score it against the query tile
                k, kpos, k_ok, offs_n = _key_tile(K, KPOS, b, hk, t0 // BLOCK_N, k_hi, stride_kb, stride_kh,
                                                  stride_kn, HEAD_DIM, BLOCK_N)
                s, visible, offs_m, q_ok = _score_tile(
                    Q, QPOS, k, kpos, k_ok, b, h, m0, W, WINDOW, qk_scale, stride_qb, stride_qh, stride_qn,
                    HAS_WINDOW, HEAD_DIM, BLOCK_M, BLOCK_N, FP32_DOT)
                # -- compute: online max and sum (a row hidden from every key so far keeps -inf, 0)
                s = tl.where(visible, s, float("-inf"))
                m_new = tl.maximum(m_i, tl.max(s, 1))
                m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)
                l_i = l_i * tl.exp2(m_i - m_sub) + tl.sum(tl.exp2(s - m_sub[:, None]), 1)
                m_i = m_new
            # -- epilogue: (spans, batch, heads, w) float32
            offs_m = m0 + tl.arange(0, BLOCK_M)
            out = ((sp * B + b) * H + h) * W + offs_m
            tl.store(MAX + out, m_i, mask=offs_m < W)
            tl.store(SUM + out, l_i, mask=offs_m < W)


@triton.jit
def _lse_rows(MAX, SUM, b, h, m0, S, B, W, H: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_M: tl.constexpr):
    # Base-2 log-sum-exp of query rows [m0, m0 + BLOCK_M) of head h, combined from the S spans' statistics
    # (the same fixed order in every program: the result does not depend on the launch).
    offs_m = m0 + tl.arange(0, BLOCK_M)
    q_ok = offs_m < W
    top = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    total = tl.zeros([BLOCK_M], dtype=tl.float32)
    for s0 in range(0, S, BLOCK_S):
        offs_s = s0 + tl.arange(0, BLOCK_S)
        ok = (offs_s < S)[:, None] & q_ok[None, :]
        idx = ((offs_s[:, None] * B + b) * H + h) * W + offs_m[None, :]
        m = tl.load(MAX + idx, mask=ok, other=float("-inf"))
        l = tl.load(SUM + idx, mask=ok, other=0.0)
        new = tl.maximum(top, tl.max(m, 0))
        sub = tl.where(new == float("-inf"), 0.0, new)
        total = total * tl.exp2(top - sub) + tl.sum(l * tl.exp2(m - sub[None, :]), 0)
        top = new
    return tl.where(top == float("-inf"), 0.0, top) + tl.log2(tl.maximum(total, 1e-38))  # no key seen: p = 0


@triton.jit
def _h2o_scores_kernel(
    Q, K, QPOS, KPOS, MAX, SUM, OUT,
    stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn,
    B, N, W, WINDOW, SPAN, S, qk_scale, H: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
    HAS_WINDOW: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_S: tl.constexpr,
    FP32_DOT: tl.constexpr,
):
    # Pass 2: the probabilities p = exp2(s - lse) of this span's keys, summed over queries and the group's heads.
    sp = tl.program_id(0)
    HK: tl.constexpr = H // GROUP
    b = tl.program_id(1) // HK
    hk = tl.program_id(1) % HK
    k_lo = sp * SPAN
    k_hi = tl.minimum(k_lo + SPAN, N)
    OUTb = OUT + (b * HK + hk) * N

    for g in range(GROUP):
        h = hk * GROUP + g
        for m0 in range(0, W, BLOCK_M):
            # -- the rows' log-sum-exp from every span's statistics (no launch, no PyTorch op in between)
            lse = _lse_rows(MAX, SUM, b, h, m0, S, B, W, H, BLOCK_S, BLOCK_M)
            later = (g + m0) > 0  # the first head and query tile of the program start from 0
            for t0 in range(k_lo, k_hi, BLOCK_N):
                k, kpos, k_ok, offs_n = _key_tile(K, KPOS, b, hk, t0 // BLOCK_N, k_hi, stride_kb, stride_kh,
                                                  stride_kn, HEAD_DIM, BLOCK_N)
                s, visible, offs_m, q_ok = _score_tile(
                    Q, QPOS, k, kpos, k_ok, b, h, m0, W, WINDOW, qk_scale, stride_qb, stride_qh, stride_qn,
                    HAS_WINDOW, HEAD_DIM, BLOCK_M, BLOCK_N, FP32_DOT)
                p = tl.where(visible, tl.exp2(s - lse[:, None]), 0.0)
                # -- epilogue: add to what the earlier heads / query tiles of this program left, (batch, kv_heads, n)
                prev = tl.load(OUTb + offs_n, mask=k_ok & later, other=0.0)
                tl.store(OUTb + offs_n, prev + tl.sum(p, 0), mask=k_ok)
            tl.debug_barrier()  # the next head reads back what this one stored


# ---------------------------------------------------------------------------------------------
# Compression gather: kept entries moved to consecutive positions, keys re-rotated
# ---------------------------------------------------------------------------------------------
@triton.jit
def _compress_kernel(
    K, V, IDX, COS, SIN, KO, VO,
    stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
    M, HK: tl.constexpr, HALF: tl.constexpr, BLOCK: tl.constexpr,
):
    # One program per (BLOCK kept entries, batch x key/value head).
    j = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    bh = tl.program_id(1)
    b = bh // HK
    hk = bh % HK
    live = j < M
    offs_h = tl.arange(0, HALF)

    # -- load: source rows of the kept entries (padding slots read row 0 and are not stored), and the
    #    rotation by delta = j - src <= 0 from the table of shifts: cos(delta f) = cos(-delta f),
    #    sin(delta f) = -sin(-delta f)
    src = tl.load(IDX + j, mask=live, other=0)
    rows_k = K + b * stride_kb + hk * stride_kh + src[:, None] * stride_kn
    k1 = tl.load(rows_k + offs_h[None, :]).to(tl.float32)
    k2 = tl.load(rows_k + HALF + offs_h[None, :]).to(tl.float32)
    shift = tl.where(live, src - j, 0)
    c = tl.load(COS + shift[:, None] * HALF + offs_h[None, :])
    s = -tl.load(SIN + shift[:, None] * HALF + offs_h[None, :])

    # -- compute: k * cos + rotate_half(k) * sin, rotate_half(k) = (-k2, k1), in float32
    out1 = k1 * c - k2 * s
    out2 = k2 * c + k1 * s

    # -- epilogue: keys and values of entry j in contiguous (batch, kv_heads, m, dim) outputs
    dst = bh * M * (2 * HALF) + j[:, None] * (2 * HALF)
    tl.store(KO + dst + offs_h[None, :], out1.to(KO.dtype.element_ty), mask=live[:, None])
    tl.store(KO + dst + HALF + offs_h[None, :], out2.to(KO.dtype.element_ty), mask=live[:, None])
    offs_d = tl.arange(0, 2 * HALF)
    val = tl.load(V + b * stride_vb + hk * stride_vh + src[:, None] * stride_vn + offs_d[None, :])
    tl.store(VO + dst + offs_d[None, :], val, mask=live[:, None])


# ---------------------------------------------------------------------------------------------
# Launch configuration and host wrappers
# ---------------------------------------------------------------------------------------------
def default_config(interpret: bool | None = None) -> dict:
    """Tile sizes: ``BLOCK_M`` queries and ``BLOCK_N`` keys per score tile, ``BLOCK`` entries per gather
    program; one small config in the CPU interpreter."""
    interpret = _interpreting() if interpret is None else interpret
    if interpret:
        return dict(BLOCK_M=16, BLOCK_N=16, BLOCK=16, num_warps=4)
    # 128 queries (the paper's window) in one tile; 64 keys per program gives 192 programs at n = 4096 with
    # 3 key/value heads (SmolLM2), enough to fill an H100's 132 SMs.
    return dict(BLOCK_M=128, BLOCK_N=64, BLOCK=64, num_warps=4)


_SM_COUNT: dict = {}


def _spans(n: int, programs_per_span: int, block_n: int, device) -> tuple[int, int]:
    """``(span, spans)``: keys per program (a multiple of ``block_n``) and the number of programs along the keys,
    enough to fill the GPU twice over but at most 64 (pass 2 combines every span's statistics)."""
    tiles = triton.cdiv(n, block_n)
    if _interpreting():
        target = 3  # small: several spans, and spans of several tiles, on the test shapes
    else:
        key = str(device)
        if key not in _SM_COUNT:
            _SM_COUNT[key] = torch.cuda.get_device_properties(device).multi_processor_count
        target = min(64, max(1, triton.cdiv(2 * _SM_COUNT[key], programs_per_span)))
    per_span = triton.cdiv(tiles, min(tiles, target))
    return per_span * block_n, triton.cdiv(tiles, per_span)


def _dot_mode(dtype: torch.dtype, cfg: dict) -> int:
    """0: bf16/fp16 tensor cores; 1: true fp32 products (the interpreter, or ``fp32_precision="ieee"``);
    2: float32 as three tf32 products (``"tf32x3"``, the default on the GPU: the plain fp32 FMA path makes the
    kernel's two passes over the keys slower than the eager matmul at 256k keys)."""
    if dtype != torch.float32:
        return 1 if _interpreting() else 0
    if _interpreting():
        return 1
    precision = cfg.get("fp32_precision", "tf32x3")
    if precision not in ("tf32x3", "ieee"):
        raise ValueError(f"config fp32_precision must be 'tf32x3' or 'ieee', got {precision!r}")
    return 2 if precision == "tf32x3" else 1


def h2o_scores_triton(query: torch.Tensor, keys: torch.Tensor, scaling: float, q_pos: torch.Tensor,
                      k_pos: torch.Tensor, window: int | None = None, config: dict | None = None) -> torch.Tensor:
    """Heavy-hitter scores, the arguments and result of :func:`kvlab.reform.reference.h2o_scores`.

    query ``(batch, heads, w, dim)``, keys ``(batch, kv_heads, n, dim)`` (RoPE-rotated, ``heads % kv_heads
    == 0``), ``q_pos`` ``(w,)``, ``k_pos`` ``(n,)`` integer positions. Returns ``(batch, n)`` float32:
    ``sum_{heads, queries} softmax(q k^T * scaling)``, causal (and within ``window``). Inputs are assumed
    valid (``kvlab.reform.api`` checks the model once).
    """
    cfg = default_config() if config is None else config
    bsz, h, w, d = query.shape
    hk, n = keys.shape[1], keys.shape[2]
    query = query if query.stride(-1) == 1 else query.contiguous()
    keys = keys if keys.stride(-1) == 1 else keys.contiguous()
    q_pos = q_pos.to(device=query.device, dtype=torch.int64).contiguous()
    k_pos = k_pos.to(device=query.device, dtype=torch.int64).contiguous()
    span, spans = _spans(n, bsz * hk, cfg["BLOCK_N"], query.device)
    grid = (spans, bsz * hk)
    strides = (query.stride(0), query.stride(1), query.stride(2), keys.stride(0), keys.stride(1), keys.stride(2))
    meta = dict(H=h, GROUP=h // hk, HEAD_DIM=d, HAS_WINDOW=window is not None, BLOCK_M=cfg["BLOCK_M"],
                BLOCK_N=cfg["BLOCK_N"], FP32_DOT=_dot_mode(query.dtype, cfg),
                num_warps=cfg["num_warps"])
    qk_scale = float(scaling) * _LOG2E
    window = 0 if window is None else int(window)

    # -- pass 1: per-span statistics of every query row
    stats = torch.empty(2, spans, bsz, h, w, dtype=torch.float32, device=query.device)
    _h2o_stats_kernel[grid](query, keys, q_pos, k_pos, stats[0], stats[1], *strides, bsz, n, w, window, span,
                            qk_scale, **meta)
    # -- pass 2: combine them per row, then probabilities summed per key and key/value head; then over the
    #    key/value heads (a fixed order: no atomics, the result does not vary run to run)
    out = torch.empty(bsz, hk, n, dtype=torch.float32, device=query.device)
    _h2o_scores_kernel[grid](query, keys, q_pos, k_pos, stats[0], stats[1], out, *strides, bsz, n, w, window, span,
                             spans, qk_scale, BLOCK_S=triton.next_power_of_2(spans), **meta)
    return out[:, 0] if hk == 1 else out.sum(dim=1)


_TABLES: dict = {}


def _rotation_table(inv_freq: torch.Tensor, n: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """``cos``, ``sin`` ``(>= n, dim/2)`` float32 of the angles ``shift * inv_freq`` for shifts ``0..n-1``,
    computed in float64 as :func:`kvlab.core.rerotate` does (so the kernel rotates by the very same values).

    Every layer of a model shares its frequencies and every chunk the same cache length, so the table is
    computed once and kept (keyed by the frequency tensor itself, which the entry holds: its address cannot be
    reused while cached; a new version of it, or a longer cache, recomputes the table).
    """
    key = (id(inv_freq), str(device))
    hit = _TABLES.get(key)
    if hit is None or hit[0] is not inv_freq or hit[1] != inv_freq._version or hit[2].shape[0] < n:
        if len(_TABLES) >= 16:
            _TABLES.clear()
        angles = torch.arange(n, device=device, dtype=torch.float64)[:, None] * inv_freq.to(device, torch.float64)
        hit = (inv_freq, inv_freq._version, angles.cos().float().contiguous(), angles.sin().float().contiguous())
        _TABLES[key] = hit
    return hit[2], hit[3]


def compress_kv_triton(keys: torch.Tensor, values: torch.Tensor, index: torch.Tensor, inv_freq: torch.Tensor,
                       config: dict | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Keep entries ``index`` ``(m,)`` (ascending) of one layer: entry ``index[j]`` moves to position ``j``.

    keys, values ``(batch, kv_heads, n, dim)``; inv_freq ``(dim/2,)`` the layer's RoPE frequencies. Returns new
    contiguous ``(batch, kv_heads, m, dim)`` keys (re-rotated by ``j - index[j]``) and values, in the input
    dtypes: what :meth:`kvlab.reform.reference.CompressedCache.compress` computes for one layer.
    """
    cfg = default_config() if config is None else config
    bsz, hk, n, d = keys.shape
    m = int(index.numel())
    keys = keys if keys.stride(-1) == 1 else keys.contiguous()
    values = values if values.stride(-1) == 1 else values.contiguous()
    idx = index.to(device=keys.device, dtype=torch.int64).contiguous()
    cos, sin = _rotation_table(inv_freq, n, keys.device)
    k_out = torch.empty(bsz, hk, m, d, dtype=keys.dtype, device=keys.device)
    v_out = torch.empty(bsz, hk, m, d, dtype=values.dtype, device=values.device)
    grid = (triton.cdiv(m, cfg["BLOCK"]), bsz * hk)
    _compress_kernel[grid](keys, values, idx, cos, sin, k_out, v_out,
                           keys.stride(0), keys.stride(1), keys.stride(2),
                           values.stride(0), values.stride(1), values.stride(2),
                           m, HK=hk, HALF=d // 2, BLOCK=cfg["BLOCK"], num_warps=cfg["num_warps"])
    return k_out, v_out


# ---------------------------------------------------------------------------------------------
# Benchmark: python -m kvlab.reform.triton (GPU). The full suite is `python -m kvlab bench reform scoring`.
# ---------------------------------------------------------------------------------------------
if __name__ == "__main__":
    from kvlab.kernels.benchmarking import require_cuda
    from kvlab.reform.reference import h2o_scores

    require_cuda()

    @triton.testing.perf_report(triton.testing.Benchmark(
        x_names=["chunk"], x_vals=[2048, 4096, 8192], line_arg="provider", line_vals=["torch", "triton"],
        line_names=["eager reference", "Triton"], ylabel="ms", plot_name="reform_h2o_scores",
        args={"H": 9, "HK": 3, "D": 64, "budget": 2048, "w": 128}))
    def bench(chunk, H, HK, D, budget, w, provider):
        n = budget + chunk
        gen = torch.Generator(device="cuda").manual_seed(0)
        q = torch.randn(1, H, w, D, device="cuda", generator=gen)
        k = torch.randn(1, HK, n, D, device="cuda", generator=gen)
        q_pos, k_pos = torch.arange(n - w, n, device="cuda"), torch.arange(n, device="cuda")
        fn = h2o_scores if provider == "torch" else h2o_scores_triton
        return triton.testing.do_bench(lambda: fn(q, k, D ** -0.5, q_pos, k_pos), return_mode="median")

    bench.run(print_data=True)
