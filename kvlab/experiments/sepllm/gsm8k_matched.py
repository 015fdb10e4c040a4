"""SepLLM Table 1's GSM8K comparison at matched r.KV, with per-problem records.

Paper: Chen et al., SepLLM (ICML 2025), Table 1: training-free, SepLLM (n=256) against StreamingLLM with a window
widened until it keeps the same share of the KV as SepLLM (``StrmLLM (n=380)``: r.KV 47.54 % vs 47.36 %).

What this module adds to :mod:`kvlab.eval.gsm8k` (the prompt, the answer-NLL proxy and the generation):

* **Matched r.KV over the sample** (:func:`matched_window`): one StreamingLLM window for every problem, the
  smallest whose *mean* r.KV over the problems reaches SepLLM's mean, as Table 1 sets one ``n`` per benchmark.
* **Problems long enough that the window binds** (:func:`long_problems`): a problem whose question and
  solution fit inside ``n`` tokens is scored by both methods with the whole problem in view; only problems of at
  least ``min_tokens`` tokens (question + solution) are kept, in the data set's order.
* **Per-problem records** (``*.examples.jsonl.gz``: ``example`` = ``gsm8k-test-<index>``, metrics ``answer_nll``
  and ``r_kv``; with generation also ``flexible_match`` / ``strict_match`` and the raw ``output``) and the paired
  bootstrap of SepLLM minus the matched window (:func:`kvlab.eval.stats.paired_bootstrap`), so the summary
  says whether this sample separates the methods; on a 135M model it may not, and the records show that.
* **Scoring fewer than the sample** (``--scored K``): the methods (the matched window) are still set over every
  selected problem, only the first ``K`` are scored; a ``--smoke`` run scores 2 this way, so its method names,
  record file and example ids are the full run's.

Command line::

    python -m kvlab run sepllm-gsm8k-matched --neighbors 128 --min-tokens 192 --problems 40 --out DIR
    python -m kvlab run sepllm-gsm8k-matched --neighbors 128 --min-tokens 192 --problems 300 --generate 100 --out DIR
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable

import torch

from kvlab.core import check_int, kv_ratio
from kvlab.eval.gsm8k import cot_prompt, gsm8k_answer_nll, gsm8k_generate, load_gsm8k, reference_solution
from kvlab.eval.stats import paired_bootstrap
from kvlab.experiments import records
from kvlab.experiments.registry import experiment_parser, positive_int
from kvlab.experiments.sepllm.common import (device_label, nonnegative_int, open_out, smallest_reaching, start_model,
                                             write_summary)
from kvlab.sepllm.pattern import SepLLMPattern, StreamingPattern

__all__ = ["long_problems", "problem_ids", "problem_sequences", "matched_window", "matched_methods", "matched_gsm8k",
           "records_of", "parser", "run"]
NAME = "sepllm-gsm8k-matched"


def _question(problem: dict) -> str:
    return f"Q: {problem['question']}\nA:"


def long_problems(tokenizer, problems: list[dict], min_tokens: int, n: int | None = None) -> list[tuple[int, dict]]:
    """``(index, problem)`` of the problems whose question (``Q: ...\\nA:``) and reference solution together have
    at least ``min_tokens`` tokens, in order; at most ``n``. ``index`` is the problem's place in ``problems``."""
    min_tokens = check_int("min_tokens", min_tokens, 1)
    out = []
    for i, p in enumerate(problems):
        size = (len(tokenizer(_question(p), add_special_tokens=False).input_ids)
                + len(tokenizer(reference_solution(p["answer"]), add_special_tokens=False).input_ids))
        if size >= min_tokens:
            out.append((i, p))
            if n is not None and len(out) >= n:
                break
    if not out:
        raise ValueError(f"no problem has {min_tokens} tokens of question and solution: lower min_tokens")
    return out


def problem_ids(tokenizer, problem: dict, exemplars: list[dict]) -> torch.Tensor:
    """``(1, T)`` ids of the whole scored sequence: the exemplars' prompt, the question and the reference
    solution, tokenized in the pieces :func:`kvlab.eval.gsm8k.gsm8k_answer_nll` uses."""
    return problem_sequences(tokenizer, [problem], exemplars)[0]


def problem_sequences(tokenizer, problems: list[dict], exemplars: list[dict]) -> list[torch.Tensor]:
    """:func:`problem_ids` of every problem, the exemplars' prompt tokenized once."""
    prefix = list(tokenizer(cot_prompt("", exemplars).rsplit("Q: ", 1)[0]).input_ids)
    return [torch.tensor([prefix + list(tokenizer(_question(p), add_special_tokens=False).input_ids)
                          + list(tokenizer(reference_solution(p["answer"]), add_special_tokens=False).input_ids)])
            for p in problems]


def matched_window(make: Callable[[int], Any], target: float, sequences: list[torch.Tensor], lo: int = 1,
                   hi: int | None = None) -> int:
    """Smallest window ``n`` whose pattern ``make(n)`` keeps on average over ``sequences`` at least ``target``
    of the causal entries (the mean r.KV); ``hi`` (default: the longest sequence) when out of reach."""
    if not sequences:
        raise ValueError("sequences must hold at least one (1, T) id tensor")
    hi = max(s.shape[-1] for s in sequences) if hi is None else hi

    def mean_kept(n: int) -> float:
        return sum(kv_ratio(make(n), s) for s in sequences) / len(sequences)

    return smallest_reaching(mean_kept, target, lo, hi)


def matched_methods(separators, sequences: list[torch.Tensor], *, init: int = 3,
                    neighbors: int = 256) -> dict[str, Any]:
    """Vanilla, SepLLM (``neighbors``), StreamingLLM at the same ``neighbors`` and StreamingLLM with the window
    that matches SepLLM's mean r.KV over ``sequences``: ``{name: pattern or None}``."""
    sep = SepLLMPattern(separators, init, neighbors)
    target = sum(kv_ratio(sep, s) for s in sequences) / len(sequences)
    n = matched_window(lambda k: StreamingPattern(init, k), target, sequences)
    return {"Vanilla": None, f"SepLLM (n={neighbors})": sep,
            f"StrmLLM (n={neighbors})": StreamingPattern(init, neighbors),
            f"StrmLLM (n={n}, r.KV matched)": StreamingPattern(init, n)}


def records_of(ids: list[str], method: str, metric: str, values: list, config: dict, device: str,
               **extra) -> list[dict]:
    """One record per example: ``values[j]`` of ``ids[j]``, with ``extra[key][j]`` beside it."""
    return [records.record(example, method, metric, float(value), config=config, device=device,
                           **{k: v[j] for k, v in extra.items()})
            for j, (example, value) in enumerate(zip(ids, values))]


def score_methods(model, tokenizer, ids: list[str], problems: list[dict], exemplars: list[dict],
                  methods: dict[str, Any], config: dict, device: str, *, info: Callable[[Any], dict],
                  progress: str = "") -> tuple[dict[str, Any], dict[str, list[float]]]:
    """The answer NLL and r.KV of every method (``{name: pattern or None}``) on ``problems``: ``({"methods": {name:
    {**info(pattern), "mean_answer_nll", "mean_r_kv", "seconds"}}, "pairs": [], "examples": [records]}, {name:
    per-problem NLLs})``. ``progress``: a format of ``name``, ``nll`` and ``kv`` printed per method ("": quiet)."""
    out: dict[str, Any] = {"methods": {}, "pairs": [], "examples": []}
    nll: dict[str, list[float]] = {}
    for name, pattern in methods.items():
        t0 = time.perf_counter()
        r = gsm8k_answer_nll(model, tokenizer, problems, exemplars, pattern=pattern, name=name, progress=False)
        nll[name] = r.answer_nll
        out["methods"][name] = {**info(pattern), "mean_answer_nll": r.mean_answer_nll, "mean_r_kv": r.mean_kv_ratio,
                                "seconds": time.perf_counter() - t0}
        out["examples"] += records_of(ids, name, "answer_nll", r.answer_nll, config, device)
        out["examples"] += records_of(ids, name, "r_kv", r.kv_ratio, config, device)
        if progress:
            print(progress.format(name=name, nll=r.mean_answer_nll, kv=r.mean_kv_ratio), flush=True)
    return out, nll


def matched_gsm8k(model, tokenizer, selected: list[tuple[int, dict]], exemplars: list[dict], separators, *,
                  init: int = 3, neighbors: int = 256, generate: int = 0, max_new_tokens: int = 256,
                  device: str = "cpu", progress: bool = False, scored: int | None = None) -> dict[str, Any]:
    """The answer-NLL proxy of every method of :func:`matched_methods` on ``selected`` problems, and greedy
    generation (exact match) on the first ``generate`` of them for SepLLM and the matched window. ``scored``:
    only the first ``scored`` problems are scored (and generated on), the methods still matched over all.

    Returns ``{"methods": {name: {"neighbors", "mean_answer_nll", "mean_r_kv", ...}}, "pairs": [...],
    "examples": [records]}``; ``pairs`` holds the paired bootstrap of SepLLM minus each other method (answer NLL:
    below 0 = SepLLM better; exact match: above 0 = SepLLM better)."""
    sequences = problem_sequences(tokenizer, [p for _, p in selected], exemplars)
    methods = matched_methods(separators, sequences, init=init, neighbors=neighbors)
    chosen = selected[:scored] if scored else selected
    ids = [f"gsm8k-test-{i:04d}" for i, _ in chosen]
    problems = [p for _, p in chosen]
    config = {"init": init, "neighbors": neighbors, "problems": len(problems)}
    if len(chosen) < len(selected):  # the window was matched over more problems than were scored
        config["matched_over"] = len(selected)
    out, nll = score_methods(model, tokenizer, ids, problems, exemplars, methods, config, device,
                             info=lambda pattern: {"neighbors": getattr(pattern, "neighbors", None)},
                             progress="  {name:34s} answer NLL {nll:.4f}  r.KV {kv:5.1f} %" if progress else "")
    sep_name = f"SepLLM (n={neighbors})"
    for other in methods:
        if other != sep_name:
            d = paired_bootstrap(nll[sep_name], nll[other])
            out["pairs"].append({"metric": "answer_nll", "a": sep_name, "b": other, "mean_diff": d.estimate,
                                 "low": d.low, "high": d.high, "n": d.n})
    if generate:
        from kvlab.policies import StreamingLLM
        from kvlab.sepllm.policy import SepLLM

        matched = next(name for name in methods if "matched" in name)
        policies = {sep_name: (methods[sep_name], SepLLM(init, neighbors, separators=separators)),
                    matched: (methods[matched], StreamingLLM(sink=init, window=methods[matched].neighbors - 1,
                                                             positions="original"))}
        hits = {}
        for name, (pattern, policy) in policies.items():
            r = gsm8k_generate(model, tokenizer, problems[:generate], exemplars, pattern=pattern, policy=policy,
                               max_new_tokens=max_new_tokens, name=name, progress=progress)
            hits[name] = r.flexible
            targets = [p["answer"].split("####")[-1].strip() for p in problems[:generate]]
            gen_ids = ids[:generate]
            out["examples"] += records_of(gen_ids, name, "flexible_match", r.flexible, config, device,
                                          output=r.generations, target=targets)
            out["examples"] += records_of(gen_ids, name, "strict_match", r.strict, config, device,
                                          output=r.generations, target=targets)
            out["examples"] += records_of(gen_ids, name, "decode_r_kv", r.kv_ratio, config, device)
            out["methods"][name].update(flexible=r.flexible_accuracy, strict=r.strict_accuracy,
                                        decode_r_kv=r.mean_kv_ratio, generated=len(r.flexible))
        d = paired_bootstrap([float(x) for x in hits[sep_name]], [float(x) for x in hits[matched]])
        out["pairs"].append({"metric": "flexible_match", "a": sep_name, "b": matched, "mean_diff": d.estimate,
                             "low": d.low, "high": d.high, "n": d.n})
    return out


def parser():
    p = experiment_parser(NAME, __doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m", help="kvlab model id")
    p.add_argument("--init", type=positive_int, default=3, help="initial tokens a (Table 1: 3)")
    p.add_argument("--neighbors", type=positive_int, default=256, help="SepLLM's window n (Table 1: 256)")
    p.add_argument("--min-tokens", type=nonnegative_int, default=0, help="keep problems with at least this many "
                   "tokens of question + solution (0: 1.5 x neighbors, so the window binds)")
    p.add_argument("--problems", type=positive_int, default=40, help="problems the methods are set over and "
                   "scored (the first long enough ones)")
    p.add_argument("--scored", type=nonnegative_int, default=0, help="score only the first K of them (0: all); "
                   "the matched window is still set over all --problems (--smoke: 2)")
    p.add_argument("--generate", type=nonnegative_int, default=0,
                   help="also generate on the first N of them (exact match; at most --problems and --scored)")
    p.add_argument("--max-new-tokens", type=positive_int, default=256)
    p.add_argument("--threads", type=nonnegative_int, default=0, help="CPU threads (0: torch's default)")
    return p


def check(args) -> None:
    from kvlab.experiments.registry import ParameterError

    if args.smoke:  # the full run's sample, window and file name; only 2 problems scored, 4 tokens generated
        args.scored = min(args.scored or 2, 2, args.problems)
        args.generate, args.max_new_tokens = min(args.generate, 1), 4
    limit = ("--scored", args.scored) if 0 < args.scored < args.problems else ("--problems", args.problems)
    if args.generate > limit[1]:
        raise ParameterError(f"--generate {args.generate} exceeds {limit[0]} {limit[1]}: generation runs on the "
                             "first --generate of the scored problems")


def run(args):
    from kvlab.sepllm.separators import separator_ids

    stem = f"gsm8k_matched_n{args.neighbors}"
    out = open_out(args, NAME, [stem + records.SUFFIX])
    started = time.perf_counter()
    device, model, tokenizer = start_model(args)
    problems, exemplars = load_gsm8k(None)
    min_tokens = args.min_tokens or math.ceil(1.5 * args.neighbors)
    selected = long_problems(tokenizer, problems, min_tokens, args.problems)
    print(f"{len(selected)} problems with >= {min_tokens} tokens of question + solution; n = {args.neighbors}"
          + (f"; the first {args.scored} scored" if 0 < args.scored < len(selected) else ""), flush=True)
    label = device_label(device)
    result = matched_gsm8k(model, tokenizer, selected, exemplars, separator_ids(tokenizer), init=args.init,
                           neighbors=args.neighbors, generate=args.generate, max_new_tokens=args.max_new_tokens,
                           device=label, progress=True, scored=args.scored or None)
    written = [records.write(stem + records.SUFFIX, result.pop("examples"), out=out)]
    result.update(model=args.model, device=label, init=args.init, neighbors=args.neighbors, min_tokens=min_tokens,
                  problems=len(selected), generate=args.generate, max_new_tokens=args.max_new_tokens,
                  command=f"python -m kvlab run {NAME}", seconds=time.perf_counter() - started)
    if 0 < args.scored < len(selected):
        result["scored"] = args.scored
    written.append(write_summary(out, stem + ".json", result))
    for p in result["pairs"]:
        print(f"  {p['a']} - {p['b']} ({p['metric']}): {p['mean_diff']:+.4f} [{p['low']:+.4f}, {p['high']:+.4f}] "
              f"n={p['n']}")
    return written
