"""Prepare notebooks for nbval, and record the numbers their checked cells must print.

    python scripts/notebooks.py prepare --out build/notebooks   # what scripts/test.sh runs
    python scripts/notebooks.py record notebooks/01_attention_sinks.ipynb

Notebooks are committed without outputs. ``prepare`` copies each ``notebooks/NN_name.ipynb`` to ``--out``
with the small parameters of ``notebooks/params/NN_name.ci.yaml`` injected (papermill, no execution) and, for
every cell marked ``# NBVAL_CHECK_OUTPUT``, the output recorded in ``notebooks/params/NN_name.checks.json``;
nbval then executes the copy and compares those cells. ``record`` executes a notebook with its CI parameters
and writes the checks file from what the marked cells printed (review the diff before committing it). The
full-size parameter sets, ``notebooks/params/NN_name.full.yaml``, are for papermill by hand (see each notebook).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

import nbformat
import papermill
import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
PARAMS_DIR = "params"  # beside the notebooks: NN_name.ci.yaml, NN_name.full.yaml, NN_name.checks.json
MARK = "# NBVAL_CHECK_OUTPUT"


def _sidecar(nb: pathlib.Path, suffix: str) -> pathlib.Path:
    """``notebooks/NN_name.ipynb`` -> ``notebooks/params/NN_name<suffix>`` (parameter sets and recorded checks)."""
    return nb.parent / PARAMS_DIR / (nb.stem + suffix)


def _parameters(nb: pathlib.Path) -> dict:
    path = _sidecar(nb, ".ci.yaml")
    return yaml.safe_load(path.read_text()) or {} if path.exists() else {}


def _checked(nb) -> list:
    return [c for c in nb.cells if c.cell_type == "code" and c.source.lstrip().startswith(MARK)]


CONFTEST = f"""# Written by scripts/notebooks.py prepare: checked cells compare their numbers with a stated tolerance.
import sys
sys.path.insert(0, {str(ROOT / "scripts")!r})
from nbcheck import pytest_configure  # noqa: E402,F401
"""


def prepare(out: pathlib.Path, names: list[str], overrides: dict | None = None) -> None:
    """Copy notebooks to ``out`` with their CI parameters (then ``overrides``) and their recorded checks."""
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.ipynb"):
        old.unlink()
    (out / "conftest.py").write_text(CONFTEST)
    for path in _selected(names):
        target = out / path.name
        parameters = {**_parameters(path), **(overrides or {})}
        papermill.execute_notebook(str(path), str(target), parameters=parameters, prepare_only=True,
                                   kernel_name="python3", cwd=str(NOTEBOOKS), progress_bar=False)
        nb = nbformat.read(target, as_version=4)
        checks_path = _sidecar(path, ".checks.json")
        expected = json.loads(checks_path.read_text()) if checks_path.exists() else []
        cells = _checked(nb)
        if len(expected) != len(cells):
            sys.exit(f"{path.name}: {len(cells)} cells marked {MARK} but {len(expected)} recorded outputs in "
                     f"{checks_path.relative_to(path.parent)}; run `python scripts/notebooks.py record {path}`")
        for cell, text in zip(cells, expected):
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=text)]
            cell.execution_count = 1  # nbval only compares cells that look executed
        nbformat.write(nb, target)
        print(f"prepared {target} ({len(cells)} checked cells)")


def record(names: list[str]) -> None:
    for path in _selected(names):
        executed = ROOT / "build" / "recorded" / path.name
        executed.parent.mkdir(parents=True, exist_ok=True)
        papermill.execute_notebook(str(path), str(executed), parameters=_parameters(path), kernel_name="python3",
                                   cwd=str(NOTEBOOKS))
        nb = nbformat.read(executed, as_version=4)
        texts = []
        for cell in _checked(nb):
            texts.append("".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream"))
        _sidecar(path, ".checks.json").write_text(json.dumps(texts, indent=1) + "\n")
        print(f"recorded {len(texts)} checked outputs of {path.name}")


def _selected(names: list[str]) -> list[pathlib.Path]:
    if names:
        return [pathlib.Path(n).resolve() for n in names]
    return sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--out", type=pathlib.Path, default=ROOT / "build" / "notebooks")
    p.add_argument("-p", "--parameter", nargs=2, action="append", default=[], metavar=("NAME", "YAML"),
                   help="override a CI parameter, e.g. -p num_threads 1")
    p.add_argument("names", nargs="*")
    r = sub.add_parser("record")
    r.add_argument("names", nargs="*")
    args = parser.parse_args()
    if args.command == "prepare":
        prepare(args.out, args.names, {k: yaml.safe_load(v) for k, v in args.parameter})
    else:
        record(args.names)


if __name__ == "__main__":
    main()
