"""``python -m kvlab run notebook --notebook 04_sepllm_training --params full``: a numbered notebook, as the ledger ran it.

A ledger row that a notebook's run stands behind (SepLLM's training curves, DHSA's Eq. 4) is re-run by executing
that notebook through papermill with one of its parameter sets, ``notebooks/params/NN_name.<params>.yaml``
(``full``, ``ci`` or ``book``; ``defaults``: the notebook's own defaults), every parameter checked against the
notebook's parameters cell first. Into ``--out``:

    NN_name.ipynb                 the executed notebook (outputs kept)
    notebook.examples.jsonl.gz    one record per code cell: example = its index, metric ``ran`` (1: it ran
                                  without an error), with the seconds it took
    summary.json                  the parameter set, the parameters, the seconds, the device

``--runner plain`` runs the cells in this Python process instead (:mod:`kvlab.notebooks.plain_run`, as the SepLLM
training run went on a GPU host without Jupyter); the executed notebook, its log and figures go in ``OUT/plain/``.

It fails (exit 1) when a cell raises. ``--smoke`` runs the same notebook with its ``ci`` set, on the CPU, up to
and including its set-up cell (the one that checks the parameters: ``check_parameters(globals())``), so the
parameters, the imports and the checks run in seconds; the whole notebook at its ``ci`` set is what
``scripts/test.sh`` runs through nbval.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

from kvlab.experiments import records, registry
from kvlab.outputs import OutputFolder

NAME = "notebook"
ROOT = Path(__file__).resolve().parents[3]
NOTEBOOKS = ROOT / "notebooks"
RECORDS = NAME + records.SUFFIX
SETS = ("full", "ci", "book", "defaults")
RUNNERS = ("papermill", "plain")


def parser():
    p = registry.experiment_parser(NAME, __doc__.split("\n\n")[0])
    p.add_argument("--notebook", required=True,
                   help="a numbered notebook: its name (04_sepllm_training) or its number (04)")
    p.add_argument("--params", choices=SETS, default="full",
                   help="the parameter set notebooks/params/NN_name.PARAMS.yaml (defaults: none; default full)")
    p.add_argument("--runner", choices=RUNNERS, default="papermill",
                   help="papermill (a Jupyter kernel; default) or plain: the cells in this Python process "
                        "(python -m kvlab notebooks run), for a GPU host without Jupyter; its files go in OUT/plain/")
    return p


def notebook_path(name: str) -> Path:
    """``04``, ``04_sepllm_training`` or ``04_sepllm_training.ipynb`` -> the notebook; an unknown name is refused."""
    stem = Path(name).name.removesuffix(".ipynb")
    found = sorted(NOTEBOOKS.glob(f"{stem}*.ipynb")) if stem else []
    exact = [p for p in found if p.stem == stem]
    if exact or len(found) == 1:
        return (exact or found)[0]
    names = sorted(p.stem for p in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    raise registry.ParameterError(f"--notebook {name!r}: " + (f"matches {[p.stem for p in found]}; give one"
                                  if found else f"no such notebook; the notebooks are {names}"))


def parameters(nb: Path, which: str) -> dict:
    """The parameter set ``which`` of ``nb``, checked against its parameters cell (ParameterError otherwise)."""
    from kvlab.core.checks import check_notebook_parameters
    from kvlab.notebooks.copies import read_set

    if which == "defaults":
        return {}
    path = NOTEBOOKS / "params" / f"{nb.stem}.{which}.yaml"
    if not path.is_file():
        have = sorted(p.name.split(".")[1] for p in (NOTEBOOKS / "params").glob(f"{nb.stem}.*.yaml"))
        raise registry.ParameterError(f"--params {which}: {nb.stem} has no {path.relative_to(ROOT)}; its sets are "
                                      f"{have + ['defaults']}")
    try:
        values = read_set(path)
        check_notebook_parameters(nb, values, str(path.relative_to(ROOT)))
    except (ValueError, TypeError) as err:
        raise registry.ParameterError(str(err)) from None
    return values


def check(args) -> None:
    from kvlab.experiments.system.options import check_device, refuse_rerun

    if args.smoke:
        args.params = "ci"
    args.path = notebook_path(args.notebook)
    args.values = parameters(args.path, args.params)
    check_device(args.device)
    refuse_rerun(args.out, RECORDS, args.path.name, "summary.json", "plain")


def _cells(nb) -> list[dict]:
    """Per code cell: whether it ran through and its seconds, from papermill's cell metadata."""
    out = []
    for i, cell in enumerate(c for c in nb.cells if c.cell_type == "code"):
        meta = cell.metadata.get("papermill", {})
        ran = "completed" if cell.get("execution_count") is not None else "pending"  # a plain run's cell
        out.append({"cell": i, "status": meta.get("status", ran), "seconds": meta.get("duration"),
                    "error": any(o.get("output_type") == "error" for o in cell.get("outputs", []))})
    return out


def run(args) -> list[Path]:
    import nbformat

    from kvlab.experiments.system.options import device_string, resolve_device, write_json

    if not hasattr(args, "path"):
        check(args)
    out = OutputFolder(args.out, f"python -m kvlab run {NAME}")
    device = resolve_device(args.device)
    values = {**args.values, **({"device": device} if "device" in _declared(args.path) else {})}
    source = nbformat.read(args.path, as_version=4)
    if args.smoke:
        source = _through_setup(source)
    env_before = os.environ.get("CUDA_VISIBLE_DEVICES")
    if device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # the kernel papermill starts inherits it
    t0 = time.monotonic()
    try:
        run_notebook = _papermill if args.runner == "papermill" else _plain
        target, failure = run_notebook(args, source, values, out)
    finally:
        if device == "cpu":
            os.environ.pop("CUDA_VISIBLE_DEVICES") if env_before is None else os.environ.update(
                CUDA_VISIBLE_DEVICES=env_before)
    seconds = round(time.monotonic() - t0, 1)
    cells = _cells(nbformat.read(target, as_version=4))
    config = {"notebook": args.path.stem, "params": args.params, "runner": args.runner, "smoke": args.smoke}
    recs = [records.record(c["cell"], "notebook", "ran", float(c["status"] == "completed" and not c["error"]),
                           config=config, device=device_string(device), seconds=c["seconds"]) for c in cells]
    written = [records.write(RECORDS, recs, out=out), target]
    written.append(write_json(out, "summary.json", {**config, "parameters": values, "seconds": seconds,
                                                    "failure": failure}))
    if failure:
        raise SystemExit(f"kvlab run {NAME}: {args.path.name} stopped in a cell: {failure}; see {target}")
    return written


def _papermill(args, source, values: dict, out) -> tuple[Path, str | None]:
    """Execute ``source`` through papermill into ``OUT/NN_name.ipynb``: that path and the failure, if any."""
    import papermill

    target = out.claim(args.path.name)
    try:
        papermill.execute_notebook(source, str(target), parameters=values, kernel_name="python3",
                                   cwd=str(NOTEBOOKS), progress_bar=False)
    except papermill.PapermillExecutionError as err:
        return target, f"{err.ename}: {err.evalue}"
    return target, None


def _plain(args, source, values: dict, out) -> tuple[Path, str | None]:
    """Run ``source``'s cells in this process (:mod:`kvlab.notebooks.plain_run`) into ``OUT/plain/`` (its own
    output folder): the executed notebook and the failure, if any."""
    import json

    import nbformat

    from kvlab.notebooks import plain_run

    path = args.path
    if args.smoke:  # the cut copy, beside the results
        path = out.claim(f"{args.path.stem}.smoke.ipynb")
        nbformat.write(source, path)
    argv = [str(path), "--out", str(out.root / "plain"), "--cwd", str(NOTEBOOKS)]
    argv += [x for name, value in values.items() for x in ("-p", name, json.dumps(value))]  # JSON is YAML
    try:
        code = plain_run.main(argv)
    except Exception as err:  # a cell raised: what it left is in the executed copy
        return out.root / "plain" / path.name, f"{type(err).__name__}: {err}"
    return out.root / "plain" / path.name, None if code == 0 else f"{plain_run.COMMAND} exited {code}"


def _through_setup(nb):
    """``nb`` cut after its set-up cell (the first code cell that calls ``check_parameters``)."""
    cut = next((i for i, c in enumerate(nb.cells) if c.cell_type == "code" and "check_parameters(" in c.source),
               len(nb.cells) - 1)
    nb.cells = nb.cells[:cut + 1]
    return nb


def _declared(nb: Path) -> dict:
    from kvlab.core.checks import declared_parameters

    return declared_parameters(nb)


