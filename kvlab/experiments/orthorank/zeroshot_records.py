"""OrthoRank Table 2 (zero-shot accuracy of OrthoRank against SLEB at equal sparsity) with one record per question,
so that the ledger can pair the plans question by question.

The paper averages lm-eval's zero-shot accuracy over six tasks (Llama3-8B at 20 %: OrthoRank 60.84 vs SLEB 58.10).
Here the plans of ``--layers`` (notebook 11's results JSON: ``sleb_order`` and ``orthorank_order``, the same as
``python -m kvlab run orthorank-zeroshot --layers``) run on the first ``--questions`` questions of each of
``--tasks`` (:mod:`kvlab.eval.zeroshot`: one forward pass per choice), and each question's 0/1 accuracy (``acc``,
lm-eval's rule) is written as::

    {"example": "<task>/<i>", "method": "SLEB 20%" | "OrthoRank 20%", "metric": "acc", "value": 0 | 1, ...}

    python -m kvlab run orthorank-zeroshot-records --device cpu --threads 1 \\
        --layers benchmarks/results/orthorank/notebook11_default_smollm2_cpu.json \\
        --tasks piqa,arc-easy --questions 30 --out benchmarks/results/orthorank/table2_per_question_cpu

``--table4 FILE`` runs Table 4 instead (the layer and token ratios at 20 % sparsity: 0.2 / 0, 0.3 / 0.33,
0.4 / 0.5): the plans are the ones the per-document perplexity run chose (FILE, the JSON of ``python -m
kvlab run orthorank-table4docs``, its ``table``), so the accuracy and the perplexity rows score the same
layers; methods are named as there (``"T4 layers 0.30 / tokens 0.33"``). Records:
``OUT/zeroshot.examples.jsonl.gz``; a second run into the same ``--out`` is refused.
"""

from __future__ import annotations

import time
from pathlib import Path

from kvlab.experiments import records, registry
from kvlab.experiments.registry import ParameterError
from kvlab.experiments.system import options
from kvlab.outputs import OutputFolder

__all__ = ["parser", "check", "run", "plans", "table4_from_file"]

NAME = "orthorank-zeroshot-records"
RECORDS = "zeroshot" + records.SUFFIX


def parser():
    from kvlab.eval import zeroshot

    p = registry.experiment_parser(NAME, __doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--layers", default=None, help="notebook 11's results JSON (sleb_order, orthorank_order); "
                   "Table 2's plans")
    p.add_argument("--sparsities", type=options.number_list(float, low=0.01, high=0.99, what="sparsity"),
                   default=[0.2], help="comma list: SLEB and OrthoRank at each")
    p.add_argument("--token-ratio", type=options.number_list(float, low=0.01, high=0.99, what="token ratio"),
                   default=[0.33])
    p.add_argument("--tasks", type=registry.names_list(zeroshot.TASKS, what="task"), default=["piqa", "arc-easy"])
    p.add_argument("--questions", type=registry.positive_int, default=30, help="questions per task")
    p.add_argument("--threads", type=registry.positive_int, default=1)
    p.add_argument("--table4", default=None, help="Table 4's plans: the JSON of orthorank-table4docs (its table)")
    return p


def check(args) -> None:
    options.check_model(args.model)
    options.check_device(args.device)
    if len(args.token_ratio) != 1:
        raise ParameterError("--token-ratio takes one ratio")
    if args.smoke and not (args.layers or args.table4):  # the committed plans of notebook 11
        args.layers = "benchmarks/results/orthorank/notebook11_default_smollm2_cpu.json"
    if bool(args.layers) == bool(args.table4):
        raise ParameterError("give one of --layers (Table 2: SLEB and OrthoRank from notebook 11's orders) or "
                             "--table4 (Table 4's plans)")
    for opt, f in (("--layers", args.layers), ("--table4", args.table4)):
        if f and not Path(f).is_file():
            raise ParameterError(f"{opt} {f}: no such file")
    options.refuse_rerun(args.out, RECORDS)
    if args.smoke:
        args.model, args.questions, args.tasks, args.threads = "smollm2-135m", 2, args.tasks[:1], 1


def plans(num_layers: int, known: dict, sparsity: float, token_ratio: float) -> dict:
    """SLEB and OrthoRank at ``sparsity`` from the searched orders, as the zeroshot command builds them."""
    from kvlab.orthorank.layers import Plan, layers_for_sparsity

    sleb = Plan(removed=tuple(sorted(known["sleb_order"][:layers_for_sparsity(num_layers, sparsity)])))
    n = layers_for_sparsity(num_layers, sparsity, token_ratio)
    ortho = Plan(routed=tuple(sorted(known["orthorank_order"][:n])), router={"token_ratio": token_ratio})
    return {f"SLEB {sparsity:.0%}": sleb, f"OrthoRank {sparsity:.0%}": ortho}


def table4_from_file(path: str, num_layers: int = 0, smoke: bool = False) -> dict:
    """Table 4's plans as the perplexity run chose them (its JSON's ``table``), by the same method names
    (``smoke``: folded onto the tiny model's ``num_layers``, :func:`layer_frame.read_layers`)."""
    from kvlab.experiments.orthorank.layer_frame import read_layers
    from kvlab.orthorank.layers import Plan

    table = read_layers(path, num_layers, smoke)["table"]
    return {row["method"]: Plan(removed=tuple(row["removed"]), routed=tuple(row["routed"]),
                                router=dict(row["router"])) for row in table}


def run(args) -> list[Path]:
    import torch

    from kvlab.eval import zeroshot
    from kvlab.experiments.orthorank.commands import load_model, read_layers
    from kvlab.orthorank.layers import use_plan

    out = OutputFolder(args.out, f"python -m kvlab run {NAME}")
    torch.set_num_threads(args.threads)
    model, tok = load_model(args)  # --smoke: a tiny random model of the same architecture
    device = options.device_string(next(model.parameters()).device)
    num_layers = model.config.get_text_config().num_hidden_layers
    chosen = {}
    if args.table4:
        chosen = table4_from_file(args.table4, num_layers, args.smoke)
    else:
        known = read_layers(args.layers, num_layers, args.smoke)
        for sparsity in args.sparsities:
            chosen.update(plans(num_layers, known, sparsity, args.token_ratio[0]))
    begin = time.perf_counter()
    with records.RecordWriter(RECORDS, out=out) as w:
        for task in args.tasks:
            questions = zeroshot.load_task(task, args.questions)
            for name, plan in chosen.items():
                with use_plan(model, plan):
                    r = zeroshot.evaluate_task(model, tok, questions)
                config = {"model": args.model, "task": task}
                for i, (q, lls) in enumerate(zip(questions, r.lls)):
                    acc, _ = zeroshot.choice_metrics(lls, q.gold, q.lengths)
                    w.add(records.record(f"{task}/{i:03d}", name, "acc", acc, config=config, device=device,
                                         plan={"removed": list(plan.removed), "routed": list(plan.routed)}))
                print(f"{task} {name}: acc {r.acc:.3f} ({time.perf_counter() - begin:.0f} s)", flush=True)
    return [w.path]
