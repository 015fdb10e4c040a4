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

    python benchmarks/dhsa_prefill_e2e.py --out OUT/dhsa_e2e                            # H200: ~2-4 min
    python benchmarks/dhsa_prefill_e2e.py --out /tmp/x --shapes tiny-global --seqs 256 --budget 64 --initial 4 \\
        --local 4 --chunk 16 --max-len 16 --repeats 1                                 # CPU smoke test (torch backend)

With ``--rounds R`` (the ledger's Tables 2-3 and Figs. 8-10 rows: 20 rounds), every method is also timed once per
round, in an order that rotates from round to round, with its peak memory (``torch.cuda.max_memory_allocated``):
``dhsa_prefill_rounds.examples.jsonl``, one record per round, method and metric, paired by round.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere without installing kvlab

import torch  # noqa: E402

import kvlab.dhsa.api as dhsa_api  # noqa: E402
from kvlab.core import use_pattern  # noqa: E402
from kvlab.experiments.dhsa import prefill_cost, random_model  # noqa: E402
from kvlab.dhsa.pattern import DHSAPattern, dhsa_layers  # noqa: E402
from kvlab.dhsa.boundary_predictor import BoundaryPredictor  # noqa: E402


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


def paired_rounds(model, ids, pred, layers, runs, args, device, prefix: str) -> list[dict]:
    """``args.rounds`` rounds; in each, one prefill per method (the order rotates by one every round, so a change
    of load falls on every method), timed and with its peak memory: one record per (round, method) and metric
    (``prefill_latency_ms``, ``prefill_peak_memory_bytes``), paired across methods by round."""
    patterns = []
    for method, kern, sh in runs:
        label = method if kern is None else f"{method}@{kern}{'+sh' if sh else ''}"
        if kern is not None:
            dhsa_api.TRITON_VARIANT = kern
        pat = None if method == "sdpa" else make_patterns(pred, ids.shape[1], args, device, share_heads=bool(sh))[method](False)
        patterns.append((label, kern, pat))
    out = []
    for r in range(args.rounds):
        k = r % len(patterns)
        for label, kern, pat in patterns[k:] + patterns[:k]:
            if kern is not None:
                dhsa_api.TRITON_VARIANT = kern
            try:
                cost = prefill_cost(model, ids, pat, layers, repeats=1, memory=device.type == "cuda")
            except torch.OutOfMemoryError:
                continue
            ex = f"{prefix}/round{r:02d}"
            out.append({"example": ex, "method": label, "metric": "prefill_latency_ms", "value": cost["ms"]})
            if cost["peak_bytes"] is not None:
                out.append({"example": ex, "method": label, "metric": "prefill_peak_memory_bytes",
                            "value": cost["peak_bytes"]})
        print(json.dumps({"round": r, "prefix": prefix}), flush=True)
    return out


def write_records(path: Path, records: list[dict]) -> None:
    """JSON lines written whole (a temporary file renamed into place)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(json.dumps(x) + "\n" for x in records))
    tmp.replace(path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="folder for dhsa_prefill_e2e.json / .md")
    ap.add_argument("--shapes", default="gemma2-2b-global,gemma3-270m")
    ap.add_argument("--seqs", default="16384,32768")
    ap.add_argument("--methods", default="sdpa,dhsa-fixed,dhsa-pred,dhsa-pred-shared")
    ap.add_argument("--kernels", default="packed", help="Triton variants for the DHSA rows (lists, packed)")
    ap.add_argument("--share-heads", default="1", help="0 and/or 1: a selection per head / one for all heads")
    ap.add_argument("--combos", default="", help="kernel:share pairs instead of --kernels x --share-heads, "
                                                 "e.g. lists:0,packed:1")
    ap.add_argument("--budget", type=int, default=2048, help="N_b keys per query")
    ap.add_argument("--initial", type=int, default=128)
    ap.add_argument("--local", type=int, default=128)
    ap.add_argument("--chunk", type=int, default=64, help="fixed chunk size; dynamic chunks: N_c = seq // 64")
    ap.add_argument("--max-chunks-per", type=int, default=64, help="N_c = seq // this")
    ap.add_argument("--max-len", type=int, default=128, help="dynamic chunks are cut at this length")
    ap.add_argument("--nms-window", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=256, help="predictor MLP hidden size (paper: 256)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--rounds", type=int, default=0,
                    help="paired rounds for the ledger: each round times one prefill of every method in turn (the "
                         "order rotating) and measures its peak memory (torch.cuda.max_memory_allocated above the "
                         "weights); written to dhsa_prefill_rounds.examples.jsonl")
    args = ap.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    info = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "torch": torch.__version__,
            "date": time.strftime("%Y-%m-%d %H:%M:%S"), "command": " ".join(sys.argv)}
    print(json.dumps(info), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows, records = [], []
    t_start = time.perf_counter()
    methods = args.methods.split(",")
    for shape in args.shapes.split(","):
        model = random_model(shape, attn_implementation="sdpa", device=device)
        print(json.dumps({"shape": shape, "model_ready_s": time.perf_counter() - t_start}), flush=True)
        layers = dhsa_layers(model)
        pred = make_predictor(model, args, device)
        for n in (int(x) for x in args.seqs.split(",")):
            ids = torch.randint(0, model.config.vocab_size, (1, n), device=device)
            runs = [("sdpa", None, None)] if "sdpa" in methods else []
            combos = ([(c.split(":")[0], int(c.split(":")[1])) for c in args.combos.split(",")] if args.combos else
                      [(kern, int(sh)) for kern in args.kernels.split(",") for sh in args.share_heads.split(",")])
            runs += [(m, kern, sh) for m in methods if m != "sdpa" for kern, sh in combos]
            for method, kern, sh in runs:
                label = method if kern is None else f"{method}@{kern}{'+sh' if sh else ''}"
                row = {"shape": shape, "seq": n, "method": label, "dhsa_layers": len(layers),
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
                row["elapsed_s"] = time.perf_counter() - t_start
                rows.append(row)
                print(json.dumps(row), flush=True)
                (out / "dhsa_prefill_e2e.json").write_text(json.dumps({"info": info, "args": vars(args), "rows": rows,
                                                                      "partial": True}, indent=1))
                if device.type == "cuda":
                    torch.cuda.empty_cache()
            base = {r["method"]: r for r in rows if r["shape"] == shape and r["seq"] == n}.get("sdpa")
            for r in rows:
                if r["shape"] == shape and r["seq"] == n and base and "ms" in r and "ms" in base:
                    r["x_sdpa_latency"] = r["ms"] / base["ms"]
                    r["x_sdpa_peak"] = r["peak_gib"] / max(base["peak_gib"], 1e-9)
            (out / "dhsa_prefill_e2e.json").write_text(json.dumps({"info": info, "args": vars(args), "rows": rows},
                                                                  indent=1))
            if args.rounds:
                records += paired_rounds(model, ids, pred, layers, runs, args, device, f"{shape}/{n}")
                write_records(out / "dhsa_prefill_rounds.examples.jsonl", records)
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    cols = [("shape", "{}"), ("seq", "{}"), ("method", "{}"), ("ms", "{:.1f}"), ("x_sdpa_latency", "{:.2f}"),
            ("sdpa_attention_ms", "{:.1f}"), ("sdpa_attention_share", "{:.3f}"), ("floor_ms", "{:.1f}"),
            ("peak_gib", "{:.2f}"), ("x_sdpa_peak", "{:.2f}"), ("chunking_ms", "{:.1f}"), ("selection_ms", "{:.1f}"),
            ("attention_ms", "{:.1f}"), ("chunking_share", "{:.3f}"), ("selection_share", "{:.3f}"),
            ("attention_share", "{:.3f}"), ("chunks", "{}"), ("chunk_calls", "{}"), ("error", "{}")]
    lines = ["| " + " | ".join(c for c, _ in cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        lines.append("| " + " | ".join(f.format(r[c]) if c in r else "-" for c, f in cols) + " |")
    table = "\n".join(lines)
    (out / "dhsa_prefill_e2e.md").write_text(f"{info['device']} ({info['date']})\n\n`{info['command']}`\n\n{table}\n")
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
