"""The repository stays tidy where students look first (issue 26): notebooks/ shows the numbered notebooks and
START.md, with every parameter set and recorded check in notebooks/params/; benchmarks/results/ holds one folder per
paper or topic, each with a README, and no loose files. Every command lives in the package (one house): no Python
file with a command line under benchmarks/ or scripts/ (GPU launchers and the README's scripts are shell), and no
driver script among the results."""

from __future__ import annotations

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
PARAMS = NOTEBOOKS / "params"
NUMBERED = re.compile(r"\d\d_[a-z0-9_]+\.ipynb")
# Besides the numbered notebooks: the page scripts/lab.sh opens on, and the parameter folder. Jupyter's own
# checkpoints folder appears when the lab is used and is ignored by git, so it is allowed here too.
NOTEBOOKS_ALSO = {"START.md", "params", ".ipynb_checkpoints"}
RESULTS = ROOT / "benchmarks" / "results"
SIDECAR = re.compile(r"(\d\d_[a-z0-9_]+)\.(ci\.yaml|full\.yaml|book\.yaml|checks\.json)")


def test_notebooks_folder_holds_only_the_numbered_notebooks_start_and_params():
    names = {p.name for p in NOTEBOOKS.iterdir()}
    stray = sorted(n for n in names - NOTEBOOKS_ALSO if not NUMBERED.fullmatch(n))
    assert not stray, (f"notebooks/ should hold only NN_name.ipynb, START.md and params/; found {stray}: "
                       "parameter sets and recorded checks go in notebooks/params/ (kvlab.notebooks.copies reads them there)")
    assert {"START.md", "params"} <= names


def test_every_numbered_notebook_has_its_ci_parameters_and_checks():
    for nb in sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")):
        for suffix in (".ci.yaml", ".checks.json"):
            assert (PARAMS / (nb.stem + suffix)).is_file(), f"notebooks/params/{nb.stem}{suffix} is missing"


def test_params_folder_holds_only_sidecars_of_existing_notebooks():
    for path in sorted(PARAMS.iterdir()):
        match = SIDECAR.fullmatch(path.name)
        assert match, (f"notebooks/params/{path.name}: only NN_name.ci.yaml, .full.yaml, .book.yaml and .checks.json "
                       "belong here")
        assert (NOTEBOOKS / (match.group(1) + ".ipynb")).is_file(), \
            f"notebooks/params/{path.name} belongs to no notebook (notebooks/{match.group(1)}.ipynb is missing)"


def test_scripts_read_the_params_folder():
    from kvlab.notebooks import copies as nbscript

    nb = NOTEBOOKS / "00_tour.ipynb"
    assert nbscript._sidecar(nb, ".ci.yaml") == PARAMS / "00_tour.ci.yaml"
    assert nbscript._parameters(nb), "the CI parameters of notebook 00 were not found in notebooks/params/"


def test_results_folder_has_no_loose_files():
    loose = sorted(p.name for p in RESULTS.iterdir() if p.is_file() and p.name != "README.md")
    assert not loose, (f"benchmarks/results/ should hold only folders and README.md; move {loose} into the folder of "
                       "their paper or topic (kernels/, decode/, fidelity/, ...) and name them in its README.md")


def test_every_results_folder_has_a_readme():
    assert (RESULTS / "README.md").is_file(), "benchmarks/results/README.md (one line per folder) is missing"
    folders = sorted(p for p in RESULTS.iterdir() if p.is_dir() and not p.name.startswith((".", "__")))
    missing = [p.name for p in folders if not (p / "README.md").is_file()]
    assert not missing, (f"benchmarks/results/{{{','.join(missing)}}}/README.md missing: say what the files are, the "
                         "command that made them, the device and the date")
    index = (RESULTS / "README.md").read_text()
    unlisted = [p.name for p in folders if f"`{p.name}/`" not in index]
    assert not unlisted, f"benchmarks/results/README.md has no line for {unlisted}"


# --------------------------------------------------------------------------------------------- one house
#: the Python files allowed under benchmarks/ and scripts/: JupyterLab's configuration, which scripts/lab.sh passes
#: to `jupyter lab --config` (it has no command line of its own)
PYTHON_ALLOWED = {"scripts/jupyter_lab_config.py"}
CLI = re.compile(r"^\s*(import argparse|from argparse |import click|import typer|import fire)|__name__ == .__main__.|"
                 r"sys\.argv", re.M)


def _python_files(*folders: str) -> list[str]:
    return sorted(p.relative_to(ROOT).as_posix() for folder in folders for p in (ROOT / folder).rglob("*.py")
                  if "__pycache__" not in p.parts)


def test_no_python_command_outside_the_package():
    """Every experiment, tool and check runs as ``python -m kvlab ...``; benchmarks/ keeps the thin GPU launchers
    (shell) and its results, scripts/ the README's two commands and their shell helpers."""
    stray = [f for f in _python_files("benchmarks", "scripts") if f not in PYTHON_ALLOWED]
    with_cli = [f for f in stray if CLI.search((ROOT / f).read_text(encoding="utf-8", errors="replace"))]
    assert not stray, (f"Python files outside the package: {stray} (with a command line: {with_cli}); move each "
                       "into kvlab/ (an experiment in kvlab/experiments/ behind `python -m kvlab run NAME`, a tool "
                       "behind `python -m kvlab COMMAND`) and call it from the launcher")


def test_the_allowed_python_file_has_no_command_line():
    for f in sorted(PYTHON_ALLOWED):
        assert not CLI.search((ROOT / f).read_text(encoding="utf-8")), f"{f} grew a command line: move it into kvlab/"


def test_no_driver_script_among_the_results():
    """A results folder holds what a run wrote and its README (which names the command); the command itself lives
    in kvlab/ or benchmarks/gpu/, where it is tested and kept working."""
    scripts = sorted(p.relative_to(ROOT).as_posix() for p in RESULTS.rglob("*")
                     if p.suffix in (".py", ".sh") and p.is_file())
    assert not scripts, (f"driver scripts inside {RESULTS.relative_to(ROOT)}/: {scripts}; move each into "
                         "benchmarks/gpu/ (a launcher) or kvlab/experiments/, and name the command in the folder's "
                         "README.md")
