"""Which model clears the accuracy floor: vanilla (full cache) MMLU 5-shot and GSM8K-CoT 8-shot on the CPU.

SepLLM's Table 1 and Table 15 compare KV methods by accuracy; on a model that scores at chance (MMLU 25 %) or near
zero (GSM8K) every method ties whatever n is. This measures each candidate's vanilla accuracy with kvlab's own
harnesses, the prompts and answer extraction the GPU run will use:

* MMLU: ``kvlab.experiments.sepllm.mmlu.mmlu_scores`` (5 exemplars of the subject, the answer letter's log-likelihood),
  ``--subjects`` subjects spread over the 57, ``--questions`` each.
* GSM8K: ``kvlab.eval.gsm8k.gsm8k_generate`` (lm-eval gsm8k-cot's 8 exemplars, greedy, the stop rule of
  ``kvlab.eval.gsm8k.UNTIL``, lm-eval's strict-match and flexible-extract), the first ``--problems`` test problems.

Writes ``<out>/<model>_<task>.json`` (accuracy, n, Wilson 95 % interval, seconds, command) and
``<out>/<model>_<task>.examples.jsonl.gz`` (one record per question, with the raw generation for GSM8K), both
rewritten after every subject / chunk; with ``--table`` writes ``<out>/table.md``, the markdown table of every
summary in ``<out>``. Usable for a claim: vanilla >= 20 % on GSM8K and >= 35 % on
MMLU (the lower end of the interval is what says "clearly above").

    python -m kvlab run headline-model-choice --model qwen2.5-coder-0.5b --task mmlu --subjects 40 --questions 5 \\
        --threads 1 --out benchmarks/results/headline/model_choice
    python -m kvlab run headline-model-choice --table --out benchmarks/results/headline/model_choice
"""

from __future__ import annotations

import glob
import json
import os
import platform
import time

import torch

from kvlab.experiments import records
from kvlab.experiments.registry import experiment_parser, positive_int
from kvlab.experiments.sepllm.common import open_out, write_summary

NAME = "headline-model-choice"
FLOOR = {"mmlu": 35.0, "gsm8k_flexible": 20.0, "gsm8k_strict": 20.0}


def _accuracy(hits: list) -> dict:
    from kvlab.eval.stats import proportion_interval

    ci = proportion_interval(int(sum(hits)), len(hits))
    return {"n": len(hits), "correct": int(sum(hits)), "accuracy": 100 * ci.estimate, "low": 100 * ci.low,
            "high": 100 * ci.high}


def run_mmlu(model, tokenizer, args, save) -> dict:
    from kvlab.experiments.sepllm.mmlu import mmlu_prompts, mmlu_scores

    prompts = mmlu_prompts(subjects=args.subjects, questions=args.questions, shots=5)
    recs, hits = [], []
    for i in range(0, len(prompts), args.questions):  # one subject at a time, so progress shows
        chunk = mmlu_scores(model, tokenizer, prompts[i:i + args.questions])
        hits += [r["correct"] for r in chunk]
        recs += [records.record(f"mmlu-{r['subject']}-{r['index']:04d}", "Vanilla", "mmlu_correct", r["correct"],
                                config=args.config, device="cpu", pred=r["pred"], gold=r["gold"],
                                letter_logprobs=r["letter_logprobs"]) for r in chunk]
        print(f"  {prompts[i].subject}: {sum(r['correct'] for r in chunk)}/{len(chunk)}", flush=True)
        save({"mmlu": _accuracy(hits)}, recs)
    return {"mmlu": _accuracy(hits)}


def run_gsm8k(model, tokenizer, args, save) -> dict:
    from kvlab.eval.gsm8k import gsm8k_generate, load_gsm8k

    problems, exemplars = load_gsm8k(args.problems)
    recs, flexible, strict = [], [], []
    for start in range(0, len(problems), 10):  # ten at a time (one prefill of the exemplars each): progress shows
        chunk = problems[start:start + 10]
        r = gsm8k_generate(model, tokenizer, chunk, exemplars, max_new_tokens=args.max_new_tokens, name="Vanilla",
                           progress=False)
        flexible += r.flexible
        strict += r.strict
        for j, problem in enumerate(chunk):
            ex, target = f"gsm8k-test-{start + j:04d}", problem["answer"].split("####")[-1].strip()
            recs.append(records.record(ex, "Vanilla", "flexible_match", r.flexible[j], config=args.config,
                                       device="cpu", stop=r.stops[j], target=target, output=r.generations[j],
                                       raw=r.raw[j]))
            recs.append(records.record(ex, "Vanilla", "strict_match", r.strict[j], config=args.config, device="cpu"))
        print(f"  {start + len(chunk)}: flexible {sum(flexible)}, strict {sum(strict)}; stops {r.stops}", flush=True)
        save({"gsm8k_flexible": _accuracy(flexible), "gsm8k_strict": _accuracy(strict)}, recs)
    return {"gsm8k_flexible": _accuracy(flexible), "gsm8k_strict": _accuracy(strict)}


def table(out: str) -> str:
    rows = ["| model | metric | n | accuracy % | 95 % interval (Wilson) | floor | clears it | CPU s / item |",
            "|---|---|---|---|---|---|---|---|"]
    for path in sorted(glob.glob(os.path.join(out, "*.json"))):
        s = json.load(open(path))
        for metric, a in s.get("metrics", {}).items():
            clears = "yes" if a["low"] >= FLOOR[metric] else ("no" if a["high"] < FLOOR[metric] else "unclear")
            rows.append(f"| {s['model']} | {metric} | {a['n']} | {a['accuracy']:.1f} | [{a['low']:.1f}, "
                        f"{a['high']:.1f}] | {FLOOR[metric]:.0f} | {clears} | {s['seconds'] / a['n']:.1f} |")
    return "\n".join(rows)


def parser():
    p = experiment_parser(NAME, __doc__.split("\n\n")[0])
    p.add_argument("--model", default="qwen2.5-coder-0.5b", help="kvlab model id")
    p.add_argument("--task", choices=["mmlu", "gsm8k"], default="mmlu")
    p.add_argument("--subjects", type=positive_int, default=40, help="mmlu: subjects spread over the 57")
    p.add_argument("--questions", type=positive_int, default=5, help="mmlu: scored questions per subject")
    p.add_argument("--problems", type=positive_int, default=50, help="gsm8k: the first N test problems")
    p.add_argument("--max-new-tokens", type=positive_int, default=256, help="gsm8k (lm-eval's max_gen_toks: 256)")
    p.add_argument("--threads", type=positive_int, default=1)
    p.add_argument("--table", action="store_true", help="write table.md from the summaries in --out and stop")
    return p


def check(args) -> None:
    from kvlab.experiments.registry import ParameterError

    if args.smoke:
        args.model, args.subjects, args.questions, args.problems, args.max_new_tokens = "smollm2-135m", 1, 1, 1, 4
    if args.subjects > 57:
        raise ParameterError(f"--subjects {args.subjects}: MMLU has 57 subjects; give 1 to 57")
    args.config = {"model": args.model, "task": args.task, "subjects": args.subjects, "questions": args.questions,
                   "problems": args.problems, "max_new_tokens": args.max_new_tokens}


def run(args):
    stem = f"{args.model}_{args.task}"
    if args.table:
        from kvlab.outputs import OutputFolder

        out = OutputFolder(args.out, f"python -m kvlab run {NAME}")
        path = out.claim("table.md")
        path.write_text(table(args.out) + "\n")
        print(path.read_text())
        return [path]
    import kvlab

    out = open_out(args, NAME, [stem + records.SUFFIX])
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model, tokenizer = kvlab.load_model(args.model, device="cpu")
    started = time.perf_counter()

    def save(metrics: dict, recs: list[dict]) -> dict:
        """Write the summary so far (a stopped run keeps every finished subject / chunk)."""
        summary = {"model": args.model, "task": args.task, "metrics": metrics,
                   "seconds": time.perf_counter() - started, "threads": args.threads,
                   "dtype": str(next(model.parameters()).dtype), "machine": platform.machine(),
                   "command": f"python -m kvlab run {NAME}", "config": args.config}
        records.write(stem + records.SUFFIX, recs, out=out)
        write_summary(out, stem + ".json", summary)
        return summary

    metrics = (run_mmlu if args.task == "mmlu" else run_gsm8k)(model, tokenizer, args, save)
    for name, a in metrics.items():
        print(f"{args.model} {name}: {a['correct']}/{a['n']} = {a['accuracy']:.1f} % [{a['low']:.1f}, {a['high']:.1f}]")
    return [out.root / (stem + records.SUFFIX), out.root / (stem + ".json")]
