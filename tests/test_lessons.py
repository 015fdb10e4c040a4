"""The classroom, graded by otter-grader as an instructor would (`python -m kvlab lessons make|grade`).

Every master in lessons/ gets full points; its generated student version gets zero on every autograded
question (solutions and hidden tests removed); the deliberately wrong submissions in tests/fixtures/lessons/
get exactly the partial points written below; the grades CSV has one row per submission. The lessons are
made and graded once for the module (about a dozen notebook runs) and the asserts share the results.
"""

from __future__ import annotations

import csv
import pathlib
import shutil

import nbformat
import pytest

from kvlab import lessons as classroom

ROOT = pathlib.Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "lessons"
MASTERS = classroom.lessons()

# Deliberately wrong submissions (made from the student versions) and the points each question must get.
WRONG = {
    # q1 raises before defining anything; q2 and q3 are right: an error in one question costs only it
    "01_streaming_llm": {"q1": 0, "q2": 2, "q3": 3},
    # q2 forgets to clamp the offsets at R (public test passes, hidden fails); q4 counts StreamingLLM wrong
    "03_lacache": {"q1": 2, "q2": 1, "q3": 2, "q4": 0},
}


def _points(master: pathlib.Path) -> dict[str, float]:
    """Points of each autograded question, read from the master's question configs."""
    import yaml

    points = {}
    for cell in nbformat.read(master, as_version=4).cells:
        if cell.cell_type == "raw" and cell.source.lstrip().startswith("# BEGIN QUESTION"):
            config = yaml.safe_load(cell.source.split("\n", 1)[1])
            if not config.get("manual"):
                points[config["name"]] = config["points"]
    return points


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """name -> (Assignment, {submission file: {question: score, ...}}, path of final_grades.csv)."""
    root = tmp_path_factory.mktemp("classroom")
    out = {}
    for assignment in classroom.make(out=root / "built"):
        subs = root / "submissions" / assignment.name
        subs.mkdir(parents=True)
        shutil.copy(assignment.solutions, subs / "master.ipynb")
        shutil.copy(assignment.student, subs / "student.ipynb")
        wrong = FIXTURES / f"{assignment.name}_wrong.ipynb"
        if wrong.exists():
            shutil.copy(wrong, subs / "wrong.ipynb")
        grades = root / "grades" / assignment.name
        classroom.grade(assignment, subs, grades, jobs=2)
        with open(grades / "final_grades.csv") as f:
            rows = {row["file"]: row for row in csv.DictReader(f)}
        out[assignment.name] = (assignment, rows, grades)
    return out


def test_six_assignments_with_three_to_five_questions_each():
    assert len(MASTERS) >= 6
    for master in MASTERS:
        autograded = _points(master)
        written = classroom.written_questions(master)
        assert 3 <= len(autograded) + len(written) <= 5, master.name
        assert written, f"{master.name} has no written question"
        assert len(autograded) >= 2, master.name


def test_tests_never_call_the_function_the_student_writes():
    """A question's tests must not pass by calling kvlab's version of what the student was asked to write:
    they never import the paper's reference module or the policy the lesson rebuilds."""
    forbidden = ("kvlab.baselines", "kvlab.policies", "kvlab.sepllm", "kvlab.lacache", "kvlab.dhsa", "kvlab.reform",
                 "kvlab.orthorank", "from kvlab", "import kvlab", "StreamingLLM", "H2O", "simulate(")
    for master in MASTERS:
        in_tests = False
        for cell in nbformat.read(master, as_version=4).cells:
            if cell.cell_type == "raw":
                in_tests = {"# BEGIN TESTS": True, "# END TESTS": False}.get(cell.source.strip(), in_tests)
            elif in_tests and cell.cell_type == "code":
                used = [f for f in forbidden if f in cell.source]
                assert not used, (master.name, used, cell.source[:200])


def test_student_version_has_no_solution_and_no_hidden_test(graded):
    for name, (assignment, _, _) in graded.items():
        student = nbformat.read(assignment.student, as_version=4)
        text = "\n".join(c.source for c in student.cells)
        assert "BEGIN SOLUTION" not in text and "# HIDDEN" not in text and "hidden: true" not in text, name
        cases = [case for question in student.metadata["otter"]["tests"].values()
                 for suite in question["suites"] for case in suite["cases"]]
        assert cases and not any(case["hidden"] for case in cases), f"{name}: a hidden test reached the student"


@pytest.mark.parametrize("name", [m.stem for m in MASTERS])
def test_master_gets_full_points(graded, name):
    _, rows, _ = graded[name]
    row = rows["master.ipynb"]
    assert row["grading_status"] == "Completed", row
    points_of = _points(ROOT / "lessons" / f"{name}.ipynb")
    assert points_of and set(points_of) <= set(row), (points_of, row)
    for question, points in points_of.items():
        assert float(row[question]) == points, (question, row)
    assert float(row["percent_correct"]) == 1.0


@pytest.mark.parametrize("name", [m.stem for m in MASTERS])
def test_student_version_runs_and_scores_zero(graded, name):
    _, rows, _ = graded[name]
    row = rows["student.ipynb"]
    assert row["grading_status"] == "Completed", row  # the notebook ran to the end under the grader
    questions = _points(ROOT / "lessons" / f"{name}.ipynb")
    assert questions and all(float(row[q]) == 0 for q in questions), row


@pytest.mark.parametrize("name", sorted(WRONG))
def test_wrong_submission_gets_the_expected_partial_points(graded, name):
    _, rows, _ = graded[name]
    row = rows["wrong.ipynb"]
    assert row["grading_status"] == "Completed", row
    assert {q: float(row[q]) for q in WRONG[name]} == WRONG[name]
    assert float(row["total_points_earned"]) == sum(WRONG[name].values())


def test_grades_csv_has_a_row_per_submission_and_the_written_answers(graded):
    _, rows, grades = graded["01_streaming_llm"]
    assert set(rows) == {"points-per-question", "master.ipynb", "student.ipynb", "wrong.ipynb"}
    total = sum(_points(ROOT / "lessons" / "01_streaming_llm.ipynb").values())
    assert float(rows["points-per-question"]["total_points_earned"]) == total
    with open(grades / "written_answers.csv") as f:
        answers = list(csv.DictReader(f))
    assert [(a["file"], a["question"]) for a in answers] == [
        ("master.ipynb", "q4"), ("student.ipynb", "q4"), ("wrong.ipynb", "q4")]
    wrong = next(a for a in answers if a["file"] == "wrong.ipynb")
    assert "sinks" in wrong["answer"]


def test_a_broken_submission_is_a_row_not_a_crash(tmp_path, graded):
    assignment, _, _ = graded["03_lacache"]
    subs = tmp_path / "subs"
    subs.mkdir()
    (subs / "garbage.ipynb").write_text("this is not a notebook")
    table = classroom.grade(assignment, subs, tmp_path / "grades")
    row = table[table["file"] == "garbage.ipynb"].iloc[0]
    assert row["total_points_earned"] == 0 and row["grading_status"] != "Completed"


def test_lesson_names_resolve():
    assert classroom.lessons(["03"])[0].stem == "03_lacache"
    with pytest.raises(ValueError, match="matches 0"):
        classroom.lessons(["99"])
