"""Lessons: the master notebook passes its own checks; the student version fails cleanly at exercise 1."""

from __future__ import annotations

import importlib.util
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
LESSONS = sorted((ROOT / "lessons").glob("*.ipynb"))


def _lessons_script():
    spec = importlib.util.spec_from_file_location("lessons_script", ROOT / "scripts" / "lessons.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_strip_solutions_keeps_indentation():
    src = "def f():\n    # BEGIN SOLUTION\n    return 1\n    # END SOLUTION\n"
    assert _lessons_script().strip_solutions(src) == (
        'def f():\n    raise NotImplementedError("write your solution here")\n')


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.name)
def test_master_passes_and_student_fails_cleanly(path, tmp_path):
    import nbformat
    import papermill

    master_out = tmp_path / "master.ipynb"
    papermill.execute_notebook(str(path), str(master_out), kernel_name="python3", cwd=str(path.parent),
                               progress_bar=False)
    outputs = "".join(o.get("text", "") for c in nbformat.read(master_out, 4).cells
                      for o in c.get("outputs", []))
    assert "✓" in outputs and "✗" not in outputs
    student = _lessons_script().make_students(tmp_path / "student")
    target = next(p for p in student if p.name == path.name)
    with pytest.raises(papermill.PapermillExecutionError) as err:
        papermill.execute_notebook(str(target), str(tmp_path / "student_out.ipynb"), kernel_name="python3",
                                   cwd=str(path.parent), progress_bar=False)
    assert err.value.ename == "NotImplementedError"
