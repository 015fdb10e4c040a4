"""Ledger rows for SepLLM's Table 1 and Table 15 on Qwen2.5-Coder (benchmarks/gpu/sepllm_headline.sh), written as
data (``OUT/claim_rows.json``) once that run's records are in the repository, for the ledger to take in; the ledger
then recomputes n, the interval and the verdict from the per-example records (``kvlab.experiments.claims.update``).

    python -m kvlab run headline-claim-rows --folder benchmarks/results/headline/sepllm_qwen2.5-coder-0.5b --out OUT

Rows (A - B of per-problem 0/1 outcomes, paired; higher is better): GSM8K flexible-extract and strict-match, SepLLM
against Vanilla, StreamingLLM (n=256), StreamingLLM at the r.KV SepLLM measured, and H2O at the same entries
(Table 15, on the problems H2O finished); MMLU against the same three; and two floor checks (Vanilla against chance
on MMLU, against 20 % on GSM8K): a method comparison on a model under the floor says nothing whatever its interval.
A row whose records are missing is not written.
"""

from __future__ import annotations

import json
import os
import sys

MODEL_TEXT = {"qwen2.5-coder-0.5b": "Qwen2.5-Coder-0.5B-Instruct, AWQ GGUF dequantized (bf16)",
              "qwen2.5-coder-1.5b": "Qwen2.5-Coder-1.5B-Instruct, GGUF dequantized (bf16)"}
PAPER_GSM8K = {"flexible": {"Vanilla": 77.79, "StrmLLM (n=380)": 70.89, "StrmLLM (n=256)": 69.67, "H2O": 76.27,
                            "SepLLM": 77.18},
               "strict": {"Vanilla": 77.26, "StrmLLM (n=380)": 71.42, "StrmLLM (n=256)": 68.61, "H2O": 75.06,
                          "SepLLM": 77.18}}
PAPER_MMLU = {"Vanilla": 65.72, "StrmLLM (n=380)": 63.39, "StrmLLM (n=256)": 62.10, "SepLLM": 64.68}


def _load(folder: str, part: str) -> tuple[dict, str]:
    path = os.path.join(folder, f"table1_{part}.json")
    if not os.path.exists(path):
        return {"methods": {}}, ""
    return json.load(open(path)), os.path.relpath(os.path.join(folder, f"table1_{part}.examples.jsonl.gz"))


def rows_for(folder: str) -> list[dict]:
    gsm, gsm_file = _load(folder, "gsm8k")
    mmlu, mmlu_file = _load(folder, "mmlu")
    methods = {**gsm["methods"], **mmlu["methods"]}
    summary = gsm if gsm_file else mmlu
    model = summary["model"]
    budget = gsm.get("matched_budget")
    sep = "SepLLM (n=256)"
    matched = f"StrmLLM (n={budget - 2}, r.KV matched)" if budget else None
    mmlu_matched = f"StrmLLM (n={mmlu['mmlu_matched_neighbors']}, r.KV matched)" if mmlu_file else None
    h2o = f"H2O (budget={budget})" if budget else None
    command = f"KVLAB_RESULTS=DIR bash benchmarks/gpu/sepllm_headline.sh ({summary['device']})"
    tag = model.replace("qwen2.5-coder-", "qwen")
    common = {"paper": "SepLLM", "kind": "statistical", "model": MODEL_TEXT.get(model, model),
              "where": os.path.relpath(folder), "command": command, "direction": "a>b"}
    out = []

    def add(id_, item, claim, metric, a, b, paper_value, paper_cell, differs, role="claim", note=""):
        key = ("mmlu/" if metric == "mmlu_correct" else "gsm8k/") + a
        if key not in methods or (not b.startswith("=") and (
                ("mmlu/" if metric == "mmlu_correct" else "gsm8k/") + b) not in methods):
            print(f"skipped {id_}: no records of {a!r} / {b!r}", file=sys.stderr)
            return
        out.append(dict(common, results_file=mmlu_file if metric == "mmlu_correct" else gsm_file, id=id_, item=item, claim=claim, metric=metric, method_a=a, method_b=b,
                        paper_value=paper_value, paper_cell=paper_cell, differs=differs, role=role, note=note))

    size = f"{model} instead of Llama-3-8B-Instruct"
    for metric, col in (("flexible_match", "flexible"), ("strict_match", "strict")):
        p = PAPER_GSM8K[col]
        add(f"sepllm-{tag}-gsm8k-{col}-vs-vanilla", f"Table 1 (GSM8K-CoT {col}, vs Vanilla, {model})",
            f"A = SepLLM (n=256) vs B = Vanilla, {col} accuracy", metric, sep, "Vanilla",
            f"SepLLM {p['SepLLM']} vs Vanilla {p['Vanilla']} (close)",
            f"A matches B (Table 1: {p['SepLLM']} vs {p['Vanilla']}, read by the paper as comparable)",
            f"{size}; all problems planned", note="the paper claims near-equality, which an interval can only fail "
            "to reject; the row tests A >= B")
        add(f"sepllm-{tag}-gsm8k-{col}-vs-streaming", f"Table 1 (GSM8K-CoT {col}, same n, {model})",
            f"A = SepLLM (n=256) vs B = StreamingLLM (n=256), {col} accuracy", metric, sep, "StrmLLM (n=256)",
            f"SepLLM {p['SepLLM']} > StreamingLLM {p['StrmLLM (n=256)']}",
            f"{p['SepLLM']} vs {p['StrmLLM (n=256)']} (higher is better; Table 1, GSM8K {col})", size)
        if matched:
            add(f"sepllm-{tag}-gsm8k-{col}-vs-matched", f"Table 1 (GSM8K-CoT {col}, equal r.KV, {model})",
                f"A = SepLLM (n=256) vs B = StreamingLLM widened to SepLLM's measured r.KV ({matched}), {col} "
                "accuracy", metric, sep, matched, f"SepLLM {p['SepLLM']} > StreamingLLM (n=380) "
                f"{p['StrmLLM (n=380)']}", f"{p['SepLLM']} vs {p['StrmLLM (n=380)']} (higher is better; Table 1, "
                f"StrmLLM n=380 at equal r.KV)", size)
            add(f"sepllm-{tag}-gsm8k-{col}-vs-h2o", f"Table 15 (GSM8K-CoT {col}, vs H2O, {model})",
                f"A = SepLLM (n=256) vs B = {h2o} (the matched StreamingLLM's entries), {col} accuracy", metric, sep,
                h2o, f"SepLLM {p['SepLLM']} > H2O {p['H2O']}", f"{p['SepLLM']} vs {p['H2O']} (higher is better; "
                f"Table 15, {col})", f"{size}; H2O on the first problems only (hooks engine, one at a time)",
                note="planned as a collapse check: a gap of the paper's size (0.9 / 2.1 points) needs thousands of "
                "problems")
    add(f"sepllm-{tag}-gsm8k-floor", f"Table 1 (GSM8K-CoT, above the floor, {model})",
        "A = Vanilla flexible accuracy vs 20 %", "flexible_match", "Vanilla", "=0.20",
        "Vanilla 77.8 (far above the floor)", "", size, role="check",
        note="checks whether the GSM8K rows can say anything at all")
    for b, paper_b in (("Vanilla", "Vanilla"), ("StrmLLM (n=256)", "StrmLLM (n=256)"),
                       (mmlu_matched, "StrmLLM (n=380)")):
        if b is None:
            continue
        short = {"Vanilla": "vs-vanilla", "StrmLLM (n=256)": "vs-streaming"}.get(b, "vs-matched")
        add(f"sepllm-{tag}-mmlu-{short}", f"Table 1 (MMLU 5-shot, {short.replace('-', ' ')}, {model})",
            f"A = SepLLM (n=256) vs B = {b}, accuracy", "mmlu_correct", sep, b,
            f"SepLLM {PAPER_MMLU['SepLLM']} vs {paper_b} {PAPER_MMLU[paper_b]}",
            (f"A matches B (Table 1: {PAPER_MMLU['SepLLM']} vs {PAPER_MMLU[paper_b]}, read by the paper as "
             "comparable)") if b == "Vanilla" else
            f"{PAPER_MMLU['SepLLM']} vs {PAPER_MMLU[paper_b]} (higher is better; Table 1, MMLU overall)",
            f"{size}; 20 questions per subject")
    add(f"sepllm-{tag}-mmlu-chance", f"Table 1 (MMLU 5-shot, above chance, {model})", "A = Vanilla accuracy vs "
        "chance 0.25", "mmlu_correct", "Vanilla", "=0.25", "Vanilla 65.7 (far above chance)", "", size, role="check")
    return out


NAME = "headline-claim-rows"


def parser():
    from kvlab.experiments.registry import experiment_parser

    p = experiment_parser(NAME, __doc__.split("\n\n")[0])
    p.add_argument("--folder", default=None, help="the run's results folder (table1_{gsm8k,mmlu}.json and records; "
                   "--smoke: the committed Qwen2.5-Coder-0.5B run)")
    return p


def check(args) -> None:
    from kvlab.experiments.registry import ParameterError

    if args.smoke and args.folder is None:
        args.folder = "benchmarks/results/headline/sepllm_qwen2.5-coder-0.5b"
    if args.folder is None or not os.path.isdir(args.folder):
        raise ParameterError(f"--folder {args.folder}: not a folder; give a sepllm-headline results folder")
    if not any(os.path.exists(os.path.join(args.folder, f"table1_{p}.json")) for p in ("gsm8k", "mmlu")):
        raise ParameterError(f"--folder {args.folder} holds neither table1_gsm8k.json nor table1_mmlu.json")


def run(args):
    from kvlab.experiments.sepllm.common import write_summary
    from kvlab.outputs import OutputFolder

    out = OutputFolder(args.out, f"python -m kvlab run {NAME}")
    new = rows_for(args.folder)
    for r in new:
        print(r["id"], "|", r["method_a"], "vs", r["method_b"], "|", r["metric"])
    return [write_summary(out, "claim_rows.json", {"rows": new})]
