"""LaCache's Fig. 3 as a paired test: the ladder against the best of many random KV patterns of the same size, the
best one chosen on some text windows and scored on other ones.

    python benchmarks/lacache_pareto_claim.py --out DIR [--sizes 64,128,256 --per-family 20 --selection 4
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
3. **held-out**: on the next ``--heldout`` windows (disjoint from the selection ones) the ladder, the best random
   pattern and StreamingLLM of each size are scored; one record per (window, method) in ``pareto.examples.jsonl``,
   metric ``window_nll`` = mean NLL per token of the window's continuation (``log`` of the perplexity
   :func:`~kvlab.lacache.coverage.pattern_perplexity` returns);
4. ``summary.json``: the plan, the selection and the held-out means with the paired 95 % bootstrap interval of
   ``ladder - best random`` (:func:`kvlab.eval.paired_bootstrap`, as the claims ledger computes it).

The ladder is the state a ``LaCache(size, span, overlap)`` cache (the paper's bands, notebook 05's defaults S = 8,
O = 4) holds after streaming the context one token at a time (:func:`kvlab.lacache.coverage.simulate`); it holds a
few entries per layer fewer than ``size`` at 128 and 256 (footnote 1's whole ladders), which can only hurt it.
Windows already in ``pareto.examples.jsonl`` are skipped and a ``selection.json`` of the same plan is reused, so an
interrupted run resumes.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

RANDOM_FAMILIES = ("window+block", "scattered", "window+strided")
METRIC = "window_nll"


def plan(args) -> dict:
    """Every setting of the run and the windows of both sets, fixed before any model call."""
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.claim_size not in sizes:
        raise ValueError(f"--claim-size {args.claim_size} is not one of --sizes {sizes}")
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
            "heldout_windows": windows(args.selection, args.heldout), "planned_n": args.heldout,
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


def heldout(model, ids, p: dict, cands: dict[int, dict], chosen: dict, path: Path, device: str) -> None:
    """Score the ladder, the best random pattern and StreamingLLM of every size on each held-out window; append one
    record per (window, method) to ``path``, skipping windows already there."""
    from kvlab.lacache.coverage import pattern_perplexity

    done = set()
    if path.exists():
        done = {json.loads(line)["example"] for line in path.read_text().splitlines() if line.strip()}
    jobs = []  # (size, role, pattern, config)
    for size, c in cands.items():
        info = chosen["sizes"][str(size)]
        best = c["random"][info["best_random_index"]]
        jobs += [(size, "ladder", c["ladder"], {"pattern": p["ladder"]["policy"].replace("size", str(size))}),
                 (size, "best_random", best[1], {"pattern": info["best_random"], "family": best[0],
                                                 "selected_from": p["random_patterns_per_size"]}),
                 (size, "streamingllm", c["streamingllm"], {"pattern": p["streamingllm"].replace("size", str(size))})]
    for w in p["heldout_windows"]:
        if w["example"] in done:
            continue
        begin = time.perf_counter()
        nll = pattern_perplexity(model, _window_ids(ids, w), p["context"], [j[2] for j in jobs]).log().tolist()
        seconds = round(time.perf_counter() - begin, 1)
        with path.open("a") as f:
            for (size, role, pattern, extra), value in zip(jobs, nll):
                config = {"size": size, "entries_per_layer": round(entries(pattern), 2), **extra,
                          "tokens": w["tokens"], "context": p["context"], "continuation": p["continuation"],
                          "device": device, "seconds_window": seconds}
                f.write(json.dumps({"example": w["example"], "method": method_names(size)[role], "output": None,
                                    "target": None, "metric": METRIC, "value": value, "config": config}) + "\n")
        print(f"held-out {w['example']}: " + ", ".join(
            f"{method_names(s)[r]} {v:.4f}" for (s, r, _, _), v in zip(jobs, nll)) + f" ({seconds} s)", flush=True)


def summarise(p: dict, chosen: dict, path: Path) -> dict:
    """The held-out means per method and the paired interval of ladder - best random (and - StreamingLLM)."""
    import numpy as np

    from kvlab.eval import paired_bootstrap

    recs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
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


def _model_and_ids(p: dict):
    import torch

    torch.set_num_threads(1)
    import kvlab
    from kvlab.datasets import load_text

    model, tok = kvlab.load_model(p["model"], device="cpu", dtype="float32")
    end = p["heldout_windows"][-1]["tokens"][1] if p["heldout_windows"] else p["selection_windows"][-1]["tokens"][1]
    ids = tok(load_text(p["corpus"])[: 8 * end], return_tensors="pt").input_ids
    if ids.shape[1] < end:
        raise ValueError(f"{p['corpus']} has fewer than {end} tokens in its first {8 * end} characters")
    return model, ids


def run(args, load=_model_and_ids) -> dict:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    p = plan(args)
    plan_path = out / "plan.json"
    if plan_path.exists() and json.loads(plan_path.read_text()) != p:
        raise ValueError(f"{plan_path} holds another plan; use a new --out (a plan is fixed before its run)")
    plan_path.write_text(json.dumps(p, indent=1) + "\n")
    model, ids = load(p)
    device = _device_line()
    cands = candidates(model.config.num_hidden_layers, p)
    sel_path = out / "selection.json"
    if sel_path.exists():
        chosen = json.loads(sel_path.read_text())
    else:
        chosen = select(model, ids, p, cands)
        chosen["device"] = device
        sel_path.write_text(json.dumps(chosen) + "\n")
    for size in p["sizes"]:
        info = chosen["sizes"][str(size)]
        print(f"size {size}: best random {info['best_random']} (ladder beaten by {info['random_better_than_ladder']}"
              f" of {info['random']} on the selection windows)", flush=True)
    begin = time.perf_counter()
    heldout(model, ids, p, cands, chosen, out / "pareto.examples.jsonl", device)
    summary = summarise(p, chosen, out / "pareto.examples.jsonl")
    summary["device"] = device
    summary["heldout_seconds_this_call"] = round(time.perf_counter() - begin, 1)
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def parser() -> argparse.ArgumentParser:
    a = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    a.add_argument("--out", required=True)
    a.add_argument("--model", default="smollm2-135m")
    a.add_argument("--corpus", default="wikitext")
    a.add_argument("--context", type=int, default=1024)
    a.add_argument("--continuation", type=int, default=128)
    a.add_argument("--sizes", default="64,128,256")
    a.add_argument("--claim-size", type=int, default=128)
    a.add_argument("--per-family", type=int, default=20)
    a.add_argument("--selection", type=int, default=4)
    a.add_argument("--heldout", type=int, default=30)
    a.add_argument("--span", type=int, default=8)
    a.add_argument("--overlap", type=int, default=4)
    a.add_argument("--sink", type=int, default=4)
    a.add_argument("--seed", type=int, default=0)
    return a


def main(argv=None) -> int:
    summary = run(parser().parse_args(argv))
    for size, s in summary["sizes"].items():
        d = s.get("ladder_minus_best_random")
        if d:
            print(f"size {size}: ladder - best random = {d['estimate']:+.4f} nats [{d['ci_low']:+.4f}, "
                  f"{d['ci_high']:+.4f}], n = {d['n']}, ladder lower on {d['ladder_lower']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
