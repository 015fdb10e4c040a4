"""The static decode engine's attention in Triton: read each live entry once, through the slot index, and
re-rotate its key as it is read.

Context: :class:`~kvlab.core.StaticKVCache` with ``kernel="triton"`` keeps every entry of a row in the physical
slot where it was written; ``phys[b, i]`` is the slot of the ``i``-th entry of row ``b`` (oldest first) and
``n[b]`` entries are live (the step's new one included, at ``i = n - 1``). Under ``positions="cache"``
(StreamingLLM's positional shift, SepLLM Sec. 4.5, kvlab's ``rerotate``) entry ``i`` must sit at position
``query - (n - 1) + i``, and its key was rotated at ``rot[b, i]``: RoPE is a rotation per frequency pair, so the
key is moved by ``shift = query - (n - 1) + i - rot`` when it is read::

    for each row b, kv head h (one program):
        for i in [0, n[b]):                                   # BLOCK_N entries at a time
            k = K[b, h, phys[b, i]];  v = V[b, h, phys[b, i]]
            if rotate:  k = k * cos[shift_i] + rotate_half(k) * sin[shift_i]   # the engine's own table
            s = q[b, group of h] . k * scale;  online softmax;  acc += p v
        out[b, group of h] = acc / l

Nothing is re-rotated or moved in memory: a step reads the live entries once (the memory floor of decode
attention) instead of writing every slot's rotated key and moving every kept slot. The cos/sin rows are the
engine's table (float64 angles cast to the key dtype, ``(tables x (4C + 1), d)``, a few hundred kB that stay in
L2) and the rotation is rounded as torch rounds ``keys * cos + rotate_half(keys) * sin`` in the key dtype, so
the rotated key equals the one the ``"compact"`` engine builds (up to fp32 FMA contraction).

GQA: one program owns a kv head and its ``group`` query heads, so each key/value row is read once for all of
them. The group is small (3 for SmolLM2, 4-8 for Llama): scores and the weighted sum are either broadcast products
reduced in fp32 (``(GROUP_PAD, BLOCK_N, d)`` tiles, no padding rows) or ``tl.dot`` over 16 padded query rows
(tensor cores in bf16; true fp32 products, not tf32, in fp32) (``USE_DOT``).

Schedule: at 256 streams there are ``256 x kv_heads`` programs, at one stream only ``kv_heads``: each row's entries
are cut into ranges (``splits``, one program each, merged by a second small kernel: base-2 log-sum-exp) until the
GPU has enough programs. ``PHYS_ORDER`` walks the physical slots in memory order instead of the entries in logical
order (the engine keeps the inverse index and each slot's rotation): the K/V addresses then do not wait for a
loaded index, dead slots are read and masked. Which of these is fastest depends on the GPU, dtype and shape:
with ``KVLAB_STATIC_TUNE=1`` the engine times a few choices once per shape on full rows (:func:`tuned_config`,
CUDA-graph replays) and keeps the fastest; by default it runs :func:`default_config` (broadcast products, logical
order, ranges only for small batches: the configuration the H200 run measured and tested).

Specification (float64 oracle): :func:`static_decode_reference`. Tests: ``tests/test_static_triton.py`` (CPU
interpreter with ``TRITON_INTERPRET=1``, and CUDA).
"""

from __future__ import annotations

import os

import torch

__all__ = ["candidate_configs", "check_static_triton", "default_config", "static_decode_reference",
           "static_decode_triton", "tuned_config"]

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def check_static_triton(x: torch.Tensor, head_dim: int) -> None:
    """Raise ValueError naming the fix when ``kernel="triton"`` cannot run on tensors like ``x``."""
    if x.dtype not in _DTYPES:
        raise ValueError(f"kernel='triton' takes {_DTYPES}, got {x.dtype}; use kernel='indexed'")
    if head_dim < 16 or head_dim > 256 or head_dim & (head_dim - 1):
        raise ValueError(f"kernel='triton' needs a head dim that is a power of two in [16, 256], got {head_dim}; "
                         "use kernel='indexed'")
    if not x.is_cuda and not _interpreting():
        raise ValueError("kernel='triton' needs CUDA tensors; on a CPU set TRITON_INTERPRET=1 before importing "
                         "triton (slow: small shapes only) or use kernel='indexed'")
    try:
        import triton  # noqa: F401
    except ImportError as err:  # pragma: no cover - kvlab without the triton extra
        raise ValueError("kernel='triton' needs Triton (pip install 'kvlab[triton]'); or use kernel='indexed'") from err


def static_decode_reference(q, keys, values, phys, n, scale, *, rot=None, rope=None, cos=None, sin=None,
                            base: int = 0):
    """Eager loop over rows, in the dtype of the inputs (pass float64 for the oracle).

    Args:
        q: ``(B, heads, d)``, the step's query per row (already rotated at its position).
        keys, values: ``(B, kv_heads, C, d)``, physical slots.
        phys: ``(B, C)`` integer, physical slot of entry ``i`` (oldest first).
        n: ``(B,)`` live entries per row (``1 <= n <= C``).
        rot, rope, cos, sin, base: the lazy re-rotation (all or none): ``rot (B, C)`` position each entry's key
            was rotated at, ``rope (B,)`` the query's position, ``cos``/``sin`` ``(T, d)`` table rows of shifts
            ``-2C..2C`` starting at row ``base - 2C``.

    Returns ``(B, heads, d)``.
    """
    bsz, h, d = q.shape
    group = h // keys.shape[1]
    c = keys.shape[2]
    out = torch.empty_like(q)
    for b in range(bsz):
        m = int(n[b])
        slot = phys[b, :m].long()
        k, v = keys[b][:, slot], values[b][:, slot]  # (kv_heads, m, d)
        if rot is not None:
            shift = int(rope[b]) - (m - 1) + torch.arange(m, device=q.device) - rot[b, :m]
            index = shift.clamp(-2 * c, 2 * c) + base
            half = d // 2
            k_half = torch.cat((-k[..., half:], k[..., :half]), dim=-1)
            k = k * cos[index].to(k.dtype) + k_half * sin[index].to(k.dtype)
        k, v = k.repeat_interleave(group, 0), v.repeat_interleave(group, 0)  # (heads, m, d)
        scores = (k @ q[b, :, :, None]).squeeze(-1) * scale
        out[b] = (torch.softmax(scores, dim=-1)[:, None, :] @ v).squeeze(1)
    return out


def default_config(interpret: bool | None = None) -> dict:
    """Tile size, warps, products (``USE_DOT``: ``tl.dot`` over 16 padded query rows, else broadcast products), and
    ``programs``: a row's entries are cut into ranges (merged by a second kernel) until about this many programs
    run, when ``rows x kv_heads`` alone is fewer; ``splits`` forces the number of ranges. On CUDA the engine times
    a few of these choices at its shape once (:func:`tuned_config`)."""
    interpret = _interpreting() if interpret is None else interpret
    if interpret:
        return dict(BLOCK_N=8, num_warps=4, num_stages=1, programs=None, splits=None, USE_DOT=False, PHYS_ORDER=False)
    # the fastest of the tiles timed on an H200 at 256 streams (benchmarks/results/decode/engine_256_h200_2026_11_25.md);
    # ranges only when the batch leaves the GPU short of programs
    return dict(BLOCK_N=16, num_warps=2, num_stages=2, programs=2 * _sm_count(), splits=None, USE_DOT=False,
                PHYS_ORDER=False)


_SM: list = []


def _sm_count() -> int:
    if not _SM:
        _SM.append(torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
                   if torch.cuda.is_available() else 4)
    return _SM[0]


def _splits(cfg: dict, rows: int, capacity: int) -> tuple[int, int]:
    """``(ranges per row, entries per range)`` for a config: enough programs for the GPU, never a range shorter
    than one tile."""
    block = cfg["BLOCK_N"]
    splits = cfg.get("splits") or (1 if not cfg.get("programs") else
                                   max(1, min(-(-cfg["programs"] // rows), -(-capacity // block))))
    size = -(-(-(-capacity // splits)) // block) * block
    return -(-capacity // size), size


#: (device, dtype, batch, kv heads, group, capacity, dim, rotate) -> the fastest config timed there
_TUNED: dict = {}
#: every timing tuned_config made (for the benchmark's record)
TUNE_LOG: list = []


def candidate_configs(rows: int, capacity: int, phys_order: bool = True, fp32: bool = False) -> list[dict]:
    """The choices :func:`tuned_config` times (distinct numbers of ranges only). ``fp32``: also ``tl.dot`` on the
    tensor cores in three TF32 passes (``DOT_PRECISION="tf32x3"``: close to fp32 products, not bit-equal)."""
    sm, seen, out = _sm_count(), set(), []
    variants = [(False, 16, 2, False, "ieee"), (False, 32, 2, False, "ieee"), (False, 16, 4, False, "ieee"),
                (False, 32, 4, False, "ieee"), (True, 32, 4, False, "ieee")]
    if fp32:
        variants += [(True, 16, 4, False, "tf32x3"), (True, 32, 4, False, "tf32x3")]
    if phys_order:
        variants += [(False, 16, 2, True, "ieee"), (True, 32, 4, True, "ieee")]
    for use_dot, block, warps, order, precision in variants:
        for programs in (2 * sm, 8 * sm, 32 * sm):
            cfg = dict(BLOCK_N=block, num_warps=warps, num_stages=2, programs=programs, splits=None,
                       USE_DOT=use_dot, PHYS_ORDER=order, DOT_PRECISION=precision)
            splits, _ = _splits(cfg, rows, capacity)
            key = (use_dot, block, warps, order, precision, splits)
            if key not in seen:
                seen.add(key)
                out.append(dict(cfg, splits=splits))
    return out


def _gpu_ms(fn, reps: int = 5) -> float:
    """GPU milliseconds of one call of ``fn``, as the engine meets it: the keys and values of a layer are not in L2
    when its call starts (the other layers' went through it since), so L2 is flushed (a 256 MB write) before each
    timed run; one call captured in a CUDA graph and replayed (no host time between launches), best of ``reps``;
    plain launches timed by events if the capture fails. (Replaying many calls back to back on the same buffers
    timed the choices with warm caches: the chosen one ran 25 % slower in the engine than timed.)"""
    flush = torch.empty(256 * 2**20, dtype=torch.int8, device="cuda")
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        run = graph.replay
    except Exception:  # noqa: BLE001 - a capture refused here: time the launches themselves
        run = fn
    runs = []
    for _ in range(reps):
        flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        runs.append(start.elapsed_time(end))
    return min(runs)


def tuned_config(q, keys, values, phys, length, scale, extra: dict) -> dict:
    """The fastest of :func:`candidate_configs` on these buffers with every row full and its entries in scattered
    slots (the steady state of a stream: the first call comes with nearly empty rows in slot order, which reads
    memory in sequence and timed a choice 20 % faster than the engine later ran it), each timed as one CUDA graph
    replay after an L2 flush (:func:`_gpu_ms`); timed once per shape and cached. Opt-in (``KVLAB_STATIC_TUNE=1``);
    otherwise (and inside a capture) the default."""
    rows, c = q.shape[0] * keys.shape[1], keys.shape[2]
    key = (q.device, q.dtype, q.shape[0], keys.shape[1], q.shape[1] // keys.shape[1], c, q.shape[2],
           extra.get("rot") is not None)
    if key in _TUNED:
        return _TUNED[key]
    if os.environ.get("KVLAB_STATIC_TUNE", "0") != "1" or torch.cuda.is_current_stream_capturing():
        return default_config()
    best, best_ms = None, float("inf")
    length = torch.full_like(length, c - 1)  # full rows: every slot valid
    gen = torch.Generator(device=phys.device).manual_seed(0)
    phys = torch.argsort(torch.rand(phys.shape, device=phys.device, generator=gen), dim=-1).to(phys.dtype)
    if extra.get("inv") is not None:  # the memory-order walk reads the inverse permutation (and each slot's rotation)
        extra = dict(extra, inv=torch.argsort(phys, dim=-1).to(extra["inv"].dtype))
    for cfg in candidate_configs(rows, c, phys_order=extra.get("inv") is not None, fp32=q.dtype == torch.float32):
        try:
            _launch(q, keys, values, phys, length, scale, cfg, **extra)  # compile
        except Exception:  # noqa: BLE001 - a tile that does not fit this GPU is not a candidate
            continue
        ms = _gpu_ms(lambda: _launch(q, keys, values, phys, length, scale, cfg, **extra))  # noqa: B023
        TUNE_LOG.append(dict(key=[str(k) for k in key], config=cfg, ms=ms))
        if ms < best_ms:
            best, best_ms = cfg, ms
    _TUNED[key] = best if best is not None else default_config()
    return _TUNED[key]


try:  # the kernel exists only where Triton is installed
    import triton
    import triton.language as tl

    @triton.jit
    def _static_decode_kernel(
        Q, K, V, PHYS, N, ROT, ROPE, COS, SIN, O, OPART, LPART,
        stride_qb, stride_qh, stride_kb, stride_kh, stride_kc, stride_vb, stride_vh, stride_vc,
        stride_pb, stride_rb, stride_ob, stride_oh,
        qk_scale, base, max_shift, split_size, capacity,
        HK: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
        BLOCK_N: tl.constexpr, ROTATE: tl.constexpr, SPLIT: tl.constexpr, USE_DOT: tl.constexpr,
        FP32_DOT: tl.constexpr, PHYS_ORDER: tl.constexpr, LOADS_ONLY: tl.constexpr = False,
        DOT_PRECISION: tl.constexpr = "ieee",
    ):
        # PHYS_ORDER: walk the physical slots [0, C) in order (PHYS then holds the *logical index* of each slot's
        # entry, the inverse permutation, and ROT the rotation of each slot's key): K/V addresses no longer depend
        # on loaded data, dead slots (logical index >= n) are read and masked. Otherwise walk the entries [0, n)
        # in logical order through PHYS (slot of entry i) with ROT in logical order.
        # -- which row and kv head, and (SPLIT) which range of the row's entries
        pid = tl.program_id(0)
        b = pid // HK
        hk = pid % HK
        part = tl.program_id(1)
        offs_g = tl.arange(0, GROUP_PAD)
        offs_d = tl.arange(0, HEAD_DIM)
        g_ok = offs_g < GROUP
        n = tl.load(N + b).to(tl.int32)
        q = tl.load(Q + b * stride_qb + (hk * GROUP + offs_g)[:, None] * stride_qh + offs_d[None, :],
                    mask=g_ok[:, None], other=0.0).to(tl.float32)
        kbh = K + b * stride_kb + hk * stride_kh
        vbh = V + b * stride_vb + hk * stride_vh
        if ROTATE:
            # rotate_half(k)[j] = -k[j + d/2] (j < d/2), k[j - d/2] (j >= d/2)
            swap = (offs_d + HEAD_DIM // 2) % HEAD_DIM
            sign = tl.where(offs_d < HEAD_DIM // 2, -1.0, 1.0)
            first = tl.load(ROPE + b) - (n - 1)  # entry i sits at first + i

        m_i = tl.full([GROUP_PAD], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([GROUP_PAD], dtype=tl.float32)
        acc = tl.zeros([GROUP_PAD, HEAD_DIM], dtype=tl.float32)
        # -- stream the live entries [lo, hi) through the slot index, online softmax in base 2
        lo = part * split_size
        if PHYS_ORDER:
            hi = tl.minimum(capacity, lo + split_size)
        else:
            hi = tl.minimum(n, lo + split_size)
        for i0 in range(lo, hi, BLOCK_N):
            if PHYS_ORDER:
                slot = i0 + tl.arange(0, BLOCK_N)
                inb = slot < hi
                i = tl.load(PHYS + b * stride_pb + slot, mask=inb, other=0)  # logical index of the slot's entry
                ok = inb & (i < n)
                k = tl.load(kbh + slot[:, None] * stride_kc + offs_d[None, :], mask=inb[:, None], other=0.0)
                v = tl.load(vbh + slot[:, None] * stride_vc + offs_d[None, :], mask=inb[:, None], other=0.0)
                v = tl.where(ok[:, None], v, tl.zeros_like(v))  # a dead slot's value must not meet p = 0 as NaN
                rot_at = slot
                readable = inb
            else:
                i = i0 + tl.arange(0, BLOCK_N)
                ok = i < hi
                slot = tl.load(PHYS + b * stride_pb + i, mask=ok, other=0)
                k = tl.load(kbh + slot[:, None] * stride_kc + offs_d[None, :], mask=ok[:, None], other=0.0)
                v = tl.load(vbh + slot[:, None] * stride_vc + offs_d[None, :], mask=ok[:, None], other=0.0)
                rot_at = i
                readable = ok
            if ROTATE:
                # -- lazy re-rotation, rounded as torch rounds keys * cos + rotate_half(keys) * sin in k's dtype
                rot = tl.load(ROT + b * stride_rb + rot_at, mask=ok, other=0)
                shift = first + i - rot
                row = tl.minimum(tl.maximum(shift, -max_shift), max_shift) + base
                cos = tl.load(COS + row[:, None] * HEAD_DIM + offs_d[None, :], mask=ok[:, None], other=0.0)
                sin = tl.load(SIN + row[:, None] * HEAD_DIM + offs_d[None, :], mask=ok[:, None], other=0.0)
                k_sw = tl.load(kbh + slot[:, None] * stride_kc + swap[None, :], mask=readable[:, None], other=0.0)
                if LOADS_ONLY:  # diagnostics: the table rows and the second key read, without the rotation
                    k = k + cos + sin + k_sw
                else:
                    a = (k.to(tl.float32) * cos.to(tl.float32)).to(k.dtype)
                    c = ((k_sw.to(tl.float32) * sign[None, :]) * sin.to(tl.float32)).to(k.dtype)
                    k = (a.to(tl.float32) + c.to(tl.float32)).to(k.dtype)
            if PHYS_ORDER:  # a dead slot's key (and its rotation) may be NaN: 0 keeps its score finite before the mask
                k = tl.where(ok[:, None], k, tl.zeros_like(k))
            if LOADS_ONLY:  # diagnostics (benchmarks only): the same loads, summed instead of attended
                acc += (tl.sum(k.to(tl.float32), 0) + tl.sum(v.to(tl.float32), 0))[None, :]
                l_i = l_i + tl.sum(ok.to(tl.float32), 0)
                m_i = tl.zeros_like(m_i)  # a range's log-sum-exp is log2(its count): the merge then takes the mean
            else:
                if USE_DOT:  # (16, d) x (d, BLOCK_N) on the tensor cores (bf16) or fp32 FMAs (ieee)
                    if FP32_DOT:
                        s = tl.dot(q, tl.trans(k.to(tl.float32)), input_precision=DOT_PRECISION)
                    else:
                        s = tl.dot(q.to(k.dtype), tl.trans(k))
                else:  # broadcast products reduced in fp32: no padding rows
                    s = tl.sum(q[:, None, :] * k.to(tl.float32)[None, :, :], axis=2)
                s = tl.where(ok[None, :], s * qk_scale, float("-inf"))  # (GROUP_PAD, BLOCK_N), base 2
                m_new = tl.maximum(m_i, tl.max(s, 1))
                # -inf while no live entry has been seen (a PHYS_ORDER tile of dead slots only): subtract 0 instead, so
                # alpha and p are exp2(-inf) = 0, not exp2(-inf - -inf) = NaN
                m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)
                alpha = tl.exp2(m_i - m_sub)
                p = tl.exp2(s - m_sub[:, None])
                l_i = l_i * alpha + tl.sum(p, 1)
                if USE_DOT:
                    if FP32_DOT:
                        acc = tl.dot(p, v.to(tl.float32), acc * alpha[:, None], input_precision=DOT_PRECISION)
                    else:
                        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
                else:
                    acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v.to(tl.float32)[None, :, :], axis=1)
                m_i = m_new

        # -- epilogue: the output, or (SPLIT) this range's normalised partial and its base-2 log-sum-exp
        has = l_i > 0  # False only for a range without live entries (past the row's end, or dead slots only)
        out = tl.where(has[:, None], acc / tl.where(has, l_i, 1.0)[:, None], 0.0)
        if SPLIT:
            row = (pid * tl.num_programs(1) + part) * GROUP_PAD + offs_g
            tl.store(LPART + row, tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("-inf")))
            tl.store(OPART + row[:, None] * HEAD_DIM + offs_d[None, :], out)
        else:
            tl.store(O + b * stride_ob + (hk * GROUP + offs_g)[:, None] * stride_oh + offs_d[None, :],
                     out.to(O.dtype.element_ty), mask=g_ok[:, None])

    @triton.jit
    def _static_merge_kernel(
        OPART, LPART, O, stride_ob, stride_oh, PARTS,
        HK: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
    ):
        # -- the partials of one (row, kv head): lse = log2(sum 2^lse_j), out = sum 2^(lse_j - lse) out_j
        pid = tl.program_id(0)
        b = pid // HK
        hk = pid % HK
        offs_g = tl.arange(0, GROUP_PAD)
        offs_d = tl.arange(0, HEAD_DIM)
        m = tl.full([GROUP_PAD], float("-inf"), dtype=tl.float32)
        denom = tl.zeros([GROUP_PAD], dtype=tl.float32)
        acc = tl.zeros([GROUP_PAD, HEAD_DIM], dtype=tl.float32)
        for j in range(0, PARTS):
            row = (pid * PARTS + j) * GROUP_PAD + offs_g
            lse = tl.load(LPART + row)
            part = tl.load(OPART + row[:, None] * HEAD_DIM + offs_d[None, :])
            m_new = tl.maximum(m, lse)
            m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)  # range 0 always has entries: only padding rows
            alpha = tl.exp2(m - m_sub)
            w = tl.exp2(lse - m_sub)
            denom = denom * alpha + w
            # a range without live entries has weight 0: skip its partial rather than multiply it (0 x NaN = NaN)
            acc = acc * alpha[:, None] + tl.where(w[:, None] > 0, w[:, None] * part, 0.0)
            m = m_new
        out = acc / tl.where(denom > 0, denom, 1.0)[:, None]
        tl.store(O + b * stride_ob + (hk * GROUP + offs_g)[:, None] * stride_oh + offs_d[None, :],
                 out.to(O.dtype.element_ty), mask=(offs_g < GROUP)[:, None])
except ImportError:  # pragma: no cover - kvlab without the triton extra
    _static_decode_kernel = _static_merge_kernel = None


def static_decode_triton(q, keys, values, phys, length, scale: float, *, rot=None, rope=None, cos=None, sin=None,
                         base: int = 0, inv=None, rot_phys=None, config: dict | None = None) -> torch.Tensor:
    """The kernel: ``q (B, heads, d)``, ``keys``/``values`` ``(B, kv_heads, C, d)``, ``phys (B, C)``, ``length (B,)``
    entries held *before* this step's (so ``length + 1`` are read: the caller wrote the new one at
    ``phys[length]``); the re-rotation arguments as in :func:`static_decode_reference`. Returns ``(B, heads, d)``.
    ``inv``/``rot_phys`` ``(B, C)``: the logical index of each physical slot's entry and the rotation of its key
    (what ``PHYS_ORDER`` configs walk; without them those configs are not candidates). ``config``: tiles and ranges
    (default: :func:`tuned_config` on CUDA, :func:`default_config` in the interpreter). Inputs are not checked on
    the device (that would synchronise; the engine builds them)."""
    if q.stride(-1) != 1:
        q = q.contiguous()
    if keys.stride(-1) != 1 or values.stride(-1) != 1 or phys.stride(-1) != 1:
        raise ValueError("keys, values and phys must be contiguous in their last dimension (the engine's buffers are)")
    extra = dict(rot=rot, rope=rope, cos=cos, sin=sin, base=base, inv=inv, rot_phys=rot_phys)
    if inv is not None and inv.stride(-1) != 1:
        raise ValueError("inv must be contiguous in its last dimension")
    if config is None:
        config = tuned_config(q, keys, values, phys, length, scale, extra) if q.is_cuda else default_config()
    return _launch(q, keys, values, phys, length, scale, config, **extra)


def _launch(q, keys, values, phys, length, scale, cfg, *, rot=None, rope=None, cos=None, sin=None, base=0,
            inv=None, rot_phys=None):
    bsz, h, d = q.shape
    phys_order = bool(cfg.get("PHYS_ORDER", False))
    if phys_order:  # the inverse permutation and the rotations by physical slot
        if inv is None:
            raise ValueError("config PHYS_ORDER needs inv= (the logical index of each slot's entry)")
        phys, rot = inv, (rot_phys if rot is not None else None)
    hk, c = keys.shape[1], keys.shape[2]
    group = h // hk
    out = torch.empty((bsz, h, d), dtype=q.dtype, device=q.device)
    rotate = rot is not None
    n = length + 1
    dummy = phys  # never read when not rotating
    splits, split_size = _splits(cfg, bsz * hk, c)
    use_dot = bool(cfg.get("USE_DOT", False))
    group_pad = max(16, triton.next_power_of_2(group)) if use_dot else triton.next_power_of_2(group)
    if splits > 1:
        opart = torch.empty((bsz * hk * splits * group_pad, d), dtype=torch.float32, device=q.device)
        lpart = torch.empty((bsz * hk * splits * group_pad,), dtype=torch.float32, device=q.device)
    else:
        opart = lpart = out  # never touched
    _static_decode_kernel[(bsz * hk, splits)](
        q, keys, values, phys, n, rot if rotate else dummy, rope if rotate else dummy,
        cos if rotate else q, sin if rotate else q, out, opart, lpart,
        q.stride(0), q.stride(1), keys.stride(0), keys.stride(1), keys.stride(2),
        values.stride(0), values.stride(1), values.stride(2),
        phys.stride(0), rot.stride(0) if rotate else 0, out.stride(0), out.stride(1),
        float(scale) * 1.4426950408889634, base, 2 * c, split_size, c,
        HK=hk, GROUP=group, GROUP_PAD=group_pad, HEAD_DIM=d, BLOCK_N=cfg["BLOCK_N"],
        ROTATE=rotate, SPLIT=splits > 1, USE_DOT=use_dot, FP32_DOT=q.dtype == torch.float32 or _interpreting(),
        PHYS_ORDER=phys_order, LOADS_ONLY=bool(cfg.get("LOADS_ONLY", False)),
        DOT_PRECISION="ieee" if _interpreting() else cfg.get("DOT_PRECISION", "ieee"),
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )
    if splits > 1:
        _static_merge_kernel[(bsz * hk,)](opart, lpart, out, out.stride(0), out.stride(1), splits,
                                          HK=hk, GROUP=group, GROUP_PAD=group_pad, HEAD_DIM=d, num_warps=4)
    return out


if __name__ == "__main__":
    if not torch.cuda.is_available():
        raise SystemExit("the benchmark needs a CUDA GPU; tests run on CPU with TRITON_INTERPRET=1")

    @triton.testing.perf_report(triton.testing.Benchmark(
        x_names=["B"], x_vals=[1, 16, 64, 256], line_arg="provider", line_vals=["gather_sdpa", "triton"],
        line_names=["gather + rotate + SDPA", "Triton indexed"], ylabel="ms",
        plot_name="static_decode", args={"H": 9, "HK": 3, "D": 64, "C": 325}))
    def bench(B, H, HK, D, C, provider):
        dev, dt = torch.device("cuda"), torch.bfloat16
        q = torch.randn(B, H, D, device=dev, dtype=dt)
        k, v = (torch.randn(B, HK, C, D, device=dev, dtype=dt) for _ in range(2))
        phys = torch.stack([torch.randperm(C, device=dev) for _ in range(B)])
        length = torch.full((B,), C - 1, device=dev)
        if provider == "triton":
            fn = lambda: static_decode_triton(q, k, v, phys, length, D ** -0.5)  # noqa: E731
        else:
            def fn():
                order = phys[:, None, :, None].expand(-1, HK, -1, D)
                kk, vv = k.gather(2, order), v.gather(2, order)
                return torch.nn.functional.scaled_dot_product_attention(q[:, :, None], kk, vv, enable_gqa=True)
        return triton.testing.do_bench(fn, return_mode="median")

    bench.run(print_data=True)
