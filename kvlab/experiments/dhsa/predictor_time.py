"""DHSA's boundary predictor as a fast path: its time against dense SDPA attention of one layer, in one run.

Issue 24's target: the learned chunking (predictor + NMS, run once per forward) costs <= 10 % of one layer's dense
SDPA attention at 32k tokens. Measured here, per layer shape (bf16 q/k/v, random; the predictor at the paper's size,
window 4, 8 heads, hidden 256, random weights, input = the layer's keys, ``kv_heads * head_dim`` channels):

* ``sdpa_ms``: causal SDPA of one layer (``enable_gqa``), the reference;
* ``pred_fp32_ms`` / ``pred_bf16_ms``: the predictor alone, eager, in float32 / bfloat16;
* ``pred_compiled_ms``: ``torch.compile(predictor)`` in bfloat16 (the fast path);
* ``nms_ms``: threshold + NMS + chunk cap + cuts (:func:`kvlab.dhsa.boundary_predictor.nms_boundaries`), on the GPU;
* ``chunking_ms``: :func:`kvlab.dhsa.api.predict_boundaries` with the compiled bf16 predictor: all of it;
* ``share``: ``chunking_ms / sdpa_ms`` (target <= 0.10), and ``chunks`` / ``mean_len`` of the result;
* the fast path (:mod:`kvlab.dhsa.chunking`, what ``predict_boundaries(backend="auto")`` runs on a GPU):
  ``fast_pred_ms`` (:func:`~kvlab.dhsa.chunking.predictor_logits`, bf16, Triton window attention),
  ``fast_nms_ms`` (:func:`~kvlab.dhsa.chunking.nms_boundaries_fast`: Triton NMS + cap + cuts), ``fast_ms`` (the
  whole :func:`~kvlab.dhsa.chunking.predict_boundaries_fast`), ``share_fast`` = ``fast_ms / sdpa_ms``;
  ``fast_compiled_ms``: the same with ``torch.compile(predictor_logits)``; ``fast_graph_ms``: with
  :class:`~kvlab.dhsa.chunking.GraphedLogits` (the predictor replayed from a CUDA graph); ``nms_exact``: the fast
  NMS gives the reference's offsets on this shape's probabilities; ``agree``: share of the reference's boundaries
  (compiled bf16 predictor) that the fast path also returns (bf16 rounding can move a probability across the
  threshold).

Shapes: ``gemma2-2b`` (8 heads, 4 KV heads, dim 256: 1024 predictor channels), ``gemma3-270m`` (4 / 1 / 256:
256 channels), ``ops`` (32 / 32 / 128: the kernel benchmark's shape, 4096 channels: an upper bound).

    python -m kvlab run dhsa-predictor-time --out OUT/dhsa_predictor          # GPU, ~1-2 min (compiles)
    python -m kvlab run dhsa-predictor-time --out /tmp/x --smoke               # CPU: 256 tokens, shape tiny

Writes ``OUT/NAME.json`` / ``NAME.md`` (every shape's row) and ``OUT/NAME.examples.jsonl.gz`` (one record per shape
and timing, example ``<shape>/L<seq>``).
"""
from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from kvlab.dhsa import chunking
from kvlab.dhsa.api import predict_boundaries  # backend="auto": the fast path on a GPU
from kvlab.dhsa.boundary_predictor import BoundaryPredictor, key_features, label_valid, nms_boundaries
from kvlab.dhsa.reference import split_long_chunks
from kvlab.experiments import records, registry
from kvlab.experiments.system import options

__all__ = ["parser", "check", "run", "SHAPES", "timed"]

NAME = "dhsa-predictor-time"

SHAPES = {"gemma2-2b": (8, 4, 256), "gemma3-270m": (4, 1, 256), "ops": (32, 32, 128), "tiny": (4, 2, 16)}


def timed(fn, device, reps: int = 10) -> float:
    """Median milliseconds of ``fn()`` after two warm-up calls (CUDA events on a GPU, wall clock on a CPU)."""
    fn()
    fn()
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def run_shape(name: str, n: int, device, args) -> dict:
    h, hk, d = SHAPES[name]
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    g = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(1, h, n, d, device=device, dtype=dtype, generator=g)
    k = torch.randn(1, hk, n, d, device=device, dtype=dtype, generator=g)
    v = torch.randn(1, hk, n, d, device=device, dtype=dtype, generator=g)
    row = {"shape": name, "seq": n, "heads": h, "kv_heads": hk, "dim": d, "channels": hk * d}
    with torch.no_grad():
        row["sdpa_ms"] = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=hk != h),
                               device)
        torch.manual_seed(0)
        heads = 8 if (hk * d) % 8 == 0 else 1
        pred = BoundaryPredictor(hk * d, window=4, heads=heads, hidden=args.hidden).to(device).eval()
        x32 = key_features(k).float()
        row["pred_fp32_ms"] = timed(lambda: pred(x32), device)
        pred16 = BoundaryPredictor(hk * d, window=4, heads=heads, hidden=args.hidden).to(device, dtype).eval()
        pred16.load_state_dict(pred.state_dict())
        x16 = key_features(k)
        row["pred_bf16_ms"] = timed(lambda: pred16(x16), device)
        valid = label_valid(n, 4, device)
        max_chunks = max(2, n // args.min_mean_len)
        fb = None
        if device.type == "cuda" or chunking._interpreting():  # the fast path first: a time limit keeps it
            p16 = torch.sigmoid(pred16(x16).float())
            fast_nms = lambda: chunking.nms_boundaries_fast(  # noqa: E731
                p16, max_chunks=max_chunks, threshold=args.threshold, nms_window=args.nms_window, valid=valid,
                max_len=args.max_len)
            ref_b = [split_long_chunks(b, args.max_len) for b in nms_boundaries(
                p16, max_chunks=max_chunks, threshold=args.threshold, nms_window=args.nms_window, valid=valid)]
            row["nms_exact"] = all(torch.equal(a, b) for a, b in zip(ref_b, fast_nms()))
            row["fast_pred_ms"] = timed(lambda: chunking.predictor_logits(pred16, x16), device)
            row["fast_nms_ms"] = timed(fast_nms, device)
            fcall = lambda: chunking.predict_boundaries_fast(  # noqa: E731
                pred16, k, max_chunks=max_chunks, threshold=args.threshold, nms_window=args.nms_window,
                max_len=args.max_len)
            row["fast_ms"] = timed(fcall, device)
            row["share_fast"] = row["fast_ms"] / row["sdpa_ms"]
            fb = fcall()[0]
            row["fast_chunks"] = int(fb.numel() - 1)
            print(json.dumps(row), flush=True)
            if args.profile and device.type == "cuda":  # where the fast path's time goes, kernel by kernel
                from torch.profiler import ProfilerActivity, profile
                with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                    for _ in range(3):
                        fcall()
                    torch.cuda.synchronize()
                print(f"profile of 3 fast calls, {name}:\n" + prof.key_averages().table(
                    sort_by="cuda_time_total", row_limit=25), flush=True)
            if device.type == "cuda":
                try:
                    graphed = chunking.GraphedLogits(pred16)
                    row["graph_exact"] = bool(torch.equal(graphed(x16), chunking.predictor_logits(pred16, x16)))
                    row["fast_graph_pred_ms"] = timed(lambda: graphed(x16), device)

                    def gcall():
                        pg = torch.sigmoid(graphed(x16).float())
                        return chunking.nms_boundaries_fast(pg, max_chunks=max_chunks, threshold=args.threshold,
                                                            nms_window=args.nms_window, valid=valid,
                                                            max_len=args.max_len)
                    row["fast_graph_ms"] = timed(gcall, device)
                except Exception as exc:
                    row["graph_error"] = f"{type(exc).__name__}: {exc}"[:300]
                print(json.dumps(row), flush=True)
        fast = pred16
        if not args.no_compile:
            try:
                fast = torch.compile(pred16, dynamic=False)
                t0 = time.perf_counter()
                fast(x16)
                row["compile_s"] = time.perf_counter() - t0
                row["pred_compiled_ms"] = timed(lambda: fast(x16), device)
            except Exception as exc:  # a machine without a compiler: report it, time the eager path
                row["compile_error"] = f"{type(exc).__name__}: {exc}"[:200]
                fast = pred16
        p = torch.sigmoid(fast(x16).float())
        row["nms_ms"] = timed(lambda: [split_long_chunks(b, args.max_len) for b in nms_boundaries(
            p, max_chunks=max_chunks, threshold=args.threshold, nms_window=args.nms_window, valid=valid)], device)
        call = lambda: predict_boundaries(fast, k, max_chunks=max_chunks, threshold=args.threshold,  # noqa: E731
                                          nms_window=args.nms_window, max_len=args.max_len, backend="torch")
        row["chunking_ms"] = timed(call, device)
        bd = call()[0]
        row["chunks"] = int(bd.numel() - 1)
        row["mean_len"] = n / row["chunks"]
        row["share"] = row["chunking_ms"] / row["sdpa_ms"]
        if fb is not None:
            row["agree"] = len(set(fb.tolist()) & set(bd.tolist())) / max(1, bd.numel())
        if fb is not None and not args.no_compile and device.type == "cuda":
            try:
                logits_c = torch.compile(chunking.predictor_logits, dynamic=False)
                t0 = time.perf_counter()
                logits_c(pred16, x16)
                row["fast_compile_s"] = time.perf_counter() - t0

                def ccall():
                    pc = torch.sigmoid(logits_c(pred16, x16).float())
                    return chunking.nms_boundaries_fast(pc, max_chunks=max_chunks, threshold=args.threshold,
                                                        nms_window=args.nms_window, valid=valid,
                                                        max_len=args.max_len)
                row["fast_compiled_pred_ms"] = timed(lambda: logits_c(pred16, x16), device)
                row["fast_compiled_ms"] = timed(ccall, device)
            except Exception as exc:
                row["fast_compile_error"] = f"{type(exc).__name__}: {exc}"[:300]
    print(json.dumps(row), flush=True)
    return row


COLS = ["shape", "seq", "channels", "sdpa_ms", "pred_fp32_ms", "pred_bf16_ms", "pred_compiled_ms", "nms_ms",
        "chunking_ms", "share", "chunks", "mean_len", "fast_pred_ms", "fast_nms_ms", "fast_ms", "share_fast",
        "fast_compiled_pred_ms", "fast_compiled_ms", "fast_graph_pred_ms", "fast_graph_ms", "nms_exact", "agree"]


def write(out, name: str, info: dict, rows: list[dict]) -> list[Path]:
    js = options.write_json(out, name + ".json", {"info": info, "rows": rows})
    lines = ["| " + " | ".join(COLS) + " |", "|" + "---|" * len(COLS)]
    for r in rows:
        lines.append("| " + " | ".join(f"{r[c]:.3f}" if isinstance(r.get(c), float) else str(r.get(c, "-"))
                                        for c in COLS) + " |")
    table = "\n".join(lines)
    md = options.write_text(out, name + ".md", f"{info['device']} ({info['date']})\n\n`{info['command']}`\n\n"
                                               f"{table}\n")
    print(table, flush=True)
    return [js, md]


def row_records(rows: list[dict], device: str, *, example_keys=("shape", "seq"), method_key=None) -> list[dict]:
    """Every number of every row as a record: example ``<shape>/L<seq>``, metric the column's name."""
    recs = []
    for r in rows:
        example = "/".join(f"L{r[k]}" if k == "seq" else str(r[k]) for k in example_keys)
        method = str(r[method_key]) if method_key else "predictor"
        config = {k: v for k, v in r.items() if not isinstance(v, float)}
        recs += [records.record(example, method, k, v, config=config, device=device)
                 for k, v in r.items() if isinstance(v, float) or (isinstance(v, int) and not isinstance(v, bool)
                                                                  and k not in example_keys)]
    return recs


def parser():
    p = registry.experiment_parser(NAME, __doc__.split("\n\n")[0])
    p.add_argument("--name", type=options.stem, default="dhsa_predictor_time", help="stem of the files written")
    p.add_argument("--seq", type=registry.positive_int, default=32768)
    p.add_argument("--shapes", type=registry.names_list(SHAPES, what="shape"), default=["gemma2-2b", "gemma3-270m",
                                                                                        "ops"])
    p.add_argument("--hidden", type=registry.positive_int, default=256, help="predictor MLP hidden size (paper: 256)")
    p.add_argument("--threshold", type=float, default=0.5)
    p.add_argument("--nms-window", type=options.nonnegative_int, default=8)
    p.add_argument("--max-len", type=registry.positive_int, default=128, help="longest chunk (cut)")
    p.add_argument("--min-mean-len", type=registry.positive_int, default=32, help="N_c = seq // this")
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--profile", action="store_true", help="print a torch.profiler table of the fast path")
    return p


def check(args) -> None:
    options.check_device(args.device)
    if not 0 < args.threshold < 1:
        raise registry.ParameterError(f"--threshold {args.threshold}: a probability strictly between 0 and 1")
    options.refuse_rerun(args.out, args.name + ".json", options.records_name(args.name))
    if args.smoke:
        args.seq, args.shapes, args.no_compile, args.hidden = 256, ["tiny"], True, 16
        args.max_len = min(args.max_len, 64)


def run(args) -> list[Path]:
    out, device, info = options.start(args, NAME)
    rows, files = [], []
    for name in args.shapes:
        try:
            rows.append(run_shape(name, args.seq, device, args))
        except torch.OutOfMemoryError:
            rows.append({"shape": name, "seq": args.seq, "error": "OOM"})
        if device.type == "cuda":
            torch.cuda.empty_cache()
        files = write(out, args.name, info, rows)  # after every shape: a run stopped by a time limit keeps them
    path = records.write(options.records_name(args.name), row_records(rows, info["device"]), out=out)
    return [path, *files]
