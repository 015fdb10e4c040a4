"""LaCache's RULER long-task jobs (Table 5 analogue, Table 6's overlap rows) and the passkey grid again,
with the fixed answer loop (kvlab.eval.retrieval.greedy_answer: RULER's token counts, no stop at a newline), at
>= 20 prompts per cell, on SmolLM2-135M (float32).

    python -m kvlab run lacache-reruns --out DIR [--workers 10] [--limit 540] [--scale smoke]
        [--tables ruler,passkey] [--policies official-lacache50,official-strm50]

Cells: the five RULER kinds (seeds 0..19, ~2,048-token prompts) x the policies of :func:`kvlab.experiments.quality.runs.lacache_policies`
that Tables 5 and 6 use (Full; official protocol: full prefill, compact once, 64 sinks, 50 % budget, LaCache S=15
O=0 / StreamingLLM; ours: streamed in chunks of 64, 4 sinks; Table 6's overlaps O = 4 and O = 8 at S = 15, which
give three different ladders on 30 layers: G/A = 2/1, 3/2, 4/3); passkey (5 depths x 4 seeds = 20 prompts of
2,048 tokens) under the official protocol at 50 % and 25 % and Full. Writes ``DIR/lacache.examples.jsonl.gz`` (one
record per prompt, policy and metric, raw output included), ``DIR/summary.json`` / ``summary.md`` (means, no
verdicts) and ``DIR/raw_outputs.md`` (five generations per cell). Units already in the records (or in ``DIR/parts``) are skipped,
so a run cut by ``--limit`` goes on when called again.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

from kvlab.experiments import records, registry
from kvlab.experiments.lacache.common import policy as _policy
from kvlab.experiments.lacache.common import window_records

NAME = "lacache-reruns"
RECORDS = "lacache" + records.SUFFIX
SUMMARIES = ("summary.json", "summary.md", "raw_outputs.md")

RULER_POLICIES = ("full", "official-lacache50", "official-strm50", "ours-lacache50", "ours-strm50",
                  "official-lacache50-o4", "official-lacache50-o8")
PASSKEY_POLICIES = {  # LaCache's retrieval protocol (as quality_runs' officialprotocol jobs): b = frac x length
    "full": ("Full()", 64),
    "official-lacache50": ("LaCache.official(length // 2, 15, 0, sink=64)", 1 << 20),
    "official-strm50": ("StreamingLLM(sink=64, cache_size=length // 2)", 1 << 20),
    "official-lacache25": ("LaCache.official(length // 4, 8, 0, sink=64)", 1 << 20),
    "official-strm25": ("StreamingLLM(sink=64, cache_size=length // 4)", 1 << 20),
}
SCALES = {"full": dict(length=2048, examples=20, depths=(0.1, 0.3, 0.5, 0.7, 0.9), seeds=4, sink=64),
          "smoke": dict(length=512, examples=1, depths=(0.5,), seeds=1, sink=32),
          # the claims plan (PLAN_UNITS): passkey on new seeds, WikiText perplexity streams
          "claims": dict(length=2048, examples=0, depths=(0.1, 0.3, 0.5, 0.7, 0.9), seeds=range(4, 24), sink=64,
                         ppl_tokens=32768, ppl_segments=2),
          "claims-smoke": dict(length=512, examples=0, depths=(0.5,), seeds=range(4, 5), sink=32, ppl_tokens=1100,
                               ppl_segments=1),
          # Figs. 8 (50 % budget) and 9 (25 %): the passkey grid alone, LaCache vs StreamingLLM under LaCache's
          # retrieval protocol, 5 depths x seeds 4-23 = 100 prompts of 2,048 tokens per cell (a CPU-sized run)
          "passkey": dict(length=2048, examples=0, depths=(0.1, 0.3, 0.5, 0.7, 0.9), seeds=range(4, 24), sink=64,
                          passkey_policies=("official-lacache50", "official-strm50", "official-lacache25",
                                            "official-strm25")),
          "passkey-smoke": dict(length=512, examples=0, depths=(0.5,), seeds=range(4, 5), sink=32,
                                passkey_policies=("official-lacache25", "official-strm25"))}
#: Perplexity streams of the claims plan (WikiText, chunks of 16 tokens, NLL per token; the ledger pairs windows
#: of 1,024 tokens): Table 1 at budgets 256 / 512 (official S = 16, O = 0 vs StreamingLLM with 4 sinks, as the
#: earlier 16K run, now two streams of 32K tokens (the text's first 64K) = 64 windows: the earlier 16 windows gave a half-width of 0.007-0.011 nats,
#: 64 bring it to ~0.004-0.005), and Fig. 10's span ablation at budget 256 (S = 4, 8 = L/4, 16, 30 = L, O = 0).
PPL_POLICIES = {
    "strm256": "StreamingLLM(sink=4, cache_size=256)",
    "lacache256-s16": "LaCache.official(256, 16, 0)",
    "strm512": "StreamingLLM(sink=4, cache_size=512)",
    "lacache512-s16": "LaCache.official(512, 16, 0)",
    "lacache256-s8": "LaCache.official(256, 8, 0)",
    "lacache256-s4": "LaCache.official(256, 4, 0)",
    "lacache256-s30": "LaCache.official(256, 30, 0)",
}
CLAIMS_PASSKEY = ("official-lacache50", "official-strm50")


def _units(scale: dict) -> list[tuple]:
    from kvlab.experiments.quality.runs import LACACHE_RULER

    if "passkey_policies" in scale:  # the passkey grid alone
        return [("passkey", depth, seed, slug) for seed in scale["seeds"] for depth in scale["depths"]
                for slug in scale["passkey_policies"]]
    if "ppl_tokens" in scale:  # the claims plan: the long streams first (each is one unit), then the passkeys
        out = [("ppl", "wikitext", (segment, scale["ppl_tokens"]), slug) for segment in range(scale["ppl_segments"])
               for slug in PPL_POLICIES]
        return out + [("passkey", depth, seed, slug) for seed in scale["seeds"] for depth in scale["depths"]
                      for slug in CLAIMS_PASSKEY]
    out = [("ruler", kind, seed, slug) for kind in LACACHE_RULER for seed in range(scale["examples"])
           for slug in RULER_POLICIES]
    out += [("passkey", depth, seed, slug) for depth in scale["depths"] for seed in range(scale["seeds"])
            for slug in PASSKEY_POLICIES]
    return out


def _unit_id(unit: tuple, length: int) -> str:
    table, what, seed, slug = unit
    if table == "ppl":
        return f"ppl-{what}/{seed[1]}/seg{seed[0]}|{slug}"
    example = f"ruler-{what}/{length}/{seed}" if table == "ruler" else f"passkey/{length}/d{what}/s{seed}"
    return f"{example}|{slug}"


def _ppl_records(model, tok, unit: tuple, device: str, window: int = 1024) -> list[dict]:
    """One WikiText stream through one policy (chunks of 16, kvlab.eval.chunked_perplexity): a record per window
    of ``window`` tokens (its mean NLL), so policies pair up window by window."""
    from kvlab.datasets import load_text
    from kvlab.eval import chunked_perplexity

    _, corpus, (segment, tokens), slug = unit
    end = (segment + 1) * tokens  # segment k: tokens [k * tokens, (k + 1) * tokens) of the corpus
    ids = tok(load_text(corpus)[: 8 * end], return_tensors="pt").input_ids[:, segment * tokens:end]
    if ids.shape[1] < tokens:
        raise ValueError(f"corpus {corpus!r} has fewer than {end} tokens in its first {8 * end} characters")
    pol = _policy(PPL_POLICIES[slug])
    begin = time.perf_counter()
    r = chunked_perplexity(model, tok, ids, pol, max_tokens=None, chunk_size=16)
    config = {"table": "1 / Fig. 10 (PPL)", "policy": repr(pol), "chunk": 16, "tokens": tokens, "segment": segment,
              "mean_kv": float(r.kv_trace_per_layer.float().mean()), "seconds": round(time.perf_counter() - begin, 2)}
    if hasattr(pol, "settings"):
        config["settings"] = pol.settings(model.config.num_hidden_layers)
    return window_records(r.nll, window, lambda w: f"ppl-{corpus}/{tokens}/seg{segment}/w{w}", slug, config, device,
                          output=None, target=None, unit=_unit_id(unit, 0))


def _answer(model, tok, unit: tuple, scale: dict, exprs: dict, built: dict) -> tuple:
    """``(said, nll, score, target, metric, tokens, policy, chunk)`` of one RULER or passkey unit."""
    from kvlab.eval.retrieval import ask, passkey
    from kvlab.eval.tasks import ruler_task, task_score
    from kvlab.experiments.quality.runs import LACACHE_RULER

    table, what, seed, slug = unit
    length = scale["length"]
    if table == "ruler":
        if (what, seed) not in built:
            built.clear()
            built[(what, seed)] = ruler_task(tok, length, what, seed=seed)
        task = built[(what, seed)]
        expr, chunk = exprs[slug]
        n = tok(task.prompt, return_tensors="pt").input_ids.shape[1]
        pol = _policy(expr, n=n, sink=scale["sink"])
        said, nll = ask(model, tok, task.prompt, task.answer, pol, chunk_size=chunk, max_new_tokens=LACACHE_RULER[what])
        return said, nll, task_score(said, task), task.info["answers"], "string_match_all", n, pol, chunk
    expr, chunk = PASSKEY_POLICIES[slug]
    pol = _policy(expr, length=length)
    r = passkey(model, tok, pol, lengths=[length], depths=[what], seed=seed * 7919, chunk_size=chunk, progress=False)
    return r.answers[0][0], float(r.answer_nll[0, 0]), float(r.accuracy[0, 0]), None, "passkey_found", None, pol, chunk


def _worker(rank: int, units: list, args_d: dict) -> None:
    import torch

    torch.set_num_threads(1)
    import kvlab
    from kvlab.experiments.quality.runs import lacache_policies

    scale = SCALES[args_d["scale"]]
    length = scale["length"]
    model, tok = kvlab.load_model("smollm2-135m", device=args_d["device"], dtype="float32")
    layers = model.config.num_hidden_layers
    exprs = lacache_policies()
    device = args_d["device_name"]
    built: dict = {}
    part = Path(args_d["out"]) / "parts" / f"worker{rank}-{int(time.time())}{records.SUFFIX}"
    with records.RecordWriter(part) as writer:
        for unit in units:
            if time.time() > args_d["deadline"]:
                break
            begin = time.perf_counter()
            if unit[0] == "ppl":
                for rec in _ppl_records(model, tok, unit, device):
                    writer.add(rec)
                continue
            said, nll, score, target, metric, n, pol, chunk = _answer(model, tok, unit, scale, exprs, built)
            config = {"table": "5/6" if unit[0] == "ruler" else "passkey (Fig. 9)", "policy": repr(pol),
                      "chunk": chunk, "length": length, "tokens": n}
            if hasattr(pol, "settings"):
                config["settings"] = pol.settings(layers)
            extra = {"output": said, "target": target, "seconds": round(time.perf_counter() - begin, 3),
                     "unit": _unit_id(unit, length)}
            example = _unit_id(unit, length).split("|")[0]
            writer.add(records.record(example, unit[3], metric, float(score), config=config, device=device, **extra))
            writer.add(records.record(example, unit[3], "answer_nll", float(nll), config=config, device=device,
                                      **extra))


# --------------------------------------------------------------------------------------------- the records
def _records(out: Path) -> list[dict]:
    """The merged records of an earlier call (their unit rebuilt), then the parts', one per (unit, example, metric)."""
    recs = []
    if (out / RECORDS).is_file():
        for r in records.read(out / RECORDS):
            slug = r["method"]
            unit = (r["example"].rsplit("/w", 1)[0] if r["example"].startswith("ppl-") else r["example"]) + f"|{slug}"
            recs.append({**r, "unit": unit})
    for part in sorted((out / "parts").glob("*" + records.SUFFIX)):
        recs += records.read(part)
    seen, unique = set(), []
    for r in recs:
        if (r["unit"], r["example"], r["metric"]) not in seen:  # a stream's windows share its unit
            seen.add((r["unit"], r["example"], r["metric"]))
            unique.append(r)
    return unique


def _cells(recs: list[dict]) -> dict:
    cells: dict = {}
    for r in recs:
        task = r["example"].split("/")[0]
        cell = cells.setdefault(task, {}).setdefault(r["method"], {"score": [], "answer_nll": [], "outputs": []})
        if r["metric"] in ("answer_nll", "window_nll"):
            cell["answer_nll"].append(r["value"])
        else:
            cell["score"].append(r["value"])
            cell["outputs"].append((r["example"], r["output"], r["target"]))
    return cells


def _ppl_lines(ppl_cells: dict) -> list[str]:
    lines = ["", "Perplexity streams: mean window NLL -> perplexity (windows)", ""] if ppl_cells else []
    for t, by_m in sorted(ppl_cells.items()):
        for m, c in sorted(by_m.items()):
            nll = sum(c["answer_nll"]) / len(c["answer_nll"])
            lines.append(f"- {t} {m}: {nll:.4f} -> {math.exp(nll):.2f} ({len(c['answer_nll'])})")
    return lines


def _summarise(out: Path, folder) -> None:
    recs = sorted(_records(out), key=lambda r: (r["example"].split("/")[0], r["method"], r["example"], r["metric"]))
    records.write(RECORDS, [{k: v for k, v in r.items() if k != "unit"} for r in recs], out=folder)
    cells = _cells(recs)
    summary = {t: {m: {"n": len(c["score"]), "score_mean": round(100 * sum(c["score"]) / max(len(c["score"]), 1), 2),
                       "answer_nll_mean": round(sum(c["answer_nll"]) / max(len(c["answer_nll"]), 1), 3)}
                   for m, c in by_m.items()} for t, by_m in cells.items()}
    methods = [*RULER_POLICIES, *(m for m in PASSKEY_POLICIES if m not in RULER_POLICIES)]
    lines = ["# LaCache re-run: mean score % / mean answer NLL (n prompts); intervals: the claims ledger, "
             f"from {RECORDS}", "", "| task | " + " | ".join(methods) + " |", "|---" * (len(methods) + 1) + "|"]
    raw = ["# First five generations per policy and task (repr; references after the arrow)", ""]
    for t, by_m in sorted(cells.items()):
        if t.startswith("ppl-"):
            continue
        lines.append(f"| {t} | " + " | ".join(
            "-" if m not in summary[t] else
            f"{summary[t][m]['score_mean']:.1f} / {summary[t][m]['answer_nll_mean']:.2f} ({summary[t][m]['n']})"
            for m in methods) + " |")
        raw += [f"- {t}, {m}: " + "; ".join(f"{e}: {o!r} -> {g!r}" for e, o, g in sorted(by_m[m]["outputs"])[:5])
                for m in methods if m in by_m]
    lines += _ppl_lines({t: by_m for t, by_m in cells.items() if t.startswith("ppl-")})
    folder.claim("summary.json").write_text(json.dumps(summary, indent=1))
    folder.claim("summary.md").write_text("\n".join(lines) + "\n")
    folder.claim("raw_outputs.md").write_text("\n".join(raw) + "\n")
    print("\n".join(lines))


# --------------------------------------------------------------------------------------------- the command
def check(args) -> None:
    if args.smoke:
        args.scale = args.scale if args.scale.endswith("smoke") else "claims-smoke" if args.scale == "claims" \
            else "passkey-smoke" if args.scale == "passkey" else "smoke"
        args.workers = 1
    scale = SCALES[args.scale]
    args.units = _selected(_units(scale), args)
    if not args.units and not args.summary_only:
        chosen = " ".join(f"--{k} {','.join(v)}" for k, v in (("tables", args.tables), ("policies", args.policies))
                          if v)
        raise registry.ParameterError(f"--scale {args.scale} {chosen}".strip() + " plans no unit; its tables are "
                                      f"{sorted({u[0] for u in _units(scale)})}, its policies "
                                      f"{sorted({u[3] for u in _units(scale)})}: choose among those")


def _selected(units: list[tuple], args) -> list[tuple]:
    """The units of ``--tables`` and ``--policies`` (unset: all). ``--smoke`` keeps the first unit, or with
    ``--policies`` (a ledger row's pair) the first example under each of them, so that the row can be recomputed."""
    units = [u for u in units if (not args.tables or u[0] in args.tables)
             and (not args.policies or u[3] in args.policies)]
    if args.smoke and units:
        return [u for u in units if u[:3] == units[0][:3]] if args.policies else units[:1]
    return units


def _start(units: list, args, out: Path) -> bool:
    """Run ``units`` on ``args.workers`` workers (in this process for one); whether a worker process failed."""
    import multiprocessing as mp

    groups: dict = {}  # the units of one example stay together (its input is built once)
    for u in units:
        groups.setdefault(u if u[0] == "ppl" else u[:3], []).append(u)
    shards = [[u for g in list(groups.values())[i::args.workers] for u in g] for i in range(args.workers)]
    args_d = {"scale": args.scale, "out": str(out), "deadline": time.time() + args.limit, "device": args.device,
              "device_name": args.device_name}
    if args.workers == 1:
        if shards[0]:
            _worker(0, shards[0], args_d)
        return False
    procs = [mp.get_context("spawn").Process(target=_worker, args=(i, s, args_d)) for i, s in enumerate(shards) if s]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join()
    return any(proc.exitcode for proc in procs)


def run(args) -> list[Path]:
    import torch

    from kvlab.experiments.lacache.common import device_line
    from kvlab.outputs import OutputFolder

    if not hasattr(args, "units"):
        check(args)
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    args.device_name = device_line(args.device)
    folder = OutputFolder(args.out, f"python -m kvlab run {NAME}")
    out = folder.root
    folder.claim("parts/")
    failed = False
    if not args.summary_only:
        length = SCALES[args.scale]["length"]
        done = {r["unit"] for r in _records(out)}
        units = [u for u in args.units if _unit_id(u, length) not in done]
        print(f"{len(units)} units to run ({len(done)} done before), {args.workers} workers", flush=True)
        begin = time.time()
        failed = _start(units, args, out)
        left = len(units) - (len({r["unit"] for r in _records(out)}) - len(done))
        print(f"{time.time() - begin:.0f} s; {left} units left" + (" (run again to finish)" if left else ""),
              flush=True)
    if not _records(out):
        raise RuntimeError(f"no unit finished in {out}, so no records were written; the log says why")
    _summarise(out, folder)
    folder.remove_tree("parts")  # merged into the records file, which the next call resumes from
    if failed:
        raise RuntimeError("a worker process failed; the log says why; run again to resume")
    return [out / RECORDS] + [out / name for name in SUMMARIES]


def parser() -> argparse.ArgumentParser:
    p = registry.experiment_parser(NAME, __doc__.split("\n\n")[0])
    p.add_argument("--scale", choices=sorted(SCALES), default="full")
    p.add_argument("--workers", type=registry.positive_int, default=10, help="worker processes (one model copy each)")
    p.add_argument("--limit", type=registry.positive_int, default=480,
                   help="seconds; units not started by then wait for a rerun")
    p.add_argument("--tables", type=registry.names_list(("ruler", "passkey", "ppl"), what="table"), default=None,
                   help="only the units of these tables of the plan (ruler, passkey, ppl)")
    p.add_argument("--policies", default=None, help="only these policies of the plan (comma-separated: "
                   "official-lacache50,official-strm50)",
                   type=registry.names_list(dict.fromkeys([*RULER_POLICIES, *PASSKEY_POLICIES, *PPL_POLICIES]),
                                            what="policy"))
    p.add_argument("--summary-only", action="store_true", help="merge and summarise what is there, run nothing")
    return p
