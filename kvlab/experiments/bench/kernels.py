"""``python -m kvlab bench kernels decode``: one decode step over ragged packed caches.

Batch 16, 6k-8k entries each, GQA 32/8, dim 128: the Triton kernel of :mod:`kvlab.kernels.decode` vs padding
+ SDPA, against the memory-bandwidth floor of the bytes read; eager calls and CUDA-graph replays (GPU time
alone), the fixed cost on 1-entry caches, a skewed batch.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kvlab.kernels.benchmarking import bench_ms, device_info, fmt_table, machine_ceilings, require_cuda, spin
from kvlab.kernels.benchmarking import write_outputs

__all__ = ["main"]


def run_decode(args, ceilings: dict) -> dict:
    torch = require_cuda()
    import torch.nn.functional as F

    from kvlab.kernels.decode.reference import pad_packed, ragged_decode_padded_sdpa
    from kvlab.kernels.decode.triton import ragged_decode_triton

    bsz, h, hk, d, dtype = args.batch, args.heads, args.kv_heads, args.dim, torch.bfloat16
    gen = torch.Generator(device="cuda").manual_seed(0)
    lens = torch.randint(args.min_len, args.max_len + 1, (bsz,), device="cuda", generator=gen)
    cu = torch.zeros(bsz + 1, dtype=torch.int32, device="cuda")
    cu[1:] = torch.cumsum(lens, 0)
    total, longest = int(cu[-1]), int(lens.max())
    q = torch.randn(bsz, h, d, device="cuda", dtype=dtype, generator=gen)
    k = torch.randn(total, hk, d, device="cuda", dtype=dtype, generator=gen)
    v = torch.randn(total, hk, d, device="cuda", dtype=dtype, generator=gen)
    kp, vp, valid = pad_packed(k, v, cu, longest)
    kp, vp = kp.contiguous(), vp.contiguous()
    spin(2.0)
    nbytes = 2 * total * hk * d * 2 + 2 * q.numel() * 2
    floor_ms = nbytes / (ceilings["copy_GBps"] * 1e6)
    floor_read_ms = nbytes / (max(ceilings["read_GBps"], ceilings["copy_GBps"]) * 1e6)
    res = {}
    res["triton"] = bench_ms(lambda: ragged_decode_triton(q, k, v, cu, max_seqlen=longest), 0.5)
    res["sdpa_padded_gqa"] = bench_ms(lambda: ragged_decode_padded_sdpa(q, kp, vp, valid), 0.5)
    res["sdpa_padded_repeat_kv"] = bench_ms(lambda: ragged_decode_padded_sdpa(q, kp, vp, valid, repeat_kv=True), 0.5)

    def pad_then_sdpa():
        kp_, vp_, valid_ = pad_packed(k, v, cu, longest)
        return ragged_decode_padded_sdpa(q, kp_, vp_, valid_)

    res["pad_and_sdpa_gqa"] = bench_ms(pad_then_sdpa, 0.5)
    # same kernel, head-major packed memory (kv_heads, total, dim): each piece reads contiguous bytes
    kh = k.transpose(0, 1).contiguous().transpose(0, 1)
    vh = v.transpose(0, 1).contiguous().transpose(0, 1)
    res["triton_head_major"] = bench_ms(lambda: ragged_decode_triton(q, kh, vh, cu, max_seqlen=longest), 0.5)
    from kvlab.kernels.decode.triton import default_config as decode_config

    for per_sm in (2, 4):  # the grid: programs per multiprocessor (the default is in the first row)
        cfg = decode_config() | {"programs_per_sm": per_sm}
        res[f"triton_{per_sm}_per_sm"] = bench_ms(
            lambda: ragged_decode_triton(q, k, v, cu, max_seqlen=longest, config=cfg), 0.5)  # noqa: B023
    # GPU time alone: the call captured once in a CUDA graph and replayed (how serving engines run
    # decode steps); the eager rows above also count the host's latency before the first launch
    res["triton_cuda_graph"] = bench_ms(_graph_replay(lambda: ragged_decode_triton(q, k, v, cu, max_seqlen=longest)), 0.5)
    # fixed cost: the same call over 1-entry caches (two launches, no bytes to speak of)
    cu1 = torch.arange(bsz + 1, dtype=torch.int32, device="cuda")
    tiny = lambda: ragged_decode_triton(q, k[:bsz], v[:bsz], cu1, max_seqlen=1)  # noqa: E731
    res["triton_1_entry_caches"] = bench_ms(tiny, 0.5)
    res["triton_1_entry_caches_cuda_graph"] = bench_ms(_graph_replay(tiny), 0.5)
    for _ in range(20):
        tiny()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(200):
        tiny()
    torch.cuda.synchronize()
    host_ms = (time.perf_counter() - t0) / 200 * 1e3  # back-to-back calls: the host is the bottleneck
    # scale reference: dense batch x max_len cache, no mask, SDPA enable_gqa
    kd = torch.randn(bsz, hk, args.max_len, d, device="cuda", dtype=dtype)
    vd = torch.randn_like(kd)
    qd = q[:, :, None, :]
    res["sdpa_dense_maxlen_gqa"] = bench_ms(lambda: F.scaled_dot_product_attention(qd, kd, vd, enable_gqa=True), 0.5)
    res["triton_repeat"] = bench_ms(lambda: ragged_decode_triton(q, k, v, cu, max_seqlen=longest), 0.5)  # spread
    dense_bytes = 2 * kd.numel() * 2
    del kd, vd
    rows = []
    for name, r in res.items():
        rows.append({"method": name, "ms": r["ms"],
                     "GBps_packed_bytes": nbytes / r["ms"] / 1e6,
                     "x_floor": r["ms"] / floor_ms})
    # skewed batch (one long cache, many short ones): every multiprocessor must still get equal work
    skew = [8 * args.max_len] + [args.max_len // 8] * (bsz - 1)
    cu_s = torch.zeros(bsz + 1, dtype=torch.int32, device="cuda")
    cu_s[1:] = torch.cumsum(torch.tensor(skew, device="cuda"), 0)
    k_s = torch.randn(int(cu_s[-1]), hk, d, device="cuda", dtype=dtype, generator=gen)
    v_s = torch.randn_like(k_s)
    bytes_s = 2 * k_s.numel() * 2 + 2 * q.numel() * 2
    floor_s = bytes_s / (ceilings["copy_GBps"] * 1e6)
    kp_s, vp_s, valid_s = pad_packed(k_s, v_s, cu_s, max(skew))
    skew_res = {
        "skewed_triton": bench_ms(lambda: ragged_decode_triton(q, k_s, v_s, cu_s, max_seqlen=max(skew)), 0.5),
        "skewed_triton_cuda_graph": bench_ms(
            _graph_replay(lambda: ragged_decode_triton(q, k_s, v_s, cu_s, max_seqlen=max(skew))), 0.5),
        "skewed_sdpa_padded_gqa": bench_ms(lambda: ragged_decode_padded_sdpa(q, kp_s, vp_s, valid_s), 0.5),
    }
    for name, r in skew_res.items():
        rows.append({"method": name, "ms": r["ms"], "GBps_packed_bytes": bytes_s / r["ms"] / 1e6,
                     "x_floor": r["ms"] / floor_s})
    return {"batch": bsz, "heads": h, "kv_heads": hk, "dim": d, "lens": lens.tolist(), "total": total,
            "bytes_read": nbytes, "floor_ms_copy_bw": floor_ms, "floor_ms_read_bw": floor_read_ms,
            "dense_bytes": dense_bytes, "ceilings": ceilings, "rows": rows,
            "host_ms_per_call": host_ms, "skewed_lens": skew, "skewed_bytes": bytes_s, "skewed_floor_ms": floor_s}


def _graph_replay(fn):
    """Capture ``fn`` once in a CUDA graph (after a warm-up on a side stream) and return its replay."""
    torch = require_cuda()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def print_decode(rec: dict) -> str:
    head = (f"batch {rec['batch']}, heads {rec['heads']}/{rec['kv_heads']}, dim {rec['dim']}, entries "
            f"{min(rec['lens'])}-{max(rec['lens'])} (total {rec['total']}); reads {rec['bytes_read'] / 1e6:.0f} MB; "
            f"floor {rec['floor_ms_copy_bw']:.3f} ms at copy bandwidth {rec['ceilings']['copy_GBps']:.0f} GB/s "
            f"({rec['floor_ms_read_bw']:.3f} ms at read bandwidth {rec['ceilings']['read_GBps']:.0f} GB/s)\n")
    if "skewed_lens" in rec:
        sk = rec["skewed_lens"]
        head += (f"skewed_* rows: entries {sk[0]} + {len(sk) - 1} x {sk[1]}, reads {rec['skewed_bytes'] / 1e6:.0f} MB, "
                 f"floor {rec['skewed_floor_ms']:.3f} ms; host time per eager call (1-entry caches, back to back) "
                 f"{rec['host_ms_per_call'] * 1e3:.0f} us\n")
    cols = [("method", "method", ""), ("ms", "ms", "{:.4f}"), ("GBps_packed_bytes", "GB/s of packed bytes", "{:.0f}"),
            ("x_floor", "x floor", "{:.2f}")]
    return head + fmt_table(rec["rows"], cols)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="kvlab bench kernels", description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=["decode"])
    ap.add_argument("--out", default="build/bench",
                    help="folder for JSON/table (default build/bench; the committed "
                         "benchmarks/results only when named)")
    ap.add_argument("--tag", default="", help="suffix for output names (e.g. the device)")
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--min-len", type=int, default=6144)
    ap.add_argument("--max-len", type=int, default=8192)
    args = ap.parse_args(argv)
    info = device_info()
    rec = run_decode(args, machine_ceilings()) | {"info": info}
    write_outputs(Path(args.out), "decode" + (f"_{args.tag}" if args.tag else ""), rec, print_decode(rec), info)
    return 0


if __name__ == "__main__":
    sys.exit(main())
