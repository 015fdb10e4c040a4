"""REFORM's Figs. 2-4 and Tables 2/3/7 on SmolLM2-135M at CPU sizes, with one record per example.

    python -m kvlab run reform-heads-needle-qa mnr    --out benchmarks/results/reform/mnr_per_example [--samples 20]
    python -m kvlab run reform-heads-needle-qa needle --out benchmarks/results/reform/needle_depth
    python -m kvlab run reform-heads-needle-qa qa     --out benchmarks/results/reform/longdoc_qa [--samples 30]

``mnr`` (Figs. 2 and 4, Tables 2 and 7): Mean Normalized Rank (App. C.2, :func:`kvlab.reform.heads.task_mnr`) of
every Q/K/V head, attention head and hidden-state layer on fresh synthetic multi-hop QA and key-value ("pattern
matching") examples. The candidates compared are fixed *before* these examples are seen, from the committed
head-selection grids (``kvlab/reform/heads/smollm2-135m.json``, 64 other examples per task,
:func:`candidates`): the best Q/K/V head, the best V head, the best attention head, the best hidden-state layer
and the median V head. Each is recorded per example as ``retrieval_auc = 1 - MNR / 100`` (the share of the
context ranked below the evidence; higher is better), so a held-out paired comparison answers "does the QKV head
beat the hidden states" without selection bias. The mean MNR grid of the value heads (the figures' content) goes
to ``grids.json``.

``needle`` (Fig. 3, App. D.1): Kamradt's San Francisco needle (:func:`kvlab.datasets.niah_prompt`, Paul Graham
haystack) at depths 0, 0.25, 0.5, 0.75, 1 of 1,024- and 2,048-token inputs, two haystack offsets; REFORM and
truncation at the same budget. Scored by the paper's rule: correct when the answer holds all three key phrases
("eat a sandwich", "sit in Dolores Park", "a sunny day"); ``score`` is the share of them (RULER's
string_match_all).

``qa`` (Table 3, an ∞-Bench En.QA stand-in): kvlab's long-document QA set (:func:`kvlab.experiments.dhsa.measures.qa_items`,
``single-doc``: a SQuAD question inside a window of its Wikipedia article's paragraphs) at 2,048 tokens; REFORM vs
truncation; token F1 of the answer's first line (:func:`kvlab.experiments.dhsa.measures.qa_f1`, SQuAD/LongBench's rule).

Settings of ``needle`` / ``qa`` (the paper's beside ours): eviction budget = chunk = REFORM's recompute budget
512 (paper 32k / 8k), initial / recent / final 64 tokens (paper 256: 256 + 256 would be all of a 512 budget),
REFORM's four committed heads, greedy answers of 24 / 16 tokens. Every command writes ``OUT/<what>.examples.jsonl.gz``
(:mod:`kvlab.experiments.records`), keeping and skipping the (example, method) pairs already there, so a cut run goes
on.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from kvlab.experiments import records, registry

NAME = "reform-heads-needle-qa"
HEADS_FILE = Path(__file__).resolve().parents[2] / "reform" / "heads" / "smollm2-135m.json"  # the committed grids

NIAH_PHRASES = ("eat a sandwich", "sit in Dolores Park", "a sunny day")  # App. D.1's rule
NEEDLE_LENGTHS = (1024, 2048)
NEEDLE_DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)
SETTINGS = dict(budget=512, chunk_size=512, n_initial=64, n_recent=64, n_final=64)
MNR_SETTINGS = dict(chunk_size=1024, budget=256, n_initial=16, n_recent=64)  # as the committed heads file
MNR_TASKS = {"multihop_qa": "multihop", "pattern_matching": "kv"}
# --smoke: one example; these tiny inputs unless --tokens is given (a ledger row's example ids hold the length, so its
# smoke rerun keeps it)
SMOKE = {"mnr": dict(tokens=256, chunk_size=128, tasks=["pattern_matching"]),
         "needle": dict(offsets=1, lengths=[256], depths=[0.5]), "qa": dict(tokens=384)}
DEFAULT_TOKENS = 2048
QA_TAIL = "\n\nAnswer the question with a short phrase from the text."


# ------------------------------------------------------------------------------------------------- tasks
def needle_task(tokenizer, length: int, depth: float, offset: int, haystack: str):
    """A :class:`kvlab.eval.tasks.LongTask` of :func:`kvlab.datasets.niah_prompt` (the haystack rotated by
    ``offset`` paragraphs, so two offsets give two haystacks): context = instruction + document, query = the
    question, answer prefix = ``"Answer: The best thing to do in San Francisco is"``."""
    from kvlab.datasets import niah_prompt
    from kvlab.eval.tasks import LongTask

    paras = haystack.split("\n\n")
    cut = (offset * len(paras)) // 2
    text = "\n\n".join(paras[cut:] + paras[:cut])
    p = niah_prompt(tokenizer, text, length, depth)
    at = p.prompt.rindex("\n\nQuestion:")
    context, tail = p.prompt[:at], p.prompt[at:]
    split = tail.index("\nAnswer:")
    needle = p.info["needle"]
    start = p.info["needle_char"]
    if context[start:start + len(needle)] != needle:
        raise RuntimeError("kvlab.datasets.niah_prompt changed its layout (needle_char)")
    return LongTask("niah", context, tail[:split], tail[split:], p.answer, [(start, start + len(needle))],
                    {"answers": list(NIAH_PHRASES), "seed": f"{depth:g}-{offset}", "depth": depth,
                     "offset": offset, "tokens": p.n_tokens})


def qa_task(item, index: int):
    """A :class:`kvlab.eval.tasks.LongTask` of one :class:`kvlab.experiments.dhsa.measures.QAItem`: the document is the
    context, the instruction and question the query, ``"\\nAnswer:"`` the answer prefix; the evidence is every
    occurrence of a gold answer in the document. ``info`` holds no ``answers`` list (the score is the F1 of
    :func:`kvlab.experiments.dhsa.measures.qa_f1`, recorded beside the harness's own score)."""
    from kvlab.eval.tasks import LongTask

    at = item.prompt.rindex(QA_TAIL)
    context, tail = item.prompt[:at], item.prompt[at:]
    split = tail.rindex("\nAnswer:")
    gold = []
    for a in item.answers:
        start = context.find(a)
        while start >= 0:
            gold.append((start, start + len(a)))
            start = context.find(a, start + 1)
    return LongTask(f"qa-{item.task}", context, tail[:split], tail[split:], " " + item.answers[0], sorted(set(gold)),
                    {"gold_answers": list(item.answers), "seed": index, "tokens": item.tokens})


# --------------------------------------------------------------------------------------------- candidates
def candidates(grids: dict) -> dict[str, tuple[str, int, int]]:
    """The compared candidates of one task's committed MNR grids (``{kind: (layers, heads) list}``, percent):
    ``{name: (kind, layer, head)}`` for the best Q/K/V head, best V head, best attention head, best hidden-state
    layer (head 0) and the median V head (the lower middle of the sorted V heads). Ties go to the earlier
    (kind, layer, head)."""
    def cells(kinds):
        return sorted((v, kind, layer, head) for kind in kinds for layer, row in enumerate(grids[kind])
                      for head, v in enumerate(row))

    pick = {"best-qkv": cells(("q", "k", "v"))[0], "best-v": cells(("v",))[0],
            "best-attention": cells(("attention",))[0], "best-hidden": cells(("hidden",))[0]}
    v = cells(("v",))
    pick["median-v"] = v[(len(v) - 1) // 2]
    return {name: (kind, layer, head) for name, (_, kind, layer, head) in pick.items()}


# ------------------------------------------------------------------------------------------------ running
def _load(device: str = "cpu"):
    import torch

    import kvlab

    torch.set_num_threads(1)
    return kvlab.load_model("smollm2-135m", device=device, dtype="float32")


def _device(args) -> str:
    return "cpu" if args.device in ("auto", "cpu") else args.device


def _mean_grids(totals: dict, counts: dict) -> dict:
    return {t: {"examples": counts[t], "mean": {k: [[round(float(x), 3) for x in row] for row in (v / max(counts[t], 1))]
                                                for k, v in g.items()}} for t, g in totals.items()}


def run_mnr(args, out) -> list[Path]:
    import torch

    from kvlab.eval.tasks import kv_task, multihop_task
    from kvlab.reform.heads import task_mnr

    committed = json.loads(HEADS_FILE.read_text())
    picks = {t: candidates(committed["mnr"][t]["grids"]) for t in MNR_TASKS}
    settings = {**MNR_SETTINGS, "chunk_size": args.chunk_size or MNR_SETTINGS["chunk_size"]}
    model, tok = _load(_device(args))
    grids_path = out.root / "grids.json"
    saved = json.loads(grids_path.read_text()) if grids_path.is_file() else {}
    totals = {t: {k: torch.tensor(v) * g["examples"] for k, v in g["mean"].items()} for t, g in saved.items()}
    counts = {t: int(saved[t]["examples"]) if t in saved else 0 for t in MNR_TASKS}
    make = {"multihop_qa": lambda s: multihop_task(tok, args.tokens, seed=s),
            "pattern_matching": lambda s: kv_task(tok, args.tokens, seed=s)}
    with records.RecordWriter("mnr" + records.SUFFIX, keep=True, out=out) as writer:
        done = {(e, m) for e, m, _ in writer.done()}
        for t in args.tasks:
            for seed in range(args.seed, args.seed + args.samples):
                example = f"{MNR_TASKS[t]}/{args.tokens}/{seed}"  # the length in the id: pairs never mix lengths
                if all((example, name) in done for name in picks[t]):
                    continue
                begin = time.perf_counter()
                grid = task_mnr(model, tok, make[t](seed), **settings)
                for name, (kind, layer, head) in picks[t].items():
                    mnr = float(grid[kind][layer, head])
                    writer.add(records.record(example, name, "retrieval_auc", round(1 - mnr / 100, 6),
                                              config={"tokens": args.tokens, **settings, "neighbours": 20},
                                              device=_device(args), task=t, mnr=round(mnr, 4),
                                              head=f"{kind}:{layer}:{head}",
                                              seconds=round(time.perf_counter() - begin, 1)))
                for kind in ("v", "hidden", "q", "k", "attention"):
                    totals.setdefault(t, {})[kind] = totals.get(t, {}).get(kind, 0) + grid[kind]
                counts[t] += 1
                out.claim("grids.json").write_text(json.dumps(_mean_grids(totals, counts)))
                print(f"{example}: {time.perf_counter() - begin:.1f} s; " + ", ".join(
                    f"{n} {float(grid[k][l, h]):.2f}" for n, (k, l, h) in picks[t].items()), flush=True)
    return [writer.path, grids_path]


def _run_rows(args, out, tasks, methods, max_new_tokens, extra) -> list[Path]:
    """Every method on every task through :func:`kvlab.experiments.reform.tables.run_table` (the harness of the
    other REFORM tables), records in ``OUT/<what>.examples.jsonl.gz`` with the extra metric of ``extra``."""
    from kvlab.experiments.reform.tables import example_records, run_table
    from kvlab.reform.api import heads_file, load_heads

    model, tok = _load(_device(args))
    heads = load_heads(str(heads_file(model)), model)
    settings = {**SETTINGS, "heads": heads, "max_new_tokens": max_new_tokens}
    with records.RecordWriter(args.what + records.SUFFIX, keep=True, out=out) as writer:
        done = {(e, m) for e, m, _ in writer.done()}
        for task, length in tasks(tok):
            for method in methods:
                example = f"{task.kind}/{length}/{task.info['seed']}"
                if (example, method) in done:
                    continue
                part = run_table(model, tok, {task.kind: [task]}, {method: (method, {})}, length=length, **settings)
                config = {"length": length, "device": _device(args),
                          **{k: v for k, v in settings.items() if k != "heads"}, "heads": [str(h) for h in heads],
                          **{k: task.info[k] for k in ("depth", "offset", "tokens") if k in task.info}}
                recs = example_records(part["results"], config)
                recs.append({**recs[0], **extra(recs[0]["output"], task)})
                for r in recs:
                    writer.add(r)
                print(f"{example} {method}: {recs[0]['seconds']:.1f} s {recs[-1]['metric']} {recs[-1]['value']:.2f} "
                      f"{recs[0]['output'][:60]!r}", flush=True)
    return [writer.path]


def run_needle(args, out) -> list[Path]:
    from kvlab.datasets import load_text
    from kvlab.eval.retrieval import string_match_all

    def tasks(tok):
        haystack = load_text("paul-graham")
        for offset in range(args.offsets):
            for length in args.lengths:
                for depth in args.depths:
                    yield needle_task(tok, length, depth, offset, haystack), length

    return _run_rows(args, out, tasks, ("reform", "truncation"), 24,
                     lambda said, task: {"metric": "correct",
                                         "value": float(string_match_all(said, list(NIAH_PHRASES)) == 1.0)})


def run_qa(args, out) -> list[Path]:
    from kvlab.eval.qa import qa_f1, qa_items

    def tasks(tok):
        for i, item in enumerate(qa_items(tok, "single-doc", args.samples, args.tokens, seed=args.seed)):
            yield qa_task(item, i), args.tokens

    return _run_rows(args, out, tasks, ("reform", "truncation"), 16,
                     lambda said, task: {"metric": "f1", "value": qa_f1(said, task.info["gold_answers"])})


def check(args) -> None:
    if args.smoke:
        args.samples = 1
        if args.tokens is None:
            for key, value in SMOKE[args.what].items():
                setattr(args, key, value)
    args.tokens = args.tokens or DEFAULT_TOKENS
    args.tasks = args.tasks or list(MNR_TASKS)


def parser() -> argparse.ArgumentParser:
    p = registry.experiment_parser(NAME, __doc__.split("\n\n")[0])
    pos = registry.positive_int
    p.add_argument("what", choices=["mnr", "needle", "qa"])
    p.add_argument("--samples", type=pos, default=20, help="mnr: examples per task; qa: questions")
    p.add_argument("--tokens", type=pos, default=None, help=f"mnr / qa: input tokens (default {DEFAULT_TOKENS:,})")
    p.add_argument("--seed", type=int, default=1000, help="mnr: first seed (the committed grids used 0-63); qa: rng")
    p.add_argument("--tasks", type=registry.names_list(MNR_TASKS, what="task"), default=None,
                   help="mnr: of " + ", ".join(MNR_TASKS) + " (default both)")
    p.add_argument("--chunk-size", type=pos, default=None,
                   help="mnr: tokens per chunk of the recurrent forwarding (default 1,024, as the committed grids)")
    p.add_argument("--offsets", type=pos, default=2, help="needle: haystack rotations")
    p.set_defaults(lengths=list(NEEDLE_LENGTHS), depths=list(NEEDLE_DEPTHS))
    return p


def run(args) -> list[Path]:
    from kvlab.outputs import OutputFolder

    if args.tokens is None or args.tasks is None:
        check(args)

    out = OutputFolder(args.out, f"python -m kvlab run {NAME} {args.what}")
    return {"mnr": run_mnr, "needle": run_needle, "qa": run_qa}[args.what](args, out)
