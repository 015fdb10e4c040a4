"""A determined student against the grader: every attack of scripts/make_attack_submissions.py, graded in one
class on a small assignment without a model (fast enough for CI), each with its expected score and flag."""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import pathlib
import shutil
import zipfile

import nbformat
import pytest

from kvlab.classroom import grading
from kvlab.classroom import lessons as classroom

ROOT = pathlib.Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("make_attack_submissions", ROOT / "scripts" / "make_attack_submissions.py")
attacks = importlib.util.module_from_spec(spec)
spec.loader.exec_module(attacks)


def _nobody_processes() -> set[int]:
    """Processes of the user nobody that no grading zygote owns (a child of a class graded at the same time is
    owned by its zygote; a grandchild that outlived its run is not)."""
    found = set()
    for status in pathlib.Path("/proc").glob("[0-9]*/status"):
        try:
            text = status.read_text()
        except OSError:
            continue
        uid = next((line.split()[1] for line in text.splitlines() if line.startswith("Uid:")), None)
        if uid == str(grading.NOBODY):
            ppid = next((line.split()[1] for line in text.splitlines() if line.startswith("PPid:")), "0")
            try:
                parent = (pathlib.Path("/proc") / ppid / "cmdline").read_bytes()
            except OSError:
                parent = b""
            if b"_zygote" not in parent:
                found.add(int(status.parent.name))
    return found


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    root = tmp_path_factory.mktemp("attacks")
    master = attacks.write_master(root / "master" / f"{attacks.NAME}.ipynb")
    (assignment,) = classroom.make([str(master)], out=root / "built")
    subs = root / "subs"
    attacks.write_attacks(assignment.student, subs)
    # the same honest notebook as an export zip: a second row, a second feedback file
    with zipfile.ZipFile(subs / "honest.zip", "w") as z:
        z.write(subs / "honest.ipynb", "honest.ipynb")
    # a malformed notebook (a code cell without `source`): one failed row, the class goes on
    broken = json.loads((subs / "honest.ipynb").read_text())
    del next(c for c in broken["cells"] if c["cell_type"] == "code")["source"]
    (subs / "nosource.ipynb").write_text(json.dumps(broken))
    out = root / "grades"
    (out / "feedback").mkdir(parents=True)
    (out / "feedback" / "last_year.md").write_text("stale")
    before = _nobody_processes()
    old = os.environ.get("KVLAB_BUILT")
    os.environ["KVLAB_BUILT"] = str(root / "built")
    try:
        classroom.grade(assignment, subs, out, jobs=2)
    finally:
        if old is None:
            os.environ.pop("KVLAB_BUILT")
        else:
            os.environ["KVLAB_BUILT"] = old
    with open(out / "final_grades.csv") as f:
        rows = {row["file"]: row for row in csv.DictReader(f)}
    return rows, out, assignment, before


@pytest.mark.parametrize("name", sorted(attacks.ATTACKS))
def test_each_attack_gets_its_expected_score_and_flag(graded, name):
    rows, _, _, _ = graded
    row = rows[f"{name}.ipynb"]
    _, (q1, q2), flag = attacks.ATTACKS[name]
    assert row["grading_status"] == "Completed", row
    assert (float(row["q1"]), float(row["q2"])) == (q1, q2), row
    if flag:
        assert flag in row["review"], row["review"]
    else:
        assert row["review"] == "", row["review"]


def test_the_child_runs_unprivileged_and_leaves_nothing_behind(graded):
    rows, _, assignment, before = graded
    if os.geteuid() == 0:  # the killer could not signal the grader: the rest of the class is graded
        assert float(rows["honest.ipynb"]["total_points_earned"]) == 4
    assert _nobody_processes() <= before  # no grandchild outlived its run
    # nothing was planted beside the autograder zip, and a planted one would be refused
    zips = sorted(assignment.autograder.parent.glob("*.zip"))
    assert zips == [assignment.autograder]


def test_a_planted_autograder_zip_is_refused(graded, tmp_path):
    _, _, assignment, _ = graded
    folder = tmp_path / assignment.name
    shutil.copytree(assignment.autograder.parent.parent, folder)
    shutil.copy(assignment.autograder, folder / "autograder" / f"{assignment.name}-autograder_9999.zip")
    with pytest.raises(ValueError, match="2 autograder zips"):
        classroom.Assignment.at(folder)


def test_feedback_never_echoes_the_students_text_nor_a_hidden_test(graded):
    _, out, _, _ = graded
    for path in (out / "feedback").glob("*.md"):
        assert attacks.SECRET not in path.read_text(), path
    with open(out / "feedback.csv") as f:
        assert attacks.SECRET not in f.read()
    text = (out / "feedback" / "leaker.ipynb.md").read_text()
    assert "raised ValueError" in text


def test_feedback_files_are_keyed_by_the_full_name_and_replaced(graded):
    rows, out, _, _ = graded
    names = {p.name for p in (out / "feedback").iterdir()}
    assert {"honest.ipynb.md", "honest.zip.md"} <= names and "last_year.md" not in names
    assert float(rows["honest.zip"]["total_points_earned"]) == 4


def test_a_malformed_notebook_is_one_failed_row(graded):
    rows, _, _, _ = graded
    row = rows["nosource.ipynb"]
    assert row["grading_status"].startswith("not graded: the notebook could not be read"), row
    assert float(row["total_points_earned"]) == 0


def test_the_default_time_limit_comes_from_the_reference(graded):
    rows, _, _, _ = graded
    stopped = rows["hanger.ipynb"]["review"]
    limit = float(stopped.split("took over ")[1].split(" s")[0])
    assert grading.MIN_LIMIT <= limit < 120, stopped  # not the old 600 s


def test_scan_flags_the_new_routes_and_not_ordinary_code():
    allowed = grading.allowed_imports(["import math\nfrom kvlab.policies import Full, Policy"])
    assert grading.scan("import math\nfrom kvlab.policies import Policy\ndef f(x):\n    return math.sqrt(x)\n"
                        "class P(Policy):\n    def __init__(self):\n        super().__init__()\n", "c",
                        allowed_imports=allowed) == []
    cases = {"getattr(x, 'a' + 'b')": "computed attribute name",
             "class T(float):\n    __eq__ = lambda *a: True": "defines __eq__ in the class T",
             "class T(torch.Tensor):\n    @classmethod\n    def __torch_function__(cls, *a):\n        return True":
                 "defines __torch_function__",
             "import requests": "imports requests, outside",
             "from kvlab.policies import StreamingLLM": "imports StreamingLLM"}
    for source, reason in cases.items():
        found = grading.scan(source, "c", allowed_imports=allowed)
        assert any(reason in f for f in found), (source, found)
