"""Grading round 4: the kernel's own limits per child (a control group each: threads, memory counting memfd, CPU),
bounded reads of every submission, identifiers from a fixed list, no namespaces or mounts in a child, and no
file of a person's replaced by the class writers. On the small assignment of kvlab/classroom/attacks.py (the
attack rows themselves are graded in tests/test_grading_attacks.py)."""

from __future__ import annotations

import csv
import json
import os
import pathlib
import resource
import subprocess
import sys
import zipfile

import nbformat
import pytest

from kvlab.classroom import attacks, cgroups, grading
from kvlab.classroom import cli, lessons as classroom
from kvlab.outputs import OutputRefused

ROOT = pathlib.Path(__file__).resolve().parent.parent
needs_groups = pytest.mark.skipif(grading.cgroups_problem() is not None, reason="no cgroup can be made here")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("limits")
    master = attacks.write_master(root / "master" / f"{attacks.NAME}.ipynb")
    (assignment,) = classroom.make([str(master)], out=root / "built", seed=attacks.SEED)
    return assignment, root


def _notebook(assignment, answers: dict) -> nbformat.NotebookNode:
    nb = nbformat.read(assignment.student, as_version=4)
    for i, cell in enumerate(attacks._answer_cells(nb)):
        cell.source = answers.get(i, attacks.GOOD[i])
    return nb


def test_a_zip_declaring_a_huge_notebook_is_refused_before_reading(tiny, tmp_path):
    """64 MiB of notebook in a zip of a few KiB: refused by its declared size, the grader's memory untouched."""
    assignment, _ = tiny
    bomb = tmp_path / "bomb.zip"
    with zipfile.ZipFile(bomb, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as z:
        with z.open("bomb.ipynb", "w", force_zip64=True) as f:
            block = b" " * (1 << 20)
            for _ in range(64):
                f.write(block)
    assert bomb.stat().st_size < 1 << 20
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(grading.SubmissionRefused, match="declares 64 MiB"):
        grading.read_submission(bomb)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 32 << 10  # KiB: nothing inflated
    big = tmp_path / "big.ipynb"
    with open(big, "wb") as f:
        f.truncate(grading.MAX_SUBMISSION + 1)
    with pytest.raises(grading.SubmissionRefused, match="over the"):
        grading.read_submission(big)
    link = tmp_path / "link.ipynb"
    link.symlink_to("/etc/hostname")
    with pytest.raises(grading.SubmissionRefused):
        grading.read_submission(link)
    many = tmp_path / "many.zip"
    with zipfile.ZipFile(many, "w") as z:
        for i in range(grading.MAX_ZIP_ENTRIES + 1):
            z.writestr(f"f{i}.txt", "x")
    with pytest.raises(grading.SubmissionRefused, match="files"):
        grading.read_submission(many)


def test_a_refused_submission_is_a_row_with_the_graders_words(tiny, tmp_path):
    assignment, _ = tiny
    subs = tmp_path / "subs"
    subs.mkdir()
    nbformat.write(_notebook(assignment, {}), subs / "honest.ipynb")
    with zipfile.ZipFile(subs / "bomb.zip", "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("bomb.ipynb", " " * (grading.MAX_NOTEBOOK + 1))
    results = grading.grade_submissions(assignment.solutions, assignment.autograder, sorted(subs.iterdir()),
                                        jobs=2, seed=attacks.SEED)
    by = {r.file: r for r in results}
    assert by["bomb.zip"].status.startswith("not graded: the submission was refused"), by["bomb.zip"].status
    assert by["honest.ipynb"].total == 4 and by["honest.ipynb"].flags == []


def test_the_seccomp_filter_refuses_namespaces_mounts_and_tracing():
    """unshare (user, mount, net), setns, mount and ptrace fail with EPERM after the child's filter; threads run."""
    code = ("import ctypes, os, threading\nfrom kvlab.classroom import grading\n"
            "assert grading._no_new_processes()\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "got = [libc.unshare(0x10000000), libc.unshare(0x00020000), libc.unshare(0x40000000), libc.setns(0, 0),\n"
            "       libc.mount(b'none', b'/tmp', b'tmpfs', 0, None), libc.ptrace(16, 1, 0, 0)]\n"
            "errors = [ctypes.get_errno()]\nt = threading.Thread(target=lambda: None)\nt.start()\nt.join()\n"
            "print(got, errors)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[-1, -1, -1, -1, -1, -1] [1]", done.stdout


def test_names_a_child_reports_are_written_only_from_a_fixed_list():
    """Exception types, replaced names and rebound names the child reports: only those the judge knows."""
    leak = attacks.LEAK
    ready = {"errors": [["your answer to q1", leak + "Q" * 100, 3], ["your answer to q1", "ValueError", 4]],
             "flags": [["replaced", "your answer to q1", f"kvlab.policies.{leak}"],
                       ["replaced", "your answer to q1", "kvlab.policies.Full.keep"],
                       ["replaced", "your answer to q1", f"kvlab.policies.Full.{leak} (added)"],
                       ["rebinds", "your answer to q1", leak], ["rebinds", "your answer to q1", "double"],
                       ["shadowed", "", leak], ["builtins", "", "abs, len"]]}
    import kvlab.policies  # noqa: F401 - the judge knows the modules its zygote loaded

    errors, flags = grading._child_notes(ready, "q1", known={"double"})
    text = " ".join(errors + flags)
    assert leak not in text, text
    assert "raised an exception (line 3)" in text and "raised ValueError (line 4)" in text
    assert "replaced kvlab.policies.Full.keep" in text and "added an attribute to kvlab.policies.Full" in text
    assert "rebinds double" in text and "changed builtins abs, len" in text
    assert "changed 3 more name(s)" in text
    assert grading._word("KeyError") == "KeyError" and grading._word(leak) == "an error"


def test_a_class_writer_never_replaces_a_real_students_notebook(tiny, tmp_path, capsys):
    """`lessons class` and the attack writers refuse a folder holding a notebook they did not write."""
    from kvlab.classroom import submissions

    assignment, _ = tiny
    real = tmp_path / "class"
    real.mkdir()
    (real / "student0.ipynb").write_text("a real student's work")
    with pytest.raises(OutputRefused, match="student0.ipynb"):
        submissions.write_class(assignment.autograder.parent.parent, 2, real)
    with pytest.raises(OutputRefused, match="student0.ipynb"):
        attacks.write_class(assignment.student, real)
    code = cli.main(["class", str(assignment.autograder.parent.parent), "2", str(real)])
    assert code == 2 and "student0.ipynb" in capsys.readouterr().err
    assert (real / "student0.ipynb").read_text() == "a real student's work"
    fresh = tmp_path / "fresh"
    written = submissions.write_class(assignment.autograder.parent.parent, 2, fresh)
    assert [p.name for p in written] == ["student0.ipynb", "student1.ipynb"]
    submissions.write_class(assignment.autograder.parent.parent, 2, fresh)  # its own files: written again


def test_grading_refuses_without_cgroups_unless_the_weaker_mode_is_asked(tiny, tmp_path, monkeypatch):
    assignment, _ = tiny
    subs = tmp_path / "subs"
    subs.mkdir()
    nbformat.write(_notebook(assignment, {}), subs / "honest.ipynb")
    paths = sorted(subs.glob("*.ipynb"))
    monkeypatch.setattr(grading, "cgroups_problem", lambda: "cgroup v2: no group can be made (Permission denied)")
    with pytest.raises(grading.CgroupsUnavailable, match="--no-cgroups"):
        grading.grade_submissions(assignment.solutions, assignment.autograder, paths)
    results = grading.grade_submissions(assignment.solutions, assignment.autograder, paths, cgroups=False,
                                        seed=attacks.SEED)
    assert results[0].total == 4 and results[0].flags == []


@needs_groups
def test_memfd_pages_count_against_the_childs_memory(tiny, tmp_path):
    """768 MiB written into a memfd (outside the address-space limit) by a child allowed 384 MiB: stopped, and
    flagged; the honest student beside it is exact."""
    assignment, _ = tiny
    subs = tmp_path / "subs"
    subs.mkdir()
    nbformat.write(_notebook(assignment, {}), subs / "honest.ipynb")
    memfd = ("import random\nos = random._os\nfd = os.memfd_create('fill')\nfor _ in range(768):\n"
             "    os.write(fd, b'x' * (1 << 20))\n" + attacks.GOOD[0])
    nbformat.write(_notebook(assignment, {0: memfd}), subs / "memfd.ipynb")
    results = grading.grade_submissions(assignment.solutions, assignment.autograder, sorted(subs.glob("*.ipynb")),
                                        jobs=2, memory=384 << 20, seed=attacks.SEED)
    by = {r.file: r for r in results}
    assert by["honest.ipynb"].total == 4 and by["honest.ipynb"].flags == []
    assert by["memfd.ipynb"].questions["q1"].score == 0 and by["memfd.ipynb"].questions["q2"].score == 2
    assert any("q1: memory" in f for f in by["memfd.ipynb"].flags), by["memfd.ipynb"].flags


def _small_pids_group(limit: int):
    """A pids group of ``limit`` for the grading process (v2 where delegated, else v1), or None."""
    got = cgroups.probe()
    if isinstance(got, str):
        return None
    base = got.bases["pids"]
    path = os.path.join(base, "class")
    os.mkdir(path)
    with open(os.path.join(path, "pids.max"), "w") as f:
        f.write(str(limit))
    return got, path


@needs_groups
def test_a_thread_bomb_in_a_400_pid_group_costs_its_own_question_only(tiny, tmp_path):
    """The grading of 4 honest students and one who starts threads without bound, the whole grader in a group of
    400 pids: the bomb's child meets its own pids.max (flagged), every fork of the zygote and the judges
    succeeds, the honest 4 score 4/4, and no traceback reaches a feedback file."""
    assignment, root = tiny
    subs = tmp_path / "subs"
    attacks.write_class(assignment.student, subs, n=4)
    nbformat.write(_notebook(assignment, attacks.ATTACKS["thread_bomb"][0]), subs / "thread_bomb.ipynb")
    made = _small_pids_group(400)
    assert made is not None
    groups, path = made
    out = tmp_path / "grades"
    code = (f"import sys; from kvlab.classroom import lessons as c, grading as g\n"
            f"a = c.Assignment.at(__import__('pathlib').Path({str(assignment.autograder.parent.parent)!r}))\n"
            f"c.grade(a, {str(subs)!r}, {str(out)!r}, jobs=2)\n")
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                              preexec_fn=lambda: open(os.path.join(path, "cgroup.procs"), "w").write(str(os.getpid())))
    finally:
        groups.close()
    assert done.returncode == 0, done.stderr[-3000:]
    with open(out / "final_grades.csv") as f:
        rows = {row["file"]: row for row in csv.DictReader(f)}
    for k in range(4):
        row = rows[f"student{k}.ipynb"]
        assert float(row["total_points_earned"]) == 4 and row["review"] == "", row
    assert "threads" in rows["thread_bomb.ipynb"]["review"] and float(rows["thread_bomb.ipynb"]["q2"]) == 2
    for page in (out / "feedback").glob("*.md"):
        assert "Traceback" not in page.read_text()


def test_the_sandbox_args_and_parents(tiny):
    """The sandbox's folders above its binds are readable (0755) and its options are not on a command line."""
    spec = grading.sandbox_spec()
    args = grading._bwrap_args(spec, 3)
    parents = grading._parents(spec["ro"] + [grading.WORKDIR])
    for d in parents:
        at = args.index(d)
        assert args[at - 1] == "--dir" and args[at - 2] == "0755"
    assert "/home" in parents
    assert json.dumps(grading.REFUSED_CALLS)  # the list the guide names


def test_a_private_variant_builds_apart_from_the_public_build(tmp_path):
    """`make --seed S PATH` of a master named as a lesson: out/private/NN_name, not over out/NN_name nor in the
    hand-out bundle."""
    name = classroom.lessons()[0].stem
    variant = attacks.write_master(tmp_path / "variants" / f"{name}.ipynb")
    out = tmp_path / "built"
    public = out / name / "student"
    public.mkdir(parents=True)
    (out / ".kvlab-outputs").write_text(f"{name}/\n")
    nbformat.write(nbformat.v4.new_notebook(metadata={"marker": "public"}), public / f"{name}.ipynb")
    before = (public / f"{name}.ipynb").read_text()
    (made,) = classroom.make([str(variant)], out=out, seed=5)
    assert made.student.parent.parent == out / classroom.PRIVATE / name
    assert made.seed() == 5 and made.stale() is None
    assert json.loads((made.autograder.parent / classroom.WRITTEN_FILE).read_text()) == []  # the variant's own
    assert (public / f"{name}.ipynb").read_text() == before
    assert (out / classroom.BUNDLE / f"{name}.ipynb").read_text() == before  # the bundle has the public one
    with zipfile.ZipFile(out / f"{classroom.BUNDLE}.zip") as z:
        assert not any("private" in n for n in z.namelist())


def test_lessons_time_checks_its_options_before_any_work(tmp_path, capsys):
    """`lessons time`: a bad option, an unknown lesson or a results folder holding someone's file is refused at
    once (exit 2, nothing graded, nothing written)."""
    assert cli.main(["time", "tiny", "--repeats", "0", "--out", str(tmp_path / "a")]) == 2
    assert "--repeats" in capsys.readouterr().err and not (tmp_path / "a").exists()
    assert cli.main(["time", "99", "--out", str(tmp_path / "b")]) == 2
    assert "99" in capsys.readouterr().err
    assert cli.main(["time", "tiny", "--name", "../x.json", "--out", str(tmp_path / "c")]) == 2
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "tiny.json").write_text("someone's results")
    assert cli.main(["time", "tiny", "--out", str(theirs)]) == 2
    assert "tiny.json" in capsys.readouterr().err and (theirs / "tiny.json").read_text() == "someone's results"
    with pytest.raises(SystemExit):
        cli.main(["time", "tiny", "--rep", "3"])  # no prefixes of options
