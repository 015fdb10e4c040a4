"""DHSA end to end in the paper's setup (Tables 2-3): one prefill, dense SDPA vs DHSA in every global layer.

Issue 24: the earlier comparison (benchmarks/results/dhsa/dhsa_prefill_gemma3-270m.*) used fixed 64-token chunks, no
predictor, DHSA in 1 of 6 layers, and timed the predictor once per layer. Here, per model shape and length:

* ``sdpa``: the model's own attention (PyTorch SDPA) in every layer;
* ``dhsa-fixed``: DHSA (Triton kernel) with fixed ``--chunk`` chunks, per-layer selection (the old setup's kernel);
* ``dhsa-pred``: the paper's setup: chunks from the boundary predictor (paper size, random weights, bf16,
  ``torch.compile``), predicted **once per forward** on the first DHSA layer's keys and shared by all layers;
  ``--initial`` first and ``--local`` recent keys always kept (the authors' 128 + 128); selection per layer;
* ``dhsa-pred-shared``: the same with one kept set for all layers (``share_selection``).

Each DHSA method runs once per ``--kernels`` entry (the Triton variant :mod:`kvlab.dhsa.api` builds its tables for:
``lists``, the earlier kernel, or ``packed``: >= 64-row tiles, GQA heads packed under a shared selection, long
chunks in a taller launch) and per ``--share-heads`` entry (1: one selection for all heads, as the authors' code
averages heads; 0: one per head); the row's method reads ``method@kernel`` plus ``+sh`` for a shared selection.

Reported: prefill ms (median of ``--repeats`` after a warm-up), peak memory above the weights, and, from a separate
profiled run (CUDA events around each phase of the DHSA layers), the time in chunking (predictor + NMS) /
selection (chunk ranking, lists) / attention (the kernel), with their share of the prefill. The SDPA row also
times the dense attention alone (one layer's ``scaled_dot_product_attention`` at the model's shape, times the DHSA
layers): ``sdpa_attention_ms`` and its share of the prefill, which bounds what any sparse attention can save
(the rest of the forward is unchanged), and ``floor_ms``, the prefill with that attention removed. Shapes:
``gemma2-2b-global`` (Gemma2-2b's dimensions, every layer global: DHSA in all 26 layers) and ``gemma3-270m``
(Gemma3's layout: DHSA in its 3 global layers, SDPA in the 15 local ones). Random weights (the GPU machine holds
no model assets; the predictor is random too, so the chunks are a stand-in: ``--max-chunks-per`` caps their count
at ``seq / 64`` so that dynamic and fixed chunks have the same number).

    python -m kvlab run dhsa-prefill-e2e --out OUT/dhsa_e2e                            # H200: ~2-4 min
    python -m kvlab run dhsa-prefill-e2e --out /tmp/x --smoke     # CPU: tiny-global at 256 tokens, torch backend

With ``--rounds R`` (the ledger's Tables 2-3 and Figs. 8-10 rows: 20 rounds), every method is also timed once per
round, in an order that rotates from round to round, with its peak memory (``torch.cuda.max_memory_allocated``):
``dhsa_prefill_rounds.examples.jsonl.gz``, one record per round, method and metric, paired by round (example
``<shape>/<seq>/round<r>``; ``--attention-memory`` adds ``attention_peak_bytes``, the largest peak of one layer's
attention call above what was allocated when the call began, which sees attention's own workspace where the
whole prefill's peak is set by the MLP; under ``--smoke`` the tiny model stands in and its config says so). Also
``NAME.json`` / ``NAME.md`` (``--name``, default ``dhsa_prefill_e2e``) and, without ``--rounds``,
``NAME.examples.jsonl.gz`` with every row's numbers. A second run into the same ``--out`` is refused.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import torch

import kvlab.dhsa.api as dhsa_api
from kvlab.core import use_pattern
from kvlab.dhsa.boundary_predictor import BoundaryPredictor
from kvlab.dhsa.pattern import DHSAPattern, dhsa_layers
from kvlab.experiments import records, registry
from kvlab.experiments.dhsa.attention_memory import attention_peak_bytes
from kvlab.experiments.dhsa.measures import MODEL_SHAPES, prefill_cost, random_model
from kvlab.experiments.dhsa.predictor_time import row_records
from kvlab.experiments.registry import ParameterError
from kvlab.experiments.system import options

__all__ = ["parser", "check", "run", "METHODS"]

NAME = "dhsa-prefill-e2e"
METHODS = ("sdpa", "dhsa-fixed", "dhsa-pred", "dhsa-pred-shared")
KERNELS = ("lists", "packed")
ROUNDS = "dhsa_prefill_rounds" + records.SUFFIX


def make_predictor(model, args, device):
    """The boundary predictor at the paper's size (random weights) on the model's key channels, once per shape."""
    cfg = model.config
    channels = cfg.num_key_value_heads * cfg.head_dim
    torch.manual_seed(0)
    pred = BoundaryPredictor(channels, window=4, heads=8 if channels % 8 == 0 else 1, hidden=args.hidden)
    pred = pred.to(device, torch.bfloat16 if device.type == "cuda" else torch.float32).eval()
    if device.type == "cuda" and not args.no_compile:
        pred = torch.compile(pred, dynamic=False)
    return pred


def make_patterns(pred, n, args, device, share_heads=False):
    backend = "triton" if device.type == "cuda" else "torch"
    common = dict(initial=args.initial, backend=backend, share_heads=share_heads)
    dyn = dict(chunking="predictor", predictor=pred, chunk_size=args.chunk, max_chunks=max(2, n // args.max_chunks_per),
               max_len=args.max_len, nms_window=args.nms_window, local=args.local, share_boundaries=True, **common)
    return {
        "dhsa-fixed": lambda prof: DHSAPattern(args.budget, chunking="fixed", chunk_size=args.chunk, profile=prof,
                                               **common),
        "dhsa-pred": lambda prof: DHSAPattern(args.budget, profile=prof, **dyn),
        "dhsa-pred-shared": lambda prof: DHSAPattern(args.budget, share_selection=True, profile=prof, **dyn),
    }


def sdpa_attention_ms(model, n, n_layers, device) -> dict:
    """The dense attention of the DHSA layers alone: one ``scaled_dot_product_attention`` at the model's shape
    (bf16, causal, GQA), CUDA events, median of 5 after a warm-up, times ``n_layers``."""
    import torch.nn.functional as F

    cfg = model.config
    h, hk = cfg.num_attention_heads, cfg.num_key_value_heads
    d = getattr(cfg, "head_dim", None) or cfg.hidden_size // h
    g = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(1, h, n, d, device=device, dtype=torch.bfloat16, generator=g)
    k = torch.randn(1, hk, n, d, device=device, dtype=torch.bfloat16, generator=g)
    v = torch.randn(1, hk, n, d, device=device, dtype=torch.bfloat16, generator=g)
    times = []
    for i in range(6):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=hk != h)
        end.record()
        torch.cuda.synchronize()
        if i:
            times.append(start.elapsed_time(end))
    one = sorted(times)[len(times) // 2]
    return {"sdpa_attention_ms": one * n_layers, "sdpa_layer_ms": one}


def profiled(model, ids, pattern, layers, device) -> dict:
    """One prefill with the pattern's phase timer on: ms per phase and the chunks of the first DHSA layer."""
    with torch.no_grad(), use_pattern(model, pattern, layers):
        model(input_ids=ids, use_cache=False, logits_to_keep=1)  # warm (compiles)
        pattern.timings(reset=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        model(input_ids=ids, use_cache=False, logits_to_keep=1)
        if device.type == "cuda":
            torch.cuda.synchronize()
        total = (time.perf_counter() - t0) * 1e3
    t = pattern.timings()
    bd = pattern.boundaries[layers[0]][0]
    return {"profiled_ms": total, **{f"{k}_ms": v for k, v in t.items()}, "chunks": int(bd.numel() - 1),
            "mean_chunk": float(bd[-1]) / max(1, int(bd.numel() - 1)), "chunk_calls": pattern.chunk_calls}


def paired_rounds(model, ids, pred, layers, runs, args, device, prefix: str, config: dict) -> list[dict]:
    """``args.rounds`` rounds; in each, one prefill per method (the order rotates by one every round, so a change
    of load falls on every method), timed and with its peak memory: one record per (round, method) and metric
    (``prefill_latency_ms``, ``prefill_peak_memory_bytes`` and, with ``--attention-memory``,
    ``attention_peak_bytes`` from :mod:`kvlab.experiments.dhsa.attention_memory`), paired across methods by round."""
    patterns = []
    for method, kern, sh in runs:
        label = method if kern is None else f"{method}@{kern}{'+sh' if sh else ''}"
        if kern is not None:
            dhsa_api.TRITON_VARIANT = kern
        pat = None if method == "sdpa" else make_patterns(pred, ids.shape[1], args, device, share_heads=bool(sh))[method](False)
        patterns.append((label, kern, pat))
    out = []
    dev = options.device_string(device)
    for r in range(args.rounds):
        k = r % len(patterns)
        for label, kern, pat in patterns[k:] + patterns[:k]:
            if kern is not None:
                dhsa_api.TRITON_VARIANT = kern
            try:
                cost = prefill_cost(model, ids, pat, layers, repeats=1, memory=device.type == "cuda")
            except torch.OutOfMemoryError:
                continue
            if args.attention_memory:
                cost |= attention_peak_bytes(model, ids, pat, layers)
            out += _round_records(f"{prefix}/round{r:02d}", label, cost, config, dev)
        print(json.dumps({"round": r, "prefix": prefix}), flush=True)
    return out


def _round_records(example: str, label: str, cost: dict, config: dict, dev: str) -> list[dict]:
    """The records of one (round, method): latency, the whole prefill's peak and, measured, attention's own."""
    metrics = {"prefill_latency_ms": cost["ms"], "prefill_peak_memory_bytes": cost["peak_bytes"],
               "attention_peak_bytes": cost.get("attention_peak_bytes")}
    extra = {"per_layer": cost["per_layer"]} if "per_layer" in cost else {}
    return [records.record(example, label, metric, value, config=config, device=dev,
                           **(extra if metric == "attention_peak_bytes" else {}))
            for metric, value in metrics.items() if value is not None]


def parser():
    p = registry.experiment_parser(NAME, __doc__.split("\n\n")[0])
    p.add_argument("--name", type=options.stem, default="dhsa_prefill_e2e", help="stem of NAME.json / NAME.md")
    p.add_argument("--shapes", type=registry.names_list(MODEL_SHAPES, what="shape"),
                   default=["gemma2-2b-global", "gemma3-270m"])
    p.add_argument("--seqs", type=options.number_list(int, low=16, what="length"), default=[16384, 32768])
    p.add_argument("--methods", type=registry.names_list(METHODS, what="method"), default=list(METHODS))
    p.add_argument("--kernels", type=registry.names_list(KERNELS, what="kernel"), default=["packed"],
                   help="Triton variants for the DHSA rows")
    p.add_argument("--share-heads", type=options.number_list(int, low=0, high=1, what="share flag"), default=[1],
                   help="0 and/or 1: a selection per head / one for all heads")
    p.add_argument("--combos", type=options.number_list(str, what="kernel:share pair"), default=None,
                   help="kernel:share pairs instead of --kernels x --share-heads, e.g. lists:0,packed:1")
    p.add_argument("--budget", type=registry.positive_int, default=2048, help="N_b keys per query")
    p.add_argument("--initial", type=options.nonnegative_int, default=128)
    p.add_argument("--local", type=options.nonnegative_int, default=128)
    p.add_argument("--chunk", type=registry.positive_int, default=64, help="fixed chunk size")
    p.add_argument("--max-chunks-per", type=registry.positive_int, default=64, help="N_c = seq // this")
    p.add_argument("--max-len", type=registry.positive_int, default=128, help="dynamic chunks are cut at this")
    p.add_argument("--nms-window", type=options.nonnegative_int, default=8)
    p.add_argument("--hidden", type=registry.positive_int, default=256, help="predictor MLP hidden size")
    p.add_argument("--repeats", type=registry.positive_int, default=3)
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--rounds", type=options.nonnegative_int, default=0,
                   help="paired rounds for the ledger (dhsa_prefill_rounds.examples.jsonl.gz); 0: none")
    p.add_argument("--attention-memory", action="store_true",
                   help="with --rounds: also one prefill per round and method with every attention call measured "
                        "(attention_peak_bytes: the largest call's peak above what was allocated when it began)")
    return p


def _combos(args) -> list[tuple[str, int]]:
    if not args.combos:
        return [(kern, sh) for kern in args.kernels for sh in args.share_heads]
    out = []
    for c in args.combos:
        kern, _, sh = c.partition(":")
        if kern not in KERNELS or sh not in ("0", "1"):
            raise ParameterError(f"--combos {c!r}: give kernel:share with a kernel of {list(KERNELS)} and share 0 or 1")
        out.append((kern, int(sh)))
    return out


def check(args) -> None:
    options.check_device(args.device)
    _combos(args)
    if args.attention_memory and not args.rounds:
        raise ParameterError("--attention-memory measures each round's prefill: give --rounds R (e.g. 20)")
    options.refuse_rerun(args.out, args.name + ".json", options.records_name(args.name), ROUNDS)
    if args.smoke:  # the tiny model at 256 tokens on the torch backend; example names keep the shape asked for
        args.asked = [(shape, n) for shape in args.shapes[:1] for n in args.seqs[:1]]
        args.shapes, args.seqs = ["tiny-global"], [256]
        args.budget, args.initial, args.local, args.chunk, args.max_len = 64, 4, 4, 16, 16
        args.repeats, args.rounds, args.no_compile, args.hidden = 1, min(args.rounds, 2), True, 16


def _row(model, ids, pred, layers, run_, args, device) -> dict:
    method, kern, sh = run_
    n = ids.shape[1]
    row = {"method": method if kern is None else f"{method}@{kern}{'+sh' if sh else ''}", "dhsa_layers": len(layers),
           "layers": model.config.num_hidden_layers, "kernel": kern, "share_heads": bool(sh)}
    try:
        if kern is not None:
            dhsa_api.TRITON_VARIANT = kern
        makers = make_patterns(pred, n, args, device, share_heads=bool(sh))
        pat = None if method == "sdpa" else makers[method](False)
        cost = prefill_cost(model, ids, pat, layers, repeats=args.repeats)
        row |= {"ms": cost["ms"], "peak_gib": cost["peak_bytes"] / 2**30}
        if pat is not None:
            row |= profiled(model, ids, makers[method](True), layers, device)
            for ph in ("chunking", "selection", "attention"):
                row[f"{ph}_share"] = row.get(f"{ph}_ms", 0.0) / row["profiled_ms"]
        elif device.type == "cuda":
            row |= sdpa_attention_ms(model, n, len(layers), device)
            row["sdpa_attention_share"] = row["sdpa_attention_ms"] / row["ms"]
            row["floor_ms"] = row["ms"] - row["sdpa_attention_ms"]
    except torch.OutOfMemoryError:
        row["error"] = "OOM"
    except Exception as exc:  # report, keep the other rows
        row["error"] = f"{type(exc).__name__}: {exc}"[:300]
    return row


def _relative(rows: list[dict]) -> None:
    base = next((r for r in rows if r["method"] == "sdpa" and "ms" in r), None)
    for r in rows:
        if base and "ms" in r:
            r["x_sdpa_latency"] = r["ms"] / base["ms"]
            r["x_sdpa_peak"] = r["peak_gib"] / max(base["peak_gib"], 1e-9)


def run(args) -> list[Path]:
    out, device, info = options.start(args, NAME)
    rows, rounds, t_start = [], [], time.perf_counter()
    for shape in args.shapes:
        model = random_model(shape, attn_implementation="sdpa", device=device)
        layers = dhsa_layers(model)
        pred = make_predictor(model, args, device)
        for n in args.seqs:
            ids = torch.randint(0, model.config.vocab_size, (1, n), device=device)
            runs = [("sdpa", None, None)] if "sdpa" in args.methods else []
            runs += [(m, kern, sh) for m in args.methods if m != "sdpa" for kern, sh in _combos(args)]
            here = []
            for run_ in runs:
                here.append({"shape": shape, "seq": n} | _row(model, ids, pred, layers, run_, args, device)
                            | {"elapsed_s": time.perf_counter() - t_start})
                print(json.dumps(here[-1]), flush=True)
                options.write_json(out, args.name + ".json", {"info": info, "rows": rows + here, "partial": True})
                if device.type == "cuda":
                    torch.cuda.empty_cache()
            _relative(here)
            rows += here
            options.write_json(out, args.name + ".json", {"info": info, "rows": rows})
            if args.rounds:
                asked = args.asked[0] if args.smoke else (shape, n)
                config = {"shape": shape, "seq": n, "budget": args.budget, "stands_in_for": list(asked)}
                rounds += paired_rounds(model, ids, pred, layers, runs, args, device, f"{asked[0]}/{asked[1]}",
                                        config)
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    md = options.write_text(out, args.name + ".md", f"{info['device']} ({info['date']})\n\n`{info['command']}`\n\n"
                                                  f"{_table(rows)}\n")
    if args.rounds:
        path = records.write(ROUNDS, rounds, out=out)
    else:
        path = records.write(options.records_name(args.name), row_records(rows, info["device"],
                             example_keys=("shape", "seq"), method_key="method"), out=out)
    return [path, out.root / (args.name + ".json"), md]


def _table(rows: list[dict]) -> str:
    cols = [("shape", "{}"), ("seq", "{}"), ("method", "{}"), ("ms", "{:.1f}"), ("x_sdpa_latency", "{:.2f}"),
            ("sdpa_attention_ms", "{:.1f}"), ("sdpa_attention_share", "{:.3f}"), ("floor_ms", "{:.1f}"),
            ("peak_gib", "{:.2f}"), ("x_sdpa_peak", "{:.2f}"), ("chunking_ms", "{:.1f}"), ("selection_ms", "{:.1f}"),
            ("attention_ms", "{:.1f}"), ("chunking_share", "{:.3f}"), ("selection_share", "{:.3f}"),
            ("attention_share", "{:.3f}"), ("chunks", "{}"), ("chunk_calls", "{}"), ("error", "{}")]
    lines = ["| " + " | ".join(c for c, _ in cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        lines.append("| " + " | ".join(f.format(r[c]) if c in r else "-" for c, f in cols) + " |")
    table = "\n".join(lines)
    print(table)
    return table
