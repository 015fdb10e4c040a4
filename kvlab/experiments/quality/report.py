"""Tables from the results of ``python -m kvlab run quality-runs``, beside the papers' numbers.

    python -m kvlab run quality-report --source DIR [--summary fullsize_runs] --out OUT

Reads ``DIR/*.json`` (or the summary file written by an earlier call, when DIR is that file), writes
``OUT/report.md`` (markdown tables for LaCache and SepLLM), and with ``--summary NAME`` ``OUT/NAME.json``, one JSON
file with every job's arguments and results, the per-token NLLs replaced by perplexity per 1024-token block.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

K = {1024: "1K", 2048: "2K", 4096: "4K", 5000: "5K", 8192: "8K", 10000: "10K", 15000: "15K", 16384: "16K",
     20000: "20K", 32768: "32K", 65536: "64K"}


def load(path: Path) -> dict:
    if path.is_file():
        return json.loads(path.read_text())
    out = {}
    for f in sorted(path.glob("*.json")):
        rec = json.loads(f.read_text())
        if "params" in rec:  # a kvlab.experiments.sweep record: the job's kind and arguments are its parameters
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


# LaCache's long-input tables (issue 14): the paper's numbers of the nearest setting. Table 5: LongChat-7b-v1.5-32k,
# RULER at 16K, 50% budget, (StreamingLLM, LaCache); Tables 3/4: LongBench, (100%, StreamingLLM 50%, 25%, LaCache 50%,
# 25%) for Llama2-7B-Chat (Table 3) and SmolLM2-1.7B-Instruct (Table 4); Table 6: O = 0, S/4, S/2 (LongBench QA and
# LongBench synthetic: PassageCount / PassageRetrieval).
PAPER_T5 = {"single": ("single_2", 49.00, 43.00), "multikey": ("multikey_1", 53.00, 52.00),
            "multivalue": ("multivalue", 47.00, 62.75), "multiquery": ("multiquery", 42.00, 50.25),
            "vt": ("vt", 29.40, 60.80)}
PAPER_T34 = {"single-doc": ("MultiFieldQA-en", (35.72, 27.02, 24.74, 31.55, 25.34),
                            (38.78, 33.39, 30.28, 33.35, 30.09)),
             "multi-doc": ("HotpotQA", (33.84, 29.98, 30.74, 32.62, 30.60), (24.08, 24.22, 22.21, 24.32, 22.81))}
PAPER_T6 = {"QA": (19.48, 18.94, 18.48), "synthetic": (5.17, 5.67, 6.17)}
_T34_SLOTS = {"full": 0, "official-strm50": 1, "official-strm25": 2, "official-lacache50": 3, "official-lacache25": 4}
_LACACHE_ROWS = [("full", "Full", "100%"), ("official-strm50", "StreamingLLM, official protocol", "50%"),
                 ("official-lacache50", "LaCache, official protocol (S=15, O=0)", "50%"),
                 ("official-strm25", "StreamingLLM, official protocol", "25%"),
                 ("official-lacache25", "LaCache, official protocol (S=8, O=0)", "25%"),
                 ("ours-strm50", "StreamingLLM, ours (streamed, 4 sinks)", "50%"),
                 ("ours-lacache50", "LaCache, ours (streamed, 4 sinks, S=8/O=4)", "50%")]


def _task_cell(runs, name) -> str:
    r = runs.get(name)
    return "not run" if r is None else f"{100 * r['result']['score']:.1f} ({r['result']['answer_nll']:.2f})"


def _mean_cell(runs, names) -> str:
    got = [runs[n]["result"] for n in names if n in runs]
    if len(got) < len(names):
        return "not run" if not got else f"{len(got)}/{len(names)} run"
    score, nll = statistics.fmean(g["score"] for g in got), statistics.fmean(g["answer_nll"] for g in got)
    return f"{100 * score:.1f} ({nll:.2f})"


def _prompt_tokens(mine, prefix, lengths) -> str:
    """Mean real prompt length per nominal length (QA prompts stop at the article's end or below the nominal one)."""
    parts = []
    for n in lengths:
        toks = [e["tokens"] for r in mine.values() if r["args"]["task"].startswith(prefix) and r["args"]["length"] == n
                for e in r["result"]["examples"]]
        if toks:
            parts.append(f"{K.get(n, n)}: {statistics.fmean(toks):.0f} tokens ({min(toks)}-{max(toks)})")
    return "Prompt lengths, mean (range): " + "; ".join(parts) + "."


def _table5(runs, mine, kinds, lengths, this, examples) -> list[str]:
    """LaCache Table 5 (RULER-style tasks, 50% budget) beside the paper's LongChat-7B column."""
    out = [f"### Table 5 analogue: RULER-style tasks ({examples} example(s) a cell, string_match_all)", "",
           "| task (paper's column) | method | budget | paper (LongChat-7B, 16K) | " + this + " |",
           "|---|---|---|---|" + "---|" * len(lengths)]
    rows = [r for r in _LACACHE_ROWS if r[2] != "25%"]  # Table 5 is at 50% only
    avg = ("Avg. of these five", *(statistics.fmean(v[i] for v in PAPER_T5.values()) for i in (1, 2)))
    for kind in kinds + ["mean"]:
        col, strm, lac = PAPER_T5.get(kind, avg)
        for slug, label, budget in rows:
            paper = {"official-strm50": f"{strm:.2f}", "official-lacache50": f"{lac:.2f}"}.get(slug, "–")
            if kind == "mean":
                cells = [_mean_cell(runs, [f"lacache-ruler-{k}-{slug}-{n}" for k in kinds]) for n in lengths]
            else:
                cells = [_task_cell(runs, f"lacache-ruler-{kind}-{slug}-{n}") for n in lengths]
            out.append(f"| {kind} ({col}) | {label} | {budget} | {paper} | " + " | ".join(cells) + " |")
    return out + ["", _prompt_tokens(mine, "ruler", lengths), ""]


def _tables34(runs, mine, qa, lengths, this, examples) -> list[str]:
    """The Tables 3/4 stand-in (padded SQuAD / HotpotQA) beside the paper's Llama2-7B and SmolLM2-1.7B columns."""
    out = [f"### Tables 3/4 stand-in (not LongBench): SQuAD article / HotpotQA paragraphs padded with distractor "
           f"paragraphs, {examples} question(s) a cell, token F1 of the greedy answer", "",
           "| task (paper's column) | method | budget | paper Table 3 (Llama2-7B) | "
           "paper Table 4 (SmolLM2-1.7B) | " + this + " |", "|---|---|---|---|---|" + "---|" * len(lengths)]
    for kind in qa:
        col, t3, t4 = PAPER_T34[kind]
        for slug, label, budget in _LACACHE_ROWS:
            i = _T34_SLOTS.get(slug)
            p3, p4 = ("–", "–") if i is None else (f"{t3[i]:.2f}", f"{t4[i]:.2f}")
            cells = [_task_cell(runs, f"lacache-longqa-{kind}-{slug}-{n}") for n in lengths]
            out.append(f"| {kind} ({col}) | {label} | {budget} | {p3} | {p4} | " + " | ".join(cells) + " |")
    return out + ["", _prompt_tokens(mine, "longqa", lengths), ""]


def _table6(runs, qa, kinds, lengths, this) -> list[str]:
    """LaCache Table 6 (overlap O at S = 15), the mean over the QA tasks and over the RULER tasks."""
    out = ["### Table 6 analogue: overlap O at S = 15, 50% budget, official protocol (mean over the tasks)", "",
           "On 30 layers O = 0, 4, 8 give three different ladders (tokens per group / kept per layer: 2/1, 3/2, "
           "4/3); O = 7 would give O = 4's (every O in 1..7 does). The paper's synthetic column is LongBench's "
           "PassageCount / PassageRetrieval, which are not here: its row is RULER's tasks, not comparable.", "",
           "| tasks | O | paper (LongBench QA / LongBench synthetic; model not stated) | " + this + " |",
           "|---|---|---|" + "---|" * len(lengths)]
    for group, tasks in (("QA", [f"longqa-{k}" for k in qa]), ("RULER", [f"ruler-{k}" for k in kinds])):
        if not tasks:
            continue
        for j, (slug, o) in enumerate((("official-lacache50", "0"), ("official-lacache50-o4", "4 (S/4)"),
                                       ("official-lacache50-o8", "8 (S/2, rounded up)"))):
            cells = [_mean_cell(runs, [f"lacache-{t}-{slug}-{n}" for t in tasks]) for n in lengths]
            names = ", ".join(t.split("-", 1)[1] for t in tasks)
            paper = (f"{PAPER_T6[group][j]:.2f}" if group == "QA"
                     else f"not testable here (LongBench synthetic: {PAPER_T6['synthetic'][j]:.2f})")
            out.append(f"| {group} ({names}) | {o} | {paper} | " + " | ".join(cells) + " |")
    return out + [""]


def lacache_tasks(runs) -> str:
    """LaCache Table 5 (RULER), Tables 3/4 (LongBench stand-in) and Table 6 (overlap) from the ``longtask`` jobs."""
    mine = {n: r for n, r in runs.items() if r.get("kind") == "longtask" and n.startswith("lacache-")}
    if not mine:
        return ""
    lengths = sorted({r["args"]["length"] for r in mine.values()})
    ex = {t: max([r["args"]["examples"] for r in mine.values() if r["args"]["task"].startswith(t)] or [0])
          for t in ("ruler", "longqa")}
    this = " | ".join(f"this run {K.get(n, n)}" for n in lengths)
    out = ["## LaCache long-input tables (issue 14)", "",
           "Cells: score % (teacher-forced answer NLL, nats/token, in brackets: the proxy that separates methods at "
           "135M). Official protocol: full-attention prefill, compact once, first answer token from the full-attention "
           "logits, 64 sinks (RULER) / 128 (QA), S ~ L x budget, O = 0, official accounting. Ours: the prompt "
           "streamed in chunks of 64, 4 sinks, S=8/O=4.", ""]
    tasks = {r["args"]["task"] for r in mine.values()}
    kinds = [k for k in PAPER_T5 if f"ruler-{k}" in tasks]
    qa = [k for k in PAPER_T34 if f"longqa-{k}" in tasks]
    if kinds:
        out += _table5(runs, mine, kinds, lengths, this, ex["ruler"])
    if qa:
        out += _tables34(runs, mine, qa, lengths, this, ex["longqa"])
    if kinds or qa:
        out += _table6(runs, qa, kinds, lengths, this)
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


NAME = "quality-report"


def parser():
    from kvlab.experiments.registry import experiment_parser

    p = experiment_parser(NAME, __doc__.split("\n\n")[0])
    p.add_argument("--source", type=Path, default=None,
                   help="results folder of quality-runs, or a summary JSON (--smoke: the committed fullsize_runs.json)")
    p.add_argument("--summary", default=None, help="also write OUT/NAME.json, the summary of every job")
    p.add_argument("--pareto", action="store_true", help="SOURCE is notebook 05's lacache_pareto.json")
    return p


def check(args) -> None:
    from kvlab.experiments.registry import ParameterError

    if args.smoke and args.source is None:
        args.source = Path(__file__).resolve().parents[3] / "benchmarks/results/fidelity/fullsize_runs.json"
    if args.summary is not None and not args.summary.replace("_", "").replace("-", "").isalnum():
        raise ParameterError(f"--summary {args.summary!r}: a file name of letters, digits, _ and -")
    if args.source is None or not args.source.exists():
        raise ParameterError(f"--source {args.source}: no such folder or file; give a quality-runs results folder "
                             "or a summary JSON")


def run(args):
    from kvlab.outputs import OutputFolder

    out = OutputFolder(args.out, f"python -m kvlab run {NAME}")
    if args.pareto:
        text = pareto(json.loads(args.source.read_text()))
    else:
        runs = load(args.source)
        if not runs:
            raise ValueError(f"no results in {args.source}")
        parts = [lacache(runs), sepllm(runs), lacache_tasks(runs)]
        text = "\n\n".join(p for p in parts if p)
    written = []
    if args.summary and not args.pareto:
        path = out.claim(args.summary + ".json")
        path.write_text(json.dumps(runs, indent=0, ensure_ascii=False) + "\n")
        written.append(path)
    path = out.claim("report.md")
    path.write_text(text + "\n")
    print(text)
    return [path] + written
