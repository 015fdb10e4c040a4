"""Rerun one row of the claims ledger by its id: ``python -m kvlab claims --rerun ROW [--device D] [--out DIR] [--smoke]``.

Each live row of ``benchmarks/claims.csv`` names, as data, the experiment that produced its results (column
``experiment``, a name of :mod:`kvlab.experiments.registry`) and that experiment's options (column ``config``: a JSON
object, or a JSON list of objects when the committed records came from several runs; ``a;b`` in ``experiment``
names a different experiment for each of them, in order). A rerun

1. turns the configuration into options (:func:`kvlab.experiments.registry.config_argv`) and checks them all before
   anything runs (a ledger cell that the experiment refuses is reported as the ledger's fault);
2. runs the experiment into ``--out`` (default ``build/reruns/ROW``) on ``--device``; ``--smoke`` runs the same code
   at tiny size on the CPU;
3. recomputes the row from the records the run wrote (the files whose names the row's ``results_file`` gives, found in
   ``--out``) with the ledger's own rule (:func:`kvlab.experiments.claims.recompute`), and prints the committed and the
   rerun's n, estimate, interval and verdict side by side; the comparison is also written to ``--out/rerun.json``.

An exact row (a test) is rerun by running its tests. A row whose results cannot be produced again by a command (a
figure read off a page, a superseded run) has no experiment and is refused with the reason.

    python -m kvlab claims --list-experiments          # every experiment: CPU/GPU, model, minutes, the rows it reruns
    python -m kvlab claims --rerun sepllm-t3-flops --smoke
"""
from __future__ import annotations

import json
from pathlib import Path

from kvlab.experiments import registry

__all__ = ["plan", "command_text", "rerun", "rerun_text", "list_experiments_text", "RerunError"]

DEFAULT_OUT = "build/reruns"


class RerunError(ValueError):
    """The row cannot be rerun (no experiment, a configuration the experiment refuses); the message says why."""


def _row(row_id: str, rows: list[dict]) -> dict:
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


def _argv(config: dict, out: Path, device: str | None, smoke: bool) -> list[str]:
    config = {k: v for k, v in config.items() if k not in ("out", "device", "smoke")}
    argv = registry.config_argv(config) + ["--out", str(out)]
    if device:
        argv += ["--device", device]
    if smoke:
        argv.append("--smoke")
    return argv


def _recomputed(row: dict, out: Path) -> dict:
    """The row's computed columns from the records in ``out`` (same file names as ``results_file``)."""
    from kvlab.experiments import claims

    files = [f.strip() for f in row["results_file"].split(";") if f.strip()]
    found = []
    for f in files:
        base = Path(f).name
        base = base if base.endswith(".gz") else base + ".gz"
        hits = sorted(out.rglob(base)) or sorted(out.rglob(base[:-3]))
        if not hits:
            raise RerunError(f"the rerun wrote no {base} in {out} (the row reads {f}); the experiment's records "
                             "must keep the name the ledger's results_file gives")
        found.append(str(hits[0]))
    return claims.recompute({**row, "results_file": ";".join(found)})


def rerun(row_id: str, *, out: str | Path | None = None, device: str | None = None, smoke: bool = False,
          rows: list[dict] | None = None) -> dict:
    """Rerun ledger row ``row_id``: ``{"row", "runs", "committed", "rerun", "out"}`` (see the module's text)."""
    from kvlab.experiments import claims

    rows = claims.load() if rows is None else rows
    row = _row(row_id, rows)
    runs = plan(row)
    out = Path(out) if out is not None else Path(DEFAULT_OUT) / row_id
    argvs = [(name, _argv(cfg, out, device, smoke)) for name, cfg in runs]
    for name, argv in argvs:  # every option of every run checked before the first one starts
        try:
            registry.check_all(name, argv, raise_errors=True)
        except registry.ParameterError as e:
            raise RerunError(f"ledger row {row_id}: its configuration is refused by experiment {name}: {e}") from None
    written: list[str] = []
    for name, argv in argvs:
        print(f"kvlab claims --rerun {row_id}: python -m kvlab run {name} {' '.join(argv)}", flush=True)
        written += [str(p) for p in registry.run(name, argv, raise_errors=True)]
    columns = ("n", "estimate", "ci_low", "ci_high", "verdict")
    committed = {k: row[k] for k in columns}
    if row["kind"] == "statistical":
        new = _recomputed(row, out)
        result = {k: new[k] for k in columns}
    elif row["kind"] == "exact":
        summary = out / "tests.json"
        result = json.loads(summary.read_text()) if summary.is_file() else {"verdict": "ran (no test summary)"}
    else:
        result = {"files": written}
    report = {"row": row_id, "kind": row["kind"], "smoke": smoke, "device": device or "auto",
              "runs": [{"experiment": n, "argv": a} for n, a in argvs], "committed": committed, "rerun": result,
              "out": str(out), "written": written}
    from kvlab.outputs import OutputFolder

    folder = OutputFolder(out, f"python -m kvlab claims --rerun {row_id}")
    folder.claim("rerun.json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    return report


def rerun_text(report: dict) -> str:
    """The side-by-side lines ``claims --rerun`` prints."""
    c, r = report["committed"], report["rerun"]
    lines = [f"{report['row']} ({report['kind']}{', smoke size' if report['smoke'] else ''}) -> {report['out']}"]
    keys = [k for k in ("n", "estimate", "ci_low", "ci_high", "verdict") if k in c or k in r]
    width = max(len(k) for k in keys)
    lines.append(f"  {'':<{width}}  {'committed':>22}  {'rerun':>22}")
    for k in keys:
        lines.append(f"  {k:<{width}}  {str(c.get(k, '')):>22}  {str(r.get(k, '')):>22}")
    if report["kind"] == "statistical" and not report["smoke"]:
        same = all(str(c[k]) == str(r.get(k)) for k in ("n", "estimate"))
        lines.append("  n and estimate reproduced" if same else "  n or estimate differ from the committed row")
    return "\n".join(lines)


def list_experiments_text(rows: list[dict] | None = None) -> str:
    """The registry's table with the ledger rows each experiment reruns."""
    from kvlab.experiments import claims

    rows = claims.load() if rows is None else rows
    uses: dict[str, list[str]] = {}
    for r in rows:
        try:
            for name, _ in plan(r):
                uses.setdefault(name, []).append(r["id"])
        except (RerunError, registry.ParameterError):
            continue
    lines = [registry.list_text(), "", "ledger rows per experiment (python -m kvlab claims --rerun ROW):"]
    for name in registry.EXPERIMENTS:
        ids = uses.get(name, [])
        shown = ", ".join(ids[:6]) + (f" ... ({len(ids)} rows)" if len(ids) > 6 else "")
        lines.append(f"  {name}: {shown or '(no row)'}")
    return "\n".join(lines)

