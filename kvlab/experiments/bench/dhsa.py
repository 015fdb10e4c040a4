"""``python -m kvlab bench dhsa WHAT``: GPU benchmarks of DHSA prefill attention, with a JSON record.

Subcommands (each writes ``<out>/dhsa_<what>.json`` and ``.md`` with the device named, prints a table):

* ``ops``      DHSA attention at N = 4k..32k (bf16, 32 heads, dim 128, budget 2048 keys per query):
  dense causal SDPA, FlexAttention with the DHSA block mask (:mod:`kvlab.dhsa.flex`), the Triton kernel
  (:mod:`kvlab.dhsa.triton`, each ``--variants`` side by side), each on the same kept set; apart, the
  time of chunking (the boundary predictor, random weights, on the layer's keys), of the selection
  (Eq. 4 chunk representations, similarity, ranking: :func:`kvlab.dhsa.triton.chunk_plan_fast`, what
  ``dhsa_selection`` runs on a GPU, and beside it the readable :func:`kvlab.dhsa.reference.chunk_plan`), of the
  kernel's launch tables (:func:`~kvlab.dhsa.triton.launch_tables_fast`; the reference's for the best variant) and
  of the block mask; the kept density (kept entries over causal entries: the
  limit on saved work), the share of 128 x 128 tiles Flex touches, and the key/value bytes each kernel
  variant loads (``kv_gib``, what L2 must deliver) with the rate it reached. Chunkings: fixed 64-token
  chunks and random chunk lengths in [16, 128] (what a predictor gives).
* ``tune``     tile-size sweep of one Triton variant at one length (how the defaults were chosen).
* ``prefill``  end to end (Tables 2-3): a Gemma3-270m-shaped and a Gemma3-1B-shaped model (random weights,
  bf16; :func:`kvlab.experiments.dhsa.measures.random_model`), one prefill of N tokens, dense attention (``--attn
  eager,sdpa``: both columns) vs DHSA (Triton on CUDA, fixed chunks, global layers), latency and peak memory.
* ``decode``   Fig. 7-10: latency and memory per generated token after an N-token prompt, dense vs
  StreamingLLM / H2O (``--cache`` entries per layer) vs DHSA (full cache, ``--budget-keys`` keys read per token).

``prefill`` and ``decode`` also run on a CPU (``--shapes tiny`` for a smoke test; the timing is then wall
clock and the memory from ``torch.profiler``: :func:`kvlab.experiments.dhsa.measures.prefill_cost`).

Timing: CUDA events around each call after a warm-up call, median of repeats sized to a time budget
(:mod:`kvlab.kernels.benchmarking`). Example (H100/H200)::

    python -m kvlab bench dhsa ops --seqs 4096,8192,16384,32768 --variants ranges,lists
    python -m kvlab bench dhsa tune --variant lists --chunkings fixed64
    python -m kvlab bench dhsa prefill --seqs 4096,8192,16384,32768
    python -m kvlab bench dhsa decode --seqs 4096,16384 --steps 64
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from kvlab.kernels.benchmarking import (allow_many_compiles, bench_ms, device_info, fmt_table, ints, random_qkv,
                                        require_cuda, write_outputs)

__all__ = ["COMMANDS", "main", "random_boundaries", "spaced_boundaries", "kept_density"]


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


def spaced_boundaries(n: int, mean: int = 64, gap: int = 8, cap: int = 128, seed: int = 0, device=None):
    """Offsets shaped like the predictor's in the end-to-end setup (``n / mean`` boundaries at least ``gap``
    apart, as NMS leaves them, chunks longer than ``cap`` cut): lengths ``gap + Exp(mean - gap)``, split at
    ``cap``. A stand-in for predicted chunks at full length (the predictor has random weights there too)."""
    import torch

    from kvlab.dhsa.reference import split_long_chunks

    g = torch.Generator().manual_seed(seed)
    lens = (gap + torch.empty(2 * n // mean + 8).exponential_(1.0 / (mean - gap), generator=g)).round().long()
    ends = torch.cumsum(lens, 0)
    ends = ends[ends < n]
    bd = torch.cat([torch.zeros(1, dtype=torch.long), ends, torch.tensor([n])])
    return split_long_chunks(bd, cap).to(device)


def _chunkings(n, device, names=("fixed64", "random16-128")):
    from kvlab.dhsa.reference import fixed_boundaries

    all_ = {"fixed64": lambda: fixed_boundaries(n, 64, device=device),
            "fixed128": lambda: fixed_boundaries(n, 128, device=device),
            "random16-128": lambda: random_boundaries(n, 16, 128, 0, device),
            "spaced64": lambda: spaced_boundaries(n, device=device)}
    for name in names:
        if name not in all_:
            raise ValueError(f"chunkings: {name!r} is not one of {sorted(all_)}")
    return {name: all_[name]() for name in names}


def _chunking_ms(k, time_budget):
    """Milliseconds of the learned chunking on one layer's keys: boundary predictor (random weights, the
    paper's sizes, in the keys' dtype, eager) + threshold + NMS on the GPU + at most n/64 chunks
    (:func:`kvlab.dhsa.boundary_predictor.predict_boundaries`). ``python -m kvlab run dhsa-predictor-time`` adds the
    ``torch.compile`` fast path and the comparison with one layer's SDPA."""
    import torch

    from kvlab.dhsa.api import predict_boundaries
    from kvlab.dhsa.boundary_predictor import BoundaryPredictor, key_features

    pred = BoundaryPredictor(key_features(k[:, :, :8]).shape[-1]).to(k.device, k.dtype).eval()  # bf16, eager
    with torch.no_grad():
        return bench_ms(lambda: predict_boundaries(pred, k, max_chunks=k.shape[2] // 64, max_len=128),
                        time_budget, max_reps=10)["ms"]


def _reference_plan(q, k, bd, budget, kw, fast_plan, time_budget) -> dict:
    """The readable :func:`~kvlab.dhsa.reference.chunk_plan`'s time (``plan_ref_ms``) and the share of ranked lists
    the fast plan writes identically (``plan_equal``: float32 chunk sums added in another order can swap a near
    tie; counts and offsets are always equal)."""
    import torch

    from kvlab.dhsa.reference import chunk_plan

    ref = chunk_plan(q, k, bd, budget, **kw)
    same = [(a == b).all(-1).float().mean() for a, b in zip(ref.tokens, fast_plan.tokens)]
    counts = all(torch.equal(a, b) for a, b in zip(ref.n_tokens, fast_plan.n_tokens))
    out = {"plan_equal": float(torch.stack(same).mean()), "plan_counts_equal": counts}
    del ref
    out["plan_ref_ms"] = bench_ms(lambda: chunk_plan(q, k, bd, budget, **kw), time_budget)["ms"]
    return out


_OPTIONS = {"lazy": {"LAZY": True}, "gather": {"RUNS": 0}, "tma": {"RUNS": 2}}


def _variant_tables(plan, spec: str, *, dtype, head_dim: int, group: int, fast: bool = True):
    """Launch tables of a variant spec: a kernel variant with ``+option`` switches on its default config
    (``packed+lazy``: lazy rescaling, ``packed+gather``: gathered key loads, ``packed+tma``: TMA copies).
    ``fast``: :func:`~kvlab.dhsa.triton.launch_tables_fast` (what ``dhsa_selection`` runs on a GPU), else the
    readable :func:`~kvlab.dhsa.triton.launch_tables`."""
    from kvlab.dhsa.triton import VARIANTS, default_config, launch_tables, launch_tables_fast, host_plan

    base, *opts = spec.split("+")
    if base not in VARIANTS or any(o not in _OPTIONS for o in opts):
        raise ValueError(f"variants: {spec!r} must be one of {VARIANTS} with optional +{'/+'.join(_OPTIONS)}")
    cfg = None
    if opts:
        cfg = default_config(host_plan(plan) if fast else plan, dtype, base, head_dim=head_dim, group=group)
        for o in opts:
            cfg.update(_OPTIONS[o])
    return (launch_tables_fast if fast else launch_tables)(plan, base, cfg, dtype, head_dim=head_dim, group=group)


def _diagnose(q, k, v, plan, tables, budget, time_budget) -> dict:
    """Where the ``"packed"`` kernel stands against its two limits, measured apart: ``ms_packed_loads``, the same
    key/value gathers with no arithmetic (``LOADS_ONLY``: the traffic alone), and ``ms_packed_hot``, the same
    arithmetic and instruction stream with every list pointing at one hot 64-key block (the loads hit in
    cache: arithmetic + issue alone)."""
    import torch

    from kvlab.dhsa.triton import LaunchTables, dhsa_attention_triton

    out = {}
    loads = tables._replace(launches=tuple((t, dict(c, LOADS_ONLY=True)) for t, c in tables.launches))
    out["ms_packed_loads"] = bench_ms(lambda: dhsa_attention_triton(q, k, v, None, budget, tables=loads),
                                      time_budget)["ms"]
    hot_tok = (torch.arange(tables.tok.shape[-1], device=q.device, dtype=torch.int32) % 64 + plan.initial)
    hot = LaunchTables(tables.tiles, hot_tok.expand_as(tables.tok).contiguous(), tables.ntok, tables.variant,
                       tables.config, tables.budget, tables.initial, tables.launches)
    out["ms_packed_hot"] = bench_ms(lambda: dhsa_attention_triton(q, k, v, None, budget, tables=hot),
                                    time_budget)["ms"]
    return out


def run_ops(args) -> dict:
    torch = require_cuda()
    import torch.nn.functional as F

    from kvlab.dhsa.flex import touched_blocks, dhsa_attention_flex, dhsa_block_mask
    from kvlab.dhsa.reference import chunk_plan
    from kvlab.dhsa.triton import chunk_plan_fast, dhsa_attention_triton, kv_bytes, mma_rows

    allow_many_compiles()
    h, hk, d, budget, init = args.heads, args.kv_heads, args.dim, args.budget_keys, args.initial
    dtype = torch.bfloat16
    rows = []
    for n in args.seqs:
        q, k, v = random_qkv(n, h, hk, d, dtype)
        dense = bench_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=hk != h),
                         args.time_budget)["ms"]
        chunking = _chunking_ms(k, args.time_budget)
        for name, bd in _chunkings(n, q.device, args.chunkings).items():
            for share in args.share:
                kw = dict(initial=init, share_heads=share)
                plan = chunk_plan_fast(q, k, bd, budget, **kw)  # what dhsa_selection runs on a GPU
                row = {"seq": n, "chunks": name, "share_heads": share, "dense_ms": dense,
                       "density": kept_density(n, budget), "chunking_ms": chunking}
                row["plan_ms"] = bench_ms(lambda: chunk_plan_fast(q, k, bd, budget, **kw), args.time_budget)["ms"]
                row |= _reference_plan(q, k, bd, budget, kw, plan, args.time_budget)
                for var in args.variants:  # each kernel variant on the same plan
                    tkw = dict(dtype=dtype, head_dim=d, group=h // hk)
                    tables = _variant_tables(plan, var, **tkw)
                    row[f"tables_ms_{var}"] = bench_ms(lambda: _variant_tables(plan, var, **tkw), 0.3)["ms"]
                    row[f"config_{var}"] = {key: val for key, val in tables.config.items() if key != "LOADS_ONLY"}
                    row[f"ms_{var}"] = bench_ms(lambda: dhsa_attention_triton(q, k, v, bd, budget, tables=tables),
                                                args.time_budget)["ms"]
                    row[f"kv_gib_{var}"] = kv_bytes(tables, plan, h, d) / 2**30
                    row[f"tbps_{var}"] = row[f"kv_gib_{var}"] * 2**30 / row[f"ms_{var}"] / 1e9
                    row[f"x_dense_{var}"] = dense / row[f"ms_{var}"]
                    comp, live = mma_rows(tables, h)
                    row[f"row_use_{var}"] = live / comp  # live query rows over the rows the MMAs run
                    if var == "packed" and args.diagnose:
                        row |= _diagnose(q, k, v, plan, tables, budget, args.time_budget)
                        row["tbps_packed_loads"] = row["kv_gib_packed"] * 2**30 / row["ms_packed_loads"] / 1e9
                best = min(args.variants, key=lambda var: row[f"ms_{var}"])
                row["best"], row["triton_ms"] = best, row[f"ms_{best}"]
                ref_plan = chunk_plan(q, k, bd, budget, **kw)
                row["tables_ref_ms"] = bench_ms(lambda: _variant_tables(ref_plan, best, **tkw, fast=False), 0.3)["ms"]
                del ref_plan
                if not args.no_flex and n in (args.flex_seqs or args.seqs):
                    try:
                        row["mask_ms"] = bench_ms(lambda: dhsa_block_mask(plan), args.time_budget, max_reps=5)["ms"]
                        bm = dhsa_block_mask(plan)
                        touched = touched_blocks(plan, 128)
                        nb = touched.shape[-1]
                        row["tiles"] = float(touched.float().sum() / (touched.shape[1] * nb * (nb + 1) / 2))
                        row["flex_ms"] = bench_ms(lambda: dhsa_attention_flex(q, k, v, bd, budget, block_mask=bm, **kw),
                                                  args.time_budget)["ms"]
                    except Exception as exc:  # report, keep the other numbers
                        row["flex_error"] = f"{type(exc).__name__}: {exc}"[:200]
                row["x_dense"] = dense / row["triton_ms"]
                prep = row["plan_ms"] + row[f"tables_ms_{best}"]  # selection + the kernel's tables
                row["selection_ms"] = prep
                row["selection_ref_ms"] = row["plan_ref_ms"] + row["tables_ref_ms"]
                row["x_dense_with_plan"] = dense / (row["triton_ms"] + prep)
                if "flex_ms" in row:
                    row["x_flex"] = row["flex_ms"] / row["triton_ms"]
                row["plan_share"] = prep / (prep + row["triton_ms"])  # selection vs attention (chunks given)
                total = row["chunking_ms"] + prep + row["triton_ms"]
                row["chunking_selection_share"] = (row["chunking_ms"] + prep) / total  # with learned chunking
                rows.append(row)
                print(json.dumps(row), flush=True)
                if getattr(args, "on_rows", None):  # partial record after every row (a run may be stopped)
                    args.on_rows(_ops_record(args, rows))
        del q, k, v
        torch.cuda.empty_cache()
    return _ops_record(args, rows)


def _ops_record(args, rows) -> dict:
    return {"heads": args.heads, "kv_heads": args.kv_heads, "dim": args.dim, "budget": args.budget_keys,
            "initial": args.initial, "variants": args.variants, "rows": rows}


def table_ops(rec: dict) -> str:
    per_variant = [col for var in rec.get("variants", []) for col in (
        (f"ms_{var}", f"{var} ms", "{:.2f}"), (f"x_dense_{var}", f"{var} x SDPA", "{:.2f}"),
        (f"tbps_{var}", f"{var} K/V TB/s", "{:.1f}"), (f"row_use_{var}", f"{var} live rows", "{:.2f}"))]
    diag = [("ms_packed_loads", "packed loads-only ms", "{:.2f}"), ("tbps_packed_loads", "loads-only TB/s", "{:.1f}"),
            ("ms_packed_hot", "packed hot-keys ms", "{:.2f}")] if any("ms_packed_loads" in r for r in rec["rows"]) else []
    return fmt_table(rec["rows"], [
        ("seq", "N", ""), ("chunks", "chunks", ""), ("share_heads", "shared sel.", ""),
        ("dense_ms", "SDPA ms", "{:.2f}"), ("flex_ms", "Flex ms", "{:.2f}"), *per_variant, *diag,
        ("triton_ms", "Triton ms", "{:.2f}"), ("plan_ms", "plan ms", "{:.2f}"),
        ("selection_ms", "selection ms (plan + tables)", "{:.2f}"),
        ("selection_ref_ms", "selection ms (reference)", "{:.2f}"),
        ("plan_equal", "lists equal", "{:.4f}"),
        ("chunking_ms", "chunking ms", "{:.2f}"), ("x_dense", "x SDPA", "{:.2f}"), ("x_flex", "x Flex", "{:.2f}"),
        ("x_dense_with_plan", "x SDPA incl. sel.", "{:.2f}"),
        ("chunking_selection_share", "chunking+sel. share", "{:.2f}"), ("density", "kept density", "{:.3f}"),
        ("tiles", "Flex tiles", "{:.3f}")])


def _device():
    import torch

    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def run_prefill(args) -> dict:
    """Tables 2-3: one prefill of N tokens per shape, dense (eager / SDPA) vs DHSA in the global layers."""
    import torch

    from kvlab.experiments.dhsa.measures import prefill_cost, random_model
    from kvlab.dhsa.pattern import DHSAPattern, dhsa_layers

    rows = []
    dev = _device()
    for shape in args.shapes:
        for impl in args.attn:
            model = random_model(shape, attn_implementation=impl, device=dev)
            layers = dhsa_layers(model)
            pattern = DHSAPattern(args.budget_keys, chunking="fixed", chunk_size=args.chunk, initial=args.initial)
            for n in args.seqs:
                ids = torch.randint(0, model.config.vocab_size, (1, n), device=dev)
                for method, pat in (("dense", None), ("dhsa", pattern)):
                    try:
                        cost = prefill_cost(model, ids, pat, layers, repeats=args.repeats)
                        row = {"ms": cost["ms"], "peak_gib": cost["peak_bytes"] / 2**30}
                    except torch.OutOfMemoryError:
                        row = {"error": "OOM"}
                    except Exception as exc:  # report, keep the other numbers
                        row = {"error": f"{type(exc).__name__}: {exc}"[:160]}
                    rows.append({"shape": shape, "attn": impl, "seq": n, "method": method, **row})
                    print(json.dumps(rows[-1]), flush=True)
                    if dev.type == "cuda":
                        torch.cuda.empty_cache()
            del model
    return {"rows": rows, "budget": args.budget_keys, "chunk": args.chunk, "initial": args.initial}


def run_decode(args) -> dict:
    """Fig. 7-10: latency and memory per generated token after a prompt of N tokens: dense (full cache),
    StreamingLLM and H2O (cache of ``--cache`` entries), DHSA (full cache, ``--budget-keys`` read per token)."""
    import torch

    from kvlab.baselines import H2O, Full, StreamingLLM

    from kvlab.experiments.dhsa.measures import decode_cost, random_model
    from kvlab.dhsa.pattern import DHSAPattern, dhsa_layers
    from kvlab.dhsa.policy import DHSADecode

    rows = []
    dev = _device()
    for shape in args.shapes:
        model = random_model(shape, device=dev)
        layers = dhsa_layers(model)
        setups = {"dense": (Full(), None), "streamingllm": (StreamingLLM(4, cache_size=args.cache), None),
                  "h2o": (H2O(args.cache, recent=args.cache // 2), None),
                  "dhsa": (DHSADecode(args.budget_keys, initial=args.initial),
                           DHSAPattern(args.budget_keys, chunking="fixed", chunk_size=args.chunk,
                                       initial=args.initial))}
        for n in args.seqs:
            ids = torch.randint(0, model.config.vocab_size, (1, n), device=dev)
            for method, (policy, pattern) in setups.items():
                try:
                    c = decode_cost(model, ids, policy, pattern, layers, steps=args.steps)
                except (torch.OutOfMemoryError, RuntimeError, ValueError) as exc:  # report, keep the other numbers
                    err = "OOM" if isinstance(exc, torch.OutOfMemoryError) else f"{type(exc).__name__}: {exc}"[:160]
                    rows.append({"shape": shape, "seq": n, "method": method, "error": err})
                    continue
                ms = sorted(c["step_ms"][1:] or c["step_ms"])  # the first step pays one-off costs
                row = {"shape": shape, "seq": n, "method": method, "prefill_ms": c["prefill_ms"],
                       "step_ms": ms[len(ms) // 2], "cache_mib": c["cache_bytes"][-1] / 2**20,
                       "step_peak_mib": None if c["peak_bytes"] is None else max(c["peak_bytes"]) / 2**20,
                       "curve_ms": c["step_ms"], "curve_cache_bytes": c["cache_bytes"]}
                rows.append(row)
                print(json.dumps({k: v for k, v in row.items() if not k.startswith("curve")}), flush=True)
                if dev.type == "cuda":
                    torch.cuda.empty_cache()
        del model
    return {"rows": rows, "budget": args.budget_keys, "cache": args.cache, "steps": args.steps}


def _tune_one(row, plan, variant, cfg, q, k, v, bd, budget, ref):
    """Time one config into ``row`` (``ms``, ``max_diff`` against the reference kernel), or its error."""
    from kvlab.dhsa.triton import dhsa_attention_triton, launch_tables

    try:
        tables = launch_tables(plan, variant, cfg)

        def call():
            return dhsa_attention_triton(q, k, v, bd, budget, tables=tables)

        row["max_diff"] = float((call().float() - ref.float()).abs().max())
        row["ms"] = bench_ms(call, 0.3)["ms"]
    except Exception as exc:  # a config the compiler refuses: report it, go on
        row["error"] = f"{type(exc).__name__}: {exc}"[:120]


def _tune_grid(args, bms, bns, warps_, stages_) -> list:
    """The configs to time: tuples of the ``--grid`` axes (``packed`` adds ``--pack``, ``--long-rows``,
    ``--runs``), or the dicts of ``--configs``."""
    if args.variant == "packed":  # BLOCK_M values are rows per head; --pack, --long-rows add two axes
        grid = [(bm, bn, w, st, p, lr, ru) for bm in bms for bn in bns for w in warps_ for st in stages_
                for p in args.pack for lr in args.long_rows for ru in args.runs]
    else:
        grid = [(bm, bn, w, st, 1, 0, 0) for bm in bms for bn in bns for w in warps_ for st in stages_]
    if args.configs:  # explicit configs (JSON list of dicts) instead of the grid
        grid = [json.loads(args.configs)] if args.configs.lstrip().startswith("{") else json.loads(args.configs)
    return grid


def _tune_config(item, variant: str) -> dict:
    """One item of :func:`_tune_grid` as the launch config of ``variant``."""
    if isinstance(item, dict):
        cfg = dict(item)
        if variant == "packed":
            cfg.setdefault("BLOCK_M", cfg["ROWS"] * cfg.get("PACK", 1))
        return cfg
    bm, bn, warps, stages, pack, long_rows, runs = item
    if variant == "packed":
        return dict(ROWS=bm, PACK=pack, BLOCK_M=bm * pack, BLOCK_N=bn, num_warps=warps, num_stages=stages,
                    LONG_ROWS=long_rows, LONG_WARPS=8, RUNS=runs)
    return dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=warps, num_stages=stages)


def run_tune(args) -> dict:
    """Tile-size sweep of one Triton variant at one length (how :func:`~kvlab.dhsa.triton.default_config`
    was chosen)."""
    torch = require_cuda()

    from kvlab.dhsa.reference import chunk_plan
    from kvlab.dhsa.triton import dhsa_attention_triton

    h, hk, d, budget, n = args.heads, args.kv_heads, args.dim, args.budget_keys, args.seq
    q, k, v = random_qkv(n, h, hk, d)
    bms, bns, warps_, stages_ = ([int(x) for x in part.split(",")] for part in args.grid.split(":"))
    rows = []
    share = bool(args.share_tune)
    for name, bd in _chunkings(n, q.device, args.chunkings).items():
        plan = chunk_plan(q, k, bd, budget, initial=args.initial, share_heads=share)
        ref = dhsa_attention_triton(q, k, v, bd, budget, plan=plan, variant="ranges")
        for item in _tune_grid(args, bms, bns, warps_, stages_):
            cfg = _tune_config(item, args.variant)
            row = {"chunks": name, "variant": args.variant, "share_heads": share, **cfg}
            _tune_one(row, plan, args.variant, cfg, q, k, v, bd, budget, ref)
            rows.append(row)
            print(json.dumps(row), flush=True)
        done = [r for r in rows if r["chunks"] == name and "ms" in r]
        if done:
            print(json.dumps({"best": min(done, key=lambda r: r["ms"])}), flush=True)
    return {"seq": n, "budget": budget, "variant": args.variant, "rows": rows}


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m kvlab bench dhsa", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=sorted(COMMANDS))
    ap.add_argument("--out", default="build/bench",
                    help="folder for the JSON and table (default build/bench; the committed "
                         "benchmarks/results only when named)")
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
    ap.add_argument("--diagnose", action="store_true",
                    help="ops: also time the 'packed' kernel's loads alone and its arithmetic on hot keys")
    ap.add_argument("--flex-seqs", type=ints, default=None, help="ops: time Flex only at these lengths (default: all)")
    ap.add_argument("--variants", default="ranges,lists", help="ops: Triton kernel variants side by side")
    ap.add_argument("--variant", default="lists", help="tune: the Triton variant to sweep")
    ap.add_argument("--chunkings", default="fixed64,random16-128",
                    help="ops/tune: fixed64, fixed128, random16-128, spaced64 (predictor-like)")
    ap.add_argument("--pack", type=ints, default=[1], help="tune 'packed': query heads per program")
    ap.add_argument("--long-rows", type=ints, default=[0], help="tune 'packed': rows of the long-chunk launch (0: none)")
    ap.add_argument("--runs", type=ints, default=[0],
                    help="tune 'packed': key tile loads, 0 gathered, 1 contiguous runs, 2 TMA (fixed chunks)")
    ap.add_argument("--configs", default="",
                    help="tune: a JSON list of config dicts to time instead of --grid (e.g. packed ROWS/PACK/LONG_ROWS)")
    ap.add_argument("--share-tune", type=int, default=0, help="tune: 1 = one selection for all heads")
    ap.add_argument("--grid", default="16,32,64,128:32,64,128:4,8:1,2,3",
                    help="tune: BLOCK_M values:BLOCK_N values:warps:stages")
    ap.add_argument("--attn", default="eager,sdpa", help="prefill: dense attention implementations to compare")
    ap.add_argument("--chunk", type=int, default=64, help="prefill/decode: DHSA chunk size (fixed chunks)")
    ap.add_argument("--repeats", type=int, default=3, help="prefill: timed repeats (median)")
    ap.add_argument("--cache", type=int, default=128, help="decode: StreamingLLM / H2O cache entries (paper: 128)")
    ap.add_argument("--steps", type=int, default=32, help="decode: generated tokens")
    return ap


def _ops(argv: list[str]) -> int:
    return _run(["ops", *argv])


def _prefill(argv: list[str]) -> int:
    return _run(["prefill", *argv])


def _tune_table(rec: dict) -> str:
    ok = sorted((r for r in rec["rows"] if "ms" in r), key=lambda r: (r["chunks"], r["ms"]))
    return fmt_table(ok[:12] + [r for r in ok if r["chunks"] != ok[0]["chunks"]][:12],
                     [("chunks", "chunks", ""), ("variant", "variant", ""),
                      ("BLOCK_M", "BLOCK_M", ""), ("PACK", "pack", ""), ("LONG_ROWS", "long rows", ""),
                      ("RUNS", "runs", ""),
                      ("BLOCK_N", "BLOCK_N", ""),
                      ("num_warps", "warps", ""), ("num_stages", "stages", ""), ("ms", "ms", "{:.2f}"),
                      ("max_diff", "max diff", "{:.2g}")])


def _prefill_table(rec: dict) -> str:
    return fmt_table(rec["rows"], [("shape", "model", ""), ("attn", "dense attn", ""), ("seq", "N", ""),
                                   ("method", "method", ""), ("ms", "ms", "{:.1f}"),
                                   ("peak_gib", "peak GiB above weights", "{:.3f}"), ("error", "", "")])


def _decode_table(rec: dict) -> str:
    return fmt_table(rec["rows"], [("shape", "model", ""), ("seq", "prompt N", ""), ("method", "method", ""),
                                   ("prefill_ms", "prefill ms", "{:.1f}"), ("step_ms", "ms / token", "{:.2f}"),
                                   ("cache_mib", "cache MiB", "{:.1f}"),
                                   ("step_peak_mib", "step peak MiB", "{:.1f}"), ("error", "", "")])


def _parse_args(argv: list[str]) -> argparse.Namespace:
    """The options of ``argv``, comma lists split."""
    args = build_parser().parse_args(argv)
    args.kv_heads = args.kv_heads or args.heads
    args.share = [bool(int(s)) for s in args.share.split(",") if s]
    args.shapes = [s for s in args.shapes.split(",") if s]
    args.variants = [s for s in args.variants.split(",") if s]
    args.chunkings = [s for s in args.chunkings.split(",") if s]
    args.attn = [s for s in args.attn.split(",") if s]
    return args


def _run(argv: list[str]) -> int:
    args = _parse_args(argv)
    out = Path(args.out)
    tag = f"_{args.tag}" if args.tag else ""
    info = device_info() if args.what in ("ops", "tune") or _device().type == "cuda" else _cpu_info()
    print(json.dumps(info), flush=True)
    if args.what == "ops":
        def on_rows(partial):
            write_outputs(out, f"dhsa_ops{tag}", partial | {"info": info, "partial": True}, table_ops(partial), info)

        args.on_rows = on_rows
        rec = run_ops(args) | {"info": info}
        table = table_ops(rec)
    elif args.what == "tune":
        rec = run_tune(args) | {"info": info}
        table = _tune_table(rec)
    elif args.what == "prefill":
        rec = run_prefill(args) | {"info": info}
        table = _prefill_table(rec)
    else:
        rec = run_decode(args) | {"info": info}
        table = _decode_table(rec)
    write_outputs(out, f"dhsa_{args.what}{tag}", rec, table, info)
    return 0


def _tune(argv: list[str]) -> int:
    return _run(["tune", *argv])


def _decode(argv: list[str]) -> int:
    return _run(["decode", *argv])


def _cpu_info() -> dict:
    import platform
    import time

    import torch
    import transformers

    return {"device": f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)",
            "torch": torch.__version__, "transformers": transformers.__version__,
            "date": time.strftime("%Y-%m-%d %H:%M:%S")}


COMMANDS = {"ops": _ops, "prefill": _prefill, "tune": _tune, "decode": _decode}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        build_parser().print_help()
        return 0 if not argv or argv[0] in ("-h", "--help") else 2
    return COMMANDS[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main())
