"""A needle grid that can tell two chunkings apart: pick its depths from a pilot, then judge it.

Two steps of ``benchmarks/gpu/dhsa_needle_separating.sh``:

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

    python benchmarks/dhsa_needle_separating.py depths pilot.examples.jsonl --budgets 512,1024
    python benchmarks/dhsa_needle_separating.py summary grid.examples.jsonl --budgets 512,1024 --out summary.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere without installing kvlab

from kvlab.eval.stats import paired_bootstrap  # noqa: E402


def read(paths: str) -> list[dict]:
    out = []
    for p in paths.split(","):
        out += [json.loads(line) for line in Path(p).read_text().splitlines() if line.strip()]
    return out


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


def pick_depths(recs, budgets, *, gap: float, ceiling: float, min_token: int) -> list[float]:
    t = table(recs, "needle_recall")
    cells = defaultdict(lambda: defaultdict(list))
    for method, vals in t.items():
        for ex, v in vals.items():
            cells[(length_of(ex), depth_of(ex))][method].append(v)
    keep = []
    for (n, d), by in sorted(cells.items()):
        dense = statistics.mean(by["dense"]) if by.get("dense") else None
        sparse = [statistics.mean(by[f"block-sparse authors {nb}"]) for nb in budgets
                  if by.get(f"block-sparse authors {nb}")]
        ok = (dense is not None and len(sparse) == len(budgets) and d * n >= min_token and dense <= ceiling
              and dense - max(sparse) >= gap)
        print(f"L{n} depth {d:.2f} (needle ~token {int(d * n)}): dense {dense}, block-sparse {sparse} -> "
              f"{'keep' if ok else 'drop'}", file=sys.stderr)
        if ok:
            keep.append(d)
    return sorted(set(keep))


def paired(t, a: str, b: str) -> dict | None:
    ex = sorted(set(t.get(a, {})) & set(t.get(b, {})))
    if not ex:
        return None
    iv = paired_bootstrap([t[a][e] for e in ex], [t[b][e] for e in ex])
    return {"a": a, "b": b, "n": len(ex), "diff": round(iv.estimate, 4), "low": round(iv.low, 4),
            "high": round(iv.high, 4), "differ_on": sum(t[a][e] != t[b][e] for e in ex)}


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
        half = (row["high"] - row["low"]) / 2
        side = ("DHSA above block-sparse" if row["low"] > 0 else "DHSA below block-sparse" if row["high"] < 0
                else "inconclusive")
        width = "narrow enough to exclude a 0.05 gap either way" if half < 0.05 else "too wide to decide a 0.05 gap"
        verdicts[nb] = f"{side} (interval half-width {half:.3f}: {width})"
    out["verdicts"] = verdicts
    out["control_detects"] = bool(control and (control["low"] > 0 or control["high"] < 0))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("what", choices=["depths", "summary"])
    ap.add_argument("records", help="examples.jsonl file(s), comma separated")
    ap.add_argument("--budgets", default="512,1024")
    ap.add_argument("--gap", type=float, default=0.15, help="depths: dense minus the best block-sparse, at least")
    ap.add_argument("--ceiling", type=float, default=0.95, help="depths: dense at most (below the ceiling)")
    ap.add_argument("--min-token", type=int, default=1152, help="depths: the needle's token at least")
    ap.add_argument("--out", default=None, help="summary: JSON file")
    args = ap.parse_args(argv)
    budgets = [int(x) for x in args.budgets.split(",")]
    recs = read(args.records)
    if args.what == "depths":
        depths = pick_depths(recs, budgets, gap=args.gap, ceiling=args.ceiling, min_token=args.min_token)
        print(",".join(f"{d:g}" for d in depths))
        return 0 if depths else 1
    s = summary(recs, budgets)
    text = json.dumps(s, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
