"""The judge: the verdict is computed in a process that never runs student code, from plain data the confined
child sends back; the hidden inputs come from the instructor's secret seed; a class with a killer and a hanger
is graded about as fast as an honest one. On the small assignment of kvlab/classroom/attacks.py."""

from __future__ import annotations

import csv
import pathlib
import time

import pytest

from kvlab.classroom import attacks, grading
from kvlab.classroom import lessons as classroom

ROOT = pathlib.Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("judge")
    master = attacks.write_master(root / "master" / f"{attacks.NAME}.ipynb")
    (assignment,) = classroom.make([str(master)], out=root / "built", seed=11)
    return root, assignment


def _write(assignment, folder: pathlib.Path, answers: dict[str, dict[int, str]]) -> pathlib.Path:
    import nbformat

    folder.mkdir(parents=True, exist_ok=True)
    for name, picks in answers.items():
        nb = nbformat.read(assignment.student, as_version=4)
        cells = [c for c in nb.cells if c.cell_type == "code" and "otter_answer_cell" in c.metadata.get("tags", [])]
        for i, cell in enumerate(cells):
            cell.source = picks.get(i, attacks.GOOD[i])
        nbformat.write(nb, folder / f"{name}.ipynb")
    return folder


def _rows(out: pathlib.Path) -> dict[str, dict]:
    with open(out / "final_grades.csv") as f:
        return {row["file"]: row for row in csv.DictReader(f)}


def test_the_seed_changes_the_hidden_inputs_not_the_verdicts(tiny, tmp_path):
    root, assignment = tiny
    assert assignment.seed() == 11 and (assignment.autograder.parent / classroom.SEED_FILE).stat().st_mode & 0o077 == 0
    subs = _write(assignment, root / "seeded", {"honest": {}, "zero": {0: "def double(x):\n    return 0\n"}})
    seed_file = tmp_path / "seed"
    seed_file.write_text("13\n")
    seed_file.chmod(0o644)
    with pytest.raises(ValueError, match="chmod 600"):  # a seed others may read is refused
        classroom.grade(assignment, subs, root / "grades-open", jobs=2, timeout=20, seed_file=seed_file)
    seed_file.chmod(0o600)
    runs = {}
    for label, seed, path in (("make", None, None), ("argument", 12, None), ("file", None, seed_file)):
        out = root / f"grades-{label}"
        classroom.grade(assignment, subs, out, jobs=2, timeout=20, seed=seed, seed_file=path)
        with open(out / "feedback.csv") as f:
            hidden = [r for r in csv.DictReader(f) if r["file"] == "zero.ipynb" and r["check"] == "q1 check 2"]
        runs[label] = (_rows(out), hidden[0]["message"])
    for rows, _ in runs.values():  # the same verdicts whatever the seed
        assert float(rows["honest.ipynb"]["total_points_earned"]) == 4 and rows["honest.ipynb"]["review"] == ""
        assert (float(rows["zero.ipynb"]["q1"]), float(rows["zero.ipynb"]["q2"])) == (0, 2)
    # the hidden check's message names the first input it tried: one per seed (11 from make, 12, 13)
    messages = {label: message for label, (_, message) in runs.items()}
    assert len(set(messages.values())) == 3, messages
    import random

    first = {label: random.Random(seed).randint(-10 ** 6, 10 ** 6) for label, seed in
             (("make", 11), ("argument", 12), ("file", 13))}
    for label, message in messages.items():
        assert message == f"AssertionError: {first[label]}", (label, message)


def test_a_class_of_8_with_a_killer_and_a_hanger_grades_the_other_6_within_2x_and_a_sleeper_is_held_to_its_idle_budget(tiny):
    root, assignment = tiny
    # eight different honest students (a comment apiece: no two share a run)
    honest = {f"student{k}": {0: f"def double(x):\n    # student {k}\n    return 2 * x\n",
                              1: f"def total(xs):\n    # student {k}\n    return float(sum(xs))\n"} for k in range(8)}
    attacked = {k: v for k, v in honest.items() if k not in ("student6", "student7")}
    attacked["killer"] = attacks.ATTACKS["killer"][0]
    attacked["hanger"] = attacks.ATTACKS["hanger"][0]
    slow = {k: v for k, v in honest.items() if k != "student7"}
    slow["sleeper"] = attacks.ATTACKS["sleeper"][0]  # correct answers, then asleep to 85 % of each limit
    timeout = 3.0
    times = {}
    for label, answers in (("honest", honest), ("attacked", attacked), ("slow", slow)):
        subs = _write(assignment, root / f"class-{label}", answers)
        start = time.monotonic()
        classroom.grade(assignment, subs, root / f"grades-{label}", jobs=2, timeout=timeout)
        times[label] = time.monotonic() - start
    honest_rows, rows = _rows(root / "grades-honest"), _rows(root / "grades-attacked")
    for k in range(8):
        assert float(honest_rows[f"student{k}.ipynb"]["total_points_earned"]) == 4
    for k in range(6):
        row = rows[f"student{k}.ipynb"]
        assert float(row["total_points_earned"]) == 4 and row["review"] == "", row
    assert (float(rows["killer.ipynb"]["q1"]), float(rows["killer.ipynb"]["q2"])) == (0, 2)
    assert "imports os" in rows["killer.ipynb"]["review"]
    assert (float(rows["hanger.ipynb"]["q1"]), float(rows["hanger.ipynb"]["q2"])) == (0, 2)
    assert f"took over {timeout:g} s" in rows["hanger.ipynb"]["review"]
    slow_rows = _rows(root / "grades-slow")
    assert all(slow_rows[f"student{k}.ipynb"] == honest_rows[f"student{k}.ipynb"] for k in range(7))
    assert "slow" in slow_rows["sleeper.ipynb"]["review"]
    print(f"class of 8 on the small assignment, --jobs 2: honest {times['honest']:.1f} s, "
          f"with a killer and a hanger {times['attacked']:.1f} s, with a sleeper {times['slow']:.1f} s")
    assert times["attacked"] <= 2 * times["honest"], times
    # what the sleeper costs the class: the time its runs held a --jobs slot beyond an honest student's, at most
    # its idle budget and the floor of its second question, under 20 % of the honest class's time at two slots
    # (measured on the runs themselves: the wall time of a whole class on a shared machine is noisier than that)
    results = grading.grade_submissions(assignment.solutions, assignment.autograder,
                                        sorted((root / "class-slow").glob("*.ipynb")), jobs=2, timeout=timeout)
    held = {r.file: sum(q.seconds for q in r.questions.values()) for r in results}
    honest_held = sorted(v for k, v in held.items() if k != "sleeper.ipynb")
    extra = held["sleeper.ipynb"] - honest_held[len(honest_held) // 2]
    assert extra <= grading.IDLE_BUDGET + grading.IDLE_FLOOR + 1.0, held
    # what that bound means for a class's wall time ("a slow student adds at most 20 %") depends on how long the
    # honest class takes: at two slots the sleeper adds at most half its extra slot time, which is under 20 % of any
    # class whose honest wall time exceeds (IDLE_BUDGET + IDLE_FLOOR + 1) / 2 / 0.2 = 11 s, and a lesson's class
    # takes minutes. That ratio is a timing, measured on lesson 01 in benchmarks/grading_sandbox_times.py, not here.
    assert extra >= 0.5 * timeout, held  # and the sleeper did sleep: the bound above was exercised


def test_plain_data_round_trips_and_subclasses_equal_nothing():
    import torch

    class Sneaky(torch.Tensor):
        pass

    values = [None, True, 3, -0.0, float("inf"), "s", [1, (2, 3)], {"a": [1.5]}, {1, 2},
              torch.arange(6.0).reshape(2, 3), torch.tensor([True, False]), torch.Size([2, 3]), torch.int64]
    for v in values:
        back = grading._decode(grading._encode(v, handles={}))
        if isinstance(v, torch.Tensor):
            assert type(back) is torch.Tensor and torch.equal(back, v) and back.dtype == v.dtype
        else:
            assert type(back) is type(v) and (back == v or v != v), (v, back)
    found = []
    back = grading._decode(grading._encode(torch.ones(2).as_subclass(Sneaky), handles={}), found=found)
    assert type(back) is torch.Tensor and torch.equal(back, torch.ones(2)) and "a subclass" in found[0]
    assert "Sneaky" not in found[0]  # a name the child chose is never written

    class Yes(float):
        def __eq__(self, other):
            return True

    marker = grading._decode(grading._encode(Yes(3.0), handles={}), found=found)
    assert type(marker) is grading.Unconvertible and not (marker == 3.0) and "subclass of float" in found[-1]
    handles = {}
    assert grading._encode(len, handles=handles)["H"] == 1 and handles[1] is len
    with pytest.raises(grading.NotSendable):  # the judge sends only plain data, or a master object by name
        grading._encode(object(), names={})
