"""LaCache's Fig. 3 as a paired test: the ladder against the best of many random KV patterns of the same size, the
best one chosen on some text windows and scored on other ones.

    python -m kvlab run lacache-pareto --out DIR [--sizes 64,128,256 --per-family 20 --selection 4
        --heldout 30 --claim-size 128]

Fig. 3 of the paper plots perplexity against cache size for the ladder and over 1,500 random per-layer patterns and
finds the ladder "on the Pareto optimality boundary". Picking the best random pattern and reading its perplexity on
the same text favours it (it was chosen because it did well there); this driver separates the two:

1. ``plan.json`` is written first: every parameter, the windows (token ranges) of both sets and the planned n;
2. **selection**: for each size in ``--sizes``, ``--per-family`` random patterns of each family of
   :func:`kvlab.lacache.coverage.random_patterns` (one generator seeded with ``--seed`` across the sizes, as
   notebook 05 draws them); each is scored by :func:`kvlab.lacache.coverage.pattern_perplexity` on the
   ``--selection`` first windows of the text (one window: ``--context`` tokens of context whose full cache is cut to
   the pattern, then ``--continuation`` tokens scored); the pattern with the lowest mean log-perplexity over those
   windows is the size's *best random* pattern (``selection.json`` keeps every score and the chosen patterns);
3. **held-out**: on the next ``--heldout`` windows (disjoint from the selection ones; ``--heldout-start K`` starts
   them at window K instead, so that a re-run scores fresh text) the ladder, the best random
   pattern and StreamingLLM of each size are scored; one record per (window, method) in ``pareto.examples.jsonl.gz``,
   metric ``window_nll`` = mean NLL per token of the window's continuation (``log`` of the perplexity
   :func:`~kvlab.lacache.coverage.pattern_perplexity` returns);
4. ``summary.json``: the plan, the selection and the held-out means with the paired 95 % bootstrap interval of
   ``ladder - best random`` (:func:`kvlab.eval.paired_bootstrap`, as the claims ledger computes it).

The ladder is the state a ``LaCache(size, span, overlap)`` cache (the paper's bands, notebook 05's defaults S = 8,
O = 4) holds after streaming the context one token at a time (:func:`kvlab.lacache.coverage.simulate`); it holds a
few entries per layer fewer than ``size`` at 128 and 256 (footnote 1's whole ladders), which can only hurt it.
Windows already in ``pareto.examples.jsonl.gz`` are skipped and a ``selection.json`` of the same plan is reused, so an
interrupted run resumes (another plan in the same ``--out`` is refused). Every option is checked before the model loads.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

from kvlab.experiments import records, registry

NAME = "lacache-pareto"
RECORDS = "pareto" + records.SUFFIX
RANDOM_FAMILIES = ("window+block", "scattered", "window+strided")
METRIC = "window_nll"
# --smoke keeps --sizes (a ledger row's methods are named by size) and shrinks the rest: a context just longer than
# the largest size, one random pattern per family, one selection and two held-out windows
SMOKE = dict(continuation=8, per_family=1, selection=1, heldout=2)


def plan(args) -> dict:
    """Every setting of the run and the windows of both sets, fixed before any model call."""
    sizes = list(args.sizes)
    if args.claim_size not in sizes:
        raise registry.ParameterError(f"--claim-size {args.claim_size} is not one of --sizes {sizes}: name one of "
                                      "them (the size whose comparison is the claim)")
    first_heldout = args.selection if args.heldout_start is None else args.heldout_start
    if first_heldout < args.selection:
        raise registry.ParameterError(
            f"--heldout-start {first_heldout} falls on the selection windows 0-{args.selection - 1}: the held-out "
            f"windows must be others than the ones the best random pattern is chosen on (give >= {args.selection})")
    need = args.context + args.continuation
    windows = lambda first, count: [{"example": window_id(args.corpus, args.context, first + k),
                                     "tokens": [(first + k) * need, (first + k + 1) * need]} for k in range(count)]
    return {"model": args.model, "dtype": "float32", "corpus": args.corpus, "context": args.context,
            "continuation": args.continuation, "scored_tokens": args.continuation - 1, "sizes": sizes,
            "claim_size": args.claim_size, "per_family": args.per_family, "families": list(RANDOM_FAMILIES),
            "random_patterns_per_size": args.per_family * len(RANDOM_FAMILIES), "sink": args.sink,
            "ladder": {"policy": f"LaCache(size, span={args.span}, overlap={args.overlap}) (bands)",
                       "span": args.span, "overlap": args.overlap},
            "streamingllm": f"StreamingLLM(sink={args.sink}, cache_size=size)",
            "seed": args.seed, "selection_windows": windows(0, args.selection),
            "heldout_windows": windows(first_heldout, args.heldout), "planned_n": args.heldout,
            "selection_rule": "lowest mean log-perplexity over the selection windows among the random patterns of "
                              "one size", "metric": METRIC}


def window_id(corpus: str, context: int, index: int) -> str:
    return f"{corpus}-c{context}-w{index:03d}"


def method_names(size: int) -> dict[str, str]:
    return {"ladder": f"ladder-{size}", "best_random": f"best-random-{size}", "streamingllm": f"streamingllm-{size}"}


def candidates(num_layers: int, p: dict) -> dict[int, dict]:
    """Per size: the random patterns (with their family), the ladder's and StreamingLLM's kept positions."""
    import torch

    from kvlab.lacache import LaCache
    from kvlab.lacache.coverage import random_patterns, simulate
    from kvlab.policies import StreamingLLM

    gen = torch.Generator().manual_seed(p["seed"])
    out = {}
    for size in p["sizes"]:
        drawn = random_patterns(num_layers, p["context"], size, p["random_patterns_per_size"], sink=p["sink"],
                                generator=gen)
        ladder = simulate(LaCache(size, p["ladder"]["span"], p["ladder"]["overlap"]), num_layers, p["context"]).kept
        stream = simulate(StreamingLLM(sink=p["sink"], cache_size=size), num_layers, p["context"]).kept
        out[size] = {"random": drawn, "ladder": ladder, "streamingllm": stream}
    return out


def entries(pattern) -> float:
    """Mean kept entries per layer of a per-layer pattern."""
    return sum(len(x) for x in pattern) / len(pattern)


def _window_ids(ids, window: dict):
    lo, hi = window["tokens"]
    return ids[:, lo:hi]


def select(model, ids, p: dict, cands: dict[int, dict]) -> dict:
    """Score every random pattern (and, for reference, the ladder and StreamingLLM) on the selection windows and
    pick each size's best random pattern."""
    from kvlab.lacache.coverage import pattern_perplexity

    flat = []  # (size, name, pattern)
    for size, c in cands.items():
        flat += [(size, f"random{i:03d}:{fam}", pat) for i, (fam, pat) in enumerate(c["random"])]
        flat += [(size, "ladder", c["ladder"]), (size, "streamingllm", c["streamingllm"])]
    begin = time.perf_counter()
    per_window = []
    for w in p["selection_windows"]:
        ppl = pattern_perplexity(model, _window_ids(ids, w), p["context"], [x[2] for x in flat])
        per_window.append(ppl.log().tolist())
        print(f"selection {w['example']}: {len(flat)} patterns, {time.perf_counter() - begin:.0f} s", flush=True)
    out = {"seconds": round(time.perf_counter() - begin, 1), "sizes": {}}
    for size in cands:
        rows = []
        for k, (s, name, pat) in enumerate(flat):
            if s == size:
                nll = [pw[k] for pw in per_window]
                rows.append({"pattern": name, "entries": entries(pat), "selection_nll": sum(nll) / len(nll),
                             "per_window": nll})
        random_rows = [r for r in rows if r["pattern"].startswith("random")]
        best = min(random_rows, key=lambda r: r["selection_nll"])
        index = int(best["pattern"][6:9])
        ladder = next(r for r in rows if r["pattern"] == "ladder")
        out["sizes"][str(size)] = {
            "best_random": best["pattern"], "best_random_index": index,
            "best_per_family": {f: min((r for r in random_rows if r["pattern"].endswith(f)),
                                       key=lambda r: r["selection_nll"])["pattern"] for f in RANDOM_FAMILIES},
            "random_better_than_ladder": sum(r["selection_nll"] < ladder["selection_nll"] for r in random_rows),
            "random": len(random_rows), "scores": rows,
            "best_random_pattern": [x.tolist() for x in cands[size]["random"][index][1]]}
    return out


def heldout(model, ids, p: dict, cands: dict[int, dict], chosen: dict, out, device: str) -> Path:
    """Score the ladder, the best random pattern and StreamingLLM of every size on each held-out window: one record
    per (window, method) in ``RECORDS`` (inside ``out``, an OutputFolder), the windows already there kept and
    skipped."""
    from kvlab.lacache.coverage import pattern_perplexity

    jobs = []  # (size, role, pattern, config)
    for size, c in cands.items():
        info = chosen["sizes"][str(size)]
        best = c["random"][info["best_random_index"]]
        jobs += [(size, "ladder", c["ladder"], {"pattern": p["ladder"]["policy"].replace("size", str(size))}),
                 (size, "best_random", best[1], {"pattern": info["best_random"], "family": best[0],
                                                 "selected_from": p["random_patterns_per_size"]}),
                 (size, "streamingllm", c["streamingllm"], {"pattern": p["streamingllm"].replace("size", str(size))})]
    with records.RecordWriter(RECORDS, keep=True, out=out) as writer:
        done = {example for example, _, _ in writer.done()}
        for w in p["heldout_windows"]:
            if w["example"] in done:
                continue
            begin = time.perf_counter()
            nll = pattern_perplexity(model, _window_ids(ids, w), p["context"], [j[2] for j in jobs]).log().tolist()
            seconds = round(time.perf_counter() - begin, 1)
            for (size, role, pattern, extra), value in zip(jobs, nll):
                config = {"size": size, "entries_per_layer": round(entries(pattern), 2), **extra,
                          "tokens": w["tokens"], "context": p["context"], "continuation": p["continuation"],
                          "seconds_window": seconds}
                writer.add(records.record(w["example"], method_names(size)[role], METRIC, value, config=config,
                                          device=device))
            print(f"held-out {w['example']}: " + ", ".join(
                f"{method_names(s)[r]} {v:.4f}" for (s, r, _, _), v in zip(jobs, nll)) + f" ({seconds} s)", flush=True)
    return writer.path


def summarise(p: dict, chosen: dict, path: Path) -> dict:
    """The held-out means per method and the paired interval of ladder - best random (and - StreamingLLM)."""
    import numpy as np

    from kvlab.eval import paired_bootstrap

    recs = records.read(path)
    values: dict[str, dict[str, float]] = {}
    for r in recs:
        values.setdefault(r["method"], {})[r["example"]] = r["value"]
    sizes = {}
    for size in p["sizes"]:
        m = method_names(size)
        ladder = values.get(m["ladder"], {})
        out = {"selection": {k: v for k, v in chosen["sizes"][str(size)].items() if k not in ("scores",
                                                                                               "best_random_pattern")},
               "heldout_mean_nll": {}}
        for role, name in m.items():
            if name in values:
                out["heldout_mean_nll"][name] = float(np.mean(list(values[name].values())))
        for role in ("best_random", "streamingllm"):
            other = values.get(m[role], {})
            common = sorted(set(ladder) & set(other))
            if common:
                a, b = np.array([ladder[e] for e in common]), np.array([other[e] for e in common])
                iv = paired_bootstrap(a, b, resamples=10_000, seed=0)
                out[f"ladder_minus_{role}"] = {"n": len(common), "estimate": iv.estimate, "ci_low": iv.low,
                                               "ci_high": iv.high, "ladder_lower": int(np.sum(a < b)),
                                               "sd": float(np.std(a - b, ddof=1)) if len(common) > 1 else None}
        sizes[str(size)] = out
    return {"plan": p, "selection_seconds": chosen["seconds"], "sizes": sizes}


def _device_line() -> str:
    import torch

    cpu = platform.processor() or platform.machine()
    return f"cpu ({cpu}), torch {torch.__version__}, threads {torch.get_num_threads()}"


def _model_and_ids(p: dict, device: str = "cpu"):
    import torch

    torch.set_num_threads(1)
    import kvlab
    from kvlab.datasets import load_text

    model, tok = kvlab.load_model(p["model"], device=device, dtype="float32")
    end = p["heldout_windows"][-1]["tokens"][1] if p["heldout_windows"] else p["selection_windows"][-1]["tokens"][1]
    ids = tok(load_text(p["corpus"])[: 8 * end], return_tensors="pt").input_ids
    if ids.shape[1] < end:
        raise ValueError(f"{p['corpus']} has fewer than {end} tokens in its first {8 * end} characters")
    return model, ids


def check(args) -> None:
    """Every option before the model loads: the smoke sizes, the plan (``--claim-size`` among ``--sizes``), the
    ladder's span and overlap."""
    if args.smoke:
        for key, value in SMOKE.items():
            setattr(args, key, value)
        args.context = max(args.sizes) + 32
    if args.overlap >= args.span:
        raise registry.ParameterError(f"--overlap {args.overlap} must be below --span {args.span} (a ladder's band "
                                      "overlaps the next by fewer layers than it spans)")
    if args.continuation < 2:
        raise registry.ParameterError(f"--continuation {args.continuation}: at least 2 tokens (one is scored per "
                                      "token after the first)")
    args.plan = plan(args)
    _check_ladders(args)


def _check_ladders(args) -> None:
    """Each size's ladder fits the model's layers (read from its converted config, when there is one)."""
    from kvlab.lacache import LaCache
    from kvlab.models import converted_path

    try:
        layers = json.loads((converted_path(args.model) / "config.json").read_text())["num_hidden_layers"]
    except (OSError, ValueError, KeyError):
        return  # no local config: the model's load checks it
    for size in args.sizes:
        try:
            LaCache(size, args.span, args.overlap).check_model(layers)
        except ValueError as e:
            raise registry.ParameterError(f"--sizes {size} with --span {args.span} --overlap {args.overlap}: {e}") \
                from None


def run(args, load=_model_and_ids) -> list[Path]:
    from kvlab.outputs import OutputFolder

    if not hasattr(args, "plan"):
        check(args)
    p = args.plan
    out = OutputFolder(args.out, f"python -m kvlab run {NAME}")
    plan_path = out.root / "plan.json"
    if plan_path.exists() and _read_json(plan_path, "plan") != p:
        raise registry.ParameterError(f"{plan_path} holds another plan; give a new --out (a plan is fixed before "
                                      "its run)")
    out.claim("plan.json").write_text(json.dumps(p, indent=1) + "\n")
    device = "cpu" if args.device in ("auto", "cpu") else args.device
    model, ids = load(p, device)
    device_line = _device_line() if device == "cpu" else device
    cands = candidates(model.config.num_hidden_layers, p)
    sel_path = out.root / "selection.json"
    if sel_path.exists():
        chosen = _read_json(sel_path, "selection")
    else:
        chosen = select(model, ids, p, cands)
        chosen["device"] = device_line
        out.claim("selection.json").write_text(json.dumps(chosen) + "\n")
    for size in p["sizes"]:
        info = chosen["sizes"][str(size)]
        print(f"size {size}: best random {info['best_random']} (ladder beaten by {info['random_better_than_ladder']}"
              f" of {info['random']} on the selection windows)", flush=True)
    begin = time.perf_counter()
    path = heldout(model, ids, p, cands, chosen, out, device_line)
    summary = summarise(p, chosen, path)
    summary["device"] = device_line
    summary["heldout_seconds_this_call"] = round(time.perf_counter() - begin, 1)
    out.claim("summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    for size, s in summary["sizes"].items():
        d = s.get("ladder_minus_best_random")
        if d:
            print(f"size {size}: ladder - best random = {d['estimate']:+.4f} nats [{d['ci_low']:+.4f}, "
                  f"{d['ci_high']:+.4f}], n = {d['n']}, ladder lower on {d['ladder_lower']}")
    return [path, plan_path, sel_path, out.root / "summary.json"]


def _read_json(path: Path, what: str):
    """A file of an earlier call in this --out (the plan, the selection), or a ParameterError naming it."""
    try:
        return json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise registry.ParameterError(f"{path} is not the JSON {what} an earlier run wrote ({e}): an edited or damaged "
                                      "file; give a new --out, or empty this one to start again") from None


def _sizes(text: str) -> list[int]:
    sizes = [registry.positive_int(t) for t in str(text).split(",") if t.strip()]
    if not sizes:
        raise argparse.ArgumentTypeError(f"{text!r} names no size; give e.g. 64,128,256")
    return sizes


def _non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} must be >= 0")
    return value


def parser() -> argparse.ArgumentParser:
    a = registry.experiment_parser(NAME, __doc__.split("\n\n")[0])
    pos = registry.positive_int
    a.add_argument("--model", default="smollm2-135m")
    a.add_argument("--corpus", default="wikitext")
    a.add_argument("--context", type=pos, default=1024)
    a.add_argument("--continuation", type=pos, default=128)
    a.add_argument("--sizes", type=_sizes, default=[64, 128, 256])
    a.add_argument("--claim-size", type=pos, default=128)
    a.add_argument("--per-family", type=pos, default=20)
    a.add_argument("--selection", type=pos, default=4)
    a.add_argument("--heldout", type=pos, default=30)
    a.add_argument("--heldout-start", type=_non_negative, default=None,
                   help="index of the first held-out window (default: right after the selection windows); a re-run "
                        "on fresh windows starts past the earlier run's last one")
    a.add_argument("--span", type=pos, default=8)
    a.add_argument("--overlap", type=_non_negative, default=4)
    a.add_argument("--sink", type=_non_negative, default=4)
    a.add_argument("--seed", type=_non_negative, default=0)
    return a
