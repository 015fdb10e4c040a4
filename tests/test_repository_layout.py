"""The repository stays tidy where students look first (issue 26): notebooks/ shows the numbered notebooks and
START.md, with every parameter set and recorded check in notebooks/params/; benchmarks/results/ holds one folder per
paper or topic, each with a README, and no loose files."""

from __future__ import annotations

import pathlib
import re

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
    import importlib.util

    spec = importlib.util.spec_from_file_location("nbscript_layout", ROOT / "scripts" / "notebooks.py")
    nbscript = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(nbscript)
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
