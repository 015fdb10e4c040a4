"""kvlab.experiments.sweep: a grid of calls and a papermill run on a local Dask cluster of two workers."""
from __future__ import annotations

import json

import nbformat
import pytest

from kvlab.sepllm.theory import sliding_window_layers
from kvlab.experiments.sweep import Task, grid_tasks, load_grid, run_sweep, task_key

TARGET = "kvlab.sepllm.theory:sliding_window_layers"


def _notebook(path):
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell("x = 1")
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params, nbformat.v4.new_code_cell("y = x * 7\nprint(y)")]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """One sweep of 6 calls (2 of them invalid) and one notebook on 2 workers, then the same sweep again."""
    root = tmp_path_factory.mktemp("sweep")
    _notebook(root / "tiny.ipynb")
    tasks = grid_tasks(TARGET, {"distance": [1000, 5000], "neighbors": [1, 65, 257]}, name="d{distance}-n{neighbors}")
    tasks.append(Task("notebook", str(root / "tiny.ipynb"), {"x": 6}))
    first = run_sweep(tasks, root / "out", workers=2, progress=False)
    stamps = {p.name: p.stat().st_mtime_ns for p in (root / "out").glob("*.json")}
    again = run_sweep(tasks, root / "out", workers=2, progress=False)
    return root, tasks, first, again, stamps


def test_every_valid_task_done_and_failures_listed_with_parameters(swept):
    root, tasks, first, _, _ = swept
    assert sorted(first.done) == sorted(["d1000-n65", "d1000-n257", "d5000-n65", "d5000-n257", "notebook"])
    failed = {t.name: (t.params, err) for t, err in first.failed}
    assert set(failed) == {"d1000-n1", "d5000-n1"}
    assert failed["d1000-n1"][0] == {"distance": 1000, "neighbors": 1}
    assert "never moves information" in failed["d1000-n1"][1]
    assert "d1000-n1" in first.summary() and "FAILED" in first.summary()
    for name in (n for n in first.done if n != "notebook"):
        rec = json.loads((root / "out" / f"{name}.json").read_text())
        assert rec["result"] == sliding_window_layers(**rec["params"])  # an independent call, same answer
        assert rec["key"] == task_key(next(t for t in tasks if t.name == name))
    assert not (root / "out" / "d1000-n1.json").exists()  # nothing half-written for a failed task


def test_notebook_task_runs_through_papermill(swept):
    root = swept[0]
    executed = json.loads((root / "out" / "notebook.json").read_text())["result"]["notebook"]
    nb = nbformat.read(executed, as_version=4)
    assert any("42" in o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))


def test_second_run_skips_finished_and_retries_only_the_failed(swept):
    root, _, _, again, stamps = swept
    assert sorted(again.skipped) == sorted(["d1000-n65", "d1000-n257", "d5000-n65", "d5000-n257", "notebook"])
    assert again.done == [] and {t.name for t, _ in again.failed} == {"d1000-n1", "d5000-n1"}
    assert {p.name: p.stat().st_mtime_ns for p in (root / "out").glob("*.json")} == stamps


def test_changed_parameters_or_damaged_results_run_again(tmp_path):
    task = Task("one", TARGET, {"distance": 10, "neighbors": 3})
    assert run_sweep([task], tmp_path, workers=1, progress=False).done == ["one"]
    (tmp_path / "one.json").write_text("{not json")  # a result the sweep wrote, damaged since: redone
    assert run_sweep([task], tmp_path, workers=1, progress=False).done == ["one"]
    assert json.loads((tmp_path / "one.json").read_text())["result"] == 5
    task.params["distance"] = 11
    assert run_sweep([task], tmp_path, workers=1, progress=False).done == ["one"]
    assert json.loads((tmp_path / "one.json").read_text())["result"] == 6


def test_grid_files_and_bad_grids(tmp_path):
    grid = tmp_path / "g.yaml"
    grid.write_text(f"target: {TARGET}\nout: res\nfixed: {{distance: 64}}\ngrid: {{neighbors: [2, 3]}}\n")
    tasks, out = load_grid(grid)
    assert [t.params for t in tasks] == [{"distance": 64, "neighbors": 2}, {"distance": 64, "neighbors": 3}]
    assert out == tmp_path / "res"
    grid.write_text(f"target: {TARGET}\ngrids: {{}}\n")
    with pytest.raises(ValueError, match="unknown keys"):
        load_grid(grid)
    with pytest.raises(ValueError, match="non-empty list"):
        grid_tasks(TARGET, {"neighbors": 3})
    with pytest.raises(ValueError, match="unique"):
        run_sweep([Task("a", TARGET), Task("a", TARGET)], tmp_path, workers=1)
