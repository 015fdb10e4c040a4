"""Tables from the results of ``benchmarks/quality_runs.py``, beside the papers' numbers.

    python benchmarks/quality_report.py DIR [--summary benchmarks/results/fullsize_runs.json]

Reads ``DIR/*.json`` (or the summary file written by an earlier call, when DIR is that file), prints
markdown tables for the LaCache and SepLLM issues, and with ``--summary`` writes one JSON file with
every job's arguments and results, the per-token NLLs replaced by perplexity per 1024-token block.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

K = {1024: "1K", 2048: "2K", 4096: "4K", 5000: "5K", 8192: "8K", 10000: "10K", 15000: "15K", 16384: "16K",
     20000: "20K", 32768: "32K", 65536: "64K"}


def load(path: Path) -> dict:
    if path.is_file():
        return json.loads(path.read_text())
    out = {}
    for f in sorted(path.glob("*.json")):
        rec = json.loads(f.read_text())
        if "params" in rec:  # a kvlab.sweep record: the job's kind and arguments are its parameters
            rec = dict(job=rec["name"], kind=rec["params"]["kind"], args=rec["params"]["args"],
                       wall_seconds=rec["wall_seconds"], result=rec["result"])
        res = rec["result"]
        if "nll" in res:
            nll = res.pop("nll")
            res["block_ppl_1024"] = [round(math.exp(statistics.fmean(nll[i:i + 1024])), 3)
                                     for i in range(0, len(nll), 1024)]
        out[rec["job"]] = rec
    return out


def _ppl_row(runs, name, label, lengths, kv=True):
    r = runs.get(name)
    if r is None:
        return f"| {label} | " + " | ".join("not run" for _ in lengths) + (" | |" if kv else " |")
    at = r["result"]["ppl_at"]
    cells = [f"{at[str(n)]:.2f}" if str(n) in at else "–" for n in lengths]
    tail = f" | {r['result']['mean_kv']:.0f}" if kv else ""
    return f"| {label} | " + " | ".join(cells) + tail + " |"


def _header(first, lengths, kv=True):
    cols = [K.get(n, str(n)) for n in lengths] + (["mean KV"] if kv else [])
    return f"| {first} | " + " | ".join(cols) + " |\n|" + "---|" * (len(cols) + 1)


def lacache(runs) -> str:
    out = ["## LaCache (issue 4)", "", "### Table 1 analogue: WikiText, 16K tokens, chunks of 16 tokens", ""]
    lengths = [1024, 2048, 4096, 8192, 16384]
    out.append(_header("policy (budget)", lengths))
    out.append(_ppl_row(runs, "lacache-t1-full-16k", "Full (100%)", lengths))
    for b in (512, 256):
        out.append(_ppl_row(runs, f"lacache-t1-strm{b}-16k", f"StreamingLLM ({b})", lengths))
        out.append(_ppl_row(runs, f"lacache-t1-lacache{b}-16k", f"LaCache ({b})", lengths))
    out += ["", "### Table 2 analogue: budget 80 (1% of 8192), 32K tokens", ""]
    lengths = [1024, 2048, 4096, 8192, 16384, 32768]
    out.append(_header("policy", lengths))
    out.append(_ppl_row(runs, "lacache-t2-strm80-32k", "StreamingLLM (80)", lengths))
    out.append(_ppl_row(runs, "lacache-t2-lacache80-32k", "LaCache (80)", lengths))
    out += ["", "### Token by token (chunk 1) against chunks of 16, budget 256", ""]
    lengths = [1024, 2048, 4096]
    out.append(_header("policy, protocol", lengths))
    for pol, slug in (("StreamingLLM", "strm"), ("LaCache", "lacache")):
        out.append(_ppl_row(runs, f"lacache-tbt-{slug}256-4k", f"{pol} (256), token by token", lengths))
        out.append(_ppl_row(runs, f"lacache-t1-{slug}256-16k", f"{pol} (256), chunks of 16", lengths))
    out += ["", retrieval(runs, "lacache", [("Full", "full", "100%"), ("StreamingLLM", "strm50", "50%"),
                                            ("LaCache", "lacache50", "50%"), ("StreamingLLM", "strm25", "25%"),
                                            ("LaCache", "lacache25", "25%")])]
    tp = [r for n, r in runs.items() if n.startswith("lacache-throughput-")]
    if tp:
        out += ["", "### Decode throughput (tokens/s, median of 3 round-robin rounds, one process, float32)", ""]
        out.append("| cache before decoding | budget | device | Full | StreamingLLM | LaCache | H2O |\n|---|---|---|---|---|---|---|")
        for r in sorted(tp, key=lambda r: r["args"]["prefill"]):
            t = r["result"]["tokens_per_s"]
            out.append(f"| {r['args']['prefill']} | {r['args']['budget']} | {r['result']['device']} | "
                       + " | ".join(f"{statistics.median(t[k]):.1f}" for k in ("Full", "StreamingLLM", "LaCache", "H2O"))
                       + " |")
    return "\n".join(out)


def retrieval(runs, prefix, rows) -> str:
    out = []
    for task, title in (("niah", "Needle in a haystack (share of the needle's words in the answer)"),
                        ("passkey", "Passkey (found: 1/0)")):
        lengths = sorted({r["args"]["length"] for n, r in runs.items() if n.startswith(f"{prefix}-{task}-")})
        if not lengths:
            continue
        out += [f"### {title}, mean over 5 depths; answer NLL (nats/token) in brackets", ""]
        out.append("| policy | budget | " + " | ".join(str(n) for n in lengths) + " |\n|---|---|"
                   + "---|" * len(lengths))
        for label, slug, budget in rows:
            cells = []
            for n in lengths:
                r = runs.get(f"{prefix}-{task}-{slug}-{n}")
                if r is None:
                    cells.append("not run")
                    continue
                acc, nll = r["result"]["accuracy"], r["result"]["answer_nll"]
                cells.append(f"{statistics.fmean(acc):.2f} ({statistics.fmean(nll):.2f})")
            out.append(f"| {label} | {budget} | " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


def sepllm(runs) -> str:
    out = ["## SepLLM (issue 3)", "", "### Table 5 analogue: Austen (PG19 stand-in), 64K tokens, c = 800", ""]
    lengths = [20000, 65536]
    out.append(_header("method", lengths).replace("mean KV", "r.KV"))
    out.append(_ppl_row(runs, "sepllm-t5-full-64k", "Vanilla (full cache)", lengths))
    out.append(_ppl_row(runs, "sepllm-t5-strm800-64k", "StrmLLM (c=800)", lengths))
    out.append(_ppl_row(runs, "sepllm-t5-sep800-64k", "SepLLM (a=4, s=64, w=256, c=800)", lengths))
    out += ["", "### WikiText, 64K tokens, c = 324 (Tables 6 and 8 settings, run to 64K)", ""]
    lengths = [5000, 10000, 15000, 20000, 32768, 65536]
    out.append(_header("method", lengths).replace("mean KV", "r.KV"))
    for name, label in (("sepllm-t8-full-64k", "Vanilla (full cache)"),
                        ("sepllm-t8-strm324-64k", "StrmLLM (c=324)"),
                        ("sepllm-t8-sep32-64k", "SepLLM (s=32, w=224)"),
                        ("sepllm-t6-sep64-64k", "SepLLM (s=64, w=224)"),
                        ("sepllm-t8-strm324-noshift-64k", "StrmLLM, no shift"),
                        ("sepllm-t8-sep32-noshift-64k", "SepLLM (s=32), no shift")):
        out.append(_ppl_row(runs, name, label, lengths))
    out += ["", "### Table 6 analogue: separator cache s (a=4, w=224, c=324)", ""]
    lengths = [5000, 10000, 15000, 20000]
    out.append(_header("s", lengths).replace("mean KV", "r.KV"))
    for s, name in ((32, "sepllm-t8-sep32-64k"), (48, "sepllm-t6-sep48-20k"), (64, "sepllm-t6-sep64-64k")):
        out.append(_ppl_row(runs, name, str(s), lengths))
    out += ["", "### Table 7 analogue: (w, c), a=4, s=64", ""]
    out.append(_header("method (w, c)", lengths).replace("mean KV", "r.KV"))
    for label, name in (("StrmLLM (320, 324)", "sepllm-t8-strm324-64k"), ("StrmLLM (512, 516)", "sepllm-t7-strm516-20k"),
                        ("StrmLLM (796, 800)", "sepllm-t7-strm800-20k"), ("SepLLM (224, 324)", "sepllm-t6-sep64-64k"),
                        ("SepLLM (320, 516)", "sepllm-t7-sep516-20k"), ("SepLLM (512, 800)", "sepllm-t7-sep800-20k")):
        out.append(_ppl_row(runs, name, label, lengths))
    out += ["", "### Table 8 analogue: initial tokens and position shift (c=324; SepLLM s=32, w=224)", ""]
    out.append(_header("method, initial, shift", lengths).replace("mean KV", "r.KV"))
    for label, name in (("StrmLLM, yes, yes", "sepllm-t8-strm324-64k"), ("StrmLLM, no, yes", "sepllm-t8-strm324-noinit-20k"),
                        ("StrmLLM, yes, no", "sepllm-t8-strm324-noshift-64k"),
                        ("StrmLLM, no, no", "sepllm-t8-strm324-noinit-noshift-20k"),
                        ("SepLLM, yes, yes", "sepllm-t8-sep32-64k"), ("SepLLM, no, yes", "sepllm-t8-sep32-noinit-20k"),
                        ("SepLLM, yes, no", "sepllm-t8-sep32-noshift-64k"),
                        ("SepLLM, no, no", "sepllm-t8-sep32-noinit-noshift-20k")):
        out.append(_ppl_row(runs, name, label, lengths))
    out += ["", retrieval(runs, "sepllm", [("StreamingLLM", "strm324", "c = 324"),
                                           ("SepLLM (a=4, s=32, w=224)", "sep324", "c = 324")])]
    gsm = {}
    for n, r in runs.items():
        if n.startswith("sepllm-gsm8k-"):
            g = gsm.setdefault(r["args"]["method"], dict(flexible=[], strict=[], kv=[], n=r["result"]["neighbors"]))
            g["flexible"] += r["result"]["flexible"]
            g["strict"] += r["result"]["strict"]
            g["kv"] += r["result"]["kv_ratio"]
    if gsm:
        out += ["### GSM8K, 8-shot CoT, greedy generation (the real benchmark)", "",
                "| method | n | problems | flexible-extract % | strict-match % | r.KV % |", "|---|---|---|---|---|---|"]
        for m, g in gsm.items():
            out.append(f"| {m} | {g['n'] or '–'} | {len(g['flexible'])} | {100 * statistics.fmean(g['flexible']):.1f} | "
                       f"{100 * statistics.fmean(g['strict']):.1f} | {100 * statistics.fmean(g['kv']):.1f} |")
    return "\n".join(out)


RANDOM = ("window+block", "scattered", "window+strided")


def pareto(data: dict) -> str:
    """The Fig. 3 table from notebook 05's ``results_path`` JSON (``lacache_pareto.json``)."""
    pts = data["points"]
    named = ["StreamingLLM", "LaCache (bands)", "LaCache (interleaved)", "LaCache, layers shuffled"]
    out = [f"{data.get('contexts', 1)} context(s) of {data['context']} tokens, next {data['continuation']} scored. "
           "Cells: perplexity (better random patterns of that size / all of that size; dominated: some random "
           "pattern at most as large is better).", "",
           "| size | best random | median random | " + " | ".join(named) + " |", "|---|---|---|" + "---|" * len(named)]
    rnd = [(p["size"], p["ppl"]) for p in pts if p["family"] in RANDOM]
    for size in sorted({p["size"] for p in pts if p["family"] in RANDOM}):
        same = sorted(y for x, y in rnd if x == size)
        cells = []
        for fam in named:
            # the named pattern that belongs to this random size: the first one after that size's random patterns
            cand = [p for p in pts if p["family"] == fam and size * 0.85 <= p["size"] <= size]
            if not cand:
                cells.append("–")
                continue
            q = cand[0]
            better = sum(1 for y in same if y < q["ppl"])
            dominated = any(x <= q["size"] and y < q["ppl"] for x, y in rnd)
            cells.append(f"{q['ppl']:.2f} ({better}/{len(same)}, {'dominated' if dominated else 'on the front'})")
        out.append(f"| {size} | {same[0]:.2f} | {statistics.median(same):.2f} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("source", type=Path, help="results folder of quality_runs.py, or a summary JSON")
    ap.add_argument("--summary", type=Path, help="write the summary JSON here")
    ap.add_argument("--pareto", action="store_true", help="SOURCE is notebook 05's lacache_pareto.json")
    args = ap.parse_args(argv)
    if args.pareto:
        print(pareto(json.loads(args.source.read_text())))
        return 0
    runs = load(args.source)
    if not runs:
        sys.exit(f"no results in {args.source}")
    if args.summary:
        args.summary.write_text(json.dumps(runs, indent=0, ensure_ascii=False) + "\n")
    print(lacache(runs))
    print()
    print(sepllm(runs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
