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
from kvlab.experiments.ledger_runs import RerunError, command_text, find_row, plan

__all__ = ["plan", "command_text", "rerun", "rerun_text", "list_experiments_text", "RerunError", "find_row"]

DEFAULT_OUT = "build/reruns"


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
    # a row pooling two committed folders' files of one name reads one file here: the runs merged into it
    return claims.recompute({**row, "results_file": ";".join(dict.fromkeys(found))})


def rerun(row_id: str, *, out: str | Path | None = None, device: str | None = None, smoke: bool = False,
          rows: list[dict] | None = None) -> dict:
    """Rerun ledger row ``row_id``: ``{"row", "runs", "committed", "rerun", "out"}`` (see the module's text)."""
    from kvlab.experiments import claims

    rows = claims.load() if rows is None else rows
    row = find_row(row_id, rows)
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

