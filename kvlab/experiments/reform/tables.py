"""REFORM's experiment tables at our scale: Table 1 (RULER + BABILong), Table 4 (RepoEval stand-in), Table 5
(vs RAG), Table 6a (ablations) and Table 6b (efficiency, read from the GPU run), each beside the paper's.

``python -m kvlab.experiments.reform.tables WHAT``::

    tasks   build every input of a run here (needs the corpora) into a gzipped JSON that travels to the GPU
    run     every method on every task of that file, the ablations, the summaries: a JSON report

The notebook ``notebooks/10_reform_experiments.ipynb`` calls the same functions at CI size.
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import sys
import time
from pathlib import Path
from typing import Any, Iterable

from kvlab.eval.retrieval import RULER_TOKENS
from kvlab.experiments.reform.compare import METHODS, as_dicts, run_method, summarise
from kvlab.eval.tasks import RULER_KINDS, LongTask, babilong_task, repo_task, ruler_task

__all__ = ["PAPER", "TABLE1_KINDS", "TABLE1_METHODS", "TABLE5_KINDS", "build_tasks", "ablations", "run_table",
           "averages", "side_by_side", "efficiency_rows", "answer_tokens", "example_id", "example_records"]

#: Table 1's tasks here: RULER's four needle groups and variable tracking, BABILong qa1/qa2.
TABLE1_KINDS = (*RULER_KINDS, "babilong-qa1", "babilong-qa2")
TABLE1_METHODS = ("truncation", "streamingllm", "tova", "h2o", "infinipot", "reform")
TABLE5_KINDS = ("single", "multikey", "multivalue", "multiquery")

#: The paper's numbers (Song et al. 2025) quoted beside ours.
PAPER: dict[str, Any] = {
    # Table 1, Mistral-NeMo-Instruct-2407 (128k window), the shortest input (64k) of each benchmark, average of tasks
    "table1": {"model": "Mistral-NeMo-Instruct-2407, 64k inputs (0.5x its window)",
               "ruler": {"truncation": 32.6, "streamingllm": 27.6, "tova": 21.6, "h2o": 15.1, "infinipot": 26.9,
                         "infllm": 52.7, "reform": 79.9},
               "babilong": {"truncation": 32.2, "streamingllm": 38.8, "tova": 37.8, "h2o": 38.0, "infinipot": 39.6,
                            "infllm": 40.6, "reform": 57.4},
               "ruler_1m": {"truncation": 10.8, "streamingllm": 4.7, "tova": 4.6, "h2o": 3.6, "infinipot": 12.0,
                            "infllm": 23.3, "reform": 75.5}},
    # Table 4, RepoEval api-level, Qwen2.5-Coder-1.5B, edit similarity
    "table4": {"truncation": 54.8, "streamingllm": 55.0, "tova": 54.7, "h2o": 55.1, "infinipot": 59.4,
               "infllm": 61.8, "reform": 65.3},
    # Table 5, RULER needles at 300k, Mistral-NeMo
    "table5": {"rag_bm25": {"single": 86.7, "multikey": 77.3, "multivalue": 88.5, "multiquery": 90.0},
               "rag": {"single": 87.3, "multikey": 57.3, "multivalue": 82.5, "multiquery": 78.0},
               "reform": {"single": 99.3, "multikey": 93.3, "multivalue": 98.5, "multiquery": 100.0}},
    # Table 6a, RULER 300k / BABILong 512k
    "table6a": {"reform": (84.6, 47.6), "w/ StreamingLLM": (82.7, 44.6), "w/ TOVA": (81.4, 46.8),
                "random heads": (80.3, 43.0), "worst heads": (44.7, 22.8), "kernel 5": (18.4, 36.8)},
    # Table 6b, 256k input, 10 tokens, one H100: seconds, GB
    "table6b": {"streamingllm": (36.58, 37.34), "h2o": (41.33, 37.85), "tova": (39.46, 37.06),
                "infinipot": (40.90, 37.06), "infllm": (129.14, 51.62), "reform": (27.24, 35.00)},
}


def answer_tokens(kind: str) -> int:
    """Tokens generated per answer (no stop at a newline): RULER's ``tokens_to_generate`` (128 for the needles,
    30 for variable tracking), 20 for BABILong (its harness's ``max_new_tokens``), 32 for code (one line is
    scored; reading: RepoEval's generation length is not in the REFORM paper)."""
    kind = kind.removeprefix("ruler-")
    if kind == "vt":
        return RULER_TOKENS["vt"]
    if kind.startswith("babilong"):
        return 20
    if kind == "repo":
        return 32
    return RULER_TOKENS["niah"]


def example_id(task: LongTask, length: int | str) -> str:
    """A stable id of one example: ``kind/length/seed`` (the same id for every method, so runs pair up)."""
    return f"{task.kind}/{length}/{task.info.get('seed', 0)}"


def example_records(results: Iterable[dict[str, Any]], config: dict[str, Any] | None = None, *,
                    prefix: str = "") -> list[dict[str, Any]]:
    """Per-example records (:mod:`kvlab.experiments.records`) of :func:`run_table`'s ``results``: per result one
    ``score`` record (the task's metric: string_match_all, BABILong's rule, RepoEval ES) and one ``answer_nll``
    record, with the raw output (untruncated) and the target; ``config`` holds ``device`` (else it is not recorded).
    ``prefix`` goes before each method's name (``ablation:``)."""
    from kvlab.experiments import records

    config = dict(config or {})
    config.setdefault("device", records.NOT_RECORDED)
    out = []
    for r in results:
        extra = {"output": r["text"], "target": r["answer"], "task": r["task"], "context_tokens": r["context_tokens"],
                 "seconds": round(r["seconds"], 3)}
        for metric, value in (("score", r["score"]), ("answer_nll", r["answer_nll"])):
            out.append(records.record(r["example"], prefix + r["method"], metric, float(value), config=config,
                                      **extra))
    return out


def build_tasks(tokenizer, n_tokens: int, kinds: Iterable[str] = TABLE1_KINDS, samples: int = 1,
                seed: int = 0) -> dict[str, list[LongTask]]:
    """``samples`` examples of every kind (RULER kinds, ``babilong-qa1``/``-qa2``, ``repo``) of ~``n_tokens``."""
    out: dict[str, list[LongTask]] = {}
    for kind in kinds:
        if kind.startswith("babilong-"):
            make = lambda s, k=kind: babilong_task(tokenizer, n_tokens, task=k.split("-")[1], seed=s)
        elif kind == "repo":
            make = lambda s: repo_task(tokenizer, n_tokens, seed=s)
        else:
            make = lambda s, k=kind: ruler_task(tokenizer, n_tokens, k, seed=s)
        out[kind] = [make(seed + i) for i in range(samples)]
    return out


def ablations(model, heads_data: dict | None = None, seed: int = 0) -> dict[str, tuple[str, dict[str, Any]]]:
    """Table 6a's rows as ``name -> (method, settings overrides)``.

    ``no gather``: the tokens compression kept are recomputed instead of the gathered ones; ``no recompute``:
    answer from the compressed cache (REFORM's compression through every layer: ``compress_only``); ``no early
    exit``: chunked forwarding through every layer. That row is a consistency check, not a finding: the
    layers at and below the exit do not read the layers above it, so the embeddings and the gathered tokens
    are identical by construction (the paper's early exit saves time and cache, Table 6b); ``random
    heads`` / ``worst heads`` (the paper's other embeddings: four random Q/K/V heads below 70% depth, the four
    with the worst MNR); ``kernel 5``: max-pooling over 5 tokens instead of 129."""
    from kvlab.reform.heads import worst_heads
    from kvlab.reform.reference import Head, decoder_of

    cfg = decoder_of(model).config
    rng = random.Random(seed)
    top = int(0.7 * cfg.num_hidden_layers)
    pool = [Head(k, layer, h) for k in "qkv" for layer in range(top)
            for h in range(cfg.num_attention_heads if k == "q" else cfg.num_key_value_heads)]
    rows: dict[str, tuple[str, dict[str, Any]]] = {
        "reform": ("reform", {}), "no gather": ("reform_no_gather", {}), "no recompute": ("compress_only", {}),
        "no early exit": ("reform", {"early_exit_layer": int(cfg.num_hidden_layers)}),
        "random heads": ("reform", {"heads": sorted(rng.sample(pool, 4))})}
    if heads_data is not None and "mnr" in heads_data:  # a heads file written by kvlab.reform.heads
        rows["worst heads"] = ("reform", {"heads": worst_heads(heads_data)})
    rows["kernel 5"] = ("reform", {"pool": 5})
    return rows


def run_table(model, tokenizer, tasks: dict[str, list[LongTask]], rows: dict[str, tuple[str, dict[str, Any]]],
              *, progress: bool = False, length: int | str = "", **settings) -> dict[str, Any]:
    """Every row (``name -> (method, overrides)``) on every task: ``{"summary": {kind: {row: {...}}},
    "results": [...]}``; ``settings`` go to :func:`kvlab.experiments.reform.compare.run_method`. ``max_new_tokens`` left
    out (or None): :func:`answer_tokens` of each task. Each result carries :func:`example_id` (``length``
    names the input length in it)."""
    from kvlab.reform.api import load_heads

    settings = dict(settings)
    settings["heads"] = load_heads(settings.get("heads"), model)
    pairs = [(kind, t, name) for kind, ts in tasks.items() for t in ts for name in rows]
    if progress:
        from tqdm.auto import tqdm

        pairs = tqdm(pairs, desc="rows x tasks")
    results, by_kind = [], {}
    for kind, task, name in pairs:
        method, overrides = rows[name]
        given = {**settings, **overrides}
        if given.get("max_new_tokens") is None:
            given["max_new_tokens"] = answer_tokens(task.kind)
        r = run_method(method, model, tokenizer, task, **given)
        r.method, r.task, r.example = name, kind, example_id(task, length)
        results.append(r)
        by_kind.setdefault(kind, []).append(r)
    return {"summary": {kind: summarise(rs) for kind, rs in by_kind.items()}, "results": as_dicts(results)}


def averages(summary: dict[str, dict[str, dict[str, float]]], kinds: Iterable[str],
             key: str = "accuracy") -> dict[str, float]:
    """Per row: the mean of ``key`` over ``kinds`` (those present)."""
    kinds = [k for k in kinds if k in summary]
    rows = {r for k in kinds for r in summary[k]}
    return {r: round(sum(summary[k][r][key] for k in kinds if r in summary[k]) / len(kinds), 2) for r in sorted(rows)}


def side_by_side(title: str, paper: dict[str, Any], ours: dict[str, Any], columns: tuple[str, str] = ("paper",
                                                                                                    "this run")) -> str:
    """A text table ``row | paper | this run`` (missing values as ``-``)."""
    rows = list(dict.fromkeys([*paper, *ours]))
    width = max(len(r) for r in rows) + 2
    lines = [title, f"{'':{width}s}{columns[0]:>18s}  {columns[1]:>18s}"]
    for r in rows:
        a = paper.get(r, "-")
        b = ours.get(r, "-")
        lines.append(f"{r:{width}s}{str(a):>18s}  {str(b):>18s}")
    return "\n".join(lines)


def efficiency_rows(path: str | Path | None = None, run: str = "efficiency") -> dict[str, tuple[float, float]]:
    """Table 6b from ``kvlab/reform/data/fullsize_smollm2.json`` (one H100, SmolLM2-135M): ``method@tokens ->
    (seconds, peak GiB)``. ``run``: ``"efficiency"`` (the current code, timed with a device synchronisation at
    every step) or ``"efficiency_first_run"`` (no per-step synchronisation; before the similarity ran in blocks).
    ``compress_only`` is REFORM's compression through every layer (the recurrent row; not InfiniPot's scores)."""
    path = Path(__file__).resolve().parents[2] / "reform" / "data" / "fullsize_smollm2.json" if path is None else Path(path)
    data = json.loads(path.read_text())
    return {f"{r['method']}@{r['tokens']}": (r["seconds"], r["peak_gib"]) for r in data[run]["rows"]}


# --------------------------------------------------------------------------- command line


def _cmd_tasks(args) -> int:
    from kvlab.models import load_tokenizer

    tok = load_tokenizer(args.model)
    data = {str(n): {k: [t.to_dict() for t in ts] for k, ts in
                     build_tasks(tok, n, args.kinds, args.samples, args.seed).items()} for n in args.lengths}
    with gzip.open(args.out, "wt") as f:
        json.dump(data, f)
    print(f"-> {args.out}")
    return 0


def _cmd_run(args) -> int:
    import torch

    from kvlab.models import load_model
    from kvlab.reform.api import heads_file

    if args.threads:
        torch.set_num_threads(args.threads)
    model, tok = load_model(args.model, device=args.device, dtype=args.dtype)
    if args.round_bf16:  # kvlab's local copies are stored in bf16: the same weights as a CPU run
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(p.to(torch.bfloat16).to(p.dtype))
    data = json.loads(gzip.open(args.tasks, "rt").read())
    heads = args.heads or heads_file(model)
    heads_data = json.loads(Path(heads).read_text()) if heads else None
    settings = dict(budget=args.budget, chunk_size=args.chunk_size, n_initial=args.n_initial, n_recent=args.n_recent,
                    n_final=args.n_final, max_new_tokens=args.max_new_tokens, heads=heads and str(heads))
    device = torch.cuda.get_device_name() if next(model.parameters()).is_cuda else "cpu"
    report: dict[str, Any] = {"command": "python -m kvlab.experiments.reform.tables " + " ".join(args.argv),
                              "device": device, "settings": settings, "sets": {}}
    begin = time.perf_counter()
    ablate = ablations(model, heads_data)
    parts = []
    for n, by_kind in data.items():
        for kind in (k for k in args.kinds if k in by_kind):
            parts.append((n, kind, {m: (m, {}) for m in args.methods}, {}))
        if args.ablations:
            small = {"budget": args.ablation_budget} if args.ablation_budget else {}
            parts += [(n + "-ablations", k, ablate, small) for k in args.ablation_kinds if k in by_kind]
    for name, kind, rows, overrides in parts:  # one kind at a time, the report written after each
        tasks = {kind: [LongTask.from_dict(t) for t in data[name.split("-")[0]][kind][:args.samples]]}
        part = run_table(model, tok, tasks, rows, length=name.split("-")[0], **{**settings, **overrides})
        into = report["sets"].setdefault(name, {"summary": {}, "results": [], "settings": overrides})
        into["summary"].update(part["summary"])
        into["results"] += part["results"]
        print(f"{name} {kind} ({time.perf_counter() - begin:.0f} s): " + "  ".join(
            f"{m} {row['accuracy']:.1f}/{row['answer_nll']:.2f}" for m, row in part["summary"][kind].items()),
              flush=True)
        Path(args.out).write_text(json.dumps(report, indent=1))
    print(f"-> {args.out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="python -m kvlab.experiments.reform.tables", description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=["tasks", "run"])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default=None)
    p.add_argument("--round-bf16", action="store_true")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", required=True)
    p.add_argument("--tasks", help="run: the file `tasks` wrote")
    p.add_argument("--heads", default=None, help="heads JSON (default: the shipped file for the model)")
    p.add_argument("--lengths", type=int, nargs="+", default=[16384, 32768])
    p.add_argument("--kinds", nargs="+", default=list(TABLE1_KINDS))
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--methods", nargs="+", default=[*TABLE1_METHODS, "rag", "rag_bm25"], choices=METHODS)
    p.add_argument("--ablations", action="store_true", help="also Table 6a's rows on --ablation-kinds")
    p.add_argument("--ablation-kinds", nargs="+", default=["multikey", "multiquery", "babilong-qa1"])
    p.add_argument("--ablation-budget", type=int, default=None, help="a smaller recompute budget where rows separate")
    p.add_argument("--budget", type=int, default=2048)
    p.add_argument("--chunk-size", type=int, default=2048)
    p.add_argument("--n-initial", type=int, default=256)
    p.add_argument("--n-recent", type=int, default=256)
    p.add_argument("--n-final", type=int, default=256)
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help="tokens per answer (default: RULER's per task, answer_tokens)")
    args = p.parse_args(argv)
    args.argv = argv
    return {"tasks": _cmd_tasks, "run": _cmd_run}[args.what](args)


if __name__ == "__main__":
    raise SystemExit(main())
