"""A determined student against the grader: every attack of kvlab/classroom/attacks.py, graded in one
class beside an honest class of 8 on a small assignment without a model (fast enough for CI), each with its
expected score and flag; the honest 8 graded alone as well (with a full TMPDIR where the test may mount one) score
exactly the same."""

from __future__ import annotations

import csv
import json
import os
import pathlib
import shutil
import subprocess
import tempfile
import zipfile

import nbformat
import pytest

from kvlab.classroom import attacks, grading
from kvlab.classroom import cli, lessons as classroom

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _nobody_processes() -> set[int]:
    """Live processes of the user nobody that no grading zygote owns (a child of a class graded at the same time is
    owned by its zygote; a grandchild that outlived its run is not; a killed one left as a zombie under an init
    that does not reap, as on some CI machines, is not alive)."""
    found = set()
    for status in pathlib.Path("/proc").glob("[0-9]*/status"):
        try:
            text = status.read_text()
        except OSError:
            continue
        uid = next((line.split()[1] for line in text.splitlines() if line.startswith("Uid:")), None)
        state = next((line.split()[1] for line in text.splitlines() if line.startswith("State:")), "")
        if uid == str(grading.NOBODY) and state != "Z":  # a zombie is dead: killed, waiting for init to reap it
            ppid = next((line.split()[1] for line in text.splitlines() if line.startswith("PPid:")), "0")
            try:
                parent = (pathlib.Path("/proc") / ppid / "cmdline").read_bytes()
            except OSError:
                parent = b""
            if b"_zygote" not in parent:
                found.add(int(status.parent.name))
    return found


def _leftovers() -> set[str]:
    """What an attack would leave on the machine: files in /tmp and /dev/shm, a module planted in the project."""
    found = {str(p) for d in ("/tmp", "/dev/shm") for p in pathlib.Path(d).glob("kvlab-attack-*")}
    found |= {str(p) for p in (pathlib.Path("/tmp/kvlab-int80"), ROOT / "matplotlib", ROOT / "math.py") if p.exists()}
    return found


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    root = tmp_path_factory.mktemp("attacks")
    master = attacks.write_master(root / "master" / f"{attacks.NAME}.ipynb")
    (assignment,) = classroom.make([str(master)], out=root / "built", seed=attacks.SEED)
    subs = root / "subs"
    attacks.write_attacks(assignment.student, subs)
    attacks.write_class(assignment.student, subs)
    alone = root / "alone"
    attacks.write_class(assignment.student, alone)
    # the same honest notebook as an export zip: a second row, a second feedback file
    with zipfile.ZipFile(subs / "honest.zip", "w") as z:
        z.write(subs / "honest.ipynb", "honest.ipynb")
    # a malformed notebook (a code cell without `source`): one failed row, the class goes on
    broken = json.loads((subs / "honest.ipynb").read_text())
    del next(c for c in broken["cells"] if c["cell_type"] == "code")["source"]
    (subs / "nosource.ipynb").write_text(json.dumps(broken))
    out = root / "grades"  # a new folder: a file kvlab did not write there is refused (tests/test_output_rule_and_parameters.py)
    before = _nobody_processes()
    left_before = _leftovers()
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
    # the honest class alone, with TMPDIR on a full file system (as root: a 64 KiB tmpfs, filled)
    full = root / "full"
    full.mkdir()
    mounted = os.geteuid() == 0 and subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(full)],
                                                   capture_output=True).returncode == 0
    if mounted:
        with open(full / "filler", "wb") as f:
            try:
                f.write(b"x" * (1 << 20))
            except OSError:
                pass
    old_tmp, old_dir = os.environ.get("TMPDIR"), tempfile.tempdir
    os.environ["TMPDIR"], tempfile.tempdir = str(full), str(full)
    try:
        classroom.grade(assignment, alone, root / "grades-alone", jobs=2)
    finally:
        tempfile.tempdir = old_dir
        if old_tmp is None:
            os.environ.pop("TMPDIR")
        else:
            os.environ["TMPDIR"] = old_tmp
        if mounted:
            subprocess.run(["umount", str(full)], check=False)
    with open(root / "grades-alone" / "final_grades.csv") as f:
        alone_rows = {row["file"]: row for row in csv.DictReader(f)}
    return rows, out, assignment, before, {"alone": alone_rows, "left_before": left_before, "full": mounted}


@pytest.mark.parametrize("name", sorted(attacks.ATTACKS))
def test_each_attack_gets_its_expected_score_and_flag(graded, name):
    rows, _, _, _, _ = graded
    row = rows[f"{name}.ipynb"]
    _, (q1, q2), flag = attacks.ATTACKS[name]
    assert row["grading_status"] == "Completed", row
    assert (float(row["q1"]), float(row["q2"])) == (q1, q2), row
    if flag:
        assert flag in row["review"], row["review"]
    else:
        assert row["review"] == "", row["review"]


def test_the_child_runs_unprivileged_and_leaves_nothing_behind(graded):
    rows, _, assignment, before, _ = graded
    if os.geteuid() == 0:  # the killer could not signal the grader: the rest of the class is graded
        assert float(rows["honest.ipynb"]["total_points_earned"]) == 4
    assert _nobody_processes() <= before  # no grandchild outlived its run
    # nothing was planted beside the autograder zip, and a planted one would be refused
    zips = sorted(assignment.autograder.parent.glob("*.zip"))
    assert zips == [assignment.autograder]


def test_a_planted_autograder_zip_is_refused(graded, tmp_path):
    _, _, assignment, _, _ = graded
    folder = tmp_path / assignment.name
    shutil.copytree(assignment.autograder.parent.parent, folder)
    shutil.copy(assignment.autograder, folder / "autograder" / f"{assignment.name}-autograder_9999.zip")
    with pytest.raises(ValueError, match="2 autograder zips"):
        classroom.Assignment.at(folder)


def test_feedback_never_echoes_the_students_text_nor_a_hidden_test(graded):
    _, out, _, _, _ = graded
    for path in (out / "feedback").glob("*.md"):
        assert attacks.SECRET not in path.read_text(), path
    with open(out / "feedback.csv") as f:
        assert attacks.SECRET not in f.read()
    text = (out / "feedback" / "leaker.ipynb.md").read_text()
    assert "raised ValueError" in text


def test_feedback_files_are_keyed_by_the_full_name(graded):
    rows, out, _, _, _ = graded
    names = {p.name for p in (out / "feedback").iterdir()}
    assert {"honest.ipynb.md", "honest.zip.md"} <= names
    assert float(rows["honest.zip"]["total_points_earned"]) == 4


def test_a_malformed_notebook_is_one_failed_row(graded):
    rows, _, _, _, _ = graded
    row = rows["nosource.ipynb"]
    assert row["grading_status"].startswith("not graded: the notebook could not be read"), row
    assert float(row["total_points_earned"]) == 0


def test_the_default_time_limit_comes_from_the_reference(graded):
    rows, _, _, _, _ = graded
    stopped = rows["hanger.ipynb"]["review"]
    if "took over " in stopped:  # the wall limit (a loaded machine gave it less CPU than its budget)
        limit = float(stopped.split("took over ")[1].split(" s")[0])
        assert grading.MIN_LIMIT <= limit < 120, stopped  # not the old 600 s
    else:  # the CPU budget: 2x the reference's CPU time + 1 s
        limit = float(stopped.split("CPU budget of ")[1].split(" s")[0])
        assert grading.CPU_FLOOR <= limit < 10, stopped


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


def test_the_honest_class_scores_exactly_as_alone(graded):
    """Eight honest students graded beside every attack, and alone (with a full TMPDIR): the same rows."""
    rows, _, _, _, extra = graded
    alone = extra["alone"]
    assert extra["full"] or os.geteuid() != 0  # as root the class alone was graded with TMPDIR full
    for k in range(8):
        name = f"student{k}.ipynb"
        assert rows[name] == alone[name], (rows[name], alone[name])
        assert float(rows[name]["total_points_earned"]) == 4 and rows[name]["review"] == ""
        assert rows[name]["grading_status"] == "Completed"


def test_no_student_text_reaches_the_csv_feedback_or_terminal(graded):
    """Class names carrying escape codes, a forged REVIEW line and a hidden check's marker: none of it arrives;
    3,000 replaced names make a bounded review cell."""
    rows, out, _, _, _ = graded
    texts = [(out / "final_grades.csv").read_text(), (out / "feedback.csv").read_text()]
    texts += [p.read_text() for p in (out / "feedback").glob("*.md")]
    for text in texts:
        assert "\x1b" not in text and "REVIEW evil" not in text and attacks.SECRET not in text
    assert "returned a subclass of float" in rows["class_names.ipynb"]["review"]
    assert len(rows["flag_flood.ipynb"]["review"]) <= classroom.REVIEW_LIMIT
    assert rows["flag_flood.ipynb"]["review"].count("replaced") <= grading.MAX_FLAGS


def test_the_sandbox_leaves_nothing_on_the_machine(graded):
    """200 MB written to /tmp, /dev/shm and the working folder, a module planted wherever it could write, touch
    run through int 0x80: nothing of it outside the children's sandboxes, nothing left when they are gone."""
    _, _, _, _, extra = graded
    assert _leftovers() <= extra["left_before"]


def test_a_sleeper_is_stopped_on_its_budget_and_flagged_slow(graded):
    rows, _, _, _, _ = graded
    review = rows["sleeper.ipynb"]["review"]
    assert "q1: slow" in review and "q2: slow" in review and "without computing" in review, review
    review = rows["long_sleeper.ipynb"]["review"]
    assert "q1: slow" in review and "q2: slow" in review and "without computing" in review, review


def test_grading_refuses_without_a_sandbox_unless_trusted(graded, monkeypatch, tmp_path, capsys):
    _, _, assignment, _, _ = graded
    monkeypatch.setattr(grading, "sandbox_problem", lambda: "bubblewrap is not installed: `apt-get install bubblewrap`")
    subs = tmp_path / "subs"
    attacks.write_class(assignment.student, subs, n=1)
    with pytest.raises(grading.SandboxUnavailable, match="--trust-submissions"):
        grading.grade_submissions(assignment.solutions, assignment.autograder, sorted(subs.glob("*.ipynb")))
    built = assignment.autograder.parent.parent.parent
    master = built.parent / "master" / f"{attacks.NAME}.ipynb"
    code = cli.main(["grade", str(master), str(subs), "--built", str(built), "--out", str(tmp_path / "out")])
    assert code == 2 and "apt-get install bubblewrap" in capsys.readouterr().err
    trusted = grading.grade_submissions(assignment.solutions, assignment.autograder, sorted(subs.glob("*.ipynb")),
                                        trust_submissions=True)
    assert trusted[0].total == 4 and trusted[0].flags == []


def test_no_name_a_child_chose_reaches_a_flag_or_feedback(graded):
    """Tensor subclasses, exception classes and added attributes named with a marker (how the hidden seed was
    read out): the judge writes names only from fixed lists, so the marker is nowhere; nor a grader's traceback."""
    rows, out, _, _, _ = graded
    texts = [(out / "final_grades.csv").read_text(), (out / "feedback.csv").read_text()]
    texts += [p.read_text() for p in (out / "feedback").glob("*.md")]
    for text in texts:
        assert attacks.LEAK not in text and "Traceback" not in text
    assert "an exception raised in your code" in (out / "feedback" / "named_exception.ipynb.md").read_text()
    assert "a tensor of a subclass" in rows["named_tensor.ipynb"]["review"]
