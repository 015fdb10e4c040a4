"""SepLLM's headline accuracy claims (Table 1: GSM8K-CoT 8-shot and MMLU 5-shot; Table 15: H2O) on a model above the
accuracy floor, with per-example records and paired intervals.

Methods (training-free, Sec. 4.2; a = 3 initial tokens, n = 256 neighbours as in Table 1, the official separator set
of ``kvlab.sepllm.separator_ids``; Table 1's prompts are about 1K tokens, and so are these, so the paper's n binds the
same way on a model whose context is longer than Llama-3's 8K):

* ``Vanilla``: full cache.
* ``SepLLM (n=256)``: initial + every separator + the 256 neighbours (``kvlab.policies.SepLLM``, original positions).
* ``StrmLLM (n=256)``: initial + 256 neighbours (StreamingLLM at the same n).
* ``StrmLLM (n=K, r.KV matched)``: the smallest window whose mean runtime r.KV reaches SepLLM's measured one (Table 1's
  n=380 row): on GSM8K over the same problems (their prompt and generated lengths in the SepLLM run), on MMLU over
  the prompts (the paper reused GSM8K's n=380 there, which kept more than SepLLM on MMLU).
* ``H2O (budget=K+3)``: heavy hitters + recent half, at the matched StreamingLLM's entries (Table 15: H2O's r.KV is
  the n=380 row's 47.54 %), original positions.

GSM8K generation goes through the static decode engine (``gsm8k_generate_static``: every problem one stream, all
streams of a pass in lockstep, CUDA graph), except H2O, which ranks entries by attention scores the static engine
does not record: it runs one problem at a time through the hooks engine, on the first ``--h2o`` problems, until
``--h2o-seconds``. MMLU scores the answer letter's log-likelihood after the subject's 5 exemplars
(``kvlab.experiments.sepllm.mmlu.mmlu_scores``) under each method's prefill pattern.

Writes ``<out>/<stem>.json`` (per method: accuracy, Wilson interval, mean r.KV, seconds; per pair: paired
bootstrap of SepLLM minus the other method) and ``<out>/<stem>.examples.jsonl.gz`` (one record per example, method
and metric; GSM8K records carry the cut output, its stop and the target; ``stem`` defaults to ``table1_<part>``),
both rewritten after every method, so a stopped run keeps what finished. A folder that already holds that records
file is refused: give another ``--out``.

    python -m kvlab run sepllm-headline --part gsm8k --model qwen2.5-coder-0.5b --gsm8k 1319 --h2o 128 --out DIR
    python -m kvlab run sepllm-headline --part mmlu --model qwen2.5-coder-0.5b --mmlu-questions 20 --out DIR
    python -m kvlab run sepllm-headline --part mmlu --model qwen2.5-coder-1.5b --methods vanilla,hw8 \\
        --mmlu-subjects 15 --mmlu-questions 10 --stem table9_mmlu --out DIR     # Table 9 (CPU: about 40 min)
"""

from __future__ import annotations

import argparse
import difflib
import re
import time

import torch

from kvlab.experiments import records
from kvlab.experiments.registry import ParameterError, experiment_parser, positive_int
from kvlab.experiments.sepllm.common import (device_label, nonnegative_int, open_out, positive_float,
                                             smallest_reaching, start_model, write_summary)
from kvlab.experiments.sepllm.gsm8k_matched import records_of

NAME = "sepllm-headline"
INIT, NEIGHBORS = 3, 256
#: --methods beside SepLLM (always run), and the part each belongs to
GSM8K_ONLY = ("h2o", "sep4", "sep2")
MMLU_ONLY = tuple(f"hw{k}" for k in range(1, 65))
BOTH = ("vanilla", "sepllm", "matched", "strm256", "fix4", "fix5")
METHODS = BOTH + GSM8K_ONLY + MMLU_ONLY
#: --smoke: the row's model (its tokenizer before a tiny random model of its architecture, so head counts and token
#: lengths are the full run's); GSM8K on 2 problems; MMLU's methods set over the full run's prompts (their matched
#: windows, hence their names, are the full run's), 2 of the prompts scored
SMOKE = {"gsm8k": {"gsm8k": 2, "shots": 1, "max_new_tokens": 4, "batch": 2, "h2o": 1, "h2o_seconds": 1.0},
         "mmlu": {"mmlu_scored": 2}}


def method_list(text: str) -> list[str]:
    """``--methods``: a comma list of :data:`METHODS`; a misspelt name (``vanila``, ``HW8``) is refused with the
    nearest name, never dropped."""
    items = [t.strip() for t in str(text).split(",") if t.strip()]
    if not items:
        raise argparse.ArgumentTypeError(f"empty list; give one or more of {', '.join(BOTH + GSM8K_ONLY)}, hwK")
    bad = []
    for t in items:
        if t not in METHODS:
            near = difflib.get_close_matches(t.lower(), METHODS, n=1, cutoff=0.5)
            bad.append(f"{t!r}" + (f" (did you mean {near[0]!r}?)" if near else ""))
    if bad:
        raise argparse.ArgumentTypeError(f"unknown method {', '.join(bad)}; the methods are "
                                         f"{', '.join(BOTH + GSM8K_ONLY)} and hwK (K = 1..64)")
    return items


def matched_budget(target: float, lengths: list[tuple[int, int]], lo: int = 1, hi: int = 1 << 16) -> int:
    """Smallest StreamingLLM budget ``k`` (sink + window entries) whose mean runtime r.KV over streams of
    ``(prompt tokens, generated tokens)`` reaches ``target``: a stream holding ``min(seen, k)`` entries after each
    fed generated token (the r.KV ``generate_static`` reports)."""

    def mean_kv(k: int) -> float:
        per = []
        for n, g in lengths:
            steps = range(n, n + g - 1)
            per.append(sum(min(s + 1, k) / (s + 1) for s in steps) / len(steps) if len(steps) else 1.0)
        return sum(per) / len(per)

    return smallest_reaching(mean_kv, target, lo, hi)


class Run:
    """Records and summary of one run, both rewritten after every method (a stopped run keeps what finished)."""

    def __init__(self, out, stem: str, meta: dict, device: str):
        self.out, self.stem, self.device = out, stem, device
        self.meta, self.methods, self.pairs, self.records = meta, {}, [], []

    def add(self, ids: list[str], method: str, metric: str, values: list, config: dict, **extra) -> None:
        self.records += records_of(ids, method, metric, values, config, self.device, **extra)

    def save(self) -> list:
        written = [records.write(self.stem + records.SUFFIX, self.records, out=self.out)]
        written.append(write_summary(self.out, self.stem + ".json",
                                     dict(self.meta, methods=self.methods, pairs=self.pairs)))
        return written


def _accuracy(hits: list[bool]) -> dict:
    from kvlab.eval.stats import proportion_interval

    ci = proportion_interval(int(sum(hits)), len(hits))
    return {"n": len(hits), "accuracy": 100 * ci.estimate, "low": 100 * ci.low, "high": 100 * ci.high}


def _pair(run: Run, metric: str, a: str, b: str, x: list, y: list) -> None:
    from kvlab.eval.stats import paired_bootstrap

    d = paired_bootstrap([float(v) for v in x], [float(v) for v in y])
    run.pairs.append({"metric": metric, "a": a, "b": b, "mean_diff": 100 * d.estimate, "low": 100 * d.low,
                      "high": 100 * d.high, "n": d.n, "unit": "accuracy points"})
    print(f"  {a} - {b} ({metric}): {100 * d.estimate:+.2f} [{100 * d.low:+.2f}, {100 * d.high:+.2f}] n={d.n}",
          flush=True)


def _generate_hooks(model, tokenizer, problems, exemplars, policy, name, args, t0):
    """One problem at a time through the hooks engine, stopped after the problem that passes ``--h2o-seconds``."""
    from kvlab.eval.gsm8k import gsm8k_generate

    r, deadline = None, t0 + args.h2o_seconds
    for p in problems:
        step = gsm8k_generate(model, tokenizer, [p], exemplars, policy=policy, max_new_tokens=args.max_new_tokens,
                              name=name, progress=False)
        if r is None:
            r = step
        else:
            for field in ("flexible", "strict", "kv_ratio", "generations", "stops", "raw"):
                getattr(r, field).extend(getattr(step, field))
        if time.perf_counter() > deadline:
            break
    return r


class Gsm8kRun:
    """GSM8K-CoT generation of each method on the same problems: records, summary and results by method name."""

    def __init__(self, run: Run, model, tokenizer, problems, exemplars, args):
        self.run, self.model, self.tokenizer, self.args = run, model, tokenizer, args
        self.problems, self.exemplars = problems, exemplars
        self.ids = [f"gsm8k-test-{i:04d}" for i in range(len(problems))]
        self.targets = [p["answer"].split("####")[-1].strip() for p in problems]
        self.results = {}

    def one(self, name: str, policy, *, static: bool = True, subset=None) -> None:
        from kvlab.eval.gsm8k import gsm8k_generate_static

        t0 = time.perf_counter()
        chosen = self.problems if subset is None else self.problems[:subset]
        if static:
            r = gsm8k_generate_static(self.model, self.tokenizer, chosen, self.exemplars, policy,
                                      max_new_tokens=self.args.max_new_tokens, batch=self.args.batch, name=name,
                                      progress=False)
        else:
            r = _generate_hooks(self.model, self.tokenizer, chosen, self.exemplars, policy, name, self.args, t0)
        self._record(name, policy, r, time.perf_counter() - t0, "static" if static else "hooks")

    def _record(self, name, policy, r, seconds, engine) -> None:
        n = len(r.flexible)
        config = {"init": INIT, "neighbors": NEIGHBORS, "policy": repr(policy), "shots": len(self.exemplars),
                  "max_new_tokens": self.args.max_new_tokens, "engine": engine}
        ids = self.ids[:n]
        self.run.add(ids, name, "flexible_match", r.flexible, config, output=r.generations, stop=r.stops,
                     target=self.targets[:n])
        self.run.add(ids, name, "strict_match", r.strict, config)
        self.run.add(ids, name, "r_kv", r.kv_ratio, config)
        generated = sum(len(self.tokenizer(x, add_special_tokens=False).input_ids) for x in r.raw)
        self.run.methods[f"gsm8k/{name}"] = {
            "flexible": _accuracy(r.flexible), "strict": _accuracy(r.strict), "mean_r_kv": r.mean_kv_ratio,
            "seconds": seconds, "generated_tokens": generated, "tokens_per_s": generated / seconds,
            "policy": repr(policy), "engine": engine, "stops": {s: r.stops.count(s) for s in sorted(set(r.stops))}}
        self.results[name] = r
        print(f"gsm8k {name}: flexible {r.flexible_accuracy:.1f} strict {r.strict_accuracy:.1f} r.KV "
              f"{r.mean_kv_ratio:.1f} % n={n} ({seconds:.0f} s, {generated / seconds:.0f} generated tok/s)", flush=True)
        for text, stop in list(zip(r.generations, r.stops))[:2]:
            print(f"    [{stop!r}] {text[-160:]!r}", flush=True)
        self.run.save()

    def matched_budget(self, sep: str) -> int:
        """The StreamingLLM budget whose runtime r.KV over these problems reaches SepLLM's measured one."""
        prefix = len(self.tokenizer(_exemplar_text(self.exemplars)).input_ids)
        lengths = [(prefix + len(self.tokenizer(f"Q: {p['question']}\nA:", add_special_tokens=False).input_ids),
                    max(len(self.tokenizer(x, add_special_tokens=False).input_ids), 1))
                   for p, x in zip(self.problems, self.results[sep].raw)]
        return matched_budget(self.results[sep].mean_kv_ratio / 100, lengths, lo=INIT + 1)  # a window of >= 1

    def pair(self, a: str, b: str, n: int | None = None) -> None:
        for metric in ("flexible", "strict"):
            x = getattr(self.results[a], metric)
            y = getattr(self.results[b], metric)
            _pair(self.run, f"gsm8k_{metric}", a, b, x[:len(y)] if n else x, y)


def gsm8k_methods(run: Run, model, tokenizer, problems, exemplars, separators, args) -> dict:
    from kvlab.policies import H2O, FixLLM, Full, SepLLM, StreamingLLM
    from kvlab.sepllm.separators import SEPARATOR_SETS, separator_ids

    g = Gsm8kRun(run, model, tokenizer, problems, exemplars, args)
    want = set(args.methods)
    sep = f"SepLLM (n={NEIGHBORS})"
    if "vanilla" in want:
        g.one("Vanilla", Full())
    g.one(sep, SepLLM(INIT, NEIGHBORS, separators=separators))  # every pair is read against it
    budget = g.matched_budget(sep)
    matched = f"StrmLLM (n={budget - INIT + 1}, r.KV matched)"  # n counts the query, as in n=256: 255 kept
    run.meta["matched_budget"] = budget
    strm = f"StrmLLM (n={NEIGHBORS})"
    four, two = f"SepLLM . , ? ; (n={NEIGHBORS})", f"SepLLM . ? (n={NEIGHBORS})"
    later = {"matched": (matched, lambda: StreamingLLM(sink=INIT, window=budget - INIT, positions="original")),
             "strm256": (strm, lambda: StreamingLLM(sink=INIT, window=NEIGHBORS - 1, positions="original")),
             # Table 16: four common separators, then only ". ?" (the official sets of kvlab.sepllm.separators)
             "sep4": (four, lambda: SepLLM(INIT, NEIGHBORS, separators=separator_ids(tokenizer, SEPARATOR_SETS["4"]))),
             "sep2": (two, lambda: SepLLM(INIT, NEIGHBORS, separators=separator_ids(tokenizer, SEPARATOR_SETS["2"]))),
             # Table 17: FixLLM, one kept entry every 4 or 5 positions instead of the separators
             "fix4": ("FixLLM (interval=4, n=256)", lambda: FixLLM(INIT, NEIGHBORS, 4)),
             "fix5": ("FixLLM (interval=5, n=256)", lambda: FixLLM(INIT, NEIGHBORS, 5))}
    for key, (name, make) in later.items():
        if key in want:
            g.one(name, make())
    pairs = [(sep, other) for other in g.results if other != sep]
    pairs += [(a, b) for a, b in ((four, two), (two, strm), (four, matched)) if a in g.results and b in g.results]
    for a, b in pairs:
        g.pair(a, b)
    run.save()
    if args.h2o and "h2o" in want:
        name = f"H2O (budget={budget})"
        g.one(name, H2O(budget, positions="original"), static=False, subset=args.h2o)
        g.pair(sep, name, n=len(g.results[name].flexible))
        run.save()
    return {"budget": budget}


def _exemplar_text(exemplars) -> str:
    from kvlab.eval.gsm8k import cot_prompt

    return cot_prompt("", exemplars).rsplit("Q: ", 1)[0]


def mmlu_patterns(run: Run, model, tokenizer, prompts, separators, args) -> dict:
    """``{name: prefill pattern or None}`` of every MMLU method asked for, SepLLM always among them."""
    from kvlab.experiments.sepllm.ablations import headwise_methods
    from kvlab.experiments.sepllm.gsm8k_matched import matched_window
    from kvlab.sepllm.pattern import FixLLMPattern, SepLLMPattern, StreamingPattern, kv_ratio

    neighbors = args.neighbors
    sep = f"SepLLM (n={neighbors})"
    sep_pattern = SepLLMPattern(separators, INIT, neighbors)
    # the window whose mean kept share over the prompts (every 4th, for speed) reaches SepLLM's: r.KV matched on MMLU
    # itself (the paper reused GSM8K's n=380, which kept more on MMLU: 52.5 % vs SepLLM's 44.6 %)
    sequences = [tokenizer(p.text, return_tensors="pt").input_ids for p in prompts[::4]]
    target = sum(kv_ratio(sep_pattern, x) for x in sequences) / len(sequences)
    want = set(args.methods)
    methods = {"Vanilla": None} if "vanilla" in want else {}
    methods[sep] = sep_pattern
    if "matched" in want:
        window = matched_window(lambda k: StreamingPattern(INIT, k), target, sequences)
        run.meta["mmlu_matched_neighbors"] = window
        methods[f"StrmLLM (n={window}, r.KV matched)"] = StreamingPattern(INIT, window)
    if "strm256" in want:
        methods[f"StrmLLM (n={neighbors})"] = StreamingPattern(INIT, neighbors)
    # Table 9: H_s of the model's query heads slide a window matched to SepLLM's r.KV, the rest see everything
    window_heads = sorted(int(m[2:]) for m in want if m in MMLU_ONLY)
    if window_heads:
        heads = model.config.num_attention_heads
        found, _ = headwise_methods(tokenizer, sequences, heads, window_heads, init=INIT, neighbors=neighbors)
        run.meta["mmlu_headwise_skipped"] = found.pop("skipped", [])
        methods |= {name: pattern for name, pattern in found.items() if name != sep}
    # Table 17's MMLU half: FixLLM, one kept key every 4 or 5 positions instead of the separators
    methods |= {f"FixLLM (interval={d}, n={neighbors})": FixLLMPattern(INIT, neighbors, d)
                for d in (4, 5) if f"fix{d}" in want}
    return methods


def mmlu_methods(run: Run, model, tokenizer, separators, args) -> None:
    from kvlab.experiments.sepllm.mmlu import mmlu_prompts, mmlu_scores

    prompts = mmlu_prompts(subjects=args.mmlu_subjects, questions=args.mmlu_questions, shots=args.mmlu_shots)
    sep = f"SepLLM (n={args.neighbors})"
    hits = {}
    patterns = mmlu_patterns(run, model, tokenizer, prompts, separators, args)  # set over every prompt
    if 0 < (args.mmlu_scored or 0) < len(prompts):
        prompts = prompts[:args.mmlu_scored]
        run.meta["mmlu_scored"] = len(prompts)
    for name, pattern in patterns.items():
        t0 = time.perf_counter()
        rows = mmlu_scores(model, tokenizer, prompts, pattern)
        ids = [f"mmlu-{r['subject']}-{r['index']:04d}" for r in rows]
        config = {"init": INIT, "neighbors": args.neighbors, "pattern": repr(pattern), "shots": args.mmlu_shots}
        run.add(ids, name, "mmlu_correct", [r["correct"] for r in rows], config, pred=[r["pred"] for r in rows],
                gold=[r["gold"] for r in rows])
        run.add(ids, name, "r_kv", [r["r_kv"] for r in rows], config)
        hits[name] = [r["correct"] for r in rows]
        mean_kv = 100 * sum(r["r_kv"] for r in rows) / len(rows)
        run.methods[f"mmlu/{name}"] = {"accuracy": _accuracy(hits[name]), "mean_r_kv": mean_kv,
                                       "seconds": time.perf_counter() - t0, "pattern": repr(pattern)}
        print(f"mmlu {name}: {100 * sum(hits[name]) / len(rows):.1f} % r.KV {mean_kv:.1f} % n={len(rows)} "
              f"({time.perf_counter() - t0:.0f} s)", flush=True)
        run.save()
    for other in [m for m in hits if m != sep]:
        _pair(run, "mmlu", sep, other, hits[sep], hits[other])


# ------------------------------------------------------------------------------------------------ the experiment
def parser():
    p = experiment_parser(NAME, __doc__.split("\n\n")[0])
    p.add_argument("--part", choices=["gsm8k", "mmlu"], required=True, help="the GSM8K or the MMLU half of Table 1 "
                   "(two processes: they share a GPU, the hooks-engine MMLU barely loads it)")
    p.add_argument("--model", default="qwen2.5-coder-0.5b", help="kvlab model id")
    p.add_argument("--gsm8k", type=positive_int, default=1319, help="GSM8K: the first N test problems (1319: all)")
    p.add_argument("--shots", type=positive_int, default=8, help="GSM8K exemplars (the paper: 8; at most 8)")
    p.add_argument("--max-new-tokens", type=positive_int, default=256, help="lm-eval's max_gen_toks: 256")
    p.add_argument("--batch", type=positive_int, default=1319, help="GSM8K streams a pass of the static engine")
    p.add_argument("--mmlu-subjects", type=positive_int, default=57, help="MMLU subjects spread over the 57")
    p.add_argument("--mmlu-questions", type=positive_int, default=20, help="scored questions per subject")
    p.add_argument("--mmlu-shots", type=nonnegative_int, default=5, help="MMLU exemplars per prompt (the paper: 5)")
    p.add_argument("--mmlu-scored", type=nonnegative_int, default=None, help="MMLU: score only the first N "
                   "prompts (0 or unset: all); the methods' matched windows are still set over all of them "
                   "(--smoke: 2)")
    p.add_argument("--h2o", type=nonnegative_int, default=128, help="H2O: the first N problems (0: skip)")
    p.add_argument("--h2o-seconds", type=positive_float, default=90.0,
                   help="H2O stops after the problem that passes this")
    p.add_argument("--methods", type=method_list, default=None,
                   help="methods beside SepLLM (always run; default vanilla,matched,strm256 and, for GSM8K, h2o): vanilla, matched, strm256, h2o (Tables 1, 15; h2o GSM8K "
                        "only); sep4, sep2 (Table 16, GSM8K only: four and two separators); fix4, fix5 (Table 17: "
                        "FixLLM); hwK (Table 9, MMLU only: K query heads slide a window matched to SepLLM's r.KV, "
                        "e.g. hw8 for 8 of Qwen2.5-1.5B's 12, the paper's H_s = 20 of 32 rounded up)")
    p.add_argument("--neighbors", type=positive_int, default=NEIGHBORS, help="MMLU only: SepLLM's n (the paper: "
                   "256; 96 reaches the paper's Table 9 r.KV of about 45 %% on these prompts with Qwen's tokenizer)")
    p.add_argument("--stem", default=None, help="results file stem (default table1_<part>)")
    p.add_argument("--threads", type=nonnegative_int, default=0, help="CPU threads (0: torch's default)")
    return p


def check(args) -> None:
    """Every option, before a model loads: a method of the other part, a count out of range or a GSM8K
    ``--neighbors`` is refused, never ignored."""
    if args.smoke:
        for key, value in SMOKE[args.part].items():
            setattr(args, key, value)
    args.stem = args.stem or f"table1_{args.part}"
    if args.methods is None:
        args.methods = ["vanilla", "sepllm", "matched", "strm256"] + (["h2o"] if args.part == "gsm8k" else [])
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", args.stem):
        raise ParameterError(f"--stem {args.stem!r}: use letters, digits, '.', '_' and '-' (it names a file)")
    other = MMLU_ONLY if args.part == "gsm8k" else GSM8K_ONLY
    wrong = [m for m in args.methods if m in other]
    if wrong:
        raise ParameterError(f"--methods {','.join(wrong)}: not a method of --part {args.part} (h2o, sep4 and sep2 "
                             "are GSM8K's; hwK is MMLU's)")
    if args.part == "gsm8k" and args.neighbors != NEIGHBORS:
        raise ParameterError(f"--neighbors applies to --part mmlu; GSM8K runs the paper's n = {NEIGHBORS}")
    if args.part == "gsm8k" and args.mmlu_scored is not None:
        raise ParameterError("--mmlu-scored applies to --part mmlu")
    if args.shots > 8:
        raise ParameterError(f"--shots {args.shots}: lm-eval's gsm8k-cot has 8 exemplars; give 1 to 8")
    if args.mmlu_subjects > 57:
        raise ParameterError(f"--mmlu-subjects {args.mmlu_subjects}: MMLU has 57 subjects; give 1 to 57")


def run(args):
    from kvlab.eval.gsm8k import load_gsm8k
    from kvlab.sepllm.separators import separator_ids

    out = open_out(args, NAME, [args.stem + records.SUFFIX])
    started = time.perf_counter()
    device, model, tokenizer = start_model(args)
    separators = separator_ids(tokenizer)
    label = device_label(device)
    planned = ({"gsm8k": args.gsm8k, "h2o": args.h2o} if args.part == "gsm8k"
               else {"mmlu": args.mmlu_subjects * args.mmlu_questions})
    run = Run(out, args.stem, {
        "model": args.model, "device": label, "dtype": str(next(model.parameters()).dtype), "init": INIT,
        "neighbors": args.neighbors, "separators": len(separators), "methods": ",".join(args.methods),
        "planned": planned, "command": f"python -m kvlab run {NAME} " + " ".join(_argv(args))}, label)
    print(f"{args.model} on {label}: {len(separators)} separator ids; planned n: {planned}", flush=True)
    if args.part == "gsm8k":
        problems, exemplars = load_gsm8k(args.gsm8k)
        gsm8k_methods(run, model, tokenizer, problems, exemplars[:args.shots], separators, args)
    else:
        mmlu_methods(run, model, tokenizer, separators, args)
    run.meta["seconds"] = time.perf_counter() - started
    written = run.save()
    print(f"wrote {written[-1]} ({run.meta['seconds']:.0f} s)")
    return written


def _argv(args) -> list[str]:
    from kvlab.experiments.registry import config_argv

    keep = {k: v for k, v in vars(args).items() if k not in ("out", "device")}
    return config_argv(keep)
