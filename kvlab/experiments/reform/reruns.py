"""Issue 23: REFORM's Tables 1, 4 (code stand-in), 5 and 6a again on SmolLM2-135M, with the fixed harness (answers
generated as RULER does, no stop at a newline; every baseline keeps the same initial/recent tokens and the question;
the code prompt ending at the target line's start), at >= 20 examples per cell.

    python benchmarks/reform_reruns.py tasks --out benchmarks/inputs/reform_repo_8192.json.gz   # CPU, once
    python benchmarks/reform_reruns.py run --out DIR [--workers 12] [--limit 540] [--scale smoke]

``run`` builds the RULER / BABILong inputs from the corpora (seeds 0..N-1), reads the code-completion inputs from the
committed file (built from the ``click`` package here, which the GPU machine does not have), shards every
(example, row) unit over worker processes (one model copy each, one thread each; on a GPU they share it), and
writes ``DIR/reform.examples.jsonl`` (one record per example, method and metric, raw output included),
``DIR/summary.json`` / ``summary.md`` (means per cell, no verdicts) and ``DIR/raw_outputs.md`` (the first five
generations per method and cell). Units already in ``DIR/parts/*.jsonl`` or in ``DIR/reform.examples.jsonl`` (the
merged records of an earlier run, whose parts are gone) are skipped and kept, so a run cut by ``--limit`` (seconds)
goes on where it stopped when called again. ``--kinds``, ``--rows`` and ``--seeds`` keep only those units of the plan
(e.g. one table's paired methods on a fixed number of further examples, on a slower device; seeds run in the order
named)::

    python benchmarks/reform_reruns.py run --out DIR --scale claims --workers 1 --kinds repo \
        --rows truncation,reform --seeds 12-47 --repo-file benchmarks/inputs/reform_repo_8192_distinct.json.gz

Settings (the paper's beside ours): input 8,192 tokens (paper: 64k-1M, 0.5-8x a 128k window; here 1x SmolLM2's 8k
window); eviction budget and chunk 2,048 (paper: 32k, 1/4 of the window: the same ratio); REFORM's recompute budget
2,048 (paper: 8k, a quarter of its 32k cache budget); initial / recent / final 256 tokens for every method (paper:
256); Table 6a's rows at a recompute budget of 1,024 (below the main 2,048, where rows can separate; 512 left no room beside the 256 + 256 initial and recent tokens), on multi-key and multi-query needles.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

REPO_FILE = ROOT / "benchmarks" / "inputs" / "reform_repo_8192.json.gz"
TABLE1 = ("truncation", "streamingllm", "tova", "h2o", "infinipot", "reform")
TABLE5 = ("rag", "rag_bm25")  # beside Table 1's reform row, on the four needle kinds
ABLATION_KINDS = ("multikey", "multiquery")
SCALES = {  # length, examples per cell, budget = chunk, initial/recent/final, ablation budget
    "full": dict(length=8192, examples=20, budget=2048, keep=256, ablation_budget=1024),
    "smoke": dict(length=1024, examples=1, budget=256, keep=32, ablation_budget=128),
    # the claims plan (PLANS): same settings as "full", other examples
    "claims": dict(length=8192, examples=20, budget=2048, keep=256, ablation_budget=1024),
    "claims-smoke": dict(length=1024, examples=1, budget=256, keep=32, ablation_budget=128),
}
ABLATION_ROWS = ("reform", "no gather", "no recompute", "random heads", "worst heads", "kernel 5")
#: The claims run: (kinds, seeds, rows, length factor) in priority order (a run cut by --limit keeps the first).
#: Sizes from the paper's effects (see benchmarks/results/reform/claims/README.md): key-value retrieval re-run
#: with the fixed answer loop and the whole value as the rule, 20 prompts of 2x the window (the old effect was
#: 0.67: 20 decide it); code completion on 48 distinct targets (paper +10.5 points of edit similarity, paired
#: sd ~0.2 here: n ~ 30 for 80 % power); Table 6a's random / worst heads on 80 more prompts (pooled n = 120);
#: BABILong on 80 more per task (pooled n = 200: our +7.5 points with ~15 % discordant pairs needs ~200);
#: Table 5's BM25 row on 80 more (pooled n = 160).
PLANS = {
    "claims": [
        (("kv",), range(20), ("truncation", "streamingllm", "h2o", "reform"), 2),
        (("repo",), range(48), ("truncation", "streamingllm", "infinipot", "reform"), 1),
        (("multikey", "multiquery"), range(20, 60), ("ablation:reform", "ablation:random heads",
                                                     "ablation:worst heads"), 1),
        (("babilong-qa1", "babilong-qa2"), range(20, 100), ("streamingllm", "reform"), 1),
        (("single", "multikey", "multivalue", "multiquery"), range(20, 40), ("reform", "rag_bm25"), 1),
    ],
    "claims-smoke": [
        (("kv",), range(1), ("truncation", "streamingllm", "h2o", "reform"), 2),
        (("repo",), range(2), ("truncation", "reform"), 1),
        (("multikey",), range(1), ("ablation:reform", "ablation:random heads", "ablation:worst heads"), 1),
        (("babilong-qa1",), range(1), ("streamingllm", "reform"), 1),
        (("single",), range(1), ("reform", "rag_bm25"), 1),
    ],
}


def _units(scale: dict, with_repo: bool, plan: str | None = None) -> list[tuple[str, int, str, int]]:
    """``(kind, seed, row, length)``: every example of every kind with the rows that table runs on it."""
    from kvlab.experiments.reform.tables import TABLE1_KINDS, TABLE5_KINDS

    if plan is not None:
        out = []
        for kinds, seeds, rows, factor in PLANS[plan]:
            if kinds == ("repo",) and not with_repo:
                continue
            out += [(kind, seed, row, scale["length"] * factor) for seed in seeds for kind in kinds for row in rows]
        return out
    out = []
    for kind in (*TABLE1_KINDS, *(("repo",) if with_repo else ())):
        for seed in range(scale["examples"]):
            rows = list(TABLE1) + (list(TABLE5) if kind in TABLE5_KINDS or kind == "repo" else [])
            out += [(kind, seed, r, scale["length"]) for r in rows]
            if kind in ABLATION_KINDS:
                out += [(kind, seed, "ablation:" + r, scale["length"]) for r in ABLATION_ROWS]
    return out


def _build_task(tok, kind: str, seed: int, length: int, repo: dict):
    from kvlab.experiments.reform.tables import build_tasks
    from kvlab.eval.tasks import LongTask, kv_task

    if kind == "repo":  # the example's id is its number in the file, not the seed within its package (the ids of
        task = LongTask.from_dict(repo[str(seed)])  # four packages' seeds 0.. would collide)
        task.info = {**task.info, "package_seed": task.info.get("seed"), "seed": seed}
        return task
    if kind == "kv":  # Table 1's key-value retrieval; scored on the whole value (RULER's string_match_all)
        task = kv_task(tok, length, n_pairs=12, seed=seed)
        task.info["answers"] = [task.answer.strip()]
        return task
    return build_tasks(tok, length, [kind], samples=1, seed=seed)[kind][0]


def _worker(rank: int, units: list, args_d: dict) -> None:
    import torch

    torch.set_num_threads(1)
    import kvlab
    from kvlab.reform.api import heads_file, load_heads
    from kvlab.experiments.reform.tables import ablations, example_id, example_records, run_table

    scale = SCALES[args_d["scale"]]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model, tok = kvlab.load_model("smollm2-135m", device=device, dtype="float32")
    heads_path = heads_file(model)
    heads_data = json.loads(Path(heads_path).read_text())
    rows = ablations(model, heads_data)
    heads = load_heads(str(heads_path), model)
    repo = {}
    if args_d["repo_file"]:
        with gzip.open(args_d["repo_file"], "rt") as f:
            repo = json.load(f)["tasks"]
    settings = dict(budget=scale["budget"], chunk_size=scale["budget"], n_initial=scale["keep"],
                    n_recent=scale["keep"], n_final=scale["keep"], heads=heads)
    out = Path(args_d["out"]) / "parts" / f"worker{rank}.jsonl"
    deadline = args_d["deadline"]
    tasks = {}
    with out.open("a") as f:
        for kind, seed, row, length in units:
            key = (kind, seed, length)
            if key not in tasks and time.time() > deadline:
                break  # the limit stops before a new example, never between the rows of one (they stay paired)
            if key not in tasks:
                tasks = {key: _build_task(tok, kind, seed, length, repo)}  # one example in memory
            task = tasks[key]
            if row.startswith("ablation:"):
                name = row.split(":", 1)[1]
                table, spec = "6a", {name: rows[name]}
                overrides = {"budget": scale["ablation_budget"]}
            else:
                table, spec, overrides = ("5" if row in TABLE5 else "4" if kind == "repo" else "1"), {row: (row, {})}, {}
            try:
                part = run_table(model, tok, {kind: [task]}, spec, length=length, **{**settings, **overrides})
            except Exception as exc:  # one failing unit is reported and retried on the next call; the rest go on
                with (Path(args_d["out"]) / "errors.txt").open("a") as e:
                    e.write(f"{kind}/{seed}|{row}: {type(exc).__name__}: {exc}\n")
                continue
            config = {"table": table, "length": length, "device": device,
                      **{k: v for k, v in {**settings, **overrides}.items() if k != "heads"},
                      "heads": [str(h) for h in heads]}
            for rec in example_records(part["results"], config):
                rec["method"] = ("ablation:" if table == "6a" else "") + rec["method"]
                rec["unit"] = f"{example_id(task, length)}|{row}"
                f.write(json.dumps(rec) + "\n")
            f.flush()


def _records(out: Path) -> list[dict]:
    """The records of ``out``: those of an earlier merged ``reform.examples.jsonl`` first (their ``unit``,
    ``example|method``, rebuilt), then those of ``parts/`` (lines cut by the time limit skipped)."""
    records = []
    merged = out / "reform.examples.jsonl"
    if merged.is_file():
        for line in merged.read_text().splitlines():
            r = json.loads(line)
            records.append({**r, "unit": f"{r['example']}|{r['method']}"})
    for p in sorted((out / "parts").glob("*.jsonl")):
        for line in p.read_text().splitlines():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                pass  # a line cut by the time limit
    return records


def _done(out: Path) -> set[str]:
    return {r["unit"] for r in _records(out) if "unit" in r}


def _summarise(out: Path) -> None:
    records = _records(out)
    seen, unique = set(), []
    for r in records:
        key = (r["unit"], r["metric"])
        if key not in seen:
            seen.add(key)
            unique.append(r)
    unique.sort(key=lambda r: (r["config"]["table"], r["task"], r["method"], r["example"], r["metric"]))
    with (out / "reform.examples.jsonl").open("w") as f:
        for r in unique:
            f.write(json.dumps({k: v for k, v in r.items() if k != "unit"}) + "\n")
    cells: dict = {}
    for r in unique:
        cell = cells.setdefault(r["config"]["table"], {}).setdefault(r["task"], {}).setdefault(
            r["method"], {"score": [], "answer_nll": [], "outputs": []})
        cell[r["metric"]].append(r["value"])
        if r["metric"] == "score":
            cell["outputs"].append((r["example"], r["output"], r["target"]))
    summary = {t: {k: {m: {"n": len(c["score"]), "score_mean": round(100 * sum(c["score"]) / max(len(c["score"]), 1), 2),
                           "answer_nll_mean": round(sum(c["answer_nll"]) / max(len(c["answer_nll"]), 1), 3)}
                       for m, c in by_m.items()} for k, by_m in by_k.items()} for t, by_k in cells.items()}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    lines = ["# REFORM re-run (issue 23): mean score % / mean answer NLL (n examples) per cell; intervals: the claims "
             "ledger, from reform.examples.jsonl", ""]
    raw = ["# First five generations per method and cell (repr; target after the arrow)", ""]
    for t, by_k in sorted(cells.items()):
        methods = sorted({m for by_m in by_k.values() for m in by_m})
        lines += [f"## Table {t}", "", "| task | " + " | ".join(methods) + " |", "|---" * (len(methods) + 1) + "|"]
        for k, by_m in sorted(by_k.items()):
            row = []
            for m in methods:
                s = summary[t][k].get(m)
                row.append("-" if s is None else f"{s['score_mean']:.1f} / {s['answer_nll_mean']:.2f} ({s['n']})")
            lines.append(f"| {k} | " + " | ".join(row) + " |")
            for m in methods:
                if m in by_m:
                    raw.append(f"- table {t}, {k}, {m}: " + "; ".join(
                        f"{e}: {o!r} -> {g!r}" for e, o, g in sorted(by_m[m]["outputs"])[:5]))
        lines.append("")
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    (out / "raw_outputs.md").write_text("\n".join(raw) + "\n")
    print("\n".join(lines))


def run(args) -> int:
    import multiprocessing as mp

    import torch

    scale = SCALES[args.scale]
    out = Path(args.out)
    (out / "parts").mkdir(parents=True, exist_ok=True)
    repo_file = args.repo_file if Path(args.repo_file).is_file() else None
    if repo_file is None:
        print(f"no {args.repo_file}: the code-completion rows (Table 4) are left out; build it with `tasks`")
    elif json.loads(gzip.open(repo_file, "rt").read())["length"] != scale["length"]:
        print(f"{repo_file} was built for another length than {scale['length']}: code rows left out")
        repo_file = None
    done = _done(out)
    plan = args.scale if args.scale in PLANS else None
    all_units = [u for u in _units(scale, repo_file is not None, plan) if _selected(u, args)]
    units = [u for u in all_units if f"{_kind_name(u[0])}/{u[3]}/{u[1]}|{u[2]}" not in done]
    if args.seeds:  # in the order named: a run cut by --limit keeps the first
        order = _seeds(args.seeds)
        units.sort(key=lambda u: order.index(u[1]))
    print(f"{len(units)} units to run ({len(done)} done before), {args.workers} workers, "
          f"{'cuda: ' + torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu'}", flush=True)
    begin = time.time()
    groups: dict = {}  # the units of one example stay together (its input is built once)
    for u in units:
        groups.setdefault((u[0], u[1], u[3]), []).append(u)
    shards = [[u for g in list(groups.values())[i::args.workers] for u in g] for i in range(args.workers)]
    ctx = mp.get_context("spawn")
    args_d = {"scale": args.scale, "out": str(out), "repo_file": repo_file, "deadline": begin + args.limit}
    procs = [ctx.Process(target=_worker, args=(i, s, args_d)) for i, s in enumerate(shards) if s]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    done = _done(out)
    left = sum(f"{_kind_name(u[0])}/{u[3]}/{u[1]}|{u[2]}" not in done for u in all_units)
    print(f"{time.time() - begin:.0f} s; {left} units left" + (" (run again to finish)" if left else ""), flush=True)
    _summarise(out)
    return 1 if any(p.exitcode for p in procs) else 0


def _seeds(text: str) -> list[int]:
    """``"12-47"`` or ``"3,5,8-9"`` -> the seeds named, in that order."""
    out = []
    for part in text.split(","):
        lo, _, hi = part.strip().partition("-")
        out += [s for s in range(int(lo), int(hi or lo) + 1) if s not in out]
    return out


def _selected(unit: tuple[str, int, str, int], args) -> bool:
    """Whether ``unit`` (kind, seed, row, length) is among ``--kinds`` / ``--rows`` / ``--seeds`` (unset: all)."""
    kind, seed, row, _ = unit
    return ((not args.kinds or kind in args.kinds.split(",")) and (not args.rows or row in args.rows.split(","))
            and (not args.seeds or seed in _seeds(args.seeds)))


def _kind_name(kind: str) -> str:
    """The task's ``kind`` field for a kind name of the command line (``single`` -> ``ruler-single``)."""
    return kind if kind.startswith("babilong") or kind in ("repo", "kv") else f"ruler-{kind}"


def tasks(args) -> int:
    """The code-completion inputs: ``--examples`` per package of ``--packages``, every target line distinct
    (:func:`kvlab.eval.tasks.repo_targets`; across packages too), numbered 0..N-1 as the runs' seeds."""
    from kvlab.models import load_tokenizer
    from kvlab.eval.tasks import repo_targets, repo_task

    scale = SCALES[args.scale]
    tok = load_tokenizer("smollm2-135m")
    out, seen = {}, set()
    for package in args.packages.split(","):
        uses = repo_targets(tok, scale["length"], args.examples, package=package)
        for i, use in enumerate(uses):
            task = repo_task(tok, scale["length"], package=package, seed=i, use=use)
            if task.answer.strip() in seen:
                continue  # the same line in two packages: one question
            seen.add(task.answer.strip())
            out[str(len(out))] = task.to_dict()
    data = {"length": scale["length"], "packages": args.packages, "distinct_targets": len(seen), "tasks": out}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(args.out, "wt") as f:
        json.dump(data, f)
    print(f"-> {args.out}: {len(out)} prompts, {len(seen)} distinct targets ({os.path.getsize(args.out)} bytes)")
    return 0


def repo_ids(args) -> int:
    """Name the code-completion records of ``--out`` by their number in ``--repo-file`` (found by the target line,
    distinct in the file). Runs before the ids were the file's numbers named them ``repo/LENGTH/<seed within the
    package>``: four packages' examples shared ids, and the merge kept one record per id and method, whichever
    example it came from. Prints every change; re-summarises."""
    with gzip.open(args.repo_file, "rt") as f:
        data = json.load(f)
    number = {t["answer"].strip(): int(k) for k, t in data["tasks"].items()}
    path = Path(args.out) / "reform.examples.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()]
    changed = 0
    for r in records:
        if r["task"] != "repo":
            continue
        if r["target"].strip() not in number:
            raise ValueError(f"{r['example']} / {r['method']}: target {r['target']!r} is not in {args.repo_file}")
        example = f"repo/{data['length']}/{number[r['target'].strip()]}"
        if example != r["example"]:
            if r["metric"] == "score":
                print(f"{r['example']} -> {example} ({r['method']}, {r['config']['device']})")
            r["example"], changed = example, changed + 1
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    print(f"{changed} records renamed")
    _summarise(Path(args.out))
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=["tasks", "run", "summary", "repo-ids"])
    p.add_argument("--out", required=True, help="run: the results folder; tasks: the inputs file")
    p.add_argument("--scale", choices=sorted(SCALES), default="full")
    p.add_argument("--workers", type=int, default=12, help="worker processes (one model copy each)")
    p.add_argument("--limit", type=float, default=480, help="seconds; units not started by then wait for a rerun")
    p.add_argument("--repo-file", default=str(REPO_FILE))
    p.add_argument("--kinds", default="", help="run: only these kinds of the plan (comma-separated: repo,kv,...)")
    p.add_argument("--rows", default="", help="run: only these rows (comma-separated: truncation,reform,...)")
    p.add_argument("--seeds", default="", help="run: only these seeds ('12-47', '3,5,8-9')")
    p.add_argument("--packages", default="click,jinja2,requests,urllib3", help="tasks: packages of the code set")
    p.add_argument("--examples", type=int, default=12, help="tasks: distinct targets per package")
    args = p.parse_args(argv)
    if args.what == "summary":
        _summarise(Path(args.out))
        return 0
    return {"tasks": tasks, "run": run, "repo-ids": repo_ids}[args.what](args)


if __name__ == "__main__":
    raise SystemExit(main())
