"""The runs a row of the claims ledger names, read from its ``experiment`` and ``config`` cells.

A live row names the experiment that produced its results (a name of :mod:`kvlab.experiments.registry`; ``a;b``
names one experiment per run, in order) and that experiment's options as JSON (an object, or a list of objects when
the committed records came from several runs). :func:`plan` turns the two cells into ``[(experiment, config)]``;
:func:`command_text` writes the ``command`` cell from them, so the text cannot drift from the data. The ledger's
checks (:mod:`kvlab.experiments.claims`) and the rerun (:mod:`kvlab.experiments.rerun`) both read rows through here.
"""
from __future__ import annotations

import json

from kvlab.experiments import registry

__all__ = ["RerunError", "find_row", "plan", "command_text"]


class RerunError(ValueError):
    """The row cannot be rerun (no experiment, a configuration the experiment refuses); the message says why."""


def find_row(row_id: str, rows: list[dict]) -> dict:
    by_id = {r["id"]: r for r in rows}
    if row_id in by_id:
        return by_id[row_id]
    import difflib

    near = difflib.get_close_matches(row_id, list(by_id), n=1, cutoff=0.6)
    raise RerunError(f"no ledger row {row_id!r}" + (f" (did you mean {near[0]!r}?)" if near else "")
                     + "; the ids are column `id` of benchmarks/claims.csv")


def plan(row: dict) -> list[tuple[str, dict]]:
    """The runs that make ``row``'s results: ``[(experiment, config), ...]`` from its ``experiment`` and ``config``
    cells (an exact row without them runs its tests)."""
    name = (row.get("experiment") or "").strip()
    if not name:
        if row["kind"] == "exact" and row.get("test", "").strip():
            return [("tests", {"tests": [t.strip() for t in row["test"].split(";") if t.strip()]})]
        why = row.get("superseded", "").strip() and "it is superseded (its run no longer measures the method)"
        raise RerunError(f"ledger row {row['id']} names no experiment: "
                         + (why or f"its results ({row['kind']}) are not produced by a kvlab command")
                         + (f"; how they were made: {row['command']}" if row.get("command", "").strip() else ""))
    text = (row.get("config") or "").strip()
    try:
        configs = json.loads(text) if text else {}
    except json.JSONDecodeError as e:
        raise RerunError(f"ledger row {row['id']}: config {text!r} is not JSON ({e.msg})") from None
    configs = configs if isinstance(configs, list) else [configs]
    if not all(isinstance(c, dict) for c in configs):
        raise RerunError(f"ledger row {row['id']}: config must be a JSON object of options or a list of them")
    names = [n.strip() for n in name.split(";")]  # runs of several experiments, one config each, in order
    if len(names) == 1:
        names = names * len(configs)
    elif len(names) != len(configs):
        raise RerunError(f"ledger row {row['id']}: experiment names {len(names)} runs ({name!r}) but config holds "
                         f"{len(configs)}; give one config object per run, in the same order")
    for n in set(names):
        registry.get(n)
    return list(zip(names, configs))


def command_text(row: dict) -> str:
    """The ``command`` cell of a row that names its experiment: the ``python -m kvlab run`` lines of its runs
    (written from ``experiment`` and ``config``, so the two cannot disagree)."""
    import shlex

    return "; ".join(f"python -m kvlab run {name} " + " ".join(shlex.quote(a) for a in registry.config_argv(c))
                     for name, c in plan(row)).replace(" ; ", "; ").strip()
