"""Wall time of grading a class in the sandbox: an honest class of 8 alone, beside the attack submissions, and with
one slow student (7 honest + one who answers right and then sleeps to 85 % of each limit), at ``--jobs 2``::

    python benchmarks/grading_sandbox_times.py tiny --repeats 3   # the small assignment of the attack tests
    python benchmarks/grading_sandbox_times.py 01 --repeats 1 --no-attacks   # lesson 01 (StreamingLLM)

Prints one JSON line per grading (class, wall seconds, CPU seconds of the grading processes, submissions, load
average when it started) and a summary; ``--out FILE`` writes them as JSON.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pathlib
import resource
import statistics
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _answers(nb) -> list:
    tags = {"otter_answer_cell", "otter_assign_solution_cell"}
    return [c for c in nb.cells if c.cell_type == "code" and tags & set(c.metadata.get("tags", []))]


SLEEP = ("\nimport time\nwith open('/proc/self/limits') as f:\n"
         "    cpu = next(int(line.split()[3]) for line in f if line.startswith('Max cpu time'))\n"
         "time.sleep(0.85 * cpu)\n")


def classes(which: str, root: pathlib.Path, attacks: bool) -> tuple[object, dict[str, pathlib.Path]]:
    """The assignment and the class folders: alone (8 honest), slow (7 honest + a sleeper), attacked (8 honest +
    every attack submission; the small assignment only)."""
    import shutil

    import nbformat

    from kvlab.classroom import lessons as classroom

    if which == "tiny":
        made = _script("make_attack_submissions")
        master = made.write_master(root / "master" / f"{made.NAME}.ipynb")
        (assignment,) = classroom.make([str(master)], out=root / "built", seed=made.SEED)
        honest = made.write_class(assignment.student, root / "alone")
    else:
        (assignment,) = classroom.make([which], out=root / "built")
        honest = _script("make_class_submissions").write_class(assignment.autograder.parent.parent, 8, root / "alone")
    folders = {"alone": root / "alone", "slow": root / "slow"}
    (root / "slow").mkdir()
    for path in honest[:7]:
        shutil.copy(path, root / "slow" / path.name)
    nb = nbformat.read(honest[7], as_version=4)
    for cell in _answers(nb):
        cell.source += SLEEP
    nbformat.write(nb, root / "slow" / "sleeper.ipynb")
    if attacks and which == "tiny":
        made.write_attacks(assignment.student, root / "attacked")
        for path in honest:
            shutil.copy(path, root / "attacked" / path.name)
        folders["attacked"] = root / "attacked"
    return assignment, folders


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("assignment", help="tiny (the attack tests' assignment) or a lesson number, e.g. 01")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--no-attacks", action="store_true", help="skip the class with the attack submissions")
    parser.add_argument("--out", type=pathlib.Path, default=None)
    args = parser.parse_args(argv)
    from kvlab.classroom import lessons as classroom

    runs = []
    with tempfile.TemporaryDirectory(prefix="kvlab-bench-") as tmp:
        root = pathlib.Path(tmp)
        assignment, folders = classes(args.assignment, root, not args.no_attacks)
        for repeat in range(args.repeats):
            for label, folder in folders.items():
                before = resource.getrusage(resource.RUSAGE_CHILDREN)
                load = os.getloadavg()[0]
                start = time.monotonic()
                classroom.grade(assignment, folder, root / "grades" / f"{label}{repeat}", jobs=args.jobs)
                wall = time.monotonic() - start
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
                run = {"class": label, "repeat": repeat, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
                       "submissions": len(list(folder.glob("*.ipynb"))), "load_at_start": round(load, 2)}
                print(json.dumps(run), flush=True)
                runs.append(run)
    summary = {}
    for label in folders:
        walls = [r["wall_s"] for r in runs if r["class"] == label]
        n = runs[[r["class"] for r in runs].index(label)]["submissions"]
        summary[label] = {"n": len(walls), "wall_mean_s": round(statistics.mean(walls), 2),
                          "wall_min_s": min(walls), "wall_max_s": max(walls),
                          "wall_per_submission_s": round(statistics.mean(walls) / n, 2), "submissions": n}
    print(json.dumps(summary, indent=1))
    if args.out:
        args.out.write_text(json.dumps({"assignment": args.assignment, "jobs": args.jobs, "runs": runs,
                                        "summary": summary}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
