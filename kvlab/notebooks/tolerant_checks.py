"""Compare a checked notebook cell's printed numbers with a stated tolerance, not character by character.

A cell marked ``# NBVAL_CHECK_OUTPUT`` prints a few rounded key numbers. Recorded on one machine, they can differ
in the last digit on another: a different CPU, thread count or BLAS splits a sum differently, and a perplexity
of 0.8424 rounds to 0.842 here and 0.846 there. nbval compares outputs as strings, so such a check would pass
where it was recorded and fail on the next machine. This plugin keeps nbval's comparison and, only where that
fails, compares again number by number:

* the text between numbers must be the same (runs of spaces count as one, so a column may shift);
* two numbers agree when ``|a - b| <= max(RTOL * max(|a|, |b|), one unit of the last printed digit)``,
  with ``RTOL = 0.01`` (1 %): ``0.842`` vs ``0.846`` agree, ``0.50`` vs ``0.75`` do not, ``1140`` vs ``1141``
  agree, ``1140`` vs ``1160`` do not;
* the output streams must be the same (a warning on stderr that was not recorded still fails).

``python -m kvlab notebooks prepare`` writes a ``conftest.py`` beside the prepared notebooks that loads this plugin,
so ``pytest build/notebooks --nbval-lax`` uses it however it is started. ``tests/test_notebook_checks.py`` runs a
checked notebook with one thread (CI records with two) and compares with :func:`texts_agree`.

With ``KVLAB_EXECUTED_DIR=DIR`` in the environment, the plugin also writes each notebook as nbval executed it
(outputs, figures as image/png, each cell's outcome in its metadata) to ``DIR/NN_name.ipynb`` when the session
ends: ``scripts/test.sh`` sets ``build/executed``, and ``scripts/book.sh`` builds the book from those copies, so
the notebooks run once.
"""

from __future__ import annotations

import math
import re

RTOL = 0.01
NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?|nan|inf", re.IGNORECASE)


def _unit(token: str) -> float:
    """One unit of the last printed digit of ``token`` (``0.842`` -> 0.001, ``1.5e-03`` -> 1e-04)."""
    mantissa, _, exponent = token.lower().partition("e")
    decimals = len(mantissa.split(".", 1)[1]) if "." in mantissa else 0
    return 10.0 ** (int(exponent or 0) - decimals)


def numbers_agree(expected: str, found: str, rtol: float = RTOL) -> bool:
    """Whether two printed numbers agree under the rule in the module docstring."""
    a, b = float(expected), float(found)
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    if math.isinf(a) or math.isinf(b):
        return a == b
    allowed = max(rtol * max(abs(a), abs(b)), _unit(expected), _unit(found))
    return abs(a - b) <= allowed * (1 + 1e-9)


def _split(text: str) -> tuple[list[str], list[str]]:
    """The text between numbers (whitespace runs collapsed) and the numbers, in order."""
    numbers = NUMBER.findall(text)
    words = [re.sub(r"\s+", " ", part) for part in NUMBER.split(text)]
    return words, numbers


def texts_agree(expected: str, found: str, rtol: float = RTOL) -> tuple[bool, str]:
    """Compare two printed outputs: same words, numbers within tolerance. Returns (agree, first difference)."""
    if expected == found:
        return True, ""
    words_e, nums_e = _split(expected)
    words_f, nums_f = _split(found)
    if len(nums_e) != len(nums_f):
        return False, f"{len(nums_e)} numbers expected, {len(nums_f)} found"
    for x, y in zip(words_e, words_f):
        if x != y:
            return False, f"text differs: expected {x!r}, found {y!r}"
    for i, (x, y) in enumerate(zip(nums_e, nums_f)):
        if not numbers_agree(x, y, rtol):
            return False, (f"number {i + 1}: expected {x}, found {y} (allowed: {rtol:.0%} or one unit of the last "
                           "printed digit)")
    return True, ""


def _streams(outputs) -> dict[str, str] | None:
    """stdout/stderr texts of a cell's outputs, or None when it has any other kind of output."""
    texts: dict[str, str] = {}
    for out in outputs:
        if out.get("output_type") != "stream":
            return None
        texts[out["name"]] = texts.get(out["name"], "") + out["text"]
    return texts


def pytest_configure(config):
    import os

    if os.environ.get(EXECUTED_ENV) and not config.pluginmanager.has_plugin("kvlab-save-executed"):
        config.pluginmanager.register(SaveExecuted(os.path.abspath(os.environ[EXECUTED_ENV])), "kvlab-save-executed")
    try:
        from nbval.plugin import IPyNbCell
    except ImportError:  # nbval not installed: nothing to patch
        return
    if getattr(IPyNbCell.compare_outputs, "_kvlab_tolerant", False):
        return
    strict = IPyNbCell.compare_outputs

    def compare_outputs(self, test, ref, skip_compare=None):
        if strict(self, test, ref, skip_compare):
            return True
        found, expected = _streams(test), _streams(ref)
        if found is None or expected is None or set(found) != set(expected):
            return False
        for name, text in expected.items():
            ok, why = texts_agree(self.sanitize(text), self.sanitize(found[name]))
            if not ok:
                self.comparison_traceback.append(f"numbers compared with tolerance: {why}")
                return False
        self.comparison_traceback = []
        return True

    compare_outputs._kvlab_tolerant = True
    IPyNbCell.compare_outputs = compare_outputs


# --- Saving what nbval executed ----------------------------------------------------------------------------------
# nbval runs each notebook in a kernel and compares, but keeps the outputs only in memory. With KVLAB_EXECUTED_DIR
# set, this plugin writes every notebook it saw, as executed (streams, results, figures as image/png, errors), to
# that folder under its own name at the end of the session, so that the book (scripts/book.sh) renders those very
# outputs instead of executing the notebooks a second time. Each code cell's metadata records nbval's outcome
# (``kvlab.nbval``: passed / failed / skipped / not run), and the notebook's metadata the run
# (``kvlab.executed_by``), so the book can refuse a notebook that did not run through.

EXECUTED_ENV = "KVLAB_EXECUTED_DIR"


class SaveExecuted:
    """A pytest plugin object: collects nbval's cell items and their outcomes, writes the notebooks at the end."""

    def __init__(self, out):
        import pathlib

        self.out = pathlib.Path(out)
        self.outcomes: dict[str, str] = {}

    def pytest_runtest_logreport(self, report):
        if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
            self.outcomes[report.nodeid] = report.outcome

    def pytest_sessionfinish(self, session):
        try:
            from nbval.plugin import IPyNbCell
        except ImportError:
            return
        files: dict = {}
        for item in session.items:
            if isinstance(item, IPyNbCell):
                files.setdefault(item.parent, []).append(item)
        for parent, items in files.items():
            if not any(item.nodeid in self.outcomes for item in items):
                continue  # another pytest-xdist worker ran this notebook (each worker collects them all)
            import nbformat

            self.out.mkdir(parents=True, exist_ok=True)
            target = self.out / parent.path.name
            nbformat.write(executed_notebook(parent.nb, items, self.outcomes), target)
            terminal = session.config.pluginmanager.get_plugin("terminalreporter")
            if terminal is not None:
                terminal.write_line(f"kvlab: saved the executed notebook {target}")


def executed_notebook(nb, items, outcomes: dict[str, str]):
    """A copy of ``nb`` whose code cells hold what nbval's ``items`` produced (untouched cells: no outputs)."""
    import copy
    import datetime

    import nbformat

    ran = {id(item.cell): item for item in items}
    out = copy.deepcopy(nb)
    count = 0
    statuses = []
    for original, cell in zip(nb.cells, out.cells):
        if cell.cell_type != "code":
            continue
        item = ran.get(id(original))
        outputs = getattr(item, "test_outputs", None) if item is not None else None
        status = outcomes.get(item.nodeid, "not run") if item is not None else "not run"
        if outputs is None:  # skipped (NBVAL_SKIP), deselected, or never reached
            cell.outputs, cell.execution_count = [], None
            status = "skipped" if status == "skipped" else "not run"
        else:
            count += 1
            cell.execution_count = count
            cell.outputs = [nbformat.from_dict(_plain(o)) for o in outputs]
            for o in cell.outputs:
                if o.output_type == "execute_result":
                    o.execution_count = count
        cell.metadata.setdefault("kvlab", {})["nbval"] = status
        statuses.append(status)
    out.metadata["kvlab"] = {"executed_by": "nbval", "date": datetime.date.today().isoformat(),
                             "cells": {s: statuses.count(s) for s in sorted(set(statuses))}}
    return out


def _plain(output) -> dict:
    """An nbval output as a plain nbformat output dict (nbval builds them from kernel messages)."""
    o = {k: v for k, v in dict(output).items()}
    kind = o["output_type"]
    if kind in ("display_data", "execute_result"):
        o.setdefault("metadata", {})
        o["data"] = dict(o.get("data", {}))
    if kind == "execute_result":
        o.setdefault("execution_count", None)
    return o
