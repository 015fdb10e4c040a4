"""A needle grid that can tell two chunkings apart: pick its depths from a pilot, then judge it.

Two steps of ``benchmarks/gpu/dhsa_needle_separating.sh`` (``python -m kvlab run dhsa-needle-separating``):

* ``depths PILOT.examples.jsonl``: the depths where the grid can separate sparse methods, from a pilot of dense and
  block-sparse (authors' protocol) at several depths. A depth qualifies when its needle lies outside the keys every
  query keeps anyway (needle token ``>= --min-token``, i.e. past ``budget + query block``), when dense is below the
  ceiling (``<= --ceiling``) and clearly above block-sparse at every budget (``dense - block-sparse >= --gap``): then
  a worse chunking has room to lose and a better one room to gain. Prints the depths as a comma list.
* ``summary GRID.examples.jsonl[,MORE...]``: per budget, DHSA minus block-sparse (paired bootstrap over the same
  prompts, needle recall and answer NLL), dense minus block-sparse, and the **control**: block-sparse at the larger
  budget minus block-sparse at the smaller one, a gap of about 0.05 in the earlier 4K grid (+0.059). The grid "can
  detect a 0.05 difference" when the control's interval excludes 0 and the DHSA interval is narrower than +-0.05;
  the verdict says which. Writes ``--out`` (JSON) beside printing it.

    python -m kvlab run dhsa-needle-separating depths --records pilot.examples.jsonl.gz --budgets 512,1024 --out DIR
    python -m kvlab run dhsa-needle-separating summary --records grid.examples.jsonl.gz --budgets 512,1024 --out DIR

Writes ``OUT/NAME.depths.txt`` (depths) or ``OUT/NAME.summary.json`` (summary), and ``OUT/NAME.examples.jsonl.gz``:
one record per depth kept or dropped (depths; metric ``dense_minus_block_sparse``) or per paired comparison
(summary; metric ``<metric>_diff``, the interval in its config). ``--smoke`` judges a small synthetic grid.
"""
from __future__ import annotations

import statistics
import sys
from collections import defaultdict
from pathlib import Path

from kvlab.eval.stats import paired_bootstrap, sign_test
from kvlab.experiments import records, registry
from kvlab.experiments.registry import ParameterError
from kvlab.experiments.system import options
from kvlab.outputs import OutputFolder

__all__ = ["parser", "check", "run", "pick_depths", "summary", "table"]

NAME = "dhsa-needle-separating"


def read(paths) -> list[dict]:
    return [r for p in paths for r in records.read(p)]


def table(recs: list[dict], metric: str) -> dict[str, dict[str, float]]:
    """``{method: {example: value}}`` for one metric."""
    t: dict[str, dict[str, float]] = defaultdict(dict)
    for r in recs:
        if r["metric"] == metric:
            t[r["method"]][r["example"]] = r["value"]
    return t


def depth_of(example: str) -> float:
    return float(example.split("/d")[1].split("/")[0])


def length_of(example: str) -> int:
    return int(example.split("/L")[1].split("/")[0])


def _cells(recs) -> dict:
    cells = defaultdict(lambda: defaultdict(list))
    for method, vals in table(recs, "needle_recall").items():
        for ex, v in vals.items():
            cells[(length_of(ex), depth_of(ex))][method].append(v)
    return cells


def pick_depths(recs, budgets, *, gap: float, ceiling: float, min_token: int, verdicts: list | None = None):
    """The depths whose needle lies past ``min_token``, where dense is at most ``ceiling`` and at least ``gap``
    above every block-sparse budget; ``verdicts`` (a list) receives ``(length, depth, dense - best sparse, kept)``."""
    keep = []
    for (n, d), by in sorted(_cells(recs).items()):
        dense = statistics.mean(by["dense"]) if by.get("dense") else None
        sparse = [statistics.mean(by[f"block-sparse authors {nb}"]) for nb in budgets
                  if by.get(f"block-sparse authors {nb}")]
        ok = (dense is not None and len(sparse) == len(budgets) and d * n >= min_token and dense <= ceiling
              and dense - max(sparse) >= gap)
        print(f"L{n} depth {d:.2f} (needle ~token {int(d * n)}): dense {dense}, block-sparse {sparse} -> "
              f"{'keep' if ok else 'drop'}", file=sys.stderr)
        if verdicts is not None:
            verdicts.append((n, d, None if dense is None or not sparse else dense - max(sparse), ok))
        if ok:
            keep.append(d)
    return sorted(set(keep))


def paired(t, a: str, b: str) -> dict | None:
    ex = sorted(set(t.get(a, {})) & set(t.get(b, {})))
    if not ex:
        return None
    va, vb = [t[a][e] for e in ex], [t[b][e] for e in ex]
    iv = paired_bootstrap(va, vb)
    return {"a": a, "b": b, "n": len(ex), "diff": round(iv.estimate, 4), "low": round(iv.low, 4),
            "high": round(iv.high, 4), "differ_on": sum(t[a][e] != t[b][e] for e in ex),
            "sign_p": round(sign_test(va, vb).p, 4)}


def verdict_words(row: dict, gap: float = 0.05) -> str:
    """What the interval of ``row`` (``low``, ``high``, ``sign_p``: :func:`paired`) says of A - B, in the ledger's
    terms: a side only when the interval excludes 0 *and* the exact sign test agrees (p < 0.05); then whether a gap of
    ``gap`` is excluded, read from the interval's ends, not its half-width: "excludes a gap of 0.05 either way" only
    when the whole interval lies inside (-gap, +gap)."""
    low, high, p = row["low"], row["high"], row.get("sign_p", 0.0)
    if low > 0 and p < 0.05:
        side = "DHSA above block-sparse"
    elif high < 0 and p < 0.05:
        side = "DHSA below block-sparse"
    elif low > 0 or high < 0:
        side = f"inconclusive (the interval excludes 0, the sign test does not: p = {p:.2g})"
    else:
        side = "inconclusive"
    if -gap < low and high < gap:
        width = f"excludes a gap of {gap:g} either way"
    else:
        open_ = [f"{g:+g}" for g, out in ((gap, high >= gap), (-gap, low <= -gap)) if out]
        width = f"cannot exclude a gap of {' or '.join(open_)}"
    return f"{side}; A - B {row['diff']:+.3f} [{low:+.3f}, {high:+.3f}] {width}"


def summary(recs, budgets) -> dict:
    out = {"rows": [], "means": {}}
    rec_t = table(recs, "needle_recall")
    nll_t = table(recs, "answer_nll")
    for method, vals in sorted(rec_t.items()):
        out["means"][method] = {"needle_recall": round(statistics.mean(vals.values()), 4), "n": len(vals)}
    for nb in budgets:
        for metric, t in (("needle_recall", rec_t), ("answer_nll", nll_t)):
            for a, b in ((f"DHSA authors {nb}", f"block-sparse authors {nb}"), ("dense", f"block-sparse authors {nb}")):
                row = paired(t, a, b)
                if row:
                    out["rows"].append(row | {"metric": metric, "budget": nb})
    lo, hi = min(budgets), max(budgets)
    control = paired(rec_t, f"block-sparse authors {hi}", f"block-sparse authors {lo}")
    out["control"] = control
    verdicts = {}
    for nb in budgets:
        row = next((r for r in out["rows"] if r["budget"] == nb and r["metric"] == "needle_recall"
                    and r["a"].startswith("DHSA")), None)
        if row is None:
            continue
        verdicts[nb] = verdict_words(row)
    out["verdicts"] = verdicts
    out["control_detects"] = bool(control and (control["low"] > 0 or control["high"] < 0))
    return out


def parser():
    p = registry.experiment_parser(NAME, __doc__.split("\n\n")[0])
    p.add_argument("what", nargs="?", choices=["depths", "summary"], default="summary",
                   help="depths (from a pilot) or summary (default: judge a grid)")
    p.add_argument("--records", type=options.number_list(str, what="records file"), default=None,
                   help="the pilot's (depths) or the grid's (summary) records files, comma separated")
    p.add_argument("--name", type=options.stem, default="dhsa_needle_separating",
                   help="stem of the files written (default %(default)s)")
    p.add_argument("--budgets", type=options.number_list(int, low=1, what="budget"), default=[512, 1024])
    p.add_argument("--gap", type=float, default=0.15, help="depths: dense minus the best block-sparse, at least")
    p.add_argument("--ceiling", type=float, default=0.95, help="depths: dense at most (below the ceiling)")
    p.add_argument("--min-token", type=options.nonnegative_int, default=1152, help="depths: the needle's token")
    return p


def check(args) -> None:
    if not args.smoke:
        if not args.records:
            raise ParameterError("--records: give the records file(s) to judge (the pilot's or the grid's)")
        for f in args.records:
            try:
                records.resolve(f)
            except FileNotFoundError:
                raise ParameterError(f"--records {f}: no such records file") from None
    outputs = {"depths": ".depths.txt", "summary": ".summary.json"}
    options.refuse_rerun(args.out, args.name + outputs[args.what], options.records_name(f"{args.name}.{args.what}"))


def _synthetic(budgets) -> list[dict]:
    """A tiny grid for --smoke: dense, DHSA and block-sparse at two depths of 8,192 tokens, 6 prompts each."""
    recs = []
    for d in (0.25, 0.75):
        for t in range(6):
            ex = f"niah/smoke/L8192/d{d:.2f}/t{t}"
            values = {"dense": 0.8 - 0.1 * (t % 2)}
            for nb in budgets:
                values[f"block-sparse authors {nb}"] = 0.2 + 0.1 * (t % 3) + nb / 1e4
                values[f"DHSA authors {nb}"] = 0.3 + 0.1 * (t % 2)
            for method, v in values.items():
                for metric in ("needle_recall", "answer_nll"):
                    recs.append(records.record(ex, method, metric, v, device="cpu"))
    return recs


def run(args) -> list[Path]:
    out = OutputFolder(args.out, f"python -m kvlab run {NAME} {args.what}")
    recs = _synthetic(args.budgets) if args.smoke else read(args.records)
    config = {"records": args.records, "budgets": args.budgets}
    if args.what == "depths":
        verdicts: list = []
        depths = pick_depths(recs, args.budgets, gap=args.gap, ceiling=args.ceiling, min_token=args.min_token,
                             verdicts=verdicts)
        if not depths:
            print("no depth separates dense from block-sparse", file=sys.stderr)
        text = options.write_text(out, args.name + ".depths.txt", ",".join(f"{d:g}" for d in depths) + "\n")
        print(",".join(f"{d:g}" for d in depths))
        rows = [records.record(f"L{n}/d{d:.2f}", "dense - best block-sparse", "dense_minus_block_sparse", diff,
                               config=config | {"kept": ok, "gap": args.gap, "ceiling": args.ceiling},
                               device=NOT_MEASURED) for n, d, diff, ok in verdicts]
        return [records.write(options.records_name(f"{args.name}.{args.what}"), rows, out=out), text]
    s = summary(recs, args.budgets)
    path = options.write_json(out, args.name + ".summary.json", s)
    print(path.read_text())
    rows = [records.record(f"budget{r['budget']}", f"{r['a']} - {r['b']}", f"{r['metric']}_diff", r["diff"],
                           config=config | {k: r[k] for k in ("n", "low", "high", "differ_on")}, device=NOT_MEASURED)
            for r in s["rows"]]
    return [records.write(options.records_name(f"{args.name}.{args.what}"), rows, out=out), path]


NOT_MEASURED = "none (computed from records)"
