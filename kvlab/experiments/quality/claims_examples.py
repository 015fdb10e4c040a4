"""Per-example records of the committed results that hold per-example outcomes inside their own JSON (per needle
depth, per question, per text window, per long-stream segment), in the one record format
(:mod:`kvlab.experiments.records`), for the claims ledger to recompute its intervals from.

It only *reformats* what the results files already hold; it computes no score that the run did not record, except
the natural log of a window's perplexity (its mean NLL, so that differences of windows add up to the log-ratio of
perplexities). Results that hold only a mean (OrthoRank's tables, the DHSA and REFORM speed rows, ...) get no file;
their ledger rows say so. Each record's ``config`` holds the run's policy where the source names it, and ``device``
``"not recorded"`` (the older results did not keep it)::

    python -m kvlab run quality-claims-examples --out DIR            # every file of SOURCES, under DIR
    python -m kvlab run quality-claims-examples --check --out DIR    # refused unless the committed files agree

``--smoke`` converts every source too: the conversion reads committed files only and takes about a second, so there
is nothing to shrink, and each file keeps its name and its methods (a ledger row recomputes from any of them).

To add a new result: make the experiment write its records itself (preferred), or add a converter here.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path

from kvlab.experiments import records
from kvlab.experiments.registry import ParameterError, experiment_parser

NAME = "quality-claims-examples"
ROOT = Path(__file__).resolve().parents[3]


def _rec(example, method, metric, value, config=None, **extra):
    cfg = config if isinstance(config, dict) else ({} if config is None else {"policy": config})
    return records.record(example, method, metric, float(value), config=cfg, device=records.NOT_RECORDED,
                          **{k: v for k, v in extra.items() if v is not None})


def job_method(name: str, kind: str, args: dict) -> str:
    """The method a quality-runs job's records carry: a needle / passkey job's name without its length, a GSM8K
    chunk's (``<method>-000``, ``-010``, ...) without its start, any other job's name."""
    if kind in ("niah", "passkey"):
        return name.removesuffix(f"-{args['length']}")
    return name.rsplit("-", 1)[0] if kind == "gsm8k" else name


def _blocks(job, result, records):
    """Perplexity runs: ``block_ppl_1024`` holds the perplexity of each 1,024-token window of the stream."""
    args = job.get("args", {})
    for i, ppl in enumerate(result.get("block_ppl_1024") or []):
        records.append(_rec(f"{args['corpus']}-{args['tokens']}-w{i:03d}", job["job"], "window_nll",
                            math.log(ppl), config=args.get("policy")))


def _retrieval(job, result, records):
    """Needle / passkey grids: one outcome per depth; the method is the job name without its length."""
    args = job["args"]
    method = job_method(job["job"], job["kind"], args)
    answers = result.get("answers") or [[]]
    outs = answers[0] if answers and isinstance(answers[0], list) else answers
    for i, depth in enumerate(args["depths"]):
        ex = f"{job['kind']}-{args['length']}-d{depth}"
        out = outs[i] if i < len(outs) else None
        records.append(_rec(ex, method, "correct", result["accuracy"][i], output=out, config=args.get("policy")))
        records.append(_rec(ex, method, "answer_nll", result["answer_nll"][i], config=args.get("policy")))


def _gsm8k(job, result, records):
    """GSM8K chunks of 10 problems: jobs ``<method>-000``, ``-010``, ... are one method."""
    args = job["args"]
    method = job_method(job["job"], job["kind"], args)
    for i, gen in enumerate(result["generations"]):
        ex = f"gsm8k-{args['start'] + i:04d}"
        target = result["answers"][i] if i < len(result.get("answers", [])) else None
        records.append(_rec(ex, method, "flexible", result["flexible"][i], output=gen, target=target,
                            config=args.get("method")))
        records.append(_rec(ex, method, "strict", result["strict"][i], config=args.get("method")))


def _mmlu(job, result, records):
    for i, (p, g) in enumerate(zip(result["predictions"], result["gold"])):
        records.append(_rec(f"mmlu-{i:04d}", job["job"], "correct", float(p == g), output=p, target=g,
                            subject=result["subjects"][i]))


def convert_job_dict(path: Path) -> list[dict]:
    """``fullsize_runs.json`` / ``fidelity_gpu_h100*.json``: a dict of quality-runs jobs."""
    return convert_jobs(json.loads(path.read_text()))


def convert_jobs(data: dict) -> list[dict]:
    """The per-example records of a dict of quality-runs jobs (``{name: {"kind", "args", "result"}}``)."""
    records: list[dict] = []
    for name in sorted(data):
        job = dict(data[name])
        job.setdefault("job", name)
        result = job.get("result") or {}
        kind = job.get("kind")
        if "block_ppl_1024" in result:
            _blocks(job, result, records)
        elif kind in ("niah", "passkey"):
            _retrieval(job, result, records)
        elif kind == "gsm8k":
            _gsm8k(job, result, records)
        elif "predictions" in result and "gold" in result:
            _mmlu(job, result, records)
    return records


def convert_longstream(folder: Path) -> list[dict]:
    """``longstream/*.json``: ``segment_ppl`` per segment of the 805,889-token stream (same segments each run)."""
    records = []
    for path in sorted(folder.glob("*.json")):
        d = json.loads(path.read_text())
        if "segment_ppl" not in d:
            continue
        for i, ppl in enumerate(d["segment_ppl"]):
            records.append(_rec(f"segment-{i:03d}", d["name"], "segment_nll", math.log(ppl), config=d["policy"],
                                tokens=d["segment_tokens"]))
    return records


def convert_longtask(folder: Path) -> list[dict]:
    """``lacache/tables/lacache-<task>-<method>-<length>.json``: one record per prompt (RULER-style / QA)."""
    records = []
    for path in sorted(folder.glob("lacache-*.json")):
        d = json.loads(path.read_text())
        args = d["params"]["args"]
        task, length = args["task"], args["length"]
        method = d["name"][len(f"lacache-{task}-"):-len(f"-{length}")]
        for i, e in enumerate(d["result"]["examples"]):
            ex = f"{task}-{length}-{i}"
            records.append(_rec(ex, method, "score", e["score"], output=e.get("said"), target=e.get("answers"),
                                config=args["policy"]))
            records.append(_rec(ex, method, "answer_nll", e["answer_nll"], config=args["policy"]))
    return records


def convert_reform(path: Path) -> list[dict]:
    """REFORM ``experiments run`` / ``bench reform compare`` files: ``sets[<name>]["results"]`` in task order; the
    k-th record of a (set, task, method) is example k (the same prompt for every method: checked by its answer)."""
    data = json.loads(path.read_text())
    records = []
    for set_name in sorted(data["sets"]):
        seen: dict = defaultdict(int)
        targets: dict = {}
        for r in data["sets"][set_name]["results"]:
            task = r.get("task", set_name.split("-")[0])
            k = seen[(task, r["method"])]
            seen[(task, r["method"])] += 1
            ex = f"{set_name}/{task}-{k}"
            if ex in targets and targets[ex] != r.get("answer"):
                raise ValueError(f"{path}: example {ex} has different answers across methods; cannot pair")
            targets.setdefault(ex, r.get("answer"))
            score = r.get("score", float(bool(r.get("correct"))))
            records.append(_rec(ex, r["method"], "score", score, output=r.get("text"), target=r.get("answer")))
            if r.get("answer_nll") is not None:
                records.append(_rec(ex, r["method"], "answer_nll", r["answer_nll"]))
    return records


# results file (relative to the repository) -> (converter, examples file written)
SOURCES = {
    "benchmarks/results/fidelity/fullsize_runs.json": (convert_job_dict,
                                                       "benchmarks/results/fidelity/fullsize_runs.examples.jsonl"),
    "benchmarks/results/fidelity/fidelity_gpu_h100.json": (convert_job_dict,
                                                           "benchmarks/results/fidelity/fidelity_gpu_h100.examples.jsonl"),
    "benchmarks/results/fidelity/fidelity_gpu_h100_sweep.json": (
        convert_job_dict, "benchmarks/results/fidelity/fidelity_gpu_h100_sweep.examples.jsonl"),
    "benchmarks/results/longstream": (convert_longstream, "benchmarks/results/longstream/segments.examples.jsonl"),
    "benchmarks/results/lacache/tables": (convert_longtask,
                                          "benchmarks/results/lacache/tables/longtask.examples.jsonl"),
    "benchmarks/results/reform/table1.json": (convert_reform, "benchmarks/results/reform/table1.examples.jsonl"),
    "benchmarks/results/reform/qwen2.5-coder-0.5b/table1_ruler.json": (
        convert_reform, "benchmarks/results/reform/qwen2.5-coder-0.5b/table1_ruler.examples.jsonl"),
    "benchmarks/results/reform/qwen2.5-coder-0.5b/table1_rest.json": (
        convert_reform, "benchmarks/results/reform/qwen2.5-coder-0.5b/table1_rest.examples.jsonl"),
    "kvlab/reform/data/fullsize_smollm2.json": (convert_reform,
                                                "benchmarks/results/reform/fullsize_smollm2.examples.jsonl"),
}


def _key(rec: dict) -> tuple:
    return rec["example"], rec["method"], rec["metric"], rec["value"]


def parser():
    p = experiment_parser(NAME, __doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true",
                   help="compare a fresh conversion with the committed records (example, method, metric, value) "
                        "instead of writing; refused when one differs")
    return p


def _check_committed() -> list:
    bad = []
    for src, (convert, dst) in SOURCES.items():
        fresh = sorted(map(_key, convert(ROOT / src)))
        try:
            committed = sorted(map(_key, records.read(ROOT / dst)))
        except FileNotFoundError:
            committed = None
        if committed != fresh:
            bad.append(dst)
    if bad:
        raise ParameterError(f"--check: these committed records differ from their sources: {bad}; run "
                             f"python -m kvlab run {NAME} and copy the files in")
    print(f"{len(SOURCES)} records files agree with their sources")
    return []


def run(args):
    if args.check:
        return _check_committed()
    from kvlab.outputs import OutputFolder

    out = OutputFolder(args.out, f"python -m kvlab run {NAME}")
    written = []
    for src, (convert, dst) in SOURCES.items():  # --smoke as well (see the module's text)
        name = Path(dst).name.removesuffix(".gz").removesuffix(".examples.jsonl") + records.SUFFIX
        written.append(records.write(name, convert(ROOT / src), out=out))
        print(f"{name}: records from {src}")
    return written
