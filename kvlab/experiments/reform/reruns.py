"""REFORM's Tables 1, 4 (code stand-in), 5 and 6a again on SmolLM2-135M, with the fixed harness (answers
generated as RULER does, no stop at a newline; every baseline keeps the same initial/recent tokens and the question;
the code prompt ending at the target line's start), at >= 20 examples per cell.

    python -m kvlab run reform-reruns tasks --out DIR            # the code-completion inputs (CPU, once)
    python -m kvlab run reform-reruns run --out DIR [--workers 12] [--limit 540] [--scale smoke]

``run`` builds the RULER / BABILong inputs from the corpora (seeds 0..N-1), reads the code-completion inputs from the
committed file (built from the ``click`` package here, which the GPU machine does not have), shards every
(example, row) unit over worker processes (one model copy each, one thread each; on a GPU they share it), and
writes ``DIR/reform.examples.jsonl.gz`` (one record per example, method and metric, raw output included),
``DIR/summary.json`` / ``summary.md`` (means per cell, no verdicts) and ``DIR/raw_outputs.md`` (the first five
generations per method and cell). Units already in ``DIR/parts/`` or in ``DIR/reform.examples.jsonl.gz`` (the
merged records of an earlier run, whose parts are gone) are skipped and kept, so a run cut by ``--limit`` (seconds)
goes on where it stopped when called again. ``--kinds``, ``--rows`` and ``--seeds`` keep only those units of the plan
(e.g. one table's paired methods on a fixed number of further examples, on a slower device; seeds run in the order
named; a selection that names no unit of the plan is refused before any work)::

    python -m kvlab run reform-reruns run --out DIR --scale claims --workers 1 --kinds repo \
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
import time
from pathlib import Path

from kvlab.experiments import records, registry

NAME = "reform-reruns"
COMMAND = f"python -m kvlab run {NAME}"
RECORDS = "reform" + records.SUFFIX
SUMMARIES = ("summary.json", "summary.md", "raw_outputs.md")
WHAT = ("run", "tasks", "summary", "repo-ids")

REPO_FILE = "benchmarks/inputs/reform_repo_8192.json.gz"
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
#: every kind a unit can name (Table 1's RULER and BABILong kinds, Table 4's code, the key-value task)
KINDS = ("single", "multikey", "multivalue", "multiquery", "vt", "babilong-qa1", "babilong-qa2", "repo", "kv")
#: every row a unit can name
ROWS = (*TABLE1, *TABLE5, *(f"ablation:{r}" for r in ABLATION_ROWS))
#: the packages whose code the ``tasks`` inputs draw from
PACKAGES = ("click", "jinja2", "requests", "urllib3")


# --------------------------------------------------------------------------------------------- the plan
def _units(scale: dict, with_repo: bool, plan: str | None = None) -> list[tuple[str, int, str, int]]:
    """``(kind, seed, row, length)``: every example of every kind with the rows that table runs on it."""
    if plan is not None:
        return [(kind, seed, row, scale["length"] * factor) for kinds, seeds, rows, factor in PLANS[plan]
                if with_repo or kinds != ("repo",) for seed in seeds for kind in kinds for row in rows]
    from kvlab.experiments.reform.tables import TABLE1_KINDS, TABLE5_KINDS

    out = []
    for kind in (*TABLE1_KINDS, *(("repo",) if with_repo else ())):
        rows = list(TABLE1) + (list(TABLE5) if kind in TABLE5_KINDS or kind == "repo" else [])
        rows += [f"ablation:{r}" for r in ABLATION_ROWS] if kind in ABLATION_KINDS else []
        out += [(kind, seed, r, scale["length"]) for seed in range(scale["examples"]) for r in rows]
    return out


def _selected(unit: tuple[str, int, str, int], args) -> bool:
    """Whether ``unit`` (kind, seed, row, length) is among ``--kinds`` / ``--rows`` / ``--seeds`` (unset: all)."""
    kind, seed, row, _ = unit
    return ((not args.kinds or kind in args.kinds) and (not args.rows or row in args.rows)
            and (not args.seeds or seed in args.seeds))


def _kind_name(kind: str) -> str:
    """The task's ``kind`` field for a kind name of the command line (``single`` -> ``ruler-single``)."""
    return kind if kind.startswith("babilong") or kind in ("repo", "kv") else f"ruler-{kind}"


def _unit_id(unit: tuple[str, int, str, int]) -> str:
    kind, seed, row, length = unit
    return f"{_kind_name(kind)}/{length}/{seed}|{row}"


def _repo_file(args, scale: dict) -> str | None:
    """The code-completion inputs for this run, or None (code rows left out, said why)."""
    path = Path(args.repo_file)
    if not path.is_file():
        if args.kinds and "repo" in args.kinds:
            raise registry.ParameterError(f"--kinds repo needs the code-completion inputs, but --repo-file {path} "
                                          f"is not a file; build it with `{COMMAND} tasks` or name the committed "
                                          "benchmarks/inputs/reform_repo_8192_distinct.json.gz")
        print(f"no {path}: the code-completion rows (Table 4) are left out; build it with `{COMMAND} tasks`")
        return None
    with gzip.open(path, "rt") as f:
        length = json.load(f).get("length")
    if length != scale["length"]:
        print(f"{path} was built for {length} tokens, not this scale's {scale['length']}: code rows left out")
        return None
    return str(path)


def _plan_units(args) -> list[tuple[str, int, str, int]]:
    """The units the options select, in the order they run (``--seeds`` in the order named).

    ``--smoke`` runs the first unit of the plan; with ``--rows`` (a ledger row's pair of methods), the first
    example the selection names under each of those rows, so that the row can be recomputed from it. A smoke run
    draws from the full-size plan's kinds and rows at the smoke sizes and ignores ``--seeds`` (its seeds are not
    the full run's)."""
    scale = SCALES[args.scale]
    plan = args.scale if args.scale in PLANS else None
    if args.smoke:
        args.seeds = None
        plan = plan and plan.removesuffix("-smoke")
    units = [u for u in _units(scale, args.repo is not None, plan) if _selected(u, args)]
    if args.seeds:
        units.sort(key=lambda u: args.seeds.index(u[1]))
    if args.smoke and units:
        first = units[0]
        return [u for u in units if u[:2] == first[:2]] if args.rows else [first]
    return units


def check(args) -> None:
    """Every option, before a model is loaded or a file written: a selection of no unit is refused."""
    if args.smoke:
        args.scale = "claims-smoke" if args.scale.startswith("claims") else "smoke"
        args.workers = 1
    if args.what == "repo-ids" and not Path(args.repo_file).is_file():
        raise registry.ParameterError(f"repo-ids renames the code records by their number in --repo-file, but "
                                      f"{args.repo_file} is not a file; name the inputs file the run used")
    if args.what != "run":
        return
    args.repo = _repo_file(args, SCALES[args.scale])
    args.units = _plan_units(args)
    if not args.units:
        chosen = ", ".join(f"--{k} {','.join(map(str, v))}" for k, v in
                           (("kinds", args.kinds), ("rows", args.rows), ("seeds", args.seeds)) if v)
        plan = _units(SCALES[args.scale], args.repo is not None, args.scale if args.scale in PLANS else None)
        raise registry.ParameterError(
            f"{chosen or 'the options'} select no unit of --scale {args.scale}'s plan, so there is nothing to run; "
            f"its kinds are {sorted({u[0] for u in plan})}, its rows {sorted({u[2] for u in plan})} and its seeds "
            f"{min(u[1] for u in plan)}-{max(u[1] for u in plan)}: choose among those (or another --scale)")


# --------------------------------------------------------------------------------------------- one worker
def _build_task(tok, kind: str, seed: int, length: int, repo: dict):
    from kvlab.eval.tasks import LongTask, kv_task
    from kvlab.experiments.reform.tables import build_tasks

    if kind == "repo":  # the example's id is its number in the file, not the seed within its package (the ids of
        task = LongTask.from_dict(repo[str(seed)])  # four packages' seeds 0.. would collide)
        task.info = {**task.info, "package_seed": task.info.get("seed"), "seed": seed}
        return task
    if kind == "kv":  # Table 1's key-value retrieval; scored on the whole value (RULER's string_match_all)
        task = kv_task(tok, length, n_pairs=12, seed=seed)
        task.info["answers"] = [task.answer.strip()]
        return task
    return build_tasks(tok, length, [kind], samples=1, seed=seed)[kind][0]


def _row_spec(row: str, kind: str, scale: dict, ablation_rows: dict) -> tuple[str, dict, dict]:
    """``(table, {name: (method, settings)}, overrides)`` of one row."""
    if row.startswith("ablation:"):
        name = row.split(":", 1)[1]
        return "6a", {name: ablation_rows[name]}, {"budget": scale["ablation_budget"]}
    return ("5" if row in TABLE5 else "4" if kind == "repo" else "1"), {row: (row, {})}, {}


def _worker(rank: int, units: list, args_d: dict) -> None:
    """Run ``units`` on one model copy; records into ``parts/worker<rank>-<start>.examples.jsonl.gz``."""
    import torch

    torch.set_num_threads(1)
    import kvlab
    from kvlab.experiments.reform.tables import ablations, example_id, example_records, run_table
    from kvlab.reform.api import heads_file, load_heads

    scale = SCALES[args_d["scale"]]
    device = args_d["device"]
    model, tok = kvlab.load_model("smollm2-135m", device=device, dtype="float32")
    heads_path = heads_file(model)
    ablation_rows = ablations(model, json.loads(Path(heads_path).read_text()))
    heads = load_heads(str(heads_path), model)
    repo = {}
    if args_d["repo_file"]:
        with gzip.open(args_d["repo_file"], "rt") as f:
            repo = json.load(f)["tasks"]
    settings = dict(budget=scale["budget"], chunk_size=scale["budget"], n_initial=scale["keep"],
                    n_recent=scale["keep"], n_final=scale["keep"], heads=heads)
    out = Path(args_d["out"])
    tasks = {}
    part = out / "parts" / f"worker{rank}-{int(time.time())}{records.SUFFIX}"
    with records.RecordWriter(part) as writer:
        for kind, seed, row, length in units:
            key = (kind, seed, length)
            if key not in tasks and time.time() > args_d["deadline"]:
                break  # the limit stops before a new example, never between the rows of one (they stay paired)
            if key not in tasks:
                tasks = {key: _build_task(tok, kind, seed, length, repo)}  # one example in memory
            task = tasks[key]
            table, spec, overrides = _row_spec(row, kind, scale, ablation_rows)
            try:
                result = run_table(model, tok, {kind: [task]}, spec, length=length, **{**settings, **overrides})
            except Exception as exc:  # one failing unit is reported and retried on the next call; the rest go on
                with (out / "errors.txt").open("a") as e:
                    e.write(f"{kind}/{seed}|{row}: {type(exc).__name__}: {exc}\n")
                continue
            config = {"table": table, "length": length, "device": args_d["device_name"],
                      **{k: v for k, v in {**settings, **overrides}.items() if k != "heads"},
                      "heads": [str(h) for h in heads]}
            for rec in example_records(result["results"], config, prefix="ablation:" if table == "6a" else ""):
                writer.add({**rec, "unit": f"{example_id(task, length)}|{row}"})


# --------------------------------------------------------------------------------------------- the records
def _records(out: Path) -> list[dict]:
    """The records of ``out``: those of an earlier merged records file first (their ``unit``, ``example|method``,
    rebuilt), then those of ``parts/``."""
    recs = []
    merged = out / RECORDS
    if merged.is_file():
        recs += [{**r, "unit": f"{r['example']}|{r['method']}"} for r in records.read(merged)]
    for part in sorted((out / "parts").glob("*" + records.SUFFIX)):
        recs += records.read(part)
    return recs


def _done(out: Path) -> set[str]:
    return {r["unit"] for r in _records(out) if "unit" in r}


def _merge(out: Path, folder=None) -> list[dict]:
    """One record per (unit, metric), the earlier first, into ``RECORDS`` (through ``folder``, an OutputFolder)."""
    seen, unique = set(), []
    for r in _records(out):
        if (r["unit"], r["metric"]) not in seen:
            seen.add((r["unit"], r["metric"]))
            unique.append({k: v for k, v in r.items() if k != "unit"})
    unique.sort(key=lambda r: (r["config"]["table"], r["task"], r["method"], r["example"], r["metric"]))
    records.write(RECORDS if folder is not None else out / RECORDS, unique, out=folder)
    return unique


def _cells(recs: list[dict]) -> dict:
    cells: dict = {}
    for r in recs:
        cell = cells.setdefault(r["config"]["table"], {}).setdefault(r["task"], {}).setdefault(
            r["method"], {"score": [], "answer_nll": [], "outputs": []})
        cell[r["metric"]].append(r["value"])
        if r["metric"] == "score":
            cell["outputs"].append((r["example"], r["output"], r["target"]))
    return cells


def _mean(values: list, scale: float = 1.0, digits: int = 2) -> float:
    return round(scale * sum(values) / max(len(values), 1), digits)


def _table_lines(table: str, by_kind: dict, summary: dict) -> tuple[list[str], list[str]]:
    methods = sorted({m for by_m in by_kind.values() for m in by_m})
    lines = [f"## Table {table}", "", "| task | " + " | ".join(methods) + " |", "|---" * (len(methods) + 1) + "|"]
    raw = []
    for kind, by_m in sorted(by_kind.items()):
        cells = [summary[table][kind].get(m) for m in methods]
        lines.append(f"| {kind} | " + " | ".join("-" if s is None else f"{s['score_mean']:.1f} / "
                                                 f"{s['answer_nll_mean']:.2f} ({s['n']})" for s in cells) + " |")
        raw += [f"- table {table}, {kind}, {m}: " + "; ".join(f"{e}: {o!r} -> {g!r}"
                                                               for e, o, g in sorted(by_m[m]["outputs"])[:5])
                for m in methods if m in by_m]
    return lines + [""], raw


def _summarise(out: Path, folder=None) -> None:
    """Merge the records, then ``summary.json`` / ``summary.md`` (means per cell) and ``raw_outputs.md``."""
    cells = _cells(_merge(out, folder))
    summary = {t: {k: {m: {"n": len(c["score"]), "score_mean": _mean(c["score"], 100),
                           "answer_nll_mean": _mean(c["answer_nll"], digits=3)}
                       for m, c in by_m.items()} for k, by_m in by_k.items()} for t, by_k in cells.items()}
    lines = ["# REFORM re-run: mean score % / mean answer NLL (n examples) per cell; intervals: the claims "
             f"ledger, from {RECORDS}", ""]
    raw = ["# First five generations per method and cell (repr; target after the arrow)", ""]
    for table, by_kind in sorted(cells.items()):
        more, more_raw = _table_lines(table, by_kind, summary)
        lines += more
        raw += more_raw
    texts = {"summary.json": json.dumps(summary, indent=1), "summary.md": "\n".join(lines) + "\n",
             "raw_outputs.md": "\n".join(raw) + "\n"}
    for name, text in texts.items():
        (folder.claim(name) if folder is not None else out / name).write_text(text)
    print("\n".join(lines))


# --------------------------------------------------------------------------------------------- the commands
def _run(args, folder) -> list[Path]:
    import multiprocessing as mp

    out = folder.root
    folder.claim("parts/", "errors.txt")
    done = _done(out)
    units = [u for u in args.units if _unit_id(u) not in done]
    print(f"{len(units)} units to run ({len(done)} done before), {args.workers} workers, {args.device_name}",
          flush=True)
    begin = time.time()
    groups: dict = {}  # the units of one example stay together (its input is built once)
    for u in units:
        groups.setdefault((u[0], u[1], u[3]), []).append(u)
    shards = [[u for g in list(groups.values())[i::args.workers] for u in g] for i in range(args.workers)]
    args_d = {"scale": args.scale, "out": str(out), "repo_file": args.repo, "deadline": begin + args.limit,
              "device": args.device, "device_name": args.device_name}
    failed = False
    if args.workers == 1:  # in this process (the smoke run, a CPU run of one worker)
        if shards[0]:
            _worker(0, shards[0], args_d)
    else:
        ctx = mp.get_context("spawn")
        procs = [ctx.Process(target=_worker, args=(i, s, args_d)) for i, s in enumerate(shards) if s]
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join()
        failed = any(proc.exitcode for proc in procs)
    done = _done(out)
    left = sum(_unit_id(u) not in done for u in args.units)
    print(f"{time.time() - begin:.0f} s; {left} units left" + (" (run again to finish)" if left else ""), flush=True)
    if not _records(out):  # every unit failed (or none started): no empty records file
        raise RuntimeError(f"no unit finished, so no records were written; {out}/errors.txt says why")
    _summarise(out, folder)
    folder.remove_tree("parts")  # merged into the records file, which the next call resumes from
    if failed:
        raise RuntimeError(f"a worker process failed; {out}/errors.txt and the log say why; run again to resume")
    return [out / RECORDS] + [out / name for name in SUMMARIES]


def _tasks(args, folder) -> list[Path]:
    """The code-completion inputs: ``--examples`` per package of ``--packages``, every target line distinct
    (:func:`kvlab.eval.tasks.repo_targets`; across packages too), numbered 0..N-1 as the runs' seeds."""
    from kvlab.eval.tasks import repo_targets, repo_task
    from kvlab.models import load_tokenizer

    scale = SCALES[args.scale]
    path = folder.claim(f"reform_repo_{scale['length']}.json.gz")
    tok = load_tokenizer("smollm2-135m")
    tasks, seen = {}, set()
    for package in args.packages:
        for i, use in enumerate(repo_targets(tok, scale["length"], args.examples, package=package)):
            task = repo_task(tok, scale["length"], package=package, seed=i, use=use)
            if task.answer.strip() not in seen:  # the same line in two packages: one question
                seen.add(task.answer.strip())
                tasks[str(len(tasks))] = task.to_dict()
    data = {"length": scale["length"], "packages": ",".join(args.packages), "distinct_targets": len(seen),
            "tasks": tasks}
    with gzip.open(path, "wt") as f:
        json.dump(data, f)
    print(f"-> {path}: {len(tasks)} prompts, {len(seen)} distinct targets ({os.path.getsize(path)} bytes)")
    return [path]


def repo_ids(args, folder) -> list[Path]:
    """Name the code-completion records of ``--out`` by their number in ``--repo-file`` (found by the target line,
    distinct in the file). Runs before the ids were the file's numbers named them ``repo/LENGTH/<seed within the
    package>``: four packages' examples shared ids, and the merge kept one record per id and method, whichever
    example it came from. Prints every change; re-summarises."""
    with gzip.open(args.repo_file, "rt") as f:
        data = json.load(f)
    number = {t["answer"].strip(): int(k) for k, t in data["tasks"].items()}
    recs = records.read(folder.root / RECORDS)
    changed = 0
    for r in recs:
        if r["task"] != "repo":
            continue
        if r["target"].strip() not in number:
            raise ValueError(f"{r['example']} / {r['method']}: target {r['target']!r} is not in {args.repo_file}")
        example = f"repo/{data['length']}/{number[r['target'].strip()]}"
        if example != r["example"]:
            if r["metric"] == "score":
                print(f"{r['example']} -> {example} ({r['method']}, {r['config']['device']})")
            r["example"], changed = example, changed + 1
    records.write(RECORDS, recs, out=folder)
    print(f"{changed} records renamed")
    _summarise(folder.root, folder)
    return [folder.root / RECORDS] + [folder.root / name for name in SUMMARIES]


def parser() -> argparse.ArgumentParser:
    p = registry.experiment_parser(NAME, __doc__.split("\n\n")[0])
    p.add_argument("what", nargs="?", default="run", choices=WHAT,
                   help="run (default): the plan's units; tasks: the code inputs; summary; repo-ids")
    p.add_argument("--scale", choices=sorted(SCALES), default="full")
    p.add_argument("--workers", type=registry.positive_int, default=12, help="worker processes (one model copy each)")
    p.add_argument("--limit", type=registry.positive_int, default=480,
                   help="seconds; units not started by then wait for a rerun")
    p.add_argument("--repo-file", default=REPO_FILE, help="the code-completion inputs (`tasks` writes them)")
    p.add_argument("--kinds", type=registry.names_list(KINDS, what="kind"), default=None,
                   help="run: only these kinds of the plan (comma-separated: repo,kv,...)")
    p.add_argument("--rows", type=registry.names_list(ROWS, what="row"), default=None,
                   help="run: only these rows (comma-separated: truncation,reform,...)")
    p.add_argument("--seeds", type=registry.seed_range, default=None, help="run: only these seeds ('12-47', '3,5,8-9')")
    p.add_argument("--packages", type=registry.names_list(PACKAGES, what="package"), default=list(PACKAGES),
                   help="tasks: packages of the code set")
    p.add_argument("--examples", type=registry.positive_int, default=12, help="tasks: distinct targets per package")
    return p


def run(args) -> list[Path]:
    import torch

    from kvlab.outputs import OutputFolder

    if not hasattr(args, "units") and args.what == "run":
        check(args)
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    args.device_name = f"cuda ({torch.cuda.get_device_name()})" if args.device.startswith("cuda") else "cpu"
    folder = OutputFolder(args.out, COMMAND)
    if args.what == "summary":
        _summarise(folder.root, folder)
        return [folder.root / RECORDS] + [folder.root / name for name in SUMMARIES]
    return {"run": _run, "tasks": _tasks, "repo-ids": repo_ids}[args.what](args, folder)


def main(argv=None) -> int:
    return registry.main([NAME, *(argv or [])])
