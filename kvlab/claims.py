"""The claims ledger: one row per paper claim that kvlab tests, with its number, interval, size and verdict.

``benchmarks/claims.csv`` holds the rows; this module loads and validates them, recomputes every statistical row
from its per-example results file, derives the verdict by one rule, and renders the tables that the README (counts
per paper), ``docs/results.md`` (every row) and the notebooks print (so that no verdict is typed by hand).

**Why CSV** (and not TOML): one claim is one line, so a diff shows exactly which claim moved; the standard
library reads *and writes* it (``python -m kvlab claims --update`` rewrites the computed columns; writing TOML
needs a third-party package); and it opens in any spreadsheet for review. Long text (notes, commands) is quoted
by the ``csv`` module.

Row kinds (column ``kind``):

- ``statistical``: a paired difference ``mean(A - B)`` over the examples of a ``*.examples.jsonl`` file
  (columns ``results_file``, ``metric``, ``method_a``, ``method_b``, optional ``filter``: a regular expression the
  example id must match) or one proportion against a constant (``method_b`` = ``=0.25``). ``direction`` is the
  paper's ordering: ``a>b`` (the paper says A scores higher) or ``a<b`` (lower, e.g. perplexity or NLL).
  Computed, never typed: ``n``, ``estimate``, ``ci_low``, ``ci_high`` (95 % paired bootstrap,
  :func:`kvlab.eval.paired_bootstrap`), ``p_value`` (exact sign test; McNemar's on 0/1 outcomes),
  ``our_value`` and ``verdict``.
- ``exact``: a mechanism identity backed by tests named in ``test`` (``tests/test_x.py::test_name``, several
  separated by ``;``); ``n`` is the number of test cases; the verdict is ``agrees`` only if every named test exists.
- ``summary``: a committed result that holds only a mean (no per-example outcomes): ``our_value`` and ``n`` are
  typed from the file in ``results_file``; the verdict is ``inconclusive (no per-example data)``.
- ``not run``: the claim is not tested; ``note`` says why; the verdict is ``not run``.

**The verdict rule** (:func:`derive_verdict`), for a statistical row: *agrees* when the 95 % interval of
``A - B`` excludes 0 on the paper's side, *does not agree* when it excludes 0 on the other side, otherwise
*inconclusive*. Also inconclusive: fewer than 20 pairs; 0/1 outcomes whose exact McNemar test has p >= 0.05 (the
bootstrap is optimistic with few discordant pairs); any generation of the pairs that is ``":"`` (a known
harness bug), or empty generations in more than a tenth of them: the verdict must not rest on those; restrict the
row with ``filter``. A row may carry ``systematic``:
a known bias bound of the measurement (in the metric's units, e.g. the segmented long-stream approximation),
by which the interval is widened on both sides before the rule is applied.

Adding a row: append a line to ``benchmarks/claims.csv`` with the typed columns (``id`` unique, ``paper``,
``item``, ``claim``, ``kind``, ``paper_value``, ``model``, ``differs``, ``results_file``, ``command``, ...), leave
the computed columns empty, then run ``python -m kvlab claims --update`` (fills them) and
``python -m kvlab claims --write-readme`` (rewrites README.md's counts block and ``docs/results.md``);
``tests/test_claims.py`` checks the result.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

__all__ = ["FIELDS", "KINDS", "PAPERS", "ledger_path", "load", "validate", "recompute", "derive_verdict",
           "update", "table", "readme_block", "results_page", "write_readme", "stale_pages", "counts",
           "main"]

ROOT = Path(__file__).resolve().parents[1]
FIELDS = ["id", "paper", "item", "claim", "kind", "paper_value", "our_value", "n", "estimate", "ci_low", "ci_high",
          "p_value", "verdict", "model", "differs", "note", "results_file", "metric", "method_a", "method_b",
          "direction", "filter", "systematic", "test", "where", "command"]
COMPUTED = ["our_value", "n", "estimate", "ci_low", "ci_high", "p_value", "verdict"]
KINDS = ("statistical", "exact", "summary", "not run")
PAPERS = ("SepLLM", "LaCache", "DHSA", "REFORM", "OrthoRank", "kvpress")
MIN_N = 20
SEED = 0
RESAMPLES = 10_000
README_BEGIN = "<!-- claims:begin -->"
README_END = "<!-- claims:end -->"
NO_DATA = "inconclusive (no per-example data)"
BUCKETS = ("agrees", "does not agree", "inconclusive", "not run")
WRITE_COMMAND = "python -m kvlab claims --write-readme"


def ledger_path() -> Path:
    """``benchmarks/claims.csv`` of the repository kvlab is imported from."""
    return ROOT / "benchmarks" / "claims.csv"


def load(path: str | Path | None = None) -> list[dict]:
    """The ledger's rows as dicts (every value a string), in file order."""
    path = Path(path) if path is not None else ledger_path()
    if not path.is_file():
        raise FileNotFoundError(f"claims ledger not found at {path}; run from a kvlab checkout (benchmarks/claims.csv)")
    with path.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        if reader.fieldnames != FIELDS:
            raise ValueError(f"{path}: columns must be exactly {FIELDS}, got {reader.fieldnames}")
        return [dict(r) for r in reader]


def save(rows: list[dict], path: str | Path | None = None) -> None:
    path = Path(path) if path is not None else ledger_path()
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=FIELDS, lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: r.get(k, "") for k in FIELDS})
    path.write_text(buf.getvalue(), encoding="utf-8")


# ----------------------------------------------------------------------------------------------- validation
def _test_exists(spec: str) -> bool:
    file, _, name = spec.strip().partition("::")
    p = ROOT / file
    if not name or not p.is_file():
        return False
    return re.search(rf"^\s*def {re.escape(name)}\(", p.read_text(encoding="utf-8"), re.M) is not None


def validate(rows: list[dict]) -> None:
    """Raise ``ValueError`` listing every row that breaks the ledger's rules (kinds, required columns, files,
    tests). Computed numbers are checked by :func:`recompute` (see ``tests/test_claims.py``)."""
    problems = []
    seen = set()
    for i, r in enumerate(rows, start=2):
        where = f"row {i} ({r.get('id') or '?'})"
        if not r["id"] or r["id"] in seen:
            problems.append(f"{where}: id must be unique and non-empty")
        seen.add(r["id"])
        if r["paper"] not in PAPERS:
            problems.append(f"{where}: paper must be one of {PAPERS}, got {r['paper']!r}")
        if r["kind"] not in KINDS:
            problems.append(f"{where}: kind must be one of {KINDS}, got {r['kind']!r}")
            continue
        for col in ("item", "claim", "paper_value", "model", "differs", "where"):
            if not r[col].strip():
                problems.append(f"{where}: {col} is empty (write 'none' where nothing differs)")
        if r["kind"] == "statistical":
            for col in ("results_file", "metric", "method_a", "method_b", "command"):
                if not r[col].strip():
                    problems.append(f"{where}: a statistical row needs {col}")
            if r["direction"] not in ("a>b", "a<b"):
                problems.append(f"{where}: direction must be 'a>b' or 'a<b' (the paper's ordering of A and B)")
            for f in r["results_file"].split(";"):
                if f.strip() and not (ROOT / f.strip()).is_file():
                    problems.append(f"{where}: results_file {f.strip()} does not exist")
                elif f.strip() and not f.strip().endswith(".examples.jsonl"):
                    problems.append(f"{where}: results_file of a statistical row must be *.examples.jsonl")
        elif r["kind"] == "exact":
            tests = [t for t in r["test"].split(";") if t.strip()]
            if not tests:
                problems.append(f"{where}: an exact row needs test = tests/test_x.py::test_name")
            for t in tests:
                if not _test_exists(t):
                    problems.append(f"{where}: test {t.strip()} does not exist")
            if r["verdict"] != "agrees":
                problems.append(f"{where}: an exact row whose tests exist has verdict 'agrees'")
        elif r["kind"] == "summary":
            if r["verdict"] != NO_DATA:
                problems.append(f"{where}: a summary row's verdict is {NO_DATA!r}")
            for f in r["results_file"].split(";"):
                if f.strip() and not (ROOT / f.strip()).exists():
                    problems.append(f"{where}: results_file {f.strip()} does not exist")
            if not r["results_file"].strip() and not r["where"].strip():
                problems.append(f"{where}: a summary row names its results file or notebook")
        elif r["kind"] == "not run":
            if r["verdict"] != "not run" or not r["note"].strip():
                problems.append(f"{where}: a 'not run' row has verdict 'not run' and a note saying why")
    if problems:
        raise ValueError("claims ledger:\n  " + "\n  ".join(problems))


# ---------------------------------------------------------------------------------------------- recompute
def _records(files: str) -> list[dict]:
    out = []
    for f in files.split(";"):
        if f.strip():
            with (ROOT / f.strip()).open(encoding="utf-8") as fh:
                out.extend(json.loads(line) for line in fh if line.strip())
    return out


def _paired(row: dict) -> tuple[list[str], np.ndarray, np.ndarray | float, int]:
    """The examples, A's and B's values (or B's constant) and the number of suspect generations."""
    recs = _records(row["results_file"])
    pattern = re.compile(row["filter"]) if row["filter"].strip() else None
    values: dict = defaultdict(dict)
    outputs: dict = {}
    for r in recs:
        if isinstance(r.get("output"), str):
            outputs[(r["example"], r["method"])] = r["output"]
        if r["metric"] == row["metric"] and (pattern is None or pattern.search(r["example"])):
            values[r["method"]][r["example"]] = float(r["value"])
    a = values.get(row["method_a"], {})
    if not a:
        raise ValueError(f"claim {row['id']}: no {row['metric']!r} records of method {row['method_a']!r} in "
                         f"{row['results_file']} (filter {row['filter']!r})")
    if row["method_b"].startswith("="):
        examples = sorted(a)
        b: np.ndarray | float = float(row["method_b"][1:])
        methods = [row["method_a"]]
    else:
        bv = values.get(row["method_b"], {})
        examples = sorted(set(a) & set(bv))
        if not examples:
            raise ValueError(f"claim {row['id']}: methods {row['method_a']!r} and {row['method_b']!r} share no "
                             f"example with metric {row['metric']!r} in {row['results_file']}")
        b = np.array([bv[e] for e in examples])
        methods = [row["method_a"], row["method_b"]]
    said = [outputs[(e, m)].strip() for e in examples for m in methods if (e, m) in outputs]
    colon, empty = said.count(":"), said.count("")
    # ':' is the known harness bug: any such answer counts; an empty answer can be the model's own choice (it
    # stopped at once), so empties count only when they are more than a tenth of the answers.
    suspect = colon + (empty if empty > 0.1 * max(1, len(said)) else 0)
    return examples, np.array([a[e] for e in examples]), b, suspect


def derive_verdict(low: float, high: float, direction: str, n: int, *, p_binary: float | None = None,
                   suspect: int = 0, systematic: float = 0.0) -> str:
    """The verdict rule (module docstring): the 95 % interval ``[low, high]`` of ``A - B`` widened by
    ``systematic``, the paper's ``direction`` (``a>b`` / ``a<b``), ``n`` pairs, McNemar's exact p for 0/1
    outcomes, and the number of suspect generations."""
    if direction not in ("a>b", "a<b"):
        raise ValueError(f"direction must be 'a>b' or 'a<b', got {direction!r}")
    if suspect:
        return f"inconclusive (harness bug: {suspect} answers ':' or empty)"
    if n < MIN_N:
        return f"inconclusive (n < {MIN_N})"
    low, high = low - systematic, high + systematic
    if low <= 0 <= high:
        return "inconclusive"
    if p_binary is not None and p_binary >= 0.05:
        return f"inconclusive (McNemar p = {p_binary:.2g})"
    positive = low > 0
    return "agrees" if positive == (direction == "a>b") else "does not agree"


def _fmt(x: float) -> str:
    return f"{x:.6g}"


def _our_value(metric: str, ma: float, mb: float | None, label_b: str) -> str:
    if metric.endswith(("window_nll", "segment_nll")):
        b = f"{math.exp(mb):.2f}" if mb is not None else label_b
        return f"ppl {math.exp(ma):.2f} vs {b}"
    b = f"{mb:.3g}" if mb is not None else label_b
    return f"{ma:.3g} vs {b}"


def recompute(row: dict) -> dict:
    """The computed columns of a statistical row, from its per-example file (strings, as in the ledger)."""
    from kvlab.eval.stats import paired_bootstrap, proportion_interval, sign_test

    if row["kind"] != "statistical":
        raise ValueError(f"claim {row['id']}: only statistical rows are recomputed (kind {row['kind']!r})")
    examples, a, b, suspect = _paired(row)
    binary = bool(np.all((a == 0) | (a == 1)) and (np.isscalar(b) or np.all((b == 0) | (b == 1))))
    n = len(examples)
    if np.isscalar(b):
        if binary:
            iv = proportion_interval(int(a.sum()), n, method="exact")
            est, low, high = iv.estimate - b, iv.low - b, iv.high - b
        else:
            iv = paired_bootstrap(a - b, resamples=RESAMPLES, seed=SEED)
            est, low, high = iv.estimate, iv.low, iv.high
        p, p_bin, mb = None, None, None
    else:
        iv = paired_bootstrap(a, b, resamples=RESAMPLES, seed=SEED)
        est, low, high = iv.estimate, iv.low, iv.high
        p = sign_test(a, b).p
        p_bin = p if binary else None
        mb = float(b.mean())
    systematic = float(row["systematic"]) if row["systematic"].strip() else 0.0
    verdict = derive_verdict(low, high, row["direction"], n, p_binary=p_bin, suspect=suspect,
                             systematic=systematic)
    return {"our_value": _our_value(row["metric"], float(a.mean()), mb, row["method_b"][1:]), "n": str(n),
            "estimate": _fmt(est), "ci_low": _fmt(low), "ci_high": _fmt(high),
            "p_value": "" if p is None else _fmt(p), "verdict": verdict}


def update(path: str | Path | None = None) -> list[dict]:
    """Recompute every statistical row and write the computed columns back into the ledger."""
    rows = load(path)
    validate(rows)
    for r in rows:
        if r["kind"] == "statistical":
            r.update(recompute(r))
    save(rows, path)
    return rows


# -------------------------------------------------------------------------------------------------- output
class Table(str):
    """A rendered table: prints as text, shows as Markdown in a notebook."""

    def _repr_markdown_(self) -> str:
        return str(self)


def _ci(r: dict) -> str:
    if r["kind"] != "statistical":
        return ""
    return f"[{float(r['ci_low']):+.3g}, {float(r['ci_high']):+.3g}]"


def _select(rows, paper, items, ids):
    out = []
    for r in rows:
        if paper is not None and r["paper"].lower() != paper.lower():
            continue
        if ids is not None and r["id"] not in ids:
            continue
        if items is not None and not any(s.lower() in r["item"].lower() for s in items):
            continue
        out.append(r)
    return out


def _md_cell(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


def table(paper: str | None = None, items: list[str] | None = None, ids: list[str] | None = None, *,
          fmt: str = "markdown", path: str | Path | None = None) -> Table:
    """The ledger's rows for ``paper`` (``"lacache"``, case-insensitive), optionally only ``items`` (substrings
    of the item column, e.g. ``["Table 5"]``) or ``ids``, as ``item | paper | this run | n | 95 % CI | verdict``.

    ``fmt="markdown"`` (shown rendered in a notebook) or ``"text"`` (aligned columns)."""
    if fmt not in ("markdown", "text"):
        raise ValueError(f"fmt must be 'markdown' or 'text', got {fmt!r}")
    rows = _select(load(path), paper, items, ids)
    if not rows:
        raise ValueError(f"no claims match paper={paper!r}, items={items!r}, ids={ids!r}; "
                         "see benchmarks/claims.csv for the papers and items")
    head = ["item", "claim", "paper", "this run", "n", "95 % CI of A - B", "verdict"]
    body = [[r["item"], r["claim"], r["paper_value"], r["our_value"], r["n"], _ci(r), r["verdict"]] for r in rows]
    if fmt == "markdown":
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in body]
        return Table("\n".join(lines))
    widths = [min(40, max(len(h), *(len(row[i]) for row in body))) for i, h in enumerate(head)]
    fmt_row = lambda cells: "  ".join(c[:w].ljust(w) for c, w in zip(cells, widths))  # noqa: E731
    return Table("\n".join([fmt_row(head), fmt_row(["-" * w for w in widths])] + [fmt_row(r) for r in body]))


def readme_block(rows: list[dict] | None = None) -> str:
    """The README's generated block (between the claims markers): how many rows of each paper agree, do not
    agree, are inconclusive or were not run; every row is in ``docs/results.md`` (:func:`results_page`)."""
    rows = load() if rows is None else rows
    by_paper = counts(rows)
    papers = [p for p in PAPERS if p in by_paper] + [p for p in by_paper if p not in PAPERS]
    lines = [README_BEGIN,
             f"<!-- generated by `{WRITE_COMMAND}` from benchmarks/claims.csv; do not edit -->",
             "",
             "| paper | " + " | ".join(BUCKETS) + " | total |",
             "|---|" + "---:|" * (len(BUCKETS) + 1)]
    total: Counter = Counter()
    for paper in papers:
        c = by_paper[paper]
        total.update(c)
        lines.append(f"| {paper} | " + " | ".join(str(c[b]) for b in BUCKETS) + f" | {sum(c.values())} |")
    lines.append("| **all** | " + " | ".join(f"**{total[b]}**" for b in BUCKETS) + f" | **{sum(total.values())}** |")
    lines += ["", README_END]
    return "\n".join(lines)


RESULTS_INTRO = """\
# Results: where each paper agrees at our scale

<!-- generated by `{command}` from benchmarks/claims.csv; do not edit (kvlab/claims.py, results_page) -->

Every row below is printed from the claims ledger [`benchmarks/claims.csv`](../benchmarks/claims.csv)
(`kvlab.claims`; regenerate with `python -m kvlab claims --update --write-readme`; `tests/test_claims.py` fails
when this page, a number or a verdict differs from what the per-example results files give). The ledger also
holds, per row, the paper's configuration difference, the model and the command that produced the results file.
The README shows the counts per paper; the book's results page (`build/book/html/results.html`, built by
`bash scripts/test.sh`) shows the same rows per paper with the command behind each.

**How a verdict is decided.** A claim is a comparison of method A with method B on the same examples (needles,
questions, 1,024-token windows, long-stream segments). We compute the mean per-example difference A - B and its
95 % paired bootstrap interval (`kvlab.eval.paired_bootstrap`: resample the examples with replacement, 10,000
times, keep the middle 95 % of the mean differences). **agrees**: the interval excludes 0 on the paper's side;
**does not agree**: it excludes 0 on the other side; **inconclusive** otherwise, and also with fewer than 20
examples, with 0/1 outcomes whose exact McNemar test has p >= 0.05, or when the examples include a generation the
harness is known to get wrong (an answer that is just `:`). A known systematic error of a measurement (the
segmented long-stream approximation) widens the interval first. *exact* rows are mechanism identities checked by
the named tests; rows without per-example outcomes (only a mean was stored) say so and decide nothing.
Perplexity rows compare the NLL of each window, so "ppl x vs y" are the windows' geometric means.
"""


def results_page(rows: list[dict] | None = None) -> str:
    """``docs/results.md``, generated whole: the verdict rule, then one table row per claim of the ledger."""
    rows = load() if rows is None else rows
    lines = [RESULTS_INTRO.format(command=WRITE_COMMAND),
             "| paper | item | claim (A vs B) | this run | verdict | n | 95 % CI of A - B | where |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        verdict = f"**{r['verdict']}**" if r["verdict"] in ("agrees", "does not agree") else r["verdict"]
        if r["kind"] == "exact":
            verdict += " (exact, tested)"
        cells = [r["paper"], r["item"], r["claim"], r["our_value"], verdict, r["n"], _ci(r), r["where"]]
        lines.append("| " + " | ".join(_md_cell(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def results_path() -> Path:
    """``docs/results.md`` of the repository kvlab is imported from."""
    return ROOT / "docs" / "results.md"


def _split_readme(text: str) -> tuple[str, str, str]:
    if text.count(README_BEGIN) != 1 or text.count(README_END) != 1:
        raise ValueError(f"README.md must hold one {README_BEGIN} ... {README_END} block")
    head, rest = text.split(README_BEGIN)
    block, tail = rest.split(README_END)
    return head, README_BEGIN + block + README_END, tail


def write_readme(readme: str | Path | None = None, results: str | Path | None = None) -> bool:
    """Replace the README's claims block with :func:`readme_block` (the counts per paper) and write
    ``docs/results.md`` whole with :func:`results_page` (every row); True when either file changed."""
    readme = Path(readme) if readme is not None else ROOT / "README.md"
    results = Path(results) if results is not None else results_path()
    rows = load()
    changed = False
    text = readme.read_text(encoding="utf-8")
    head, old, tail = _split_readme(text)
    new = readme_block(rows)
    if old != new:
        readme.write_text(head + new + tail, encoding="utf-8")
        changed = True
    page = results_page(rows)
    if not results.is_file() or results.read_text(encoding="utf-8") != page:
        results.parent.mkdir(parents=True, exist_ok=True)
        results.write_text(page, encoding="utf-8")
        changed = True
    return changed


def stale_pages(rows: list[dict] | None = None, readme: str | Path | None = None,
                results: str | Path | None = None) -> list[str]:
    """Which generated pages differ from what the ledger gives: ``README.md claims block``, ``docs/results.md``."""
    rows = load() if rows is None else rows
    readme = Path(readme) if readme is not None else ROOT / "README.md"
    results = Path(results) if results is not None else results_path()
    stale = []
    if _split_readme(readme.read_text(encoding="utf-8"))[1] != readme_block(rows):
        stale.append("README.md claims block")
    if not results.is_file() or results.read_text(encoding="utf-8") != results_page(rows):
        stale.append("docs/results.md")
    return stale


def _bucket(verdict: str) -> str:
    for b in BUCKETS:
        if verdict == b:
            return b
    return "inconclusive"


def counts(rows: list[dict] | None = None) -> dict[str, Counter]:
    """Per paper: how many rows agree / do not agree / are inconclusive / were not run."""
    rows = load() if rows is None else rows
    out: dict[str, Counter] = {}
    for r in rows:
        out.setdefault(r["paper"], Counter())[_bucket(r["verdict"])] += 1
    return out


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m kvlab claims", description=__doc__.split("\n\n")[0])
    p.add_argument("--counts", action="store_true", help="agrees / does not agree / inconclusive / not run per paper")
    p.add_argument("--update", action="store_true", help="recompute the statistical rows and write them back")
    p.add_argument("--write-readme", action="store_true",
                   help="regenerate README.md's counts block and docs/results.md (every row)")
    p.add_argument("--check", action="store_true",
                   help="exit 1 if a computed column, README.md or docs/results.md is stale")
    p.add_argument("--table", metavar="PAPER", help="print one paper's rows (as a notebook would)")
    args = p.parse_args(argv)
    if args.update:
        update()
    if args.write_readme:
        print("README.md claims block and docs/results.md",
              "rewritten" if write_readme() else "already up to date")
    rows = load()
    validate(rows)
    status = 0
    if args.check:
        for r in rows:
            if r["kind"] == "statistical":
                new = recompute(r)
                stale = [k for k in COMPUTED if new[k] != r[k]]
                if stale:
                    print(f"{r['id']}: stale {stale} (run python -m kvlab claims --update)")
                    status = 1
        for stale in stale_pages(rows):
            print(f"{stale} is stale (run {WRITE_COMMAND})")
            status = 1
    if args.table:
        print(table(args.table, fmt="text"))
    if args.counts:
        cols = list(BUCKETS)
        print(f"{'paper':10s} " + " ".join(f"{c:>15s}" for c in cols) + f" {'total':>6s}")
        total = Counter()
        for paper in PAPERS:
            c = counts(rows).get(paper, Counter())
            total.update(c)
            print(f"{paper:10s} " + " ".join(f"{c[k]:15d}" for k in cols) + f" {sum(c.values()):6d}")
        print(f"{'all':10s} " + " ".join(f"{total[k]:15d}" for k in cols) + f" {sum(total.values()):6d}")
    return status


if __name__ == "__main__":
    sys.exit(main())
