"""Grading that resists tampering (kvlab.classroom.grading): every known attack on lesson 01, graded in one class.

Each submission below is made from the student version of lesson 01 (answers filled with the master's
solutions or left empty) plus one attack. Under `otter run` (the tests in the student's kernel after the
student's code) each attack raised its score; here each scores what the honest part of the submission
earns, and the attack shows in the `review` column of final_grades.csv and in the student's feedback.
One `grade` call grades them all (one zygote process, each question of each submission forked from it).
"""

from __future__ import annotations

import csv
import pathlib

import nbformat
import pytest

from kvlab.classroom import grading
from kvlab.classroom import lessons as classroom

LESSON = "01_streaming_llm"
SINK_WINDOW_CLASS = '''class SinkWindow(Policy):
    def __init__(self, sink: int, window: int):
        super().__init__(positions="cache")
        self.sink, self.window = sink, window

    def keep(self, view):
        if view.size <= self.sink + self.window:
            return None
        return torch.tensor(sink_window_keep(view.size, self.sink, self.window))
'''
FAKE_PPL = "ppl_full = 1.0\nppl_sink_window = 2.0  # nothing measured: 2 > 1 passes the public check honestly\n"


def _answer_cells(nb) -> list:
    return [c for c in nb.cells if c.cell_type == "code" and
            {"otter_answer_cell", "otter_assign_solution_cell"} & set(c.metadata.get("tags", []))]


def _submission(assignment, answers: dict[int, str] | None = None, solved: bool = True, edit=None):
    """The student version with answer i (0-based) replaced by ``answers[i]``, the others by the master's
    solution (``solved``) or left as handed out; ``edit(nb)`` changes anything else."""
    nb = nbformat.read(assignment.student, as_version=4)
    reference = [c.source for c in _answer_cells(nbformat.read(assignment.solutions, as_version=4))]
    for i, cell in enumerate(_answer_cells(nb)):
        if answers and i in answers:
            cell.source = answers[i]
        elif solved:
            cell.source = reference[i]
    if edit:
        edit(nb)
    return nb


def _drop_checks_edit_parameters_and_metadata(nb):
    nb.cells = [c for c in nb.cells if "grader.check(" not in c.source]
    for c in nb.cells:
        if "parameters" in c.metadata.get("tags", []):
            c.source = c.source.replace("stream_tokens: int = 64", "stream_tokens: int = 8")
    for test in nb.metadata["otter"]["tests"].values():
        for suite in test["suites"]:
            suite["cases"] = [{"code": ">>> True\nTrue\n", "hidden": False, "locked": False, "points": 100}]


def _metadata_tests_only(nb):
    for test in nb.metadata["otter"]["tests"].values():
        for suite in test["suites"]:
            suite["cases"] = [{"code": ">>> True\nTrue\n", "hidden": False, "locked": False, "points": 100}]


def _copy_first_answer(nb):
    first = _answer_cells(nb)[0]
    at = nb.cells.index(first)
    copy = nbformat.from_dict({**first, "id": "copied-answer", "metadata": dict(first.metadata)})
    copy.source = "def sink_window_keep(n, sink, window):\n    return []  # my first try\n"
    nb.cells.insert(at, copy)


ATTACKS = {
    # the attack: nothing implemented, otter's doctest runner replaced (8/8 under otter run)
    "otter_patch": (dict(answers={0: "import otter.test_files.ok_test as t\n"
                                     "t.run_doctest = lambda *a, **k: (True, '')\n"}, solved=False),
                    {"q1": 0, "q2": 0, "q3": 0}, "otter"),
    # the same against kvlab's own checking code
    "grader_patch": (dict(answers={0: "import kvlab.classroom.grading as g\ng._run_case = lambda *a, **k: (True, '')\n"
                                      "g._restore = lambda *a, **k: []\n"}, solved=False),
                     {"q1": 0, "q2": 0, "q3": 0}, "kvlab.classroom.grading._run_case"),
    # a library function the tests use, replaced: q2's public check would pass (1 point under otter run)
    "torch_patch": (dict(answers={1: "def heavy_hitter_keep(scores, budget, recent):\n    return torch.tensor([0])\n"
                                     "_real = torch.as_tensor\n"
                                     "torch.as_tensor = lambda *a, **k: _real([0, 4, 5, 6])\n"}),
                    {"q1": 3, "q2": 0, "q3": 3}, "torch.as_tensor"),
    # a global over a builtin the hidden tests use: abs() == 0 passed both hidden checks (3/3 under otter run);
    # the typed perplexities pass q3's public check, which pays nothing (the points are on the hidden checks)
    "builtin_shadow": (dict(answers={2: SINK_WINDOW_CLASS + FAKE_PPL + "abs = lambda x: 0.0\n"}),
                       {"q1": 3, "q2": 2, "q3": 0}, "defines abs over the builtins"),
    "builtin_module": (dict(answers={2: SINK_WINDOW_CLASS + FAKE_PPL +
                                        "import builtins\nbuiltins.abs = lambda x: 0.0\n"}),
                       {"q1": 3, "q2": 2, "q3": 0}, "builtins.abs"),
    # check cells deleted, the parameters edited, the tests in the metadata replaced: graded as the master
    "check_cells": (dict(edit=_drop_checks_edit_parameters_and_metadata), {"q1": 3, "q2": 2, "q3": 3},
                    "stream_tokens"),
    "metadata_tests": (dict(solved=False, edit=_metadata_tests_only), {"q1": 0, "q2": 0, "q3": 0}, None),
    # leaving before the tests run costs that question only
    "exit": (dict(answers={0: "import os\nos._exit(0)\n"}), {"q1": 0, "q2": 2, "q3": 3}, "ended before its tests"),
    # an answer that equals anything: the exact type check fails it, and it is flagged
    "eq_override": (dict(answers={0: "class Yes(list):\n    def __eq__(self, other):\n        return True\n\n"
                                     "def sink_window_keep(n, sink, window):\n    return Yes()\n"}),
                    {"q1": 0, "q2": 2, "q3": 3}, "defines __eq__"),
}


@pytest.fixture(scope="module")
def attacked(tmp_path_factory):
    import test_lessons  # the session's build of every lesson (made once)

    root = tmp_path_factory.mktemp("attacks")
    assignment = test_lessons.built_lessons(tmp_path_factory)[LESSON]
    subs = root / "subs"
    subs.mkdir()
    for name, (how, _, _) in ATTACKS.items():
        nbformat.write(_submission(assignment, **how), subs / f"{name}.ipynb")
    # question independence: q1 wrong (keeps everything); q3's policy calls it, but q3 is graded with the reference
    nbformat.write(_submission(assignment, {0: "def sink_window_keep(n, sink, window):\n    return list(range(n))\n"}),
                   subs / "q1_wrong.ipynb")
    nbformat.write(_submission(assignment), subs / "honest.ipynb")
    # an honest student who copied the q1 answer cell to try something (the copy keeps otter's tag)
    nbformat.write(_submission(assignment, edit=_copy_first_answer), subs / "copied_cell.ipynb")
    out = root / "grades"
    classroom.grade(assignment, subs, out, jobs=2, timeout=300)
    with open(out / "final_grades.csv") as f:
        rows = {row["file"]: row for row in csv.DictReader(f)}
    with open(out / "feedback.csv") as f:
        feedback = list(csv.DictReader(f))
    return rows, feedback, out


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_an_attack_scores_only_what_the_honest_part_earns_and_is_flagged(attacked, name):
    rows, _, _ = attacked
    row = rows[f"{name}.ipynb"]
    _, expected, flag = ATTACKS[name]
    assert row["grading_status"] == "Completed", row
    assert {q: float(row[q]) for q in expected} == expected, row
    if flag:
        assert flag in row["review"], row["review"]
    else:
        assert row["review"] == "", row["review"]


def test_honest_submission_gets_full_points_and_no_flag(attacked):
    rows, _, _ = attacked
    row = rows["honest.ipynb"]
    assert float(row["total_points_earned"]) == 8 and row["review"] == "", row


def test_a_copied_answer_cell_is_matched_by_its_check_cell(attacked):
    """Four tagged answer cells where the assignment has three: matched by order, q2 would get the copy."""
    rows, _, _ = attacked
    row = rows["copied_cell.ipynb"]
    assert float(row["total_points_earned"]) == 8, row
    assert "matched to the question whose check cell follows them" in row["review"]


def test_each_question_is_graded_against_the_reference_of_the_others(attacked):
    """q3's policy calls the student's q1; with q1 wrong, otter run gave q3 1 of 3. Graded on its own: 3."""
    rows, _, _ = attacked
    row = rows["q1_wrong.ipynb"]
    assert (float(row["q1"]), float(row["q2"]), float(row["q3"])) == (0, 2, 3), row
    assert row["review"] == ""


def test_feedback_names_the_failed_check_and_its_hint(attacked):
    _, feedback, out = attacked
    mine = [r for r in feedback if r["file"] == "q1_wrong.ipynb" and r["question"] == "q1"]
    public = next(r for r in mine if r["check"] == "q1 check 1")
    assert public["passed"] == "False" and public["hidden"] == "False" and public["earned"] == "0.0"
    assert "keep the 2 oldest (0, 1) and the 3 newest (7, 8, 9)" in public["message"]  # a hint, not bare numbers
    text = (out / "feedback" / "q1_wrong.ipynb.md").read_text()
    assert "## q1: 0 / 3" in text and "q1 check 1 (public, 1 pt): FAILED" in text and "## q3: 3 / 3" in text
    exited = (out / "feedback" / "exit.ipynb.md").read_text()
    assert "Flagged for review" in exited and "ended before its tests" in exited


def test_scan_flags_the_usual_routes_and_not_ordinary_code():
    ordinary = ("def f(x):\n    total = sum(x)\n    self_like = dict(a=1)\n    return sorted(x)[:3]\n"
                "class P(Policy):\n    def keep(self, view):\n        self.k = 1\n        return None\n")
    assert grading.scan(ordinary, "cell", {"stream_tokens"}, {"torch", "Policy"}) == []
    cases = {"import gc": "imports gc", "exec('1')": "uses exec", "torch.allclose = None": "monkeypatching torch",
             "Policy.keep = lambda s, v: None": "monkeypatching Policy", "stream_tokens = 8": "parameter stream_tokens",
             "def len(x):\n    return 0": "redefines the builtin len", "import sys\nsys._getframe()": "_getframe",
             "from builtins import abs": "imports builtins", "setattr(torch, 'x', 1)": "uses setattr"}
    for source, reason in cases.items():
        found = grading.scan(source, "cell", {"stream_tokens"}, {"torch", "Policy"})
        assert any(reason in f for f in found), (source, found)


def test_grade_rejects_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="jobs=0"):
        grading.grade_submissions(pathlib.Path("x.ipynb"), pathlib.Path("x.zip"), [], jobs=0)
    with pytest.raises(ValueError, match="timeout=0"):
        grading.grade_submissions(pathlib.Path("x.ipynb"), pathlib.Path("x.zip"), [], timeout=0)
