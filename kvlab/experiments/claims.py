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
  separated by ``;``). ``--update`` runs them with pytest (:func:`exact_columns`): ``n`` is the number of test cases
  collected, ``estimate`` the number that passed; the verdict is ``agrees`` only if every named test was collected
  and passed (a ``def test_x(`` inside a docstring is not a test), ``does not agree`` if one failed.
- ``summary``: a committed result that holds only a mean (no per-example outcomes): ``our_value`` and ``n`` are
  typed from the file in ``results_file``; the verdict is ``inconclusive (no per-example data)``.
- ``not run``: the claim is testable here but was not tested; ``note`` says why; the verdict is ``not run``.
- ``not testable``: a numbered table or figure of the paper that kvlab cannot test (a 40B-70B model, a training
  run of days, hardware we lack); ``note`` gives the concrete reason; the verdict is ``not testable here``.

Four more columns say how a row is counted and checked (:func:`summary`, ``python -m kvlab claims --counts``):

- ``role``: ``claim`` (the paper states it), ``sensitivity`` (another configuration of a paper cell whose claim row
  is the paper's stated configuration: one paper cell, one claim row) or ``check`` (an implementation check of
  kvlab's own: mask = policy, invariants, a comparison the paper does not make). Checks and sensitivity rows are
  counted apart from the paper's claims.
- ``proxy_of``: the id of the score row (the paper's own quantity; a ``not run`` row where that was not measured)
  that this row measures on another quantity (e.g. the answer NLL where the paper reports accuracy, C4 NLL where it
  reports zero-shot accuracy). A proxy is shown beside its score row and never counted as a claim of its own.
- ``superseded``: empty, or why the row's run no longer measures the method (the fix that came after it, or the
  per-example rows that replace a summary). The row stays for the record with verdict ``superseded``, counts
  as neither tested nor decided, and is not shown in the notebooks' tables.
- ``paper_cell``: the paper's own cell for the comparison, ``"77.18 vs 69.67 (higher is better; Table 1, ...)"``,
  or ``"A better, no number (Fig. 8: ...)"`` / ``"A matches B (...)"`` where the paper gives a figure or a sentence.
  Every statistical paper claim has one, and its ``direction`` must be the one the cell gives for the row's metric
  (:func:`paper_direction`; an NLL row of an accuracy cell flips it), so that no row encodes the paper backwards.

And five that the verdict rule and the counts read (:func:`derive_verdict`, :func:`decided_strictly`):

- ``paper_effect``: the paper's own ``A - B`` in the row's units with how it was translated, ``"-0.0115
  (ln(8.62/8.72): ..., nats per token)"``, or ``"n/a: why it cannot be"`` (a figure without numbers, another
  quantity). Every statistical row states it; a number makes the outcomes *excluded* and *smaller* possible.
- ``planned_n``: the n fixed before the run. A row with more examples than planned (topped up after looking) is
  not decided by the top-up; one that stopped short for time shows its n beside the plan.
- ``plan`` (computed by ``--update`` from git history, :mod:`kvlab.experiments.ledger_history`): ``before`` when
  ``planned_n``, with the paper cell, metric and comparison, was committed before any of the row's results;
  ``with or after`` when it came in the same commit as the data or later; ``no plan`` when the row states no
  ``planned_n``; ``unknown`` where the history cannot tell. Only a plan ``before`` the data lets a claim count as
  decided (:func:`decided_strictly`): a plan written after a look is a finding to re-run, not a decided claim.
- ``floor``: ``"0.25 (chance: four options)"``: the score at which a method shows nothing on the task (chance, or
  the model's own floor, with the reason); when no method's score is shown above it, the outcome is *floor*.
- ``block``: for windows of one stream (not independent samples), the number of consecutive windows resampled
  together; the row's n then counts blocks.

Coverage: :data:`INVENTORY` lists every numbered table and figure of the five papers; the ``item`` column names
the ones a row tests (``"Table 5 (...)"``, ``"Tables 2-3, Figs. 5-6 (...)"``, read by :func:`items_of`). An item
beyond kvlab's reach gets a ``not testable`` row with the concrete reason; one that could be tested but has no
row yet shows as untested in ``python -m kvlab claims --counts``.

**The verdict rule** (:func:`derive_verdict`), for a statistical row, has seven outcomes: *agrees* when the 95 %
interval of ``A - B`` excludes 0 on the paper's side, *smaller* when it does so but also excludes the paper's own
effect (the right sign, the paper's size ruled out), *does not agree* when it excludes 0 on the other side;
otherwise *floor* when every method's score is indistinguishable from the row's stated floor, *not measurable*
when both methods gave the same value on every example (the instrument did not move), *excluded* when the interval
lies inside plus/minus the paper's own effect (``paper_effect``, in the row's units: one rule for every kind of
outcome), and *inconclusive* otherwise. Also inconclusive: fewer than 20 pairs
(or blocks); a run topped up past its ``planned_n``; 0/1 outcomes whose exact McNemar test has p >= 0.05, and
fractional scores in [0, 1] whose exact sign test on the discordant pairs has p >= 0.05 (the bootstrap is
optimistic with few discordant pairs); any generation of the pairs that is ``":"`` (a known
harness bug), or empty generations in more than a tenth of them (not for the teacher-forced metrics of
``TEACHER_FORCED``, which score the gold answer): the verdict must not rest on those; restrict the
row with ``filter``. A row may carry ``systematic``: a known bias bound of the measurement (a finite number
>= 0 in the metric's units, e.g. the segmented long-stream approximation), by which the interval is widened on
both sides before the rule is applied.

**Strict coverage** (:func:`strict_row`, :func:`summary`): an item (a numbered table or figure) is *tested* only by a
live paper-claim row (not a check, sensitivity row, summary, proxy or superseded row) with an interval and n >= 20
whose ``item`` names at most two items (two that show one experiment; never a range over others); it is *decided on
the paper's own quantity* when such a row agrees, is smaller, does not agree or is excluded at n >= 30, from a plan
committed before its data (column ``plan``). One paper cell has one claim row (:func:`cell_key`): another model or
configuration of the same cell is a sensitivity row.

Adding a row: append a line to ``benchmarks/claims.csv`` with the typed columns (``id`` unique, ``paper``,
``item`` naming the paper's numbered table or figure first, as ``Table 5 (...)`` or ``Fig. 8 (...)``, ``claim``,
``kind``, ``paper_value``, ``model``, ``differs`` (what differs from the paper *and decides the result*),
``results_file``, ``command``, ``role``, ...), leave the computed columns empty (use :func:`save` or the ``csv``
module, so that a comma inside a field is quoted: a row with more fields than the header is refused), then run
``python -m kvlab claims --update`` (fills them) and
``python -m kvlab claims --write-readme`` (rewrites README.md's counts block and ``docs/results.md``);
``tests/test_claims.py`` and ``tests/test_claims_ledger_rules.py`` check the result. A row for a new experiment
also sets ``role`` (``claim`` or ``check``), ``paper_cell`` (the paper's numbers, which fix ``direction``),
``proxy_of`` when it re-measures another row with a proxy metric, and writes in ``differs`` what decides the
result (a prompt length, a setting that makes the task impossible at our scale), not only what is smaller::

    from kvlab.experiments import claims
    rows = claims.load()
    rows.append({**dict.fromkeys(claims.FIELDS, ""), "id": "lacache-fig10-span", "paper": "LaCache",
                 "item": "Fig. 10 (span S, PPL)", "kind": "statistical", "role": "claim",
                 "paper_cell": "A better, no number (Fig. 10: ...)", "direction": "a<b", "metric": "window_nll", ...})
    claims.save(rows)          # then: python -m kvlab claims --update --write-readme
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

__all__ = ["FIELDS", "KINDS", "ROLES", "PAPERS", "INVENTORY", "ledger_path", "load", "validate", "recompute",
           "derive_verdict", "update", "table", "readme_block", "results_page", "write_readme", "stale_pages",
           "counts", "summary", "counts_text", "items_of", "untested_items", "paper_direction", "lower_is_better",
           "run_tests", "exact_columns", "main", "strict_row", "decided_strictly", "outcomes", "paper_effect",
           "planned_n", "stated_floor", "block_size", "DECIDED", "cell_key", "plan_orders", "decided_late",
           "PLAN_ORDERS"]

ROOT = Path(__file__).resolve().parents[2]  # the repository: kvlab/experiments/claims.py
FIELDS = ["id", "paper", "item", "claim", "kind", "paper_value", "our_value", "n", "estimate", "ci_low", "ci_high",
          "p_value", "verdict", "model", "differs", "note", "results_file", "metric", "method_a", "method_b",
          "direction", "filter", "systematic", "test", "where", "command", "role", "proxy_of", "superseded",
          "paper_cell", "paper_effect", "planned_n", "floor", "block", "experiment", "config", "plan"]
RERUN_FIELDS = ("experiment", "config")  # the row's experiment and its options as JSON (kvlab.experiments.rerun)
#: when the row's plan came against its data, from git history (kvlab.experiments.ledger_history; --update)
PLAN_ORDERS = ("before", "with or after", "no plan", "unknown")
#: columns that hold a number (or begin with one): a non-finite one is refused where the file is read
NUMERIC_COLUMNS = ("n", "estimate", "ci_low", "ci_high", "p_value", "systematic", "paper_effect", "planned_n",
                   "floor", "block")
_NON_FINITE = re.compile(r"^[-+]?(?:inf(?:inity)?|nan)\b", re.I)
COMPUTED = ["our_value", "n", "estimate", "ci_low", "ci_high", "p_value", "verdict"]
KINDS = ("statistical", "exact", "summary", "not run", "not testable")
ROLES = ("claim", "check", "sensitivity")
SUPERSEDED = "superseded"
NOT_TESTABLE = "not testable here"
PAPERS = ("SepLLM", "LaCache", "DHSA", "REFORM", "OrthoRank", "kvpress")
MIN_N = 20
SEED = 0
RESAMPLES = 10_000
README_BEGIN = "<!-- claims:begin -->"
README_END = "<!-- claims:end -->"
NO_DATA = "inconclusive (no per-example data)"
BUCKETS = ("agrees", "smaller", "does not agree", "excluded", "floor", "not measurable", "inconclusive", "not run")
#: the verdicts that decide a claim: its sign (at the paper's size or short of it), or that an effect of the
#: paper's size is ruled out
DECIDED = ("agrees", "smaller", "does not agree", "excluded")
#: the ledger's strict rule (:func:`strict_rows`): a claim row tests at most this many numbered items ...
STRICT_MAX_ITEMS = 2
#: ... and is decided on the paper's own quantity only from this many independent examples on
DECIDED_MIN_N = 30
OTHER_BUCKETS = (SUPERSEDED, NOT_TESTABLE)
WRITE_COMMAND = "python -m kvlab claims --write-readme"


# Every numbered table and figure of the five papers: the items a ledger row can test. Coverage per paper is the
# share of these with a tested row (:func:`summary`). kvpress is a peer implementation, not a paper: no items.
INVENTORY: dict[str, tuple[str, ...]] = {
    # Fig. 7 is a diagram of the streaming cache (nothing to test); Fig. 2 is the observation the method rests on
    "SepLLM": tuple(f"Table {i}" for i in range(1, 18)) + tuple(f"Fig. {i}" for i in (1, 2, 5, 6, 8, 9, 10, 11)),
    "LaCache": tuple(f"Table {i}" for i in range(1, 7)) + tuple(f"Fig. {i}" for i in (3, 5, 6, 7, 8, 9, 10)),
    "DHSA": tuple(f"Table {i}" for i in range(1, 4)) + tuple(f"Fig. {i}" for i in (2, 6, 7, 8, 9, 10)),
    # Table 6 is two tables: 6a the ablations (quality), 6b the efficiency at 256K and 1M tokens
    "REFORM": tuple(f"Table {i}" for i in (1, 2, 3, 4, 5)) + ("Table 6a", "Table 6b", "Table 7")
              + tuple(f"Fig. {i}" for i in (2, 3, 4)),
    "OrthoRank": tuple(f"Table {i}" for i in range(1, 5)) + tuple(f"Fig. {i}" for i in range(2, 8)),
    "kvpress": (),
}
_ITEM_RE = re.compile(r"\b(Tables?|Figs?\.|Figures?)\s*((?:\d+[a-z]?)(?:\s*(?:[-\u2013/,]|and)\s*\d+[a-z]?)*)")


def items_of(item: str, paper: str | None = None) -> list[str]:
    """The numbered tables and figures an ``item`` cell names, normalised: ``"Tables 2-3, Figs. 5-6 (training)"``
    gives ``["Table 2", "Table 3", "Fig. 5", "Fig. 6"]``; ``"Table 6a"`` gives ``["Table 6"]``; ``"Sec. 3"``
    gives ``[]``. With ``paper``, a lettered table that the paper's :data:`INVENTORY` lists apart (REFORM's
    Tables 6a and 6b) keeps its letter."""
    out: list[str] = []
    inventory = set(INVENTORY.get(paper or "", ()))
    for kind, numbers in _ITEM_RE.findall(item):
        label = "Table" if kind.startswith("Table") else "Fig."
        for part in re.split(r"\s*(?:[,/]|and)\s*", numbers):
            ends = [re.match(r"(\d+)([a-z]?)", x).groups() for x in re.split(r"\s*[-\u2013]\s*", part) if x]
            for i in range(int(ends[0][0]), int(ends[-1][0]) + 1):
                name = f"{label} {i}"
                if len(ends) == 1 and f"{name}{ends[0][1]}" in inventory:
                    name += ends[0][1]
                if name not in out:
                    out.append(name)
    return out


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
        # a ledger written before the plan column, or before the rerun columns too
        older = [[f for f in FIELDS if f != "plan"], [f for f in FIELDS if f not in (*RERUN_FIELDS, "plan")]]
        if reader.fieldnames != FIELDS and reader.fieldnames not in older:
            raise ValueError(f"{path}: columns must be exactly {FIELDS}, got {reader.fieldnames}")
        rows = []
        for r in reader:
            where = f"{path}, line {reader.line_num} (id {r.get('id')!r})"
            if None in r:
                raise ValueError(f"{where}: {len(FIELDS) + len(r[None])} fields where the header has {len(FIELDS)}; "
                                 f"the extra ones are {r[None]!r}. A field holding a comma must be quoted "
                                 "(\"--sizes 1,2,4\"): write rows with kvlab.experiments.claims.save or the csv module")
            short = [k for k, v in r.items() if v is None]
            if short:
                raise ValueError(f"{where}: missing fields {short}; every row has the header's {len(FIELDS)} "
                                 "fields (leave a field empty, do not drop it)")
            bad = [k for k in NUMERIC_COLUMNS if _NON_FINITE.match((r.get(k) or "").strip())]
            if bad:
                raise ValueError(f"{where}: column {bad[0]} holds {r[bad[0]]!r}, not a finite number; write a finite "
                                 "value (or leave a computed column empty and run python -m kvlab claims --update)")
            rows.append({**dict.fromkeys((*RERUN_FIELDS, "plan"), ""), **r})
        return rows


def save(rows: list[dict], path: str | Path | None = None) -> None:
    path = Path(path) if path is not None else ledger_path()
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=FIELDS, lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: r.get(k, "") for k in FIELDS})
    path.write_text(buf.getvalue(), encoding="utf-8")


# ----------------------------------------------------------------------------------------------- validation
def _split_tests(spec: str) -> list[tuple[str, str]]:
    out = []
    for t in spec.split(";"):
        if t.strip():
            file, _, name = t.strip().partition("::")
            out.append((file.strip(), name.strip()))
    return out


def run_tests(spec: str, root: str | Path | None = None) -> dict[str, dict]:
    """Run the tests an exact row names (``tests/test_x.py::test_name;...``) with pytest in a subprocess and
    return, per named test, ``{"collected": k, "passed": p, "failed": f, "skipped": s, "reason": str}``
    (a parametrised test is k cases). A name pytest does not collect (a ``def test_x(`` inside a docstring, a
    typo) has ``collected == 0`` and no skip reason."""
    import subprocess
    import tempfile

    root = Path(root) if root is not None else ROOT
    tests = _split_tests(spec)
    out = {f"{f}::{n}": {"collected": 0, "passed": 0, "failed": 0, "skipped": 0, "reason": ""} for f, n in tests}
    files = sorted({f for f, _ in tests if (root / f).is_file()})
    names = sorted({n for f, n in tests if n})
    if not files or not names:
        return out
    with tempfile.TemporaryDirectory() as tmp:
        xml = Path(tmp) / "junit.xml"
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "junit_family=xunit1",
               f"--junitxml={xml}", "-k", " or ".join(names), *files]
        proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True)
        if not xml.is_file():
            raise RuntimeError(f"pytest did not run the tests {spec!r} (exit {proc.returncode}):\n"
                               + (proc.stdout + proc.stderr)[-2000:])
        _count_cases(xml, out, files)
    return out


def _count_cases(report: Path, out: dict[str, dict], files: list[str]) -> None:
    """Add the test cases of pytest's JUnit report ``report`` to ``out`` (see :func:`run_tests`); a named test of a
    module that pytest skipped whole counts as one skip, with the module's reason."""
    import xml.etree.ElementTree as ET

    module_skips = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        file = case.get("file") or ""
        name = (case.get("name") or "").split("[")[0]
        skipped = case.find("skipped")
        key = f"{file}::{name}"
        if key not in out:
            if skipped is not None and file in files:  # the whole module was skipped: the reason is in the text
                found = re.search(r"Skipped: ([^\"')]+)", skipped.text or "")
                module_skips[file] = found.group(1).strip() if found else skipped.get("message", "skipped")
            continue
        o = out[key]
        o["collected"] += 1
        if skipped is not None:
            o["skipped"] += 1
            o["reason"] = skipped.get("message", "skipped")
        elif case.find("failure") is not None or case.find("error") is not None:
            o["failed"] += 1
        else:
            o["passed"] += 1
    for key, o in out.items():
        file = key.split("::")[0]
        if not o["collected"] and file in module_skips:
            o["skipped"], o["reason"] = 1, module_skips[file]


def exact_columns(row: dict, root: str | Path | None = None) -> dict:
    """The computed columns of an exact row from running its named tests (:func:`run_tests`): ``n`` = test cases
    collected, ``estimate`` = cases passed, ``verdict`` = ``agrees`` when every named test was collected and
    passed, ``does not agree`` when one failed, ``not run (...)`` when pytest skipped them in this environment.
    A named test that pytest does not collect raises."""
    results = run_tests(row["test"], root)
    missing = [k for k, o in results.items() if not o["collected"] and not o["skipped"]]
    if missing:
        raise ValueError(f"claim {row['id']}: pytest collects no test {missing} (column test); name a test "
                         "function that exists, as tests/test_x.py::test_name")
    n = sum(o["collected"] for o in results.values())
    passed = sum(o["passed"] for o in results.values())
    failed = [k for k, o in results.items() if o["failed"]]
    skipped = [k for k, o in results.items() if o["skipped"] and not o["passed"] and not o["failed"]]
    if failed:
        verdict = "does not agree"
    elif skipped:
        reason = results[skipped[0]]["reason"].replace("\n", " ").split(":")[0][:80]
        verdict = f"not run (tests skipped here: {reason})"
    else:
        verdict = "agrees"
    return {"n": str(n), "estimate": str(passed), "verdict": verdict}


_NUM = r"-?\d+(?:\.\d+)?"
_CELL_NUMBERS = re.compile(rf"^(?P<a>{_NUM}) vs (?P<b>{_NUM}) \((?P<sense>higher|lower) is better(?:; (?P<src>.+))?\)$")
_CELL_WORDS = re.compile(r"^(?:(?P<who>A|B) better, no number|A matches B) \((?P<src>.+)\)$")
# metrics where a smaller value is the better one (the ledger's own metric names)
_LOWER_IS_BETTER = re.compile(r"nll|ppl|perplexity|loss|latency|seconds|memory|flops|attention_map|_ms$|_bytes$", re.I)


def lower_is_better(metric: str) -> bool:
    """Whether a smaller value of the ledger metric ``metric`` is better (NLL, perplexity, latency ...)."""
    return bool(_LOWER_IS_BETTER.search(metric))


def paper_direction(row: dict) -> str | None:
    """The ``direction`` that the paper's own cell (column ``paper_cell``) gives for this row's metric, or None
    when the row has no cell.

    ``paper_cell`` is one of ``"77.18 vs 69.67 (higher is better; Table 1, ...)"`` (the paper's numbers for A
    and B in the paper's metric), ``"A better, no number (Fig. 8: ...)"`` / ``"B better, no number (...)"`` (a
    figure or a sentence), or ``"A matches B (...)"`` (an equality claim, tested as "A not worse than B"). The
    paper's better method is then mapped onto this row's metric: ``a>b`` when A is better and higher values of
    ``metric`` are better, ``a<b`` when A is better and lower values are better (NLL), and so on."""
    cell = row["paper_cell"].strip()
    if not cell:
        return None
    m = _CELL_NUMBERS.match(cell)
    if m:
        a, b = float(m["a"]), float(m["b"])
        if a == b:
            raise ValueError(f"claim {row['id']}: column paper_cell gives A = B = {a}; write 'A matches B (...)' "
                             "for an equality")
        a_better = (a > b) == (m["sense"] == "higher")
    else:
        m = _CELL_WORDS.match(cell)
        if not m:
            raise ValueError(f"claim {row['id']}: column paper_cell must read 'X vs Y (higher is better; source)', "
                             f"'A better, no number (source)', 'B better, ...' or 'A matches B (source)', got {cell!r}")
        a_better = m["who"] != "B"
    higher = not lower_is_better(row["metric"])
    return "a>b" if a_better == higher else "a<b"


def validate(rows: list[dict]) -> None:
    """Raise ``ValueError`` listing every row that breaks the ledger's rules (kinds, required columns, files,
    typed numbers). Computed numbers are checked by :func:`recompute` and, for exact rows, by running their
    tests (:func:`exact_columns`; see ``tests/test_claims.py``)."""
    problems = []
    seen = set()
    by_id = {str(r.get("id")): r for r in rows}
    for i, r in enumerate(rows, start=2):
        problems += _row_problems(r, f"row {i} ({r.get('id') or '?'})", seen, by_id)
    problems += _one_claim_per_cell(rows)
    if problems:
        raise ValueError("claims ledger:\n  " + "\n  ".join(problems))


def cell_key(r: dict) -> tuple | None:
    """The paper cell a statistical row compares, as ``(paper, items, A's number, B's number)`` from its
    ``paper_cell`` (``"77.18 vs 69.67 (...)"``) and ``item``; None for a cell without numbers (a figure or a
    sentence, where one figure holds several claims)."""
    m = _CELL_NUMBERS.match(r.get("paper_cell", "").strip())
    if not m:
        return None
    return (r["paper"], tuple(items_of(r["item"], r["paper"])), float(m["a"]), float(m["b"]))


def _one_claim_per_cell(rows: list[dict]) -> list[str]:
    """One paper cell, one claim row: two live statistical claim rows of the same cell (:func:`cell_key`; another
    model, another configuration) are refused."""
    seen: dict[tuple, str] = {}
    problems = []
    for r in rows:
        if not (isinstance(r.get("role"), str) and r.get("kind") == "statistical" and _counted_claim(r)):
            continue
        key = cell_key(r)
        if key is None:
            continue
        if key in seen:
            problems.append(f"{r['id']} and {seen[key]} are two claim rows of one paper cell ({key[0]} "
                            f"{', '.join(key[1])}: {key[2]:g} vs {key[3]:g}); the claim is the configuration and "
                            "model the cell names (or the nearest, chosen before the run): make the other role "
                            "'sensitivity'")
        else:
            seen[key] = r["id"]
    return problems


def _row_problems(r: dict, where: str, seen: set, by_id: dict) -> list[str]:
    """What one row breaks (:func:`validate`); adds its id to ``seen``."""
    bad = [k for k in FIELDS if not isinstance(r.get(k, ""), str)]
    if bad:  # a row built in Python: every ledger value is text, as load() reads it
        return [f"{where}: columns {bad} must be strings (as kvlab.experiments.claims.load reads the CSV), got "
                f"{[type(r[k]).__name__ for k in bad]}"]
    problems = []
    if not r["id"] or r["id"] in seen:
        problems.append(f"{where}: id must be unique and non-empty")
    seen.add(r["id"])
    verdict = r["verdict"]
    if not _known_verdict(verdict):
        problems.append(f"{where}: verdict {verdict!r} is not one of {VERDICT_WORDS()} (exactly, in lower case; "
                        "a reason may follow in parentheses): run `python -m kvlab claims --update` rather than "
                        "typing it")
    if r["paper"] not in PAPERS:
        problems.append(f"{where}: paper must be one of {PAPERS}, got {r['paper']!r}")
    if r["kind"] not in KINDS:
        problems.append(f"{where}: kind must be one of {KINDS}, got {r['kind']!r}")
        return problems
    for col in ("item", "claim", "paper_value", "model", "differs", "where"):
        if not r[col].strip():
            problems.append(f"{where}: {col} is empty (write 'none' where nothing differs)")
    problems += _KIND_PROBLEMS[r["kind"]](r, where)
    if r.get("plan", "") not in ("", *PLAN_ORDERS) or (r.get("plan") and r["kind"] != "statistical"):
        problems.append(f"{where}: plan is one of {PLAN_ORDERS} on a statistical row (written by python -m kvlab "
                        f"claims --update from git history), got {r.get('plan')!r}")
    problems += _role_problems(r, where, by_id)
    problems += _rerun_problems(r, where)
    return problems


def _statistical_problems(r: dict, where: str) -> list[str]:
    problems = []
    for col in ("results_file", "metric", "method_a", "method_b", "command"):
        if not r[col].strip():
            problems.append(f"{where}: a statistical row needs {col}")
    if r["direction"] not in ("a>b", "a<b"):
        problems.append(f"{where}: direction must be 'a>b' or 'a<b' (the paper's ordering of A and B)")
    if r["method_a"].strip() and r["method_a"].strip() == r["method_b"].strip():
        problems.append(f"{where}: method_a and method_b are both {r['method_a']!r}: a comparison needs two "
                        "distinct methods (or method_b '=x' for a constant)")
    for f in r["results_file"].split(";"):
        if f.strip() and not (ROOT / f.strip()).is_file():
            problems.append(f"{where}: results_file {f.strip()} does not exist")
        elif f.strip() and not f.strip().endswith(".examples.jsonl.gz"):
            problems.append(f"{where}: results_file of a statistical row must be a records file "
                            f"*.examples.jsonl.gz (kvlab.experiments.records), got {f.strip()}")
    for check in (_systematic, _constant_b, _filter):
        try:
            check(r)
        except ValueError as e:
            problems.append(str(e))
    if r["role"] in ("claim", "sensitivity"):  # a sensitivity row reads the same paper cell
        problems += _direction_problems(r, where)
    return problems


def _direction_problems(r: dict, where: str) -> list[str]:
    """A statistical paper claim's direction is the one its paper cell gives (:func:`paper_direction`)."""
    try:
        expected = paper_direction(r)
    except ValueError as e:
        return [str(e)]
    if expected is None:
        return [f"{where}: a statistical paper claim needs paper_cell, the paper's own cell "
                "('X vs Y (higher is better; Table N, ...)' or 'A better, no number (...)')"]
    if expected != r["direction"]:
        return [f"{where}: direction {r['direction']} contradicts the paper's cell "
                f"{r['paper_cell']!r} for metric {r['metric']!r} (which gives {expected})"]
    return []


def _exact_problems(r: dict, where: str) -> list[str]:
    problems = []
    tests = _split_tests(r["test"])
    if not tests:
        problems.append(f"{where}: an exact row needs test = tests/test_x.py::test_name")
    for file, name in tests:
        if not name or not (ROOT / file).is_file():
            problems.append(f"{where}: test {file}::{name} does not exist (column test: "
                            "tests/test_x.py::test_name, several joined with ';')")
        elif name.split("[")[0] not in _test_functions(ROOT / file):
            problems.append(f"{where}: {file} defines no test function {name.split('[')[0]!r} (a name "
                            "mentioned only in a docstring or comment is not a test); name a `def test_...` "
                            "of that file")
    return problems


def _summary_problems(r: dict, where: str) -> list[str]:
    problems = []
    wanted = SUPERSEDED if r["superseded"].strip() else NO_DATA
    if r["verdict"] != wanted:
        problems.append(f"{where}: a summary row's verdict is {wanted!r}")
    for f in r["results_file"].split(";"):
        if f.strip() and not (ROOT / f.strip()).exists():
            problems.append(f"{where}: results_file {f.strip()} does not exist")
    if not r["results_file"].strip() and not r["where"].strip():
        problems.append(f"{where}: a summary row names its results file or notebook")
    return problems


def _not_run_problems(r: dict, where: str) -> list[str]:
    if r["verdict"] != "not run" or not r["note"].strip():
        return [f"{where}: a 'not run' row has verdict 'not run' and a note saying why"]
    return []


def _not_testable_problems(r: dict, where: str) -> list[str]:
    if r["verdict"] != NOT_TESTABLE or not r["note"].strip():
        return [f"{where}: a 'not testable' row has verdict {NOT_TESTABLE!r} and a note giving the "
                "concrete reason (model size, training time, hardware)"]
    return []


_KIND_PROBLEMS = {"statistical": _statistical_problems, "exact": _exact_problems, "summary": _summary_problems,
                  "not run": _not_run_problems, "not testable": _not_testable_problems}


def _role_problems(r: dict, where: str, by_id: dict) -> list[str]:
    """Every kind of row: its role, the row it is a proxy of, whether it may be superseded."""
    problems = []
    if r["role"] not in ROLES:
        problems.append(f"{where}: role must be one of {ROLES} ('claim': the paper says it; 'check': kvlab's "
                        f"own implementation check), got {r['role']!r}")
    if r["proxy_of"].strip():
        target = by_id.get(r["proxy_of"].strip())
        if target is None:
            problems.append(f"{where}: proxy_of names {r['proxy_of']!r}, which is no row's id")
        elif target["proxy_of"].strip() or target["paper"] != r["paper"]:
            problems.append(f"{where}: proxy_of must name a score row of the same paper that is not itself "
                            f"a proxy, got {r['proxy_of']!r}")
    if r["superseded"].strip() and r["kind"] not in ("statistical", "summary"):
        problems.append(f"{where}: only a statistical or summary row is marked superseded (its run is kept for "
                        "the record)")
    return problems


def _rerun_problems(r: dict, where: str) -> list[str]:
    """A row naming its experiment: the experiment exists, the config is JSON, and ``command`` is the one written
    from them (:func:`kvlab.experiments.ledger_runs.command_text`), so the text cannot drift from the data."""
    if not r.get("experiment", "").strip():
        return [f"{where}: config without experiment"] if r.get("config", "").strip() else []
    from kvlab.experiments import ledger_runs, registry

    try:
        command = ledger_runs.command_text(r)
    except (ledger_runs.RerunError, registry.ParameterError) as e:
        return [f"{where}: {e}"]
    if r["command"] != command:
        return [f"{where}: command must be the one written from experiment and config ({command!r}); run "
                "kvlab.experiments.claims.save after setting experiment/config and command = ledger_runs.command_text(row)"]
    return []


def VERDICT_WORDS() -> tuple[str, ...]:
    """The verdict vocabulary: the module's verdict lists (read when called, so a word added there counts)."""
    return tuple(dict.fromkeys((*BUCKETS, *OTHER_BUCKETS)))


def _known_verdict(verdict: str) -> bool:
    """A verdict is a word of the vocabulary, exactly, optionally followed by a reason in parentheses."""
    return any(verdict == w or (verdict.startswith(f"{w} (") and verdict.endswith(")")) for w in VERDICT_WORDS())


def _test_functions(path: Path) -> set[str]:
    """Names of the test functions ``path`` defines (module level, or methods of its ``Test*`` classes)."""
    import ast

    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return set()
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            names |= {f.name for f in node.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                      and f.name.startswith("test")}
    return names


# ---------------------------------------------------------------------------------------------- recompute
def _records(files: str) -> list[tuple[dict, str]]:
    """Every record of the ``;``-joined files (:func:`kvlab.experiments.records.iter_records`: the one schema,
    checked), with ``file:line`` for messages; a malformed line names its file and line."""
    from kvlab.experiments import records

    out = []
    for f in files.split(";"):
        if f.strip():  # records.RecordError is a ValueError
            out += records.iter_records(ROOT / f.strip(), where=f.strip())
    return out


def _systematic(row: dict) -> float:
    text = row["systematic"].strip()
    if not text:
        return 0.0
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"claim {row['id']}: column systematic must be a number in the metric's units (a "
                         f"decimal point, not a comma), got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"claim {row['id']}: column systematic is a bias bound, a finite number >= 0, got "
                         f"{text!r}; leave it empty when there is none")
    return value


def _constant_b(row: dict) -> float | None:
    text = row["method_b"].strip()
    if not text.startswith("="):
        return None
    try:
        value = float(text[1:])
    except ValueError:
        raise ValueError(f"claim {row['id']}: column method_b '=x' compares with a constant x, a number; got "
                         f"{text!r}") from None
    if not math.isfinite(value):
        raise ValueError(f"claim {row['id']}: column method_b's constant must be finite, got {text!r}")
    return value


def _filter(row: dict):
    text = row["filter"].strip()
    if not text:
        return None
    try:
        return re.compile(text)
    except re.error as e:
        raise ValueError(f"claim {row['id']}: column filter is not a valid regular expression ({e}): "
                         f"{text!r}") from None


_LEADING_NUMBER = re.compile(r"^([-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?)\s+\((.+)\)$", re.I)


def paper_effect(row: dict) -> float | None:
    """The paper's own effect ``A - B`` in this row's units (column ``paper_effect``: ``"-0.0115 (ln(8.62/8.72),
    nats per token)"``: the number, then how it was translated), or None when the column gives why it cannot be
    translated (``"n/a: Fig. 2 is a heat map, no number"``)."""
    text = row.get("paper_effect", "").strip()
    if not text or text.lower().startswith("n/a:"):
        return None
    m = _LEADING_NUMBER.match(text)
    if not m:
        raise ValueError(f"claim {row['id']}: column paper_effect must read 'X (how X was translated into the row's "
                         f"units)' or 'n/a: why it cannot be', got {text!r}")
    value = float(m.group(1))
    if not math.isfinite(value) or value == 0:
        raise ValueError(f"claim {row['id']}: paper_effect must be a finite non-zero A - B, got {text!r}")
    return value


def planned_n(row: dict) -> int | None:
    """The n fixed before the run (column ``planned_n``), or None."""
    text = row.get("planned_n", "").strip()
    if not text:
        return None
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"claim {row['id']}: column planned_n is a whole number >= 1, got {text!r}")
    return int(text)


def stated_floor(row: dict) -> float | None:
    """The floor of the row's task (column ``floor``: ``"0.25 (chance: four options)"``), or None."""
    text = row.get("floor", "").strip()
    if not text:
        return None
    m = _LEADING_NUMBER.match(text)
    if not m:
        raise ValueError(f"claim {row['id']}: column floor must read 'X (why X is the floor: chance, or the "
                         f"model's own floor on the task)', got {text!r}")
    if lower_is_better(row["metric"]):
        raise ValueError(f"claim {row['id']}: a floor is stated for scores where higher is better, not for "
                         f"{row['metric']!r}")
    return float(m.group(1))


def block_size(row: dict) -> int | None:
    """Consecutive examples (in example order) that form one bootstrap block (column ``block``), or None: for
    windows of one stream, which are not independent samples."""
    text = row.get("block", "").strip()
    if not text:
        return None
    if not text.isdigit() or int(text) < 2:
        raise ValueError(f"claim {row['id']}: column block is the number of consecutive examples per block, a "
                         f"whole number >= 2, got {text!r}")
    return int(text)


def _blocks(values: np.ndarray, size: int, row_id: str) -> np.ndarray:
    if values.size % size:
        raise ValueError(f"claim {row_id}: {values.size} examples do not split into blocks of {size}; choose a "
                         "block size that divides n")
    return values.reshape(-1, size).mean(axis=1)


#: metrics scored on the gold text, not on the generation: an empty generation does not touch them
TEACHER_FORCED = ("answer_nll", "nll", "ppl")


def teacher_forced(metric: str) -> bool:
    """Whether ``metric`` scores the gold text (an NLL or perplexity: ``nll``, ``NLL``, ``answer_nll``,
    ``window_nll``, ``ppl``), matched case-insensitively on its last word."""
    return bool(re.search(r"(?:^|_)(?:" + "|".join(w.split("_")[-1] for w in TEACHER_FORCED) + r"|perplexity)$",
                          metric.strip(), re.I))


def _sorted_examples(ids, row: dict) -> list:
    """Example ids in order; ids of mixed kinds (3 and "3") would pair wrongly or not sort: an error naming them."""
    kinds = {type(e).__name__ for e in ids}
    if len(kinds) > 1:
        raise ValueError(f"claim {row['id']}: the example ids of {row['results_file']} mix {sorted(kinds)} (e.g. "
                         f"{sorted(map(repr, ids))[:3]}); write every example id as a string")
    return sorted(ids)


def _paired(row: dict) -> tuple[list[str], np.ndarray, np.ndarray | float, int]:
    """The examples, A's and B's values (or B's constant) and the number of suspect generations."""
    recs = _records(row["results_file"])
    values, outputs = _metric_values(row, recs)
    a = values.get(row["method_a"], {})
    if not a:
        raise ValueError(f"claim {row['id']}: no {row['metric']!r} records of method {row['method_a']!r} in "
                         f"{row['results_file']} (filter {row['filter']!r})")
    if row["method_b"].startswith("="):
        examples, b, methods = _against_constant(row, a)
    else:
        bv = values.get(row["method_b"], {})
        _sorted_examples(list(a) + list(bv), row)
        examples = sorted(set(a) & set(bv))
        if not examples:
            raise ValueError(f"claim {row['id']}: methods {row['method_a']!r} and {row['method_b']!r} share no "
                             f"example with metric {row['metric']!r} in {row['results_file']}")
        b = np.array([bv[e] for e in examples])
        methods = [row["method_a"], row["method_b"]]
    return examples, np.array([a[e] for e in examples]), b, _suspect(row, outputs, examples, methods)


def _metric_values(row: dict, recs: list[tuple[dict, str]]) -> tuple[dict, dict]:
    """Per method, the row's metric per example (records passing the row's filter), and the generated outputs
    per (example, method); ValueError for a value that is no number or an example recorded twice."""
    pattern = _filter(row)
    wanted = {row["method_a"], row["method_b"]}
    values: dict = defaultdict(dict)
    seen: dict = {}
    duplicates = []
    outputs: dict = {}
    for r, where in recs:
        if isinstance(r.get("output"), str):
            outputs[(r["example"], r["method"])] = r["output"]
        if r["metric"] == row["metric"] and (pattern is None or pattern.search(str(r["example"]))):
            key = (r["example"], r["method"])
            if r["method"] in wanted and key in seen:
                duplicates.append(f"{r['example']!r} / {r['method']!r} at {seen[key]} and {where}")
            seen.setdefault(key, where)
            try:
                values[r["method"]][r["example"]] = float(r["value"])
            except (TypeError, ValueError):
                raise ValueError(f"{where}: value must be a number, got {r['value']!r}") from None
    if duplicates:
        raise ValueError(f"claim {row['id']}: {len(duplicates)} duplicate records (the same example and method "
                         f"twice for metric {row['metric']!r}): " + "; ".join(duplicates[:5])
                         + ("; ..." if len(duplicates) > 5 else "") + ". Keep one record per example and method")
    return values, outputs


def _against_constant(row: dict, a: dict) -> tuple[list, float, list[str]]:
    """Method A's examples against the constant of column method_b (``=x``): examples, constant, methods."""
    examples = _sorted_examples(list(a), row)
    b = _constant_b(row)
    av = np.array(list(a.values()))
    if np.all((av == 0) | (av == 1)) and not 0.0 <= b <= 1.0:
        raise ValueError(f"claim {row['id']}: {row['metric']!r} is a 0/1 outcome, so the constant in column "
                         f"method_b must lie in [0, 1], got {row['method_b']!r}")
    return examples, b, [row["method_a"]]


def _suspect(row: dict, outputs: dict, examples: list, methods: list[str]) -> int:
    """How many of the compared generations look like the harness bug (see below)."""
    said = [outputs[(e, m)].strip() for e in examples for m in methods if (e, m) in outputs]
    colon, empty = said.count(":"), said.count("")
    # ':' is the known harness bug: any such answer counts; an empty answer can be the model's own choice (it
    # stopped at once), so empties count only when they are more than a tenth of the answers, and never for a
    # teacher-forced metric (the gold answer's NLL is scored whatever the model generated).
    if teacher_forced(row["metric"]):
        empty = 0
    return colon + (empty if empty > 0.1 * max(1, len(said)) else 0)


def derive_verdict(low: float, high: float, direction: str, n: int, *, p_binary: float | None = None,
                   p_sign: float | None = None, suspect: int = 0, systematic: float = 0.0,
                   paper_effect: float | None = None, at_floor: bool = False, planned_n: int | None = None,
                   unmoved: bool = False) -> str:
    """The verdict rule (module docstring): the 95 % interval ``[low, high]`` of ``A - B`` widened by
    ``systematic``, the paper's ``direction`` (``a>b`` / ``a<b``), ``n`` pairs (or blocks), the exact test on the
    discordant pairs (``p_binary``: McNemar's, for 0/1 outcomes; ``p_sign``: the sign test, for fractional scores
    in [0, 1]), and the number of suspect generations.

    The outcomes, in this order: a run topped up past ``planned_n`` is *inconclusive* (it says so: the examples
    added after looking decide nothing; a run stopped short of its plan for time is decided as it stands, and the
    tables show its n beside the plan); an interval that excludes 0 (and an exact test that agrees) on the other
    side *does not agree*; on the paper's side it is *smaller* when it also excludes the paper's effect
    (``|paper_effect|``: the right sign, an effect of the paper's size ruled out) and *agrees* otherwise; an
    interval that holds 0 is *floor* when ``at_floor`` (every method's score is indistinguishable from the row's
    stated floor: chance, or the model's floor on the task), *not measurable* when ``unmoved`` (both methods gave
    the same value on every example: the instrument did not move, so no interval is a measurement), *excluded*
    when it lies strictly inside ``+-|paper_effect|`` (the paper's effect in the row's units, one rule for every
    kind of outcome), and *inconclusive* otherwise."""
    _check_verdict_args(direction, systematic, paper_effect)
    early = _undecided(n, suspect, planned_n)
    if early:
        return early
    low, high = low - systematic, high + systematic
    if not (math.isfinite(low) and math.isfinite(high)):
        raise ValueError(f"the interval [{low}, {high}] is not finite; check the per-example values")
    reason = ""
    bound = abs(paper_effect) if paper_effect is not None else None
    if not low <= 0 <= high:
        reason = _exact_test_disagrees(p_binary, p_sign)
        if not reason:
            positive = low > 0
            if positive != (direction == "a>b"):
                return "does not agree"
            if bound is not None and (high < bound if positive else -bound < low):
                return "smaller"  # the whole interval short of the paper's effect
            return "agrees"
    if at_floor:
        return "floor"
    if unmoved:
        return "not measurable"
    if bound is not None and -bound < low and high < bound:
        return "excluded"
    return "inconclusive" + reason


def _check_verdict_args(direction: str, systematic, paper_effect) -> None:
    if direction not in ("a>b", "a<b"):
        raise ValueError(f"direction must be 'a>b' or 'a<b', got {direction!r}")
    if isinstance(systematic, bool) or not (isinstance(systematic, (int, float)) and math.isfinite(systematic)
                                            and systematic >= 0):
        raise ValueError(f"systematic must be a finite number >= 0 (a bias bound), got {systematic!r}")
    if paper_effect is not None and not (math.isfinite(paper_effect) and paper_effect != 0):
        raise ValueError(f"paper_effect must be a finite non-zero number (the paper's A - B), got {paper_effect!r}")


def _undecided(n: int, suspect: int, planned_n: int | None) -> str:
    """The inconclusive verdict that no interval can change (suspect answers, a top-up, n < MIN_N), or ''."""
    if suspect:
        return f"inconclusive ({suspect} answers ':' or empty)"
    if planned_n is not None and n > planned_n:
        return f"inconclusive (topped up from the planned n = {planned_n} to {n}; not decided by the top-up)"
    if n < MIN_N:
        return f"inconclusive (n < {MIN_N})"
    return ""


def _exact_test_disagrees(p_binary: float | None, p_sign: float | None) -> str:
    """The reason an interval that excludes 0 decides nothing (its exact test's p >= 0.05), or ''."""
    if p_binary is not None and p_binary >= 0.05:
        return f" (McNemar p = {p_binary:.2g})"
    if p_sign is not None and p_sign >= 0.05:
        return f" (sign test p = {p_sign:.2g})"
    return ""


def _fmt(x: float) -> str:
    return f"{x:.6g}"


def _ppl(nll: float) -> str:
    """exp(nll) to two decimals; past float range (a mean NLL near 1,000 nats) as e^x, not an OverflowError."""
    return f"{math.exp(nll):.2f}" if nll < 700 else f"e^{nll:.4g}"


def _our_value(metric: str, ma: float, mb: float | None, label_b: str) -> str:
    if metric.endswith(("window_nll", "segment_nll")):
        b = _ppl(mb) if mb is not None else label_b
        return f"ppl {_ppl(ma)} vs {b}"
    b = f"{mb:.3g}" if mb is not None else label_b
    return f"{ma:.3g} vs {b}"


def recompute(row: dict) -> dict:
    """The computed columns of a statistical row, from its per-example file (strings, as in the ledger)."""
    from kvlab.eval.stats import paired_bootstrap, proportion_interval, sign_test

    if row["kind"] != "statistical":
        raise ValueError(f"claim {row['id']}: only statistical rows are recomputed (kind {row['kind']!r})")
    if row["method_a"].strip() == row["method_b"].strip():
        raise ValueError(f"claim {row['id']}: method_a and method_b are both {row['method_a']!r}: a comparison needs "
                         "two distinct methods (or method_b '=x' for a constant)")
    examples, a, b, suspect = _paired(row)
    size = block_size(row)
    if size is not None:  # windows of one stream: resample runs of windows, not single windows
        if np.isscalar(b):
            raise ValueError(f"claim {row['id']}: blocks are for paired rows, not a comparison with a constant")
        a, b = _blocks(a, size, row["id"]), _blocks(np.asarray(b), size, row["id"])
    binary = bool(np.all((a == 0) | (a == 1)) and (np.isscalar(b) or np.all((b == 0) | (b == 1))))
    # fractional scores (string_match_all, F1 ...) are bounded like 0/1 outcomes and, with few discordant
    # pairs, the bootstrap alone is optimistic in the same way: the sign test on the discordant pairs must agree
    bv = np.asarray(b)
    fractional = not binary and bool(np.all((a >= 0) & (a <= 1)) and np.all((bv >= 0) & (bv <= 1)))
    n = len(a)
    p_bin = p_sign = None
    if np.isscalar(b):
        if binary:
            iv = proportion_interval(int(a.sum()), n, method="exact")
            est, low, high = iv.estimate - b, iv.low - b, iv.high - b
            p = None
        else:
            iv = paired_bootstrap(a - b, resamples=RESAMPLES, seed=SEED)
            est, low, high = iv.estimate, iv.low, iv.high
            p = sign_test(a, np.full_like(a, b)).p if fractional else None
            p_sign = p
        mb = None
    else:
        iv = paired_bootstrap(a, b, resamples=RESAMPLES, seed=SEED)
        est, low, high = iv.estimate, iv.low, iv.high
        p = sign_test(a, b).p
        p_bin = p if binary else None
        p_sign = p if fractional else None
        mb = float(b.mean())
    floor = stated_floor(row)
    at_floor = floor is not None and _at_floor(a, b, floor, binary)
    verdict = derive_verdict(low, high, row["direction"], n, p_binary=p_bin, p_sign=p_sign, suspect=suspect,
                             systematic=_systematic(row), paper_effect=paper_effect(row), at_floor=at_floor,
                             planned_n=planned_n(row), unmoved=_unmoved(a, b))
    if row.get("superseded", "").strip():
        verdict = SUPERSEDED
    return {"our_value": _our_value(row["metric"], float(a.mean()), mb, row["method_b"][1:]), "n": str(n),
            "estimate": _fmt(est), "ci_low": _fmt(low), "ci_high": _fmt(high),
            "p_value": "" if p is None else _fmt(p), "verdict": verdict}


def _unmoved(a: np.ndarray, b) -> bool:
    """Whether the instrument did not move: both methods gave the same value on every example (a paired row; a
    constant B is no second method)."""
    return not np.isscalar(b) and bool(np.array_equal(a, np.asarray(b)))


def _at_floor(a: np.ndarray, b, floor: float, binary: bool) -> bool:
    """Whether no method's mean score is shown above ``floor``: the lower end of each one's 95 % interval (exact
    for 0/1 outcomes, bootstrap otherwise) is at or below it."""
    from kvlab.eval.stats import paired_bootstrap, proportion_interval

    methods = [a] if np.isscalar(b) else [a, np.asarray(b)]
    for v in methods:
        if binary:
            low = proportion_interval(int(v.sum()), len(v), method="exact").low
        else:
            low = paired_bootstrap(v, resamples=RESAMPLES, seed=SEED).low
        if low > floor:
            return False
    return True


def update(path: str | Path | None = None, *, run_exact: bool = True) -> list[dict]:
    """Recompute every statistical row from its per-example file and (``run_exact``) run every exact row's
    tests with pytest (:func:`exact_columns`), and write the computed columns back into the ledger."""
    rows = load(path)
    validate(rows)
    orders = plan_orders(rows)
    for r in rows:
        if r["kind"] == "statistical":
            r.update(recompute(r))
            r["plan"] = orders.get(r["id"], r.get("plan") or "unknown")
        elif r["kind"] == "exact" and run_exact:
            r.update(exact_columns(r))
    save(rows, path)
    return rows


def plan_orders(rows: list[dict]) -> dict[str, str]:
    """Per statistical row, when its plan came against its data (:func:`kvlab.experiments.ledger_history.plan_order`:
    ``before``, ``with or after``, ``no plan``, ``unknown``); ``{}`` where the repository has no usable git history
    (the column is then kept as it is)."""
    from kvlab.experiments import ledger_history

    try:
        history = ledger_history.History(ROOT)
    except RuntimeError:
        return {}
    return {r["id"]: ledger_history.plan_order(r, history) for r in rows if r["kind"] == "statistical"}


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
        # "Table 1" selects "Table 1 (...)" but not "Table 12 (...)": a selector ending in a digit ends a number
        if items is not None and not any(re.search(re.escape(s.lower()) + (r"(?!\d)" if s[-1:].isdigit() else ""),
                                                   r["item"].lower()) for s in items):
            continue
        out.append(r)
    return out


def _md_cell(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


#: the seven outcomes in one short paragraph, printed under every ledger table (:func:`table`, :func:`outcomes`)
OUTCOMES = (
    ("agrees", "the 95 % interval of A - B excludes 0 on the paper's side"),
    ("smaller", "it excludes 0 on the paper's side and also excludes the paper's own effect: the right sign, but "
                "an effect of the paper's size is ruled out here"),
    ("does not agree", "it excludes 0 on the other side"),
    ("excluded", "the interval lies inside plus/minus the paper's own effect (column paper_effect, in the row's "
                 "units): an effect of the paper's size is ruled out here"),
    ("floor", "every method sits at chance or at the model's floor on the task (a stated floor), so the model "
              "cannot show the effect at all"),
    ("not measurable", "both methods gave the same value on every example: the instrument did not move, so it "
                       "cannot see the difference"),
    ("inconclusive", "none of these: the interval is too wide, n < 20, an exact test disagrees with the bootstrap, "
                     "or the run was topped up past its planned n"),
)


def outcomes(fmt: str = "markdown") -> Table:
    """The seven verdict words explained in one short paragraph (shown under every notebook's ledger table)."""
    if fmt not in ("markdown", "text"):
        raise ValueError(f"fmt must be 'markdown' or 'text', got {fmt!r}")
    mark = "**" if fmt == "markdown" else ""
    return Table("Verdicts: " + "; ".join(f"{mark}{w}{mark}: {why}" for w, why in OUTCOMES) + ". Proxies (another "
                 "quantity than the paper's), sensitivity rows (another configuration of the same cell) and "
                 "implementation checks are marked and not counted as claims; a claim counts as decided only when "
                 "its planned n was committed before its data.")


def _n_cell(r: dict) -> str:
    n, plan = r["n"].strip(), r.get("planned_n", "").strip()
    if not n:
        return f"{plan} planned" if plan else ""
    if block_size(r) is not None:
        n = f"{n} blocks of {r['block'].strip()}"
    return f"{n} of {plan} planned" if plan and n.split()[0] != plan else n


def _plan_mark(r: dict) -> str:
    """For a live statistical claim whose plan did not come before its data: why its verdict decides nothing yet."""
    if not (r["kind"] == "statistical" and _counted_claim(r)) or r.get("plan", "") in ("", "before"):
        return ""
    return {"with or after": "; planned n written with or after the data: not decided, to re-run",
            "no plan": "; no planned n: not decided, to re-run on a committed plan"}.get(r["plan"], "; plan unknown")


def _role_mark(r: dict) -> str:
    if r["proxy_of"].strip():
        return f" (proxy of {r['proxy_of'].strip()})"
    if r["role"] in ("check", "sensitivity"):
        return {"check": " (implementation check)", "sensitivity": " (sensitivity row)"}[r["role"]]
    return ""


def table(paper: str | None = None, items: list[str] | None = None, ids: list[str] | None = None, *,
          fmt: str = "markdown", path: str | Path | None = None, legend: bool = True) -> Table:
    """The ledger's rows for ``paper`` (``"lacache"``, case-insensitive), optionally only ``items`` (substrings
    of the item column, e.g. ``["Table 5"]``) or ``ids``, as ``verdict | this run | paper | 95 % CI | n | item |
    claim`` (the verdict and the numbers first), with the seven verdict words explained below (:func:`outcomes`; ``legend=False`` leaves it out).
    Superseded rows (runs made before a fix) are not shown; proxies, sensitivity rows and checks say what they are.

    ``fmt="markdown"`` (shown rendered in a notebook) or ``"text"`` (aligned columns)."""
    if fmt not in ("markdown", "text"):
        raise ValueError(f"fmt must be 'markdown' or 'text', got {fmt!r}")
    rows = [r for r in _select(load(path), paper, items, ids) if not r["superseded"].strip()]
    if not rows:
        raise ValueError(f"no live claims match paper={paper!r}, items={items!r}, ids={ids!r}; "
                         "see benchmarks/claims.csv for the papers and items")
    # the verdict and the numbers first, the long text last (it wraps in a narrow column; the verdict stays on screen)
    head = ["verdict", "this run", "paper", "95 % CI of A - B", "n", "item", "claim"]
    body = [[r["verdict"] + _role_mark(r) + _plan_mark(r), r["our_value"], r["paper_value"], _ci(r), _n_cell(r),
             r["item"], r["claim"]] for r in rows]
    below = ["", str(outcomes(fmt))] if legend else []
    if fmt == "markdown":
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in body]
        return Table("\n".join(lines + below))
    # a column is at most 40 characters wide; a longer cell wraps onto more lines (never cut), rows apart
    widths = [min(40, max(len(h), *(len(row[i]) for row in body))) for i, h in enumerate(head)]
    lines = [_text_row(head, widths), _text_row(["-" * w for w in widths], widths)]
    for i, row in enumerate(body):
        lines += ([""] if i else []) + [_text_row(row, widths)]
    return Table("\n".join(lines + below))


def _text_row(cells: list[str], widths: list[int]) -> str:
    """One row of an aligned text table: each cell wrapped to its column's width, side by side."""
    import textwrap

    wrapped = [textwrap.wrap(c, w) or [""] for c, w in zip(cells, widths)]
    return "\n".join("  ".join((col[k] if k < len(col) else "").ljust(w) for col, w in zip(wrapped, widths)).rstrip()
                     for k in range(max(len(col) for col in wrapped)))


def readme_block(rows: list[dict] | None = None) -> str:
    """The README's generated block (between the claims markers): per paper, the items covered, the paper
    claims tested and decided, and the implementation checks, proxies and superseded rows counted apart
    (:func:`summary`); every row is in ``docs/results.md`` (:func:`results_page`)."""
    rows = load() if rows is None else rows
    legend = "; ".join(f"*{k}*: {v}" for k, v in SUMMARY_COLUMNS if v and k in README_COLUMNS)
    lines = [README_BEGIN,
             f"<!-- generated by `{WRITE_COMMAND}` from benchmarks/claims.csv; do not edit -->",
             "",
             counts_text(rows, fmt="markdown", columns=README_COLUMNS),
             "",
             legend + ". Every count (checks, sensitivity rows, proxies, superseded rows, plans written late) and "
             "every row: [docs/results.md](docs/results.md) and `python -m kvlab claims --counts`.",
             "",
             README_END]
    return "\n".join(lines)


RESULTS_INTRO = """\
# Results: where each paper agrees at our scale

<!-- generated by `{command}` from benchmarks/claims.csv; do not edit (kvlab/experiments/claims.py, results_page) -->

Every row below is printed from the claims ledger [`benchmarks/claims.csv`](../benchmarks/claims.csv)
(`kvlab.experiments.claims`; regenerate with `python -m kvlab claims --update --write-readme`; `tests/test_claims.py` fails
when this page, a number or a verdict differs from what the per-example results files give). The ledger also
holds, per row, the paper's own cell (whose ordering fixes the row's direction), the configuration difference
that decides the result, the model and the command that produced the results file. The README shows the counts
per paper; the book's results page (`build/book/html/results.html`, built by `bash scripts/test.sh`) shows the
same rows per paper with the command behind each.

**How a verdict is decided.** A claim is a comparison of method A with method B on the same examples (needles,
questions, 1,024-token windows, long-stream segments). We compute the mean per-example difference A - B and its
95 % paired bootstrap interval (`kvlab.eval.paired_bootstrap`: resample the examples with replacement, 10,000
times, keep the middle 95 % of the mean differences; windows of one stream are resampled in blocks of consecutive
windows). Seven outcomes: **agrees**: the interval excludes 0 on the paper's side; **smaller**: it excludes 0 on
the paper's side and also the paper's own effect translated into the row's units (the right sign, the paper's size
ruled out); **does not agree**: it excludes 0 on the other side; **floor**: every method's score is
indistinguishable from a stated floor (chance, or the model's floor on the task), so the model cannot show the
effect; **not measurable**: both methods gave the same value on every example, so the instrument did not move;
**excluded**: the interval lies inside plus/minus the paper's own effect, so an effect of the paper's size is ruled
out; **inconclusive** otherwise, and also with fewer than 20 examples, when the exact test on the discordant pairs (McNemar's for 0/1
outcomes, the sign test for fractional scores) has p >= 0.05, when the run was topped up past its planned n, or
when the examples include a generation the harness is known to get wrong (an answer that is just `:`). A known
systematic error of a measurement (the segmented long-stream approximation) widens the interval first. *exact* rows
are mechanism identities: their named tests are run with pytest and the row records how many pass. Rows without
per-example outcomes (only a mean was stored) say so and decide nothing. Perplexity rows compare the NLL of each
window, so "ppl x vs y" are the windows' geometric means.

**What is counted.** An item is *tested* only by a live paper-claim row with an interval and n >= 20 that names at
most two items; it is *decided* when such a row agrees, is smaller, does not agree or is excluded at n >= 30 on the
paper's own quantity, and its planned n (with the paper cell, metric and comparison) was committed before any of
its results (column `plan`, read from git history; a plan written with or after the data is a finding to re-run,
counted under *plan late*). One paper cell has one claim row. *Implementation checks* (kvlab's own tests and comparisons the paper does not make) and *sensitivity rows*
(another configuration of a cell whose claim row is the paper's stated one) are marked and counted apart from the
paper's claims; a *proxy* row (another quantity than the paper's: the answer NLL beside an accuracy) follows the
score row it re-measures and is not counted; a *superseded* row comes from a run made before a fix and is kept for
the record only; a *not testable here* row names the reason (a 40B model, a fine-tuning run we cannot afford).
"""


def results_page(rows: list[dict] | None = None) -> str:
    """``docs/results.md``, generated whole: the verdict rule, then one table row per claim of the ledger."""
    rows = load() if rows is None else rows
    legend = "; ".join(f"*{k}*: {v}" for k, v in SUMMARY_COLUMNS if v)
    missing = [f"{p}: {', '.join(m)}" for p, m in untested_items(rows).items() if m]
    lines = [RESULTS_INTRO.format(command=WRITE_COMMAND),
             "## Counts per paper", "",
             counts_text(rows, fmt="markdown"), "",
             legend + ".", ""]
    if missing:
        lines += ["Numbered tables and figures with no tested row yet: " + "; ".join(missing) + ".", ""]
    lines += ["## Every row", "",
             "| paper | item | claim (A vs B) | this run | verdict | n | 95 % CI of A - B | where |",
             "|---|---|---|---|---|---|---|---|"]
    for r in _beside(rows):
        verdict = f"**{r['verdict']}**" if r["verdict"] in DECIDED + ("floor", "not measurable") else r["verdict"]
        verdict += _plan_mark(r)
        if r["kind"] == "exact":
            verdict += f" (exact: {r['estimate'] or 0} of {r['n'] or 0} test cases pass)"
        if r["role"] == "check":
            verdict += "; implementation check"
        if r["role"] == "sensitivity":
            verdict += "; sensitivity row, not counted"
        if r["proxy_of"].strip():
            verdict += f"; proxy of {r['proxy_of']}, not counted"
        if r["superseded"].strip():
            verdict += f" ({r['superseded']})"
        cells = [r["paper"], r["item"], r["claim"], r["our_value"], verdict, _n_cell(r), _ci(r), r["where"]]
        lines.append("| " + " | ".join(_md_cell(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def _beside(rows: list[dict]) -> list[dict]:
    """The rows in ledger order, each proxy moved to just after the score row it re-measures."""
    proxies: dict[str, list[dict]] = defaultdict(list)
    ids = {r["id"] for r in rows}
    for r in rows:
        if r["proxy_of"].strip() in ids:
            proxies[r["proxy_of"].strip()].append(r)
    out = []
    for r in rows:
        if r["proxy_of"].strip() in ids:
            continue
        out.append(r)
        out.extend(proxies.get(r["id"], []))
    return out


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
    for b in BUCKETS + OTHER_BUCKETS:
        if verdict == b:
            return b
    return "not run" if verdict.startswith("not run") else "inconclusive"


def counts(rows: list[dict] | None = None) -> dict[str, Counter]:
    """Per paper: how many of its *paper claims* (role ``claim``, not a proxy, not superseded, testable) agree /
    do not agree / are inconclusive / were not run. :func:`summary` gives the full picture."""
    rows = load() if rows is None else rows
    out: dict[str, Counter] = {}
    for r in rows:
        c = out.setdefault(r["paper"], Counter())
        if _counted_claim(r):
            c[_bucket(r["verdict"])] += 1
    return out


TESTED_KINDS = ("statistical", "exact", "summary")


def _counted_claim(r: dict) -> bool:
    """A row that counts as one paper claim: the paper says it, it is not a proxy of another row, its run still
    measures the method, and kvlab can test it."""
    return (r["role"] == "claim" and not r["proxy_of"].strip() and not r["superseded"].strip()
            and r["kind"] != "not testable")


def _tested(r: dict) -> bool:
    return r["kind"] in TESTED_KINDS and not r["superseded"].strip()


def strict_row(r: dict) -> bool:
    """Whether a row tests the items its ``item`` cell names, by the ledger's strict rule: a live paper claim (role
    ``claim``, not a check, sensitivity, proxy or superseded row), statistical (an interval from per-example
    outcomes; not an exact test or a summary), with n >= :data:`MIN_N`, whose item cell names at most
    :data:`STRICT_MAX_ITEMS` tables or figures (two that show the same experiment; never a range over others)."""
    return (_counted_claim(r) and r["kind"] == "statistical" and r["n"].strip().isdigit()
            and int(r["n"]) >= MIN_N and bool(r["ci_low"].strip()) and bool(r["ci_high"].strip())
            and 1 <= len(items_of(r["item"])) <= STRICT_MAX_ITEMS)


def decided_strictly(r: dict) -> bool:
    """A strict row (:func:`strict_row`) decided on the paper's own quantity (no proxy) from n >=
    :data:`DECIDED_MIN_N` (agrees, smaller, does not agree or excluded) whose plan was committed before its data
    (column ``plan``: ``before``)."""
    return decided_late(r) and r.get("plan", "") == "before"


def decided_late(r: dict) -> bool:
    """A strict row with a deciding verdict at n >= :data:`DECIDED_MIN_N`, whatever its plan's date (a plan
    written with or after the data, or none, makes it a finding to re-run: :func:`decided_strictly`)."""
    return strict_row(r) and int(r["n"]) >= DECIDED_MIN_N and r["verdict"] in DECIDED


SUMMARY_COLUMNS = (
    ("items", "numbered tables and figures of the paper"),
    ("not testable", "items with only 'not testable here' rows"),
    ("testable", "items - not testable"),
    ("tested", "items named by a live paper-claim row with an interval and n >= 20 (strict rule)"),
    ("coverage", "tested / testable"),
    ("decided n>=30", "tested items with a row decided (agrees, smaller, does not agree, excluded) on the paper's "
                      "own quantity at n >= 30 from a plan committed before its data"),
    ("decided %", "decided n>=30 / tested"),
    ("plan late", "tested items not decided whose row would be, but its planned n came with or after the data "
                  "(or it has none): findings to re-run on a committed plan"),
    ("claims tested", "paper-claim rows that ran (statistical, exact or summary; checks, sensitivity rows, proxies "
                      "and superseded rows apart)"),
    ("agrees", ""),
    ("smaller", "the right sign, but the interval rules out the paper's size"),
    ("does not agree", ""),
    ("excluded", "the interval rules out an effect of the paper's size"),
    ("floor", "every method at chance or at the model's floor"),
    ("not measurable", "the instrument did not move: the same value for both methods on every example"),
    ("inconclusive", ""),
    ("not run", "testable claims not run yet"),
    ("checks", "implementation checks (kvlab's own tests and comparisons the paper does not make)"),
    ("sensitivity", "another configuration of a claim row's paper cell, shown beside it"),
    ("proxies", "rows on another quantity than the paper's (answer NLL for accuracy ...), counted apart"),
    ("superseded", "rows whose run predates a fix (kept for the record)"),
)


def _items(rows: list[dict], paper: str) -> dict[str, set]:
    inventory = set(INVENTORY.get(paper, ()))
    mine = [r for r in rows if r["paper"] == paper]
    named, tested, decided, late = set(), set(), set(), set()
    for r in mine:
        names = set(items_of(r["item"], paper)) & inventory
        named |= names
        if strict_row(r):
            tested |= names
            if decided_strictly(r):
                decided |= names
            elif decided_late(r):
                late |= names
    not_testable = {i for i in named - tested
                    if all(r["kind"] == "not testable" for r in mine if i in items_of(r["item"], paper))}
    return {"not testable": not_testable, "tested": tested, "decided": decided, "late": late - decided}


def summary(rows: list[dict] | None = None) -> dict[str, dict[str, int | str]]:
    """Per paper (and ``"all"``), the ledger's counts, as :data:`SUMMARY_COLUMNS` names them.

    Items come from :data:`INVENTORY` and the ``item`` column (:func:`items_of`): an item is *tested* only by a
    strict row (:func:`strict_row`), *decided* when such a row is decided on the paper's own quantity at n >= 30
    (:func:`decided_strictly`), *not testable* when its only rows are ``not testable`` ones. Rows are counted once:
    a paper claim (role ``claim``) that is not a proxy and not superseded; checks, sensitivity rows, proxies and
    superseded rows have their own columns."""
    rows = load() if rows is None else rows
    papers = list(PAPERS) + sorted({r["paper"] for r in rows} - set(PAPERS))
    out: dict[str, dict] = {}
    total: Counter = Counter()
    for paper in papers:
        mine = [r for r in rows if r["paper"] == paper]
        if not mine and not INVENTORY.get(paper):
            continue
        row = _paper_summary(rows, paper, mine)
        total.update(row)
        out[paper] = row
    out["all"] = dict(total)
    for row in out.values():
        row["coverage"] = f"{100 * row['tested'] / row['testable']:.0f} %" if row["testable"] else "-"
        row["decided %"] = f"{100 * row['decided n>=30'] / row['tested']:.0f} %" if row["tested"] else "-"
    return {p: {k: row[k] for k, _ in SUMMARY_COLUMNS} for p, row in out.items()}


def _paper_summary(rows: list[dict], paper: str, mine: list[dict]) -> dict:
    """One paper's counts of :func:`summary` (``mine``: its rows), before the percentages."""
    items = _items(rows, paper)
    claims_ = [r for r in mine if _counted_claim(r)]
    c = Counter(_bucket(r["verdict"]) for r in claims_)
    live = [r for r in mine if not r["proxy_of"].strip() and not r["superseded"].strip()]
    n_items = len(INVENTORY.get(paper, ()))
    return {"items": n_items, "not testable": len(items["not testable"]),
            "testable": n_items - len(items["not testable"]), "tested": len(items["tested"]),
            "decided n>=30": len(items["decided"]), "plan late": len(items["late"]),
            "claims tested": sum(_tested(r) for r in claims_),
            **{b: c[b] for b in BUCKETS},
            "checks": sum(r["role"] == "check" for r in live),
            "sensitivity": sum(r["role"] == "sensitivity" for r in live),
            "proxies": sum(bool(r["proxy_of"].strip()) and not r["superseded"].strip() for r in mine),
            "superseded": sum(bool(r["superseded"].strip()) for r in mine)}


def untested_items(rows: list[dict] | None = None) -> dict[str, list[str]]:
    """Per paper, the numbered tables and figures that no strict row tests (:func:`strict_row`) and that are not
    'not testable here'."""
    rows = load() if rows is None else rows
    out = {}
    for paper, inventory in INVENTORY.items():
        items = _items(rows, paper)
        out[paper] = [i for i in inventory if i not in items["tested"] | items["not testable"]]
    return out


#: the README's few columns (every column of :data:`SUMMARY_COLUMNS` is on the results page and in ``--counts``):
#: the items tested and decided, and the paper claims by outcome, "smaller" and "not measurable" apart
README_COLUMNS = ("tested", "testable", "decided n>=30", "agrees", "smaller", "does not agree", "excluded", "floor",
                  "not measurable", "inconclusive")


def counts_text(rows: list[dict] | None = None, *, fmt: str = "text", columns: tuple[str, ...] | None = None) -> str:
    """:func:`summary` as aligned text (``python -m kvlab claims --counts``) or a Markdown table (the results page;
    the README's with ``columns=README_COLUMNS``)."""
    rows = load() if rows is None else rows
    s = summary(rows)
    names = [k for k, _ in SUMMARY_COLUMNS] if columns is None else list(columns)
    head = ["paper"] + names
    body = [[p] + [str(row[k]) for k in names] for p, row in s.items()]
    if fmt == "markdown":
        lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
        for cells in body:
            bold = cells[0] == "all"
            lines.append("| " + " | ".join(f"**{c}**" if bold else c for c in cells) + " |")
        return "\n".join(lines)
    widths = [max(len(h), *(len(c[i]) for c in body)) for i, h in enumerate(head)]
    lines = ["  ".join(h.rjust(w) if i else h.ljust(w) for i, (h, w) in enumerate(zip(head, widths)))]
    lines += ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))
              for cells in body]
    missing = untested_items(rows)
    lines += ["", "testable items no strict row tests (a live claim row with an interval, n >= 20, naming at most two items):"]
    lines += [f"  {p}: {', '.join(m)}" for p, m in missing.items() if m]
    return "\n".join(lines)
