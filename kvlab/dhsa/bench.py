"""``python -m kvlab bench dhsa WHAT``: GPU benchmarks of DHSA prefill attention, with a JSON record.

Subcommands (each writes ``<out>/dhsa_<what>.json`` and ``.md`` with the device named, prints a table):

* ``ops``      DHSA attention at N = 4k..32k (bf16, 32 heads, dim 128, budget 2048 keys per query):
  dense causal SDPA, FlexAttention with the DHSA block mask (:mod:`kvlab.dhsa.flex`), the Triton kernel
  (:mod:`kvlab.dhsa.triton`), each on the same kept set; the time of the selection (Eq. 4 chunk
  representations, similarity, ranking: :func:`kvlab.dhsa.reference.chunk_plan`) and of building the
  block mask, apart; the kept density (kept entries over causal entries: the limit on saved work) and
  the share of 128 x 128 tiles Flex touches. Chunkings: fixed 64-token chunks and random chunk
  lengths in [16, 128] (what a predictor gives).
* ``tune``     tile-size sweep of the Triton kernel at one length (how the defaults were chosen).
* ``prefill``  end to end: a Gemma3-270m-shaped and a Gemma3-1B-shaped model (random weights, bf16), one
  prefill of N tokens, SDPA vs DHSA (Triton, fixed chunks, global layers), latency and peak memory.

Timing: CUDA events around each call after a warm-up call, median of repeats sized to a time budget
(:mod:`kvlab.kernels.benchmarking`). Example (H100/H200)::

    python -m kvlab bench dhsa ops --seqs 4096,8192,16384,32768
    python -m kvlab bench dhsa prefill --seq 32768
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from kvlab.kernels.benchmarking import (allow_many_compiles, bench_ms, device_info, fmt_table, ints, random_qkv,
                                        require_cuda, write_outputs)

__all__ = ["COMMANDS", "main", "random_boundaries", "kept_density"]


def random_boundaries(n: int, lo: int, hi: int, seed: int = 0, device=None):
    """Offsets of chunks with lengths drawn uniformly in ``[lo, hi]`` (a stand-in for predicted chunks)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(lo, hi + 1, (n // lo + 1,), generator=g)
    ends = torch.cumsum(lens, 0)
    ends = ends[ends < n]
    return torch.cat([torch.zeros(1, dtype=torch.long), ends, torch.tensor([n])]).to(device)


def kept_density(n: int, budget: int) -> float:
    """Kept (query, key) entries over causal entries when every row keeps ``min(budget, row + 1)`` keys."""
    b = min(budget, n)
    kept = b * (b + 1) // 2 + (n - b) * b
    return kept / (n * (n + 1) // 2)


def _chunkings(n, device):
    from .reference import fixed_boundaries

    return {"fixed64": fixed_boundaries(n, 64, device=device), "random16-128": random_boundaries(n, 16, 128, 0, device)}


def run_ops(args) -> dict:
    torch = require_cuda()
    import torch.nn.functional as F

    from .flex import _touched_blocks, dhsa_attention_flex, dhsa_block_mask
    from .reference import chunk_plan
    from .triton import dhsa_attention_triton

    allow_many_compiles()
    h, hk, d, budget, init = args.heads, args.kv_heads, args.dim, args.budget_keys, args.initial
    dtype = torch.bfloat16
    rows = []
    for n in args.seqs:
        q, k, v = random_qkv(n, h, hk, d, dtype)
        dense = bench_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=hk != h),
                         args.time_budget)["ms"]
        for name, bd in _chunkings(n, q.device).items():
            for share in args.share:
                kw = dict(initial=init, share_heads=share)
                plan = chunk_plan(q, k, bd, budget, **kw)
                row = {"seq": n, "chunks": name, "share_heads": share, "dense_ms": dense,
                       "density": kept_density(n, budget)}
                row["plan_ms"] = bench_ms(lambda: chunk_plan(q, k, bd, budget, **kw), args.time_budget)["ms"]
                row["triton_ms"] = bench_ms(lambda: dhsa_attention_triton(q, k, v, bd, budget, plan=plan, **kw),
                                            args.time_budget)["ms"]
                if not args.no_flex:
                    try:
                        row["mask_ms"] = bench_ms(lambda: dhsa_block_mask(plan), args.time_budget, max_reps=5)["ms"]
                        bm = dhsa_block_mask(plan)
                        touched = _touched_blocks(plan, 128)
                        nb = touched.shape[-1]
                        row["tiles"] = float(touched.float().sum() / (touched.shape[1] * nb * (nb + 1) / 2))
                        row["flex_ms"] = bench_ms(lambda: dhsa_attention_flex(q, k, v, bd, budget, block_mask=bm, **kw),
                                                  args.time_budget)["ms"]
                    except Exception as exc:  # report, keep the other numbers
                        row["flex_error"] = f"{type(exc).__name__}: {exc}"[:200]
                row["x_dense"] = dense / row["triton_ms"]
                row["x_dense_with_plan"] = dense / (row["triton_ms"] + row["plan_ms"])
                if "flex_ms" in row:
                    row["x_flex"] = row["flex_ms"] / row["triton_ms"]
                row["plan_share"] = row["plan_ms"] / (row["plan_ms"] + row["triton_ms"])
                rows.append(row)
                print(json.dumps(row), flush=True)
        del q, k, v
        torch.cuda.empty_cache()
    return {"heads": h, "kv_heads": hk, "dim": d, "budget": budget, "initial": init, "rows": rows}


def table_ops(rec: dict) -> str:
    return fmt_table(rec["rows"], [
        ("seq", "N", ""), ("chunks", "chunks", ""), ("share_heads", "shared sel.", ""),
        ("dense_ms", "SDPA ms", "{:.2f}"), ("flex_ms", "Flex ms", "{:.2f}"), ("triton_ms", "Triton ms", "{:.2f}"),
        ("plan_ms", "selection ms", "{:.2f}"), ("x_dense", "x SDPA", "{:.2f}"), ("x_flex", "x Flex", "{:.2f}"),
        ("x_dense_with_plan", "x SDPA incl. sel.", "{:.2f}"), ("density", "kept density", "{:.3f}"),
        ("tiles", "Flex tiles", "{:.3f}")])


def _gemma3(shape: str):
    from transformers import Gemma3TextConfig

    if shape == "gemma3-270m":
        dims = dict(hidden_size=640, intermediate_size=2048, num_hidden_layers=18, num_attention_heads=4,
                    num_key_value_heads=1, head_dim=256, sliding_window=512)
    elif shape == "gemma3-1b":
        dims = dict(hidden_size=1152, intermediate_size=6912, num_hidden_layers=26, num_attention_heads=4,
                    num_key_value_heads=1, head_dim=256, sliding_window=512)
    else:
        raise ValueError(f"unknown shape {shape!r}")
    layers = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(dims["num_hidden_layers"])]
    cfg = Gemma3TextConfig(vocab_size=32000, max_position_embeddings=65536, layer_types=layers, **dims)
    return cfg


def run_prefill(args) -> dict:
    torch = require_cuda()
    from transformers import Gemma3ForCausalLM

    from kvlab.core import attach, use_pattern

    from .pattern import DHSAPattern, dhsa_layers

    rows = []
    for shape in args.shapes:
        cfg = _gemma3(shape)
        torch.manual_seed(0)
        model = attach(Gemma3ForCausalLM(cfg).to("cuda", torch.bfloat16).eval())
        ids = torch.randint(0, cfg.vocab_size, (1, args.seq), device="cuda")
        pattern = DHSAPattern(args.budget_keys, chunking="fixed", chunk_size=64, initial=args.initial,
                              backend="triton")

        def run(use):
            with torch.no_grad(), (use_pattern(model, pattern, dhsa_layers(model)) if use else _null()):
                model(input_ids=ids, use_cache=False, logits_to_keep=1)

        for method, use in (("sdpa", False), ("dhsa", True)):
            torch.cuda.reset_peak_memory_stats()
            t = bench_ms(lambda: run(use), args.time_budget, max_reps=5)["ms"]
            peak = torch.cuda.max_memory_allocated() / 2**30
            rows.append({"shape": shape, "seq": args.seq, "method": method, "ms": t, "peak_gib": peak})
            print(json.dumps(rows[-1]), flush=True)
        del model
        torch.cuda.empty_cache()
    return {"rows": rows, "budget": args.budget_keys}


def run_tune(args) -> dict:
    """Tile-size sweep of the Triton kernel at one length (used to choose :func:`~kvlab.dhsa.triton.default_config`)."""
    torch = require_cuda()

    from .reference import chunk_plan
    from .triton import dhsa_attention_triton

    h, hk, d, budget, n = args.heads, args.kv_heads, args.dim, args.budget_keys, args.seq
    q, k, v = random_qkv(n, h, hk, d)
    rows = []
    for name, bd in _chunkings(n, q.device).items():
        plan = chunk_plan(q, k, bd, budget, initial=args.initial)
        ref = dhsa_attention_triton(q, k, v, bd, budget, initial=args.initial, plan=plan)
        grid = [(bm, bn, w, st) for bm in (16, 32, 64, 128) for bn in (32, 64, 128) for w in (4, 8) for st in (1, 2, 3)]
        for bm, bn, warps, stages in grid:
            cfg = dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=warps, num_stages=stages)
            row = {"chunks": name, **cfg}

            def call(cfg=cfg, bd=bd, plan=plan):
                return dhsa_attention_triton(q, k, v, bd, budget, initial=args.initial, plan=plan, config=cfg)

            try:
                row["max_diff"] = float((call().float() - ref.float()).abs().max())
                row["ms"] = bench_ms(call, 0.3)["ms"]
            except Exception as exc:  # a config the compiler refuses: report it, go on
                row["error"] = f"{type(exc).__name__}: {exc}"[:120]
            rows.append(row)
        best = min((r for r in rows if r["chunks"] == name and "ms" in r), key=lambda r: r["ms"])
        print(json.dumps({"best": best}), flush=True)
    return {"seq": n, "budget": budget, "rows": rows}


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *a):
        return False


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m kvlab bench dhsa", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=sorted(COMMANDS))
    ap.add_argument("--out", default="benchmarks/results", help="folder for the JSON and table")
    ap.add_argument("--tag", default="", help="suffix for output names (e.g. the device)")
    ap.add_argument("--seqs", type=ints, default=[4096, 8192, 16384, 32768])
    ap.add_argument("--seq", type=int, default=32768)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=None)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--budget-keys", type=int, default=2048, help="N_b, keys per query")
    ap.add_argument("--initial", type=int, default=64)
    ap.add_argument("--share", default="0,1", help="selection per head (0) and/or shared by heads (1)")
    ap.add_argument("--shapes", default="gemma3-270m,gemma3-1b")
    ap.add_argument("--time-budget", type=float, default=1.0, help="seconds of repeats per measurement")
    ap.add_argument("--no-flex", action="store_true")
    return ap


def _ops(argv: list[str]) -> int:
    return _run(["ops", *argv])


def _prefill(argv: list[str]) -> int:
    return _run(["prefill", *argv])


def _run(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    args.kv_heads = args.kv_heads or args.heads
    args.share = [bool(int(s)) for s in args.share.split(",") if s]
    args.shapes = [s for s in args.shapes.split(",") if s]
    out = Path(args.out)
    tag = f"_{args.tag}" if args.tag else ""
    info = device_info()
    print(json.dumps(info), flush=True)
    if args.what == "ops":
        rec = run_ops(args) | {"info": info}
        table = table_ops(rec)
    elif args.what == "tune":
        rec = run_tune(args) | {"info": info}
        ok = sorted((r for r in rec["rows"] if "ms" in r), key=lambda r: (r["chunks"], r["ms"]))
        table = fmt_table(ok[:12] + [r for r in ok if r["chunks"] != ok[0]["chunks"]][:12],
                          [("chunks", "chunks", ""), ("BLOCK_M", "BLOCK_M", ""), ("BLOCK_N", "BLOCK_N", ""),
                           ("num_warps", "warps", ""), ("num_stages", "stages", ""), ("ms", "ms", "{:.2f}"),
                           ("max_diff", "max diff", "{:.2g}")])
    else:
        rec = run_prefill(args) | {"info": info}
        table = fmt_table(rec["rows"], [("shape", "model", ""), ("seq", "N", ""), ("method", "method", ""),
                                         ("ms", "ms", "{:.1f}"), ("peak_gib", "peak GiB", "{:.2f}")])
    write_outputs(out, f"dhsa_{args.what}{tag}", rec, table, info)
    return 0


def _tune(argv: list[str]) -> int:
    return _run(["tune", *argv])


COMMANDS = {"ops": _ops, "prefill": _prefill, "tune": _tune}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        build_parser().print_help()
        return 0 if not argv or argv[0] in ("-h", "--help") else 2
    return COMMANDS[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main())
