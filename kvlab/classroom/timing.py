"""Wall time of grading a class in the sandbox, every class graded in one run, one after another per repeat: an
honest class of 8 alone; with one slow student (7 honest + one who answers right and then sleeps to 85 % of each
limit); with one busy student (7 honest + one who answers right and then computes to 85 % of each limit); and,
on the small assignment, the honest 8 beside every attack submission, at ``--jobs 2``::

    python -m kvlab lessons time tiny --repeats 3 --out benchmarks/results/grading_sandbox
    python -m kvlab lessons time 01 --repeats 1 --no-attacks --out benchmarks/results/grading_sandbox

Prints one JSON line per grading (class, wall seconds, CPU seconds of the grading processes, submissions, load
average when it started) and a summary (each class's mean wall time and its ratio to the honest class alone);
writes ``OUT/tiny.json`` (``OUT/lesson01.json`` for lesson 01) under kvlab's output rule.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import resource
import statistics
import tempfile
import time

COMMAND = "python -m kvlab lessons time"

SLEEP = ("\nimport time\nwith open('/proc/self/limits') as f:\n"
         "    cpu = next(int(line.split()[3]) for line in f if line.startswith('Max cpu time'))\n"
         "time.sleep(0.85 * cpu)\n")
# correct, then busy on the CPU (at the lowest priority it may set) until 85 % of its CPU limit is spent
BUSY = ("\nimport time\nwith open('/proc/self/limits') as f:\n"
        "    cpu = next(int(line.split()[3]) for line in f if line.startswith('Max cpu time'))\n"
        "end = time.process_time() + 0.85 * cpu\nwhile time.process_time() < end:\n    pass\n")


def _answers(nb) -> list:
    tags = {"otter_answer_cell", "otter_assign_solution_cell"}
    return [c for c in nb.cells if c.cell_type == "code" and tags & set(c.metadata.get("tags", []))]


def _one_more(honest: list[pathlib.Path], folder: pathlib.Path, name: str, tail: str) -> None:
    """``folder``: the first 7 honest students and ``name``, the 8th with ``tail`` after each answer."""
    import shutil

    import nbformat

    folder.mkdir()
    for path in honest[:7]:
        shutil.copy(path, folder / path.name)
    nb = nbformat.read(honest[7], as_version=4)
    for cell in _answers(nb):
        cell.source += tail
    nbformat.write(nb, folder / f"{name}.ipynb")


def classes(which: str, root: pathlib.Path, attacks: bool) -> tuple[object, dict[str, pathlib.Path]]:
    """The assignment and the class folders: alone (8 honest), slow (7 honest + a sleeper), busy (7 honest + a
    student computing to near the limit), attacked (8 honest + every attack submission; the small assignment)."""
    import shutil

    from kvlab.classroom import attacks as made
    from kvlab.classroom import lessons as classroom
    from kvlab.classroom import submissions

    if which == "tiny":
        master = made.write_master(root / "master" / f"{made.NAME}.ipynb")
        (assignment,) = classroom.make([str(master)], out=root / "built", seed=made.SEED)
        honest = made.write_class(assignment.student, root / "alone")
    else:
        (assignment,) = classroom.make([which], out=root / "built")
        honest = submissions.write_class(assignment.autograder.parent.parent, 8, root / "alone")
    folders = {"alone": root / "alone", "slow": root / "slow", "busy": root / "busy"}
    _one_more(honest, root / "slow", "sleeper", SLEEP)
    _one_more(honest, root / "busy", "busy", BUSY)
    if attacks and which == "tiny":
        made.write_attacks(assignment.student, root / "attacked")
        for path in honest:
            shutil.copy(path, root / "attacked" / path.name)
        folders["attacked"] = root / "attacked"
    return assignment, folders


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=COMMAND, description=__doc__, allow_abbrev=False,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("assignment", help="tiny (the attack tests' assignment) or a lesson number, e.g. 01")
    p.add_argument("--repeats", type=int, default=3, help="gradings of each class (default 3)")
    p.add_argument("--jobs", type=int, default=2, help="questions graded at once (default 2)")
    p.add_argument("--no-attacks", action="store_true", help="skip the class with the attack submissions")
    p.add_argument("--out", type=pathlib.Path, default=pathlib.Path("build/runs/grading-sandbox"),
                   help="folder of the results file (default build/runs/grading-sandbox)")
    p.add_argument("--name", default=None, help="the results file's name (default tiny.json or lessonNN.json)")
    return p


def _check(args) -> str:
    """The results file's name; every option checked before anything is built."""
    from kvlab.classroom import lessons as classroom

    if args.repeats < 1:
        raise ValueError(f"--repeats must be >= 1, got {args.repeats}")
    if args.jobs < 1:
        raise ValueError(f"--jobs must be >= 1, got {args.jobs}")
    if args.name is not None and (not args.name.endswith(".json") or "/" in args.name):
        raise ValueError(f"--name must be a file name ending in .json, got {args.name!r}")
    if args.assignment == "tiny":
        return args.name or "tiny.json"
    stem = classroom.lessons([args.assignment])[0].stem  # an unknown lesson is refused here
    return args.name or f"lesson{stem[:2]}.json"


def _paired(runs: list[dict], label: str, key: str) -> list[float]:
    """Per repeat, ``key`` of class ``label`` over that of the honest class alone in the same repeat."""
    base = {r["repeat"]: r.get(key) for r in runs if r["class"] == "alone"}
    return [r[key] / base[r["repeat"]] for r in runs if r["class"] == label and base.get(r["repeat"])]


def summarise(runs: list[dict]) -> dict:
    """Per class: gradings, mean/min/max wall time, per submission, and its ratios to the honest class alone
    paired by repeat (``vs_alone``: mean of the per-repeat wall-time ratios; ``slot_s_vs_alone``,
    ``runs_cpu_s_vs_alone``: the same for the slot time and the CPU time of the students' runs)."""
    summary = {}
    for label in dict.fromkeys(r["class"] for r in runs):
        mine = [r for r in runs if r["class"] == label]
        walls = [r["wall_s"] for r in mine]
        n = mine[0]["submissions"]
        summary[label] = {"n": len(walls), "wall_mean_s": round(statistics.mean(walls), 2),
                          "wall_min_s": min(walls), "wall_max_s": max(walls),
                          "wall_per_submission_s": round(statistics.mean(walls) / n, 2), "submissions": n,
                          "cpu_mean_s": round(statistics.mean(r["cpu_s"] for r in mine), 2)}
        for key in ("slot_s", "runs_cpu_s"):
            if key in mine[0]:
                summary[label][f"{key[:-2]}_mean_s"] = round(statistics.mean(r[key] for r in mine), 2)
        if label == "alone":
            continue
        for key, name in (("wall_s", "vs_alone"), ("slot_s", "slot_s_vs_alone"), ("runs_cpu_s", "runs_cpu_s_vs_alone")):
            ratios = _paired(runs, label, key) if key in mine[0] else []
            if ratios:
                summary[label][name] = round(statistics.mean(ratios), 3)
                summary[label][name + "_min_max"] = [round(min(ratios), 3), round(max(ratios), 3)]
    return summary


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    name = _check(args)
    from kvlab.classroom import lessons as classroom
    from kvlab.outputs import OutputFolder

    result = OutputFolder(args.out, COMMAND).claim(name)  # refused before any grading if not ours
    runs = []
    with tempfile.TemporaryDirectory(prefix="kvlab-bench-") as tmp:
        root = pathlib.Path(tmp)
        assignment, folders = classes(args.assignment, root, not args.no_attacks)
        order = list(folders.items())
        for repeat in range(args.repeats):
            # each repeat starts with another class: the first grading of a repeat is not always the same one
            for label, folder in order[repeat % len(order):] + order[:repeat % len(order)]:
                before = resource.getrusage(resource.RUSAGE_CHILDREN)
                load = os.getloadavg()[0]
                start = time.monotonic()
                table = classroom.grade(assignment, folder, root / "grades" / f"{label}{repeat}", jobs=args.jobs)
                wall = time.monotonic() - start
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
                questions = [q for r in table.attrs.get("results", []) for q in r.questions.values()]
                run = {"class": label, "repeat": repeat, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
                       "submissions": len(list(folder.glob("*.ipynb"))), "load_at_start": round(load, 2),
                       # the students' runs: wall seconds they held a --jobs slot, and their CPU seconds (the
                       # child's control group and the judge), summed over every question
                       "slot_s": round(sum(q.seconds for q in questions), 2),
                       "runs_cpu_s": round(sum(q.cpu for q in questions), 2),
                       "total": sum(r.total for r in table.attrs.get("results", []))}
                print(json.dumps(run), flush=True)
                runs.append(run)
    summary = summarise(runs)
    print(json.dumps(summary, indent=1))
    result.write_text(json.dumps({"assignment": args.assignment, "jobs": args.jobs, "runs": runs,
                                  "summary": summary}, indent=1) + "\n")
    print(f"wrote {result}")
    return 0
