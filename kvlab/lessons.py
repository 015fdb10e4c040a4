"""The classroom: the assignments in ``lessons/`` are otter-grader master notebooks, and this module only wraps
otter's own commands so that a whole class is one command each::

    python -m kvlab lessons make [--out build/lessons] [LESSON ...]
        # `otter assign` per master: build/lessons/NN_name/student/NN_name.ipynb (hand this out) and
        # build/lessons/NN_name/autograder/ (solutions notebook + NN_name-autograder_*.zip with every test)
    python -m kvlab lessons grade LESSON SUBMISSIONS/ [--out build/grades/LESSON] [--jobs 2]
        # `otter run` on every SUBMISSIONS/*.ipynb (no Docker), then OUT/final_grades.csv (one row per
        # submission, one column per question, as `otter grade` writes it) and OUT/written_answers.csv

Why otter-grader: `otter run` grades one notebook in the current environment, without Docker, a database
or an exchange directory (nbgrader needs its course database and exchange), so CI and an instructor's
laptop grade exactly as the tests do. Each question's tests run on the notebook's final state after every
cell has been executed with errors allowed, so a question whose cell fails scores zero and the others are
still graded. Hidden tests live only in the autograder zip; written (manual) questions are collected into a
CSV for the instructor to read.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import multiprocessing
import pathlib
import shutil
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

__all__ = ["Assignment", "LESSONS_DIR", "grade", "lessons", "make", "main", "written_questions"]

LESSONS_DIR = pathlib.Path(__file__).resolve().parent.parent / "lessons"


@dataclass(frozen=True)
class Assignment:
    """What ``otter assign`` wrote for one master notebook."""

    name: str
    student: pathlib.Path  # the notebook to hand out: solutions and hidden tests removed
    solutions: pathlib.Path  # the master with otter's cells added: grading it gives full points
    autograder: pathlib.Path  # zip with every test (public and hidden) and the points

    @classmethod
    def at(cls, folder: pathlib.Path) -> "Assignment":
        """The assignment that ``make`` wrote into ``folder`` (``build/lessons/NN_name``)."""
        name = folder.name
        zips = sorted((folder / "autograder").glob(f"{name}-autograder_*.zip"))
        if not zips:
            raise FileNotFoundError(f"no autograder zip in {folder / 'autograder'}: run `python -m kvlab lessons "
                                    f"make {name}` first")
        return cls(name, folder / "student" / f"{name}.ipynb", folder / "autograder" / f"{name}.ipynb", zips[-1])


def lessons(names: list[str] | None = None, root: pathlib.Path = LESSONS_DIR) -> list[pathlib.Path]:
    """The master notebooks, all or those named (``01`` or ``01_streaming_llm`` or a path)."""
    found = sorted(root.glob("[0-9][0-9]_*.ipynb"))
    if not names:
        return found
    picked = []
    for name in names:
        if pathlib.Path(name).suffix == ".ipynb" and pathlib.Path(name).exists():
            picked.append(pathlib.Path(name))
            continue
        match = [p for p in found if p.stem == name or p.stem.startswith(f"{name}_")]
        if len(match) != 1:
            raise ValueError(f"lesson {name!r} matches {len(match)} of {[p.stem for p in found]}; give its number "
                             f"or full name")
        picked.append(match[0])
    return picked


def make(names: list[str] | None = None, out: pathlib.Path = pathlib.Path("build/lessons"),
         run_tests: bool = False) -> list[Assignment]:
    """``otter assign`` every master (or those named) into ``out/NN_name``; returns what was written.

    ``run_tests=True`` also lets otter execute each master against its tests (slow: grading the solutions
    notebook with :func:`grade` checks the same)."""
    from otter.assign import main as otter_assign

    made = []
    for master in lessons(names):
        folder = (pathlib.Path(out) / master.stem).resolve()
        if folder.exists():  # no stale autograder zip from an earlier make
            shutil.rmtree(folder)
        with contextlib.redirect_stdout(io.StringIO()):  # otter's summary table; the CLI prints its own line
            otter_assign(str(master.resolve()), str(folder), no_run_tests=not run_tests, no_pdfs=True)
        made.append(Assignment.at(folder))
    return made


def written_questions(notebook: pathlib.Path) -> list[str]:
    """Names of the manually graded questions of a master notebook, in order."""
    import nbformat
    import yaml

    names = []
    for cell in nbformat.read(notebook, as_version=4).cells:
        if cell.cell_type == "raw" and cell.source.lstrip().startswith("# BEGIN QUESTION"):
            config = yaml.safe_load(cell.source.split("\n", 1)[1]) or {}
            if config.get("manual"):
                names.append(config["name"])
    return names


def _run_one(submission: pathlib.Path, autograder: pathlib.Path) -> bytes:
    """``otter run`` on one submission (in this process); a submission that cannot be graded at all (not a
    notebook, say) gets a result that says why. Returns the dill-pickled ``GradingResults``."""
    import dill
    from otter.run import main as otter_run
    from otter.test_files import GradingResults

    try:
        with contextlib.redirect_stdout(io.StringIO()):  # otter prints every test's report
            results = otter_run(str(submission.resolve()), autograder=str(autograder.resolve()), output_dir=None,
                                no_logo=True)
    except Exception as exc:  # noqa: BLE001 - one broken submission must not stop the class's grading
        results = GradingResults.without_results(exc)
    results.file = submission.name
    return dill.dumps(results)


def _written_answers(submission: pathlib.Path, questions: list[str]) -> list[dict]:
    """The student's text in the answer cells of the written questions (otter tags them ``otter_answer_cell``)."""
    import nbformat

    try:
        cells = nbformat.read(submission, as_version=4).cells
    except Exception as exc:  # noqa: BLE001 - an unreadable notebook is reported, not fatal
        return [{"file": submission.name, "question": q, "answer": f"(unreadable notebook: {exc})"} for q in questions]
    answers = [c.source for c in cells
               if c.cell_type == "markdown" and "otter_answer_cell" in c.get("metadata", {}).get("tags", [])]
    answers += ["(no answer cell)"] * (len(questions) - len(answers))
    return [{"file": submission.name, "question": q, "answer": a.strip()} for q, a in zip(questions, answers)]


def grade(assignment: Assignment | pathlib.Path, submissions: pathlib.Path, out: pathlib.Path,
          jobs: int = 1):
    """Grade every ``*.ipynb`` in ``submissions`` with ``otter run``; write ``out/final_grades.csv``
    (the format of ``otter grade``: a ``points-per-question`` row, then one row per submission with the score of
    each question, ``total_points_earned``, ``percent_correct`` and ``grading_status``) and
    ``out/written_answers.csv`` (file, question, answer) for the questions graded by hand.

    Returns the grades as a pandas DataFrame. ``assignment`` is an :class:`Assignment` or the folder that
    :func:`make` wrote for it."""
    import dill
    from otter.grade.utils import merge_scores_to_df

    if not isinstance(assignment, Assignment):
        assignment = Assignment.at(pathlib.Path(assignment))
    paths = sorted(pathlib.Path(submissions).glob("*.ipynb"))
    if not paths:
        raise ValueError(f"no *.ipynb submissions in {submissions}")
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if jobs > 1:  # otter changes directory while it grades: one process per worker
        with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            pickled = list(pool.map(_run_one, paths, [assignment.autograder] * len(paths)))
    else:
        pickled = [_run_one(p, assignment.autograder) for p in paths]
    scores = [dill.loads(b) for b in pickled]
    table = merge_scores_to_df(scores)
    table.to_csv(out / "final_grades.csv", index=False)
    questions = written_questions(lessons([assignment.name])[0])  # otter drops the names from its copies
    with open(out / "written_answers.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["file", "question", "answer"])
        writer.writeheader()
        for path in paths:
            writer.writerows(_written_answers(path, questions))
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvlab lessons", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("make", help="student versions and autograders of the lessons (otter assign)")
    p.add_argument("lessons", nargs="*", help="lesson numbers or names (default: all)")
    p.add_argument("--out", type=pathlib.Path, default=pathlib.Path("build/lessons"))
    p.add_argument("--run-tests", action="store_true", help="let otter run each master against its tests")
    p = sub.add_parser("grade", help="grade a folder of submissions to a CSV (otter run, no Docker)")
    p.add_argument("lesson", help="lesson number or name, e.g. 01")
    p.add_argument("submissions", type=pathlib.Path, help="folder of the students' .ipynb files")
    p.add_argument("--built", type=pathlib.Path, default=pathlib.Path("build/lessons"),
                   help="where `make` wrote the assignments")
    p.add_argument("--out", type=pathlib.Path, default=None, help="default: build/grades/<lesson>")
    p.add_argument("--jobs", type=int, default=1, help="submissions graded at once")
    args = parser.parse_args(argv)
    if args.command == "make":
        for a in make(args.lessons, args.out, args.run_tests):
            print(f"{a.name}: hand out {a.student}; grade with {a.autograder}")
        return 0
    name = lessons([args.lesson])[0].stem
    out = args.out or pathlib.Path("build/grades") / name
    from kvlab.threads import share_threads

    share_threads(max(1, args.jobs))  # each grading process computes with cores // jobs threads (KVLAB_THREADS wins)
    table = grade(args.built / name, args.submissions, out, jobs=args.jobs)
    print(table.to_string(index=False))
    print(f"wrote {out / 'final_grades.csv'} and {out / 'written_answers.csv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
