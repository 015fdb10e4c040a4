"""SepLLM's ablation tables and needle figures as paired experiments with per-example records.

Paper: Chen et al., SepLLM (ICML 2025). What is here, each comparison scored example by example so that a paired
interval (and an exact sign test) can say whether this sample separates the methods:

* :func:`separator_choice_methods` (Table 16): SepLLM with the nine separators, four common marks
  (``. , ? ;``), only ``.`` and ``?``, none (StreamingLLM at the same ``n``), and StreamingLLM with the window
  widened to the nine-separator SepLLM's mean r.KV;
* :func:`fixed_interval_methods` (Table 17): SepLLM against FixLLM, one kept key every ``interval`` positions;
* :func:`headwise_methods` (Table 9): SepLLM against the naive baseline where ``H_s`` of the ``H`` query heads
  slide a window and the others attend to everything, each row's window chosen so its mean r.KV reaches SepLLM's;
* :func:`compare_on_gsm8k`: every method's GSM8K answer-NLL proxy (teacher-forced NLL of the reference
  solution after the 8-shot prompt, :func:`kvlab.eval.gsm8k.gsm8k_answer_nll`) and r.KV per problem, and per pair
  of methods the paired bootstrap of the mean difference and the exact sign test;
* :func:`needle_study` (Figs. 8-11): the needle-in-a-haystack grid under decoding policies, the found share of
  the needle's words and the answer NLL per cell (length x depth), paired across policies.

The paper scores GSM8K by exact match on Llama-3-8B; a 135M model solves about 2 % of the problems, so the
answer-NLL proxy is what can order the methods here (the records keep r.KV beside it).

Command line (each writes ``<name>.json`` and ``<name>.examples.jsonl.gz`` under ``--out``)::

    python -m kvlab run sepllm-ablations gsm8k --tables 9,16,17 --neighbors 256 --problems 1319 --out DIR
    python -m kvlab run sepllm-ablations needle --lengths 1024,2048,3072,4096 --depths 16 --out DIR
"""

from __future__ import annotations

import time
import warnings
from typing import Any, Callable

import torch

from kvlab.core import check_int, kv_ratio
from kvlab.eval.stats import paired_bootstrap, sign_test
from kvlab.experiments import records
from kvlab.experiments.registry import ParameterError, experiment_parser, names_list, positive_int
from kvlab.experiments.sepllm.common import (device_label, int_list, open_out, start_model, write_summary)
from kvlab.experiments.sepllm.gsm8k_matched import matched_window, problem_ids, records_of, score_methods
from kvlab.sepllm.pattern import FixLLMPattern, HeadwisePattern, SepLLMPattern, StreamingPattern
from kvlab.sepllm.separators import SEPARATOR_SETS, separator_ids

__all__ = ["separator_choice_methods", "fixed_interval_methods", "headwise_methods", "compare_on_gsm8k",
           "pair_statistics", "needle_policies", "needle_study", "parser", "check", "run"]


def _mean_kv(pattern, sequences: list[torch.Tensor]) -> float:
    return sum(kv_ratio(pattern, s) for s in sequences) / len(sequences)


def separator_choice_methods(tokenizer, sequences: list[torch.Tensor], *, init: int = 3,
                             neighbors: int = 256) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """Table 16's columns and the orderings the paper reads from them: ``({name: pattern}, [(better, worse)])``.

    The paper: nine separators 77.18 > four 76.68 > ``. ?`` 70.66 > none (StrmLLM n=256) 68.84 on GSM8K, and
    StrmLLM widened to the same r.KV (n=380, 71.42) falls short of nine and of four separators."""
    if not sequences:
        raise ValueError("sequences must hold the (1, T) ids of at least one problem (to match r.KV)")
    sets = {key: separator_ids(tokenizer, SEPARATOR_SETS[key]) for key in ("9", "4", "2")}
    names = {"9": f"SepLLM 9 separators (n={neighbors})", "4": f"SepLLM . , ? ; (n={neighbors})",
             "2": f"SepLLM . ? (n={neighbors})"}
    methods: dict[str, Any] = {names[k]: SepLLMPattern(ids, init, neighbors) for k, ids in sets.items()}
    none = f"StrmLLM (n={neighbors})"
    methods[none] = StreamingPattern(init, neighbors)
    target = _mean_kv(methods[names["9"]], sequences)
    n = matched_window(lambda k: StreamingPattern(init, k), target, sequences)
    matched = f"StrmLLM (n={n}, r.KV matched)"
    methods[matched] = StreamingPattern(init, n)
    pairs = [(names["9"], names["4"]), (names["4"], names["2"]), (names["2"], none), (names["9"], matched),
             (names["4"], matched)]
    return methods, pairs


def fixed_interval_methods(tokenizer, *, init: int = 3, neighbors: int = 256,
                           intervals=(4, 5)) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """Table 17: SepLLM (nine separators) and FixLLM at each ``interval`` with the same ``init`` and ``n``; the
    paper has SepLLM above every FixLLM (GSM8K 77.18 vs 72.71 / 70.43 at Δ = 4 / 5)."""
    if not intervals:
        raise ValueError("intervals must name at least one FixLLM interval (Table 17: 4 and 5)")
    sep = f"SepLLM (n={neighbors})"
    methods: dict[str, Any] = {sep: SepLLMPattern(separator_ids(tokenizer), init, neighbors)}
    for d in intervals:
        methods[f"FixLLM (interval={d}, n={neighbors})"] = FixLLMPattern(init, neighbors, check_int("interval", d, 2))
    return methods, [(sep, name) for name in methods if name != sep]


def headwise_methods(tokenizer, sequences: list[torch.Tensor], num_heads: int, window_heads=(6, 7, 8), *,
                     init: int = 3, neighbors: int = 256) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """Table 9: SepLLM and, for each ``H_s`` in ``window_heads``, ``H_s`` of ``num_heads`` query heads sliding
    a window (no sinks, as the paper's baseline) while the rest attend to everything, the window the smallest
    whose mean r.KV over ``sequences`` reaches SepLLM's. A row whose full heads alone exceed SepLLM's r.KV
    cannot be matched and is left out (its reason in ``skipped``). The paper: SepLLM above every row.

    Returns ``({name: pattern}, [(better, worse)])``; the dict's ``"skipped"`` key is not a method."""
    num_heads = check_int("num_heads", num_heads, 1)
    sep = f"SepLLM (n={neighbors})"
    methods: dict[str, Any] = {sep: SepLLMPattern(separator_ids(tokenizer), init, neighbors)}
    target = _mean_kv(methods[sep], sequences)
    skipped = []
    for h in window_heads:
        h = check_int("window_heads", h, 1, num_heads)
        floor = _mean_kv(HeadwisePattern(h, num_heads, 1), sequences)
        if floor > target:
            skipped.append(f"H_s={h}/{num_heads}: its full heads alone keep {floor:.1%} > SepLLM's {target:.1%}")
            continue
        n = matched_window(lambda k: HeadwisePattern(h, num_heads, k), target, sequences)
        methods[f"Headwise {h}/{num_heads} sliding (n={n})"] = HeadwisePattern(h, num_heads, n)
    pairs = [(sep, name) for name in methods if name != sep]
    return methods | ({"skipped": skipped} if skipped else {}), pairs


def pair_statistics(a: list[float], b: list[float], *, lower_is_better: bool = True) -> dict[str, Any]:
    """Mean of ``a - b`` with its 95 % paired bootstrap interval, and the exact sign test on the pairs that
    differ; ``better`` counts the pairs where ``a`` wins (lower value when ``lower_is_better``)."""
    d = paired_bootstrap(a, b)
    s = sign_test(a, b)
    better, worse = (s.losses, s.wins) if lower_is_better else (s.wins, s.losses)
    return {"mean_diff": d.estimate, "low": d.low, "high": d.high, "n": d.n, "a_better": better,
            "b_better": worse, "ties": s.ties, "sign_p": s.p}


def compare_on_gsm8k(model, tokenizer, selected: list[tuple[int, dict]], exemplars: list[dict],
                     methods: dict[str, Any], pairs: list[tuple[str, str]], *, config: dict | None = None,
                     device: str = "cpu", progress: bool = False) -> dict[str, Any]:
    """The answer-NLL proxy and r.KV of every method (``{name: pattern or None}``) on ``selected`` problems
    (``(index, problem)``), and :func:`pair_statistics` of each ``(a, b)`` in ``pairs`` (negative mean
    difference: ``a`` has the lower NLL, the paper's "a better").

    Returns ``{"methods": {name: {"mean_answer_nll", "mean_r_kv", "seconds"}}, "pairs": [...], "examples": [...]}``.
    """
    unknown = sorted({m for pair in pairs for m in pair} - set(methods))
    if unknown:
        raise ValueError(f"pairs name methods that are not in methods: {unknown}; methods are {list(methods)}")
    if not selected:
        raise ValueError("selected must hold at least one (index, problem)")
    ids = [f"gsm8k-test-{i:04d}" for i, _ in selected]
    problems = [p for _, p in selected]
    config = dict(config or {}, problems=len(problems))
    out, nll = score_methods(model, tokenizer, ids, problems, exemplars, methods, config, device,
                             info=lambda pattern: {"pattern": repr(pattern)},
                             progress="  {name:40s} answer NLL {nll:.4f}  r.KV {kv:6.3f}" if progress else "")
    for a, b in pairs:
        out["pairs"].append({"metric": "answer_nll", "a": a, "b": b, **pair_statistics(nll[a], nll[b])})
    return out


# ---------------------------------------------------------------------------------------------------
# Figs. 8-11: needle in a haystack under decoding policies


def needle_policies(tokenizer, design: str) -> dict[str, Callable[[], Any]]:
    """``{name: factory}`` of the two policies each needle figure compares.

    ``"basic"`` (Figs. 8-9, Pythia-160M): SepLLM n=64 with the first and last layers full ("H/T"), against the
    same without separators. ``"n2048"`` (Figs. 10-11, Llama-3-8B): SepLLM n=2048 with 32 initial tokens and the
    first and last two layers full, against the same without separators (contexts must exceed 2,048 tokens for
    the window to drop anything). ``"streaming"`` (App. F's text, not a figure's configuration): SepLLM's
    four-block cache (a=4, s=32, w=224, c=324) against StreamingLLM with the same capacity."""
    from kvlab.policies import StreamingLLM
    from kvlab.sepllm.policy import SepLLM, SepLLMStreaming

    seps = separator_ids(tokenizer)
    if design == "streaming":
        return {"SepLLM streaming (4, 32, 224, 324)": lambda: SepLLMStreaming(4, 32, 224, 324, separators=seps),
                "StreamingLLM (4 + 320)": lambda: StreamingLLM(sink=4, cache_size=324)}
    if design in ("basic", "n2048"):
        init, n, full = (4, 64, (0, -1)) if design == "basic" else (32, 2048, (0, 1, -2, -1))
        tag = "H/T" if design == "basic" else "first/last 2 layers full"

        def window_only():  # SepLLM without separators warns that it is a window cache: here that is the point
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                return SepLLM(init, n, separators=[], full_layers=full)

        return {f"SepLLM n={n} {tag}": lambda: SepLLM(init, n, separators=seps, full_layers=full),
                f"StrmLLM n={n} {tag}": window_only}
    raise ValueError(f"design must be 'streaming', 'basic' or 'n2048', got {design!r}")


def needle_study(model, tokenizer, policies: dict[str, Callable[[], Any]], lengths, depths, *,
                 chunk_size: int = 64, config: dict | None = None, device: str = "cpu", progress: bool = False) -> dict[str, Any]:
    """Every policy (``{name: factory}``, a fresh policy per run) on the needle grid ``lengths x depths``:
    per cell the share of the needle's words in the greedy answer (``correct``) and the answer NLL, and for the
    first policy against the second the paired statistics over cells (NLL: lower better; found: higher)."""
    from kvlab.eval import needle_in_haystack

    if len(policies) != 2:
        raise ValueError(f"policies must hold the two policies to compare, got {len(policies)}")
    config = dict(config or {}, lengths=list(lengths), depths=list(depths), chunk_size=chunk_size)
    out: dict[str, Any] = {"methods": {}, "pairs": [], "examples": []}
    values: dict[str, dict[str, list[float]]] = {}
    for name, make in policies.items():
        t0 = time.perf_counter()
        r = needle_in_haystack(model, tokenizer, make(), lengths=list(lengths), depths=list(depths),
                               chunk_size=chunk_size, progress=False)
        cells = [f"niah-{n}-{d:.3f}" for n in lengths for d in depths]
        found = r.accuracy.flatten().tolist()
        nll = r.answer_nll.flatten().tolist()
        answers = [a for row in r.answers for a in row]
        values[name] = {"correct": found, "answer_nll": nll}
        out["examples"] += records_of(cells, name, "correct", found, config, device, output=answers)
        out["examples"] += records_of(cells, name, "answer_nll", nll, config, device)
        out["methods"][name] = {"mean_correct": sum(found) / len(found), "mean_answer_nll": sum(nll) / len(nll),
                                "seconds": time.perf_counter() - t0}
        if progress:
            print(f"  {name:36s} found {out['methods'][name]['mean_correct']:.3f}  answer NLL "
                  f"{out['methods'][name]['mean_answer_nll']:.3f}", flush=True)
    a, b = list(policies)
    out["pairs"].append({"metric": "answer_nll", "a": a, "b": b,
                         **pair_statistics(values[a]["answer_nll"], values[b]["answer_nll"])})
    out["pairs"].append({"metric": "correct", "a": a, "b": b,
                         **pair_statistics(values[a]["correct"], values[b]["correct"], lower_is_better=False)})
    return out


def _write(out, stem: str, result: dict, extra: dict) -> list:
    """The records and the JSON summary of one table or design; prints each pair's statistics."""
    written = [records.write(stem + records.SUFFIX, result.pop("examples"), out=out)]
    result.update(extra)
    written.append(write_summary(out, stem + ".json", result))
    for p in result["pairs"]:
        print(f"  {p['a']} - {p['b']} ({p['metric']}): {p['mean_diff']:+.4f} [{p['low']:+.4f}, {p['high']:+.4f}] "
              f"n={p['n']}, a better in {p['a_better']}, b in {p['b_better']}, sign p={p['sign_p']:.3g}", flush=True)
    return written


# ------------------------------------------------------------------------------------------------ the experiment
NAME = "sepllm-ablations"
TABLES = ("9", "16", "17")
DESIGNS = ("streaming", "basic", "n2048")


def parser():
    p = experiment_parser(NAME, __doc__.split("\n\n")[0])
    p.add_argument("what", choices=["gsm8k", "needle"], help="gsm8k: Tables 9, 16, 17; needle: Figs. 8-11")
    p.add_argument("--model", default="smollm2-135m", help="kvlab model id")
    p.add_argument("--tables", type=names_list(TABLES, what="table"), default=list(TABLES),
                   help="gsm8k: which of Tables 9, 16, 17 to run")
    p.add_argument("--init", type=positive_int, default=3, help="gsm8k: initial tokens a (Tables 9, 16, 17: 3)")
    p.add_argument("--neighbors", type=positive_int, default=256, help="gsm8k: SepLLM's n (Tables 9, 16, 17: 256)")
    p.add_argument("--problems", type=positive_int, default=1319, help="gsm8k: the first N test problems")
    p.add_argument("--window-heads", type=int_list(1, "head count"), default=[6, 7, 8],
                   help="gsm8k, Table 9: H_s values (sliding heads)")
    p.add_argument("--design", type=names_list(DESIGNS, what="design"), default=["streaming", "basic"],
                   help="needle: basic (Figs. 8-9), n2048 (Figs. 10-11), streaming (App. F's text)")
    p.add_argument("--lengths", type=int_list(64, "length"), default=[1024, 2048, 3072, 4096],
                   help="needle: context lengths in tokens")
    p.add_argument("--depths", type=positive_int, default=16, help="needle: depths evenly spaced in [0.05, 0.95]")
    p.add_argument("--threads", type=positive_int, default=None, help="CPU threads (default: torch's)")
    return p


def check(args) -> None:
    if args.smoke:
        args.problems, args.neighbors, args.lengths, args.depths = 2, 32, [160], 1
        args.tables = args.tables[:1]
    if args.what == "needle" and "n2048" in args.design and max(args.lengths) <= 2048:
        raise ParameterError(f"--design n2048 keeps a 2,048-token window: --lengths must exceed 2048 (got "
                             f"{args.lengths}) for the window to drop anything")


def _gsm8k_tables(args, out, model, tokenizer, base: dict, device: str) -> list:
    from kvlab.eval.gsm8k import load_gsm8k

    problems, exemplars = load_gsm8k(None)
    selected = list(enumerate(problems))[:args.problems]
    sequences = [problem_ids(tokenizer, p, exemplars) for _, p in selected]
    heads = model.config.get_text_config().num_attention_heads
    builders = {
        "16": lambda: separator_choice_methods(tokenizer, sequences, init=args.init, neighbors=args.neighbors),
        "17": lambda: fixed_interval_methods(tokenizer, init=args.init, neighbors=args.neighbors),
        "9": lambda: headwise_methods(tokenizer, sequences, heads, args.window_heads, init=args.init,
                                      neighbors=args.neighbors)}
    written = []
    for k, table in enumerate(args.tables):
        t0 = time.perf_counter()
        methods, pairs = builders[table]()
        skipped = methods.pop("skipped", [])
        if k == 0:  # full attention once, for reference (no pair uses it)
            methods = {"Vanilla": None, **methods}
        print(f"Table {table}: {len(selected)} problems, methods {list(methods)}", flush=True)
        config = {"table": table, "init": args.init, "neighbors": args.neighbors}
        result = compare_on_gsm8k(model, tokenizer, selected, exemplars, methods, pairs, config=config,
                                  device=device, progress=True)
        written += _write(out, f"table{table}_gsm8k_n{args.neighbors}", result,
                          base | config | {"problems": len(selected), "skipped": skipped,
                                           "seconds": time.perf_counter() - t0})
    return written


def _needles(args, out, model, tokenizer, base: dict, device: str) -> list:
    k = args.depths
    depths = [0.5] if k == 1 else [round(0.05 + 0.9 * i / (k - 1), 4) for i in range(k)]
    written = []
    for design in args.design:
        t0 = time.perf_counter()
        result = needle_study(model, tokenizer, needle_policies(tokenizer, design), args.lengths, depths,
                              config={"design": design}, device=device, progress=True)
        written += _write(out, f"needle_{design}", result,
                          base | {"design": design, "lengths": args.lengths, "depths": depths,
                                  "seconds": time.perf_counter() - t0})
    return written


def _stems(args) -> list[str]:
    if args.what == "gsm8k":
        return [f"table{t}_gsm8k_n{args.neighbors}" for t in args.tables]
    return [f"needle_{d}" for d in args.design]


def run(args):
    out = open_out(args, NAME, [stem + records.SUFFIX for stem in _stems(args)])
    device, model, tokenizer = start_model(args)
    label = device_label(device)
    base = {"model": args.model, "device": label, "command": f"python -m kvlab run {NAME} {args.what}"}
    tables = _gsm8k_tables if args.what == "gsm8k" else _needles
    return tables(args, out, model, tokenizer, base, label)
