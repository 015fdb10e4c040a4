"""Notebooks are committed clean and wired for CI (STYLE.md 7, 9, 11)."""

from __future__ import annotations

import ast
import json
import pathlib

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb")) + sorted((ROOT / "lessons").glob("**/*.ipynb"))
MARK = "# NBVAL_CHECK_OUTPUT"


def _load(path):
    return json.loads(path.read_text())


def _source(cell):
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_without_outputs(path):
    nb = _load(path)
    assert nb["metadata"].get("kernelspec", {}).get("name") == "python3", "kernelspec must be python3"
    dirty = [i for i, c in enumerate(nb["cells"]) if c["cell_type"] == "code"
             and (c.get("outputs") or c.get("execution_count") is not None)]
    assert not dirty, f"cells {dirty} carry outputs or execution counts: clear them before committing"


@pytest.mark.parametrize("path", [p for p in NOTEBOOKS if p.parent.name == "notebooks"], ids=lambda p: p.name)
def test_parameters_cell_and_ci_parameters(path):
    nb = _load(path)
    tagged = [c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(tagged) == 1, "exactly one cell must be tagged 'parameters'"
    tree = ast.parse(_source(tagged[0]))
    names = {node.target.id for node in tree.body if isinstance(node, ast.AnnAssign)}
    untyped = [n for n in tree.body if isinstance(n, ast.Assign)]
    assert not untyped, "parameters must be typed (`name: type = value  # comment`) for papermill --help-notebook"
    ci = path.parent / "params" / (path.stem + ".ci.yaml")
    assert ci.exists(), f"{ci.name} (small parameters for the test run) is missing"
    unknown = set(yaml.safe_load(ci.read_text()) or {}) - names
    assert not unknown, f"{ci.name} sets parameters the notebook does not have: {sorted(unknown)}"
    checked = sum(_source(c).lstrip().startswith(MARK) or "nbval-check-output" in c["metadata"].get("tags", [])
                  for c in nb["cells"] if c["cell_type"] == "code")
    checks = path.parent / "params" / (path.stem + ".checks.json")
    recorded = json.loads(checks.read_text()) if checks.exists() else []
    assert len(recorded) == checked, (f"{checked} checked cells but {len(recorded)} recorded outputs: "
                                      f"run `python -m kvlab notebooks record {path.relative_to(ROOT)}`")


@pytest.mark.parametrize("path", [p for p in NOTEBOOKS if p.parent.name == "notebooks"], ids=lambda p: p.name)
def test_papermill_documents_every_parameter(path):
    """`papermill --help-notebook` must see each parameter with its type and comment."""
    import papermill

    nb = _load(path)
    cell = next(c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", []))
    names = {n.target.id for n in ast.parse(_source(cell)).body if isinstance(n, ast.AnnAssign)}
    seen = papermill.inspect_notebook(str(path))
    assert set(seen) == names, f"papermill cannot parse {sorted(names - set(seen))} (avoid '=' in comments)"
    for name, info in seen.items():
        assert info["inferred_type_name"] != "None" and info["help"], f"{name}: give it a type and a comment"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_parameters_are_type_checked_right_after(path):
    """The cell after the parameters calls kvlab.check_parameters(globals()), so `papermill -p max_tokens abc`
    fails at once with the parameter's name instead of minutes later in some other cell."""
    cells = _load(path)["cells"]
    at = next(i for i, c in enumerate(cells) if "parameters" in c.get("metadata", {}).get("tags", []))
    setup = next(c for c in cells[at + 1:] if c["cell_type"] == "code")
    assert "kvlab.check_parameters(globals())" in _source(setup), "call kvlab.check_parameters(globals()) in setup"


@pytest.mark.slow
def test_wrong_parameter_type_fails_in_the_setup_cell(tmp_path):
    """Run as papermill would: the injected string reaches check_parameters, which names it."""
    papermill = pytest.importorskip("papermill")
    path = ROOT / "lessons" / "01_streaming_llm.ipynb"
    with pytest.raises(papermill.PapermillExecutionError, match="stream_tokens: expected int, got str"):
        papermill.execute_notebook(str(path), str(tmp_path / "out.ipynb"), parameters={"stream_tokens": "abc"},
                                   kernel_name="python3", progress_bar=False)
