"""Which model clears the accuracy floor: vanilla (full cache) MMLU 5-shot and GSM8K-CoT 8-shot on the CPU.

SepLLM's Table 1 and Table 15 compare KV methods by accuracy; on a model that scores at chance (MMLU 25 %) or near
zero (GSM8K) every method ties whatever n is. This measures each candidate's vanilla accuracy with kvlab's own
harnesses, the prompts and answer extraction the GPU run will use:

* MMLU: ``kvlab.experiments.sepllm_mmlu.mmlu_scores`` (5 exemplars of the subject, the answer letter's log-likelihood),
  ``--subjects`` subjects spread over the 57, ``--questions`` each.
* GSM8K: ``kvlab.eval.gsm8k.gsm8k_generate`` (lm-eval gsm8k-cot's 8 exemplars, greedy, the stop rule of
  ``kvlab.eval.gsm8k.UNTIL``, lm-eval's strict-match and flexible-extract), the first ``--problems`` test problems.

Writes ``<out>/<model>_<task>.json`` (accuracy, n, Wilson 95 % interval, seconds, command) and
``<out>/<model>_<task>.examples.jsonl`` (one record per question, with the raw generation for GSM8K); with ``--table``
prints the markdown table of every summary in ``<out>``. Usable for a claim: vanilla >= 20 % on GSM8K and >= 35 % on
MMLU (the lower end of the interval is what says "clearly above").

    python benchmarks/headline_model_choice.py --model qwen2.5-coder-0.5b --task mmlu --subjects 40 --questions 5 \\
        --threads 1 --out benchmarks/results/headline/model_choice
    python benchmarks/headline_model_choice.py --table --out benchmarks/results/headline/model_choice
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import sys
import time

import torch

FLOOR = {"mmlu": 35.0, "gsm8k_flexible": 20.0, "gsm8k_strict": 20.0}


def _write(out: str, stem: str, summary: dict, records: list[dict]) -> None:
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, stem)
    with open(path + ".examples.jsonl.tmp", "w") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in records)
    os.replace(path + ".examples.jsonl.tmp", path + ".examples.jsonl")
    with open(path + ".json", "w") as fh:
        json.dump(summary, fh, indent=1)


def _accuracy(hits: list[bool]) -> dict:
    from kvlab.eval.stats import proportion_interval

    ci = proportion_interval(sum(hits), len(hits))
    return {"n": len(hits), "correct": sum(hits), "accuracy": 100 * ci.estimate, "low": 100 * ci.low,
            "high": 100 * ci.high}


def run_mmlu(model, tokenizer, args, save) -> tuple[dict, list[dict]]:
    from kvlab.experiments.sepllm_mmlu import mmlu_prompts, mmlu_scores

    prompts = mmlu_prompts(subjects=args.subjects, questions=args.questions, shots=5)
    records = []
    for i in range(0, len(prompts), args.questions):  # one subject at a time, so progress shows
        chunk = mmlu_scores(model, tokenizer, prompts[i:i + args.questions])
        records += [dict(r, example=f"mmlu-{r['subject']}-{r['index']:04d}", method="Vanilla") for r in chunk]
        print(f"  {prompts[i].subject}: {sum(r['correct'] for r in chunk)}/{len(chunk)}", flush=True)
        save({"mmlu": _accuracy([r["correct"] for r in records])}, records)
    return {"mmlu": _accuracy([r["correct"] for r in records])}, records


def run_gsm8k(model, tokenizer, args, save) -> tuple[dict, list[dict]]:
    from kvlab.eval.gsm8k import gsm8k_generate, load_gsm8k

    problems, exemplars = load_gsm8k(args.problems)
    records = []
    for start in range(0, len(problems), 10):  # ten at a time (one prefill of the exemplars each): progress shows
        chunk = problems[start:start + 10]
        r = gsm8k_generate(model, tokenizer, chunk, exemplars, max_new_tokens=args.max_new_tokens, name="Vanilla",
                           progress=False)
        for j, problem in enumerate(chunk):
            records.append({"example": f"gsm8k-test-{start + j:04d}", "method": "Vanilla",
                            "flexible_match": r.flexible[j], "strict_match": r.strict[j], "stop": r.stops[j],
                            "target": problem["answer"].split("####")[-1].strip(), "output": r.generations[j],
                            "raw": r.raw[j]})
        print(f"  {start + len(chunk)}: flexible {sum(x['flexible_match'] for x in records)}, strict "
              f"{sum(x['strict_match'] for x in records)}; stops {r.stops}", flush=True)
        save({"gsm8k_flexible": _accuracy([r["flexible_match"] for r in records]),
              "gsm8k_strict": _accuracy([r["strict_match"] for r in records])}, records)
    return ({"gsm8k_flexible": _accuracy([r["flexible_match"] for r in records]),
             "gsm8k_strict": _accuracy([r["strict_match"] for r in records])}, records)


def table(out: str) -> str:
    rows = ["| model | metric | n | accuracy % | 95 % interval (Wilson) | floor | clears it | CPU s / item |",
            "|---|---|---|---|---|---|---|---|"]
    for path in sorted(glob.glob(os.path.join(out, "*.json"))):
        s = json.load(open(path))
        for metric, a in s["metrics"].items():
            clears = "yes" if a["low"] >= FLOOR[metric] else ("no" if a["high"] < FLOOR[metric] else "unclear")
            rows.append(f"| {s['model']} | {metric} | {a['n']} | {a['accuracy']:.1f} | [{a['low']:.1f}, "
                        f"{a['high']:.1f}] | {FLOOR[metric]:.0f} | {clears} | {s['seconds'] / a['n']:.1f} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--task", choices=["mmlu", "gsm8k"], default="mmlu")
    ap.add_argument("--subjects", type=int, default=40, help="mmlu: subjects spread over the 57")
    ap.add_argument("--questions", type=int, default=5, help="mmlu: scored questions per subject")
    ap.add_argument("--problems", type=int, default=50, help="gsm8k: the first N test problems")
    ap.add_argument("--max-new-tokens", type=int, default=256, help="gsm8k (lm-eval's max_gen_toks: 256)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--table", action="store_true", help="print the table of the summaries in --out and stop")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    if args.table:
        print(table(args.out))
        return 0
    import kvlab

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model, tokenizer = kvlab.load_model(args.model, device="cpu")
    started = time.perf_counter()
    command = "python benchmarks/headline_model_choice.py " + " ".join(argv if argv is not None else sys.argv[1:])

    def save(metrics: dict, records: list[dict]) -> dict:
        """Write the summary so far (a stopped run keeps every finished subject / chunk)."""
        summary = {"model": args.model, "task": args.task, "metrics": metrics,
                   "seconds": time.perf_counter() - started, "threads": args.threads,
                   "dtype": str(next(model.parameters()).dtype), "machine": platform.machine(), "command": command}
        _write(args.out, f"{args.model}_{args.task}", summary, records)
        return summary

    metrics, records = (run_mmlu if args.task == "mmlu" else run_gsm8k)(model, tokenizer, args, save)
    summary = save(metrics, records)
    for name, a in metrics.items():
        print(f"{args.model} {name}: {a['correct']}/{a['n']} = {a['accuracy']:.1f} % [{a['low']:.1f}, {a['high']:.1f}]"
              f" ({summary['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
