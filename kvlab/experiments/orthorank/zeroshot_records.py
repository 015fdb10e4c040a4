"""OrthoRank Table 2 (zero-shot accuracy of OrthoRank against SLEB at equal sparsity) with one record per question,
so that the ledger can pair the plans question by question.

The paper averages lm-eval's zero-shot accuracy over six tasks (Llama3-8B at 20 %: OrthoRank 60.84 vs SLEB 58.10).
Here the plans of ``--layers`` (notebook 11's results JSON: ``sleb_order`` and ``orthorank_order``, the same as
``python -m kvlab.experiments.orthorank zeroshot --layers``) run on the first ``--questions`` questions of each of
``--tasks`` (:mod:`kvlab.eval.zeroshot`: one forward pass per choice), and each question's 0/1 accuracy (``acc``,
lm-eval's rule) is written as::

    {"example": "<task>/<i>", "method": "SLEB 20%" | "OrthoRank 20%", "metric": "acc", "value": 0 | 1}

    OMP_NUM_THREADS=1 python benchmarks/orthorank_zeroshot_records.py --device cpu \\
        --layers benchmarks/results/orthorank/notebook11_default_smollm2_cpu.json \\
        --tasks piqa,arc-easy --questions 30 --out benchmarks/results/orthorank/table2_per_question_cpu

``--table4 FILE`` runs Table 4 instead (the layer and token ratios at 20 % sparsity: 0.2 / 0, 0.3 / 0.33,
0.4 / 0.5): the plans are the ones the per-document perplexity run chose (FILE, the JSON of ``python -m
kvlab.experiments.orthorank table4docs``, its ``table``), so the accuracy and the perplexity rows score the same
layers; methods are named as there (``"T4 layers 0.30 / tokens 0.33"``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from sepllm_position_shift import write_examples  # noqa: E402 (atomic JSON-lines writer)


def plans(num_layers: int, known: dict, sparsity: float, token_ratio: float) -> dict:
    """SLEB and OrthoRank at ``sparsity`` from the searched orders, as the zeroshot command builds them."""
    from kvlab.orthorank.layers import Plan, layers_for_sparsity

    sleb = Plan(removed=tuple(sorted(known["sleb_order"][:layers_for_sparsity(num_layers, sparsity)])))
    n = layers_for_sparsity(num_layers, sparsity, token_ratio)
    ortho = Plan(routed=tuple(sorted(known["orthorank_order"][:n])), router={"token_ratio": token_ratio})
    return {f"SLEB {sparsity:.0%}": sleb, f"OrthoRank {sparsity:.0%}": ortho}


def table4_from_file(path: str) -> dict:
    """Table 4's plans as the perplexity run chose them (its JSON's ``table``), by the same method names."""
    from kvlab.orthorank.layers import Plan

    table = json.load(open(path))["table"]
    return {row["method"]: Plan(removed=tuple(row["removed"]), routed=tuple(row["routed"]),
                                router=dict(row["router"])) for row in table}


def main(argv=None) -> int:
    import kvlab
    from kvlab.eval import zeroshot
    from kvlab.orthorank.layers import use_plan

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--layers", help="notebook 11's results JSON (sleb_order, orthorank_order); Table 2's plans")
    ap.add_argument("--sparsities", default="0.2", help="comma list: SLEB and OrthoRank at each")
    ap.add_argument("--token-ratio", type=float, default=0.33)
    ap.add_argument("--tasks", default="piqa,arc-easy")
    ap.add_argument("--questions", type=int, default=30, help="questions per task")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda when there is one)")
    ap.add_argument("--table4", default=None, help="Table 4's plans: the JSON of `orthorank table4docs` (its table)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    if not (args.layers or args.table4):
        ap.error("give --layers (Table 2: SLEB and OrthoRank from notebook 11's orders) or --table4 (Table 4's plans)")
    torch.set_num_threads(args.threads)
    model, tok = kvlab.load_model(args.model, device=args.device)
    num_layers = model.config.get_text_config().num_hidden_layers
    chosen = {}
    if args.table4:
        chosen = table4_from_file(args.table4)
    else:
        known = json.load(open(args.layers))
        for sparsity in args.sparsities.split(","):
            chosen.update(plans(num_layers, known, float(sparsity), args.token_ratio))
    recs, begin = [], time.perf_counter()
    for task in args.tasks.split(","):
        questions = zeroshot.load_task(task, args.questions)
        for name, plan in chosen.items():
            with use_plan(model, plan):
                r = zeroshot.evaluate_task(model, tok, questions)
            for i, (q, lls) in enumerate(zip(questions, r.lls)):
                acc, _ = zeroshot.choice_metrics(lls, q.gold, q.lengths)
                recs.append({"example": f"{task}/{i:03d}", "method": name, "metric": "acc", "value": acc,
                             "plan": {"removed": list(plan.removed), "routed": list(plan.routed)}})
            print(f"{task} {name}: acc {r.acc:.3f} ({time.perf_counter() - begin:.0f} s)", flush=True)
    write_examples(Path(args.out) / "zeroshot.examples.jsonl", recs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
