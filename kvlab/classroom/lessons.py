"""The classroom: the assignments in ``lessons/`` are otter-grader master notebooks; this module makes the
student versions and autograders with otter and grades a class with :mod:`kvlab.classroom.grading`::

    python -m kvlab lessons make [--out build/lessons] [--seed S] [LESSON ...]
        # `otter assign` per master: build/lessons/NN_name/student/NN_name.ipynb (the student version) and
        # build/lessons/NN_name/autograder/ (solutions notebook + NN_name-autograder_*.zip with every test);
        # build/lessons/student/ and build/lessons/student.zip: every student version, nothing else (hand out);
        # --seed S: the instructor's secret for the hidden tests' inputs, kept in the private autograder folder;
        # a private variant (`make --seed S PATH/NN_name.ipynb`) builds into build/lessons/private/NN_name, apart
        # from the public build and outside the hand-out bundle (grade it with --built build/lessons/private)
    python -m kvlab lessons grade LESSON SUBMISSIONS/ [--out build/grades/LESSON] [--jobs 2] [--timeout S]
                                  [--seed-file PATH] [--trust-submissions]
        # every SUBMISSIONS/*.ipynb or *.zip (what the notebook's export cell writes), each question in a fresh
        # process against the reference of the others: OUT/final_grades.csv (one row per submission, one column
        # per question, as `otter grade` writes it, plus `review`), OUT/feedback.csv and OUT/feedback/NAME.ipynb.md
        # (every check that failed, with its message), OUT/written_answers.csv; each student's code runs in a
        # bubblewrap sandbox (Linux): where none can be made, grade refuses unless --trust-submissions
    python -m kvlab lessons class BUILT/NN_name N OUT/    # N honest submissions (to time grading)
    python -m kvlab lessons attacks OUT/                  # the attack submissions the grading tests grade
    python -m kvlab lessons time tiny|NN [--repeats R] [--out DIR]   # class wall time: alone, slow, busy, attacked

Why otter-grader: `otter assign` turns one master notebook into the student version and an autograder zip with
public and hidden tests, in a format instructors know; no Docker, database or exchange directory is needed
(nbgrader needs its course database and exchange). Grading does not use `otter run`, which runs the tests in the
student's own kernel after the student's code (a cell that patches otter's doctest runner gets full marks):
:mod:`kvlab.classroom.grading` rebuilds the master with only the student's answer cells swapped in and runs every question
in its own forked process, tests taken from the autograder zip; see that module for what is protected.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import io
import json
import os
import pathlib
import shutil
from dataclasses import dataclass

__all__ = ["Assignment", "LESSONS_DIR", "bundle", "grade", "lessons", "make", "main", "solution_leaks",
           "written_questions"]

LESSONS_DIR = pathlib.Path(__file__).resolve().parents[2] / "lessons"


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
        if len(zips) > 1:  # `make` writes exactly one: another one was put there by someone else
            raise ValueError(f"{len(zips)} autograder zips in {folder / 'autograder'} ({[z.name for z in zips]}): "
                             f"`make` writes one; rebuild with `python -m kvlab lessons make {name}`")
        return cls(name, folder / "student" / f"{name}.ipynb", folder / "autograder" / f"{name}.ipynb", zips[-1])

    def stale(self, root: pathlib.Path | None = None) -> pathlib.Path | None:
        """The master in ``root`` (default :data:`LESSONS_DIR`) this assignment was made from, when it has changed
        since ``make`` (its sha256 differs from the one ``make`` kept); None when it has not, or is not there."""
        kept = self.autograder.parent / MASTER_HASH_FILE
        if self.autograder.parent.parent.parent.name == PRIVATE:
            return None  # a private variant: made from a master outside lessons/
        master = (root or LESSONS_DIR) / f"{self.name}.ipynb"
        if not kept.exists() or not master.exists():
            return None
        return master if hashlib.sha256(master.read_bytes()).hexdigest() != kept.read_text().strip() else None

    def seed(self) -> int | None:
        """The secret seed ``make --seed`` kept beside the autograder zip (None: none was given)."""
        path = self.autograder.parent / SEED_FILE
        return _seed_in(path) if path.exists() else None


SEED_FILE = "hidden_seed"  # in the private autograder folder: the seed the hidden tests draw their inputs from
MASTER_HASH_FILE = "master_sha256"  # in the private autograder folder: the master's hash when it was made
WRITTEN_FILE = "written_questions.json"  # in the private autograder folder: the questions graded by hand


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


BUNDLE = "student"  # out/student/ and out/student.zip: only the student versions, to hand out
PRIVATE = "private"  # out/private/NN_name: private variants (`make --seed S PATH`), apart from the public build


def make(names: list[str] | None = None, out: pathlib.Path = pathlib.Path("build/lessons"),
         run_tests: bool = False, seed: int | None = None) -> list[Assignment]:
    """``otter assign`` every master (or those named) into ``out/NN_name``; returns what was written.

    Also writes the hand-out bundle: ``out/student/`` with the student version of every lesson built in ``out``
    (no solutions, no hidden tests) and the same folder as ``out/student.zip``.
    ``run_tests=True`` also lets otter execute each master against its tests (slow: grading the solutions
    notebook with :func:`grade` checks the same). ``seed``: the instructor's secret from which the hidden tests
    draw their inputs (``HIDDEN_SEED`` in a test), written into each private autograder folder so that
    :func:`grade` uses it; a public repository then does not reveal the hidden inputs."""
    from otter.assign import main as otter_assign

    from kvlab.outputs import OutputFolder

    made = []
    out = pathlib.Path(out)
    masters = lessons(names)
    written = OutputFolder(out, "kvlab lessons make", recognise=_made_here(out))
    public = {m.resolve() for m in lessons()}
    for master in masters:
        # a private variant (a master given by path, named as one of lessons/) builds apart: out/private/NN_name,
        # never over the public build nor into the hand-out bundle
        private = master.resolve() not in public and any(m.stem == master.stem for m in public)
        rel = f"{PRIVATE}/{master.stem}" if private else master.stem
        folder = (out / rel).resolve()
        written.remove_tree(rel)  # no stale autograder zip from an earlier make (and only what make wrote)
        with contextlib.redirect_stdout(io.StringIO()):  # otter's summary table; the CLI prints its own line
            otter_assign(str(master.resolve()), str(folder), no_run_tests=not run_tests, no_pdfs=True)
        (folder / "autograder").chmod(0o700)  # the tests and the solutions: only the instructor reads them
        (folder / "autograder" / MASTER_HASH_FILE).write_text(hashlib.sha256(master.read_bytes()).hexdigest() + "\n")
        # the questions graded by hand, from the master this build was made from (a private variant's own)
        (folder / "autograder" / WRITTEN_FILE).write_text(json.dumps(written_questions(master)) + "\n")
        if seed is not None:
            (folder / "autograder" / SEED_FILE).write_text(f"{int(seed)}\n")
            (folder / "autograder" / SEED_FILE).chmod(0o600)
        written.adopt_tree(rel)
        made.append(Assignment.at(folder))
    bundle(out, written)
    return made


def _made_here(out: pathlib.Path):
    """What ``make`` wrote into ``out`` before its folder kept a manifest: the folders of the lessons (otter's
    student and autograder folders), the hand-out copies, its README and zip. Anything else is the user's."""
    import zipfile

    out = pathlib.Path(out)
    names = {p.stem for p in lessons()}

    def recognise(path: pathlib.Path) -> bool:
        rel = path.relative_to(out).parts
        if rel[0] in names and len(rel) >= 3 and rel[1] in ("student", "autograder"):
            return True
        if rel[0] == BUNDLE and len(rel) == 2:
            return (rel[1] == "README.md" and path.read_text(errors="replace") == HANDOUT) or \
                (rel[1].endswith(".ipynb") and pathlib.Path(rel[1]).stem in names)
        if rel == (f"{BUNDLE}.zip",):
            try:
                with zipfile.ZipFile(path) as z:
                    return f"{BUNDLE}/README.md" in z.namelist() and all(
                        n.startswith(f"{BUNDLE}/") for n in z.namelist())
            except (OSError, zipfile.BadZipFile):
                return False
        return False
    return recognise


def bundle(out: pathlib.Path, written=None) -> pathlib.Path:
    """Copy the student version of every assignment built in ``out`` into ``out/student/`` and zip that folder
    into ``out/student.zip``; refuses (ValueError) if a solution or hidden test reached a student version, and
    (:class:`kvlab.outputs.OutputRefused`) if ``out`` holds a file kvlab did not write (``written``: the
    :class:`~kvlab.outputs.OutputFolder` that :func:`make` opened)."""
    import zipfile

    from kvlab.outputs import OutputFolder

    out = pathlib.Path(out)
    students = sorted(out.glob("[0-9][0-9]_*/student/*.ipynb"))
    for path in students:
        leaked = solution_leaks(path)
        if leaked:
            raise ValueError(f"{path} is not safe to hand out: {leaked}")
    if written is None:
        written = OutputFolder(out, "kvlab lessons make", recognise=_made_here(out))
    written.remove_tree(BUNDLE)
    folder = out / BUNDLE
    folder.mkdir(parents=True)
    for path in students:
        shutil.copy(path, written.claim(f"{BUNDLE}/{path.name}"))
    written.claim(f"{BUNDLE}/README.md").write_text(HANDOUT)
    with zipfile.ZipFile(written.claim(f"{BUNDLE}.zip"), "w", zipfile.ZIP_DEFLATED) as z:
        for path in sorted(folder.iterdir()):
            z.write(path, f"{BUNDLE}/{path.name}")
    return folder


HANDOUT = """# kvlab assignments

Install kvlab (`pip install kvlab`, or the environment your instructor gives you), open each notebook of this
folder in JupyterLab, work through the questions, and run `grader.check("qN")` under each one: these are the public checks, with a hint
when one fails. The instructor grades with more (hidden) checks, each question on its own.

To hand in: save the notebook, run the last cell (`grader.export(...)`): it writes a zip with your notebook
next to it. Hand in that zip, or the `.ipynb` itself, the way your instructor asks (course repository,
JupyterHub, e-mail). You get back per question the score and every check that failed, with its message.
"""


def solution_leaks(notebook: pathlib.Path) -> list[str]:
    """What in a notebook would give away a solution: otter's solution markers, hidden tests (in the cells or
    in the metadata otter uses for the public checks) or cells tagged as solutions. Empty when safe."""
    import nbformat

    nb = nbformat.read(notebook, as_version=4)
    found = []
    for i, cell in enumerate(nb.cells):
        text = cell.source
        for marker in ("BEGIN SOLUTION", "END SOLUTION", "# HIDDEN", "hidden: true", "BEGIN TESTS"):
            if marker in text:
                found.append(f"cell {i} contains {marker!r}")
        if "otter_assign_solution_cell" in cell.get("metadata", {}).get("tags", []):
            found.append(f"cell {i} is a solution cell")
    tests = nb.metadata.get("otter", {}).get("tests", {})
    for q, test in tests.items():
        if any(case.get("hidden") for suite in test.get("suites", []) for case in suite.get("cases", [])):
            found.append(f"a hidden test of {q} is in the notebook's metadata")
    return found


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


def _written_answers(submission: pathlib.Path, questions: list[str]) -> list[dict]:
    """The student's text in the answer cells of the written questions (otter tags them ``otter_answer_cell``;
    in the master's solutions notebook the model answer follows the placeholder, tagged as a solution)."""
    from kvlab.classroom.grading import read_submission

    try:
        cells = read_submission(submission).cells
    except Exception as exc:  # noqa: BLE001 - an unreadable notebook is reported, not fatal
        return [{"file": submission.name, "question": q, "answer": f"(unreadable notebook: {exc})"} for q in questions]
    answers = []
    for i, c in enumerate(cells):
        if c.cell_type == "markdown" and "otter_answer_cell" in c.get("metadata", {}).get("tags", []):
            text = c.source
            after = cells[i + 1] if i + 1 < len(cells) else None
            if after is not None and after.cell_type == "markdown" and \
                    "otter_assign_solution_cell" in after.get("metadata", {}).get("tags", []):
                text = after.source  # the master's model answer, not otter's placeholder above it
            answers.append(text)
    answers += ["(no answer cell)"] * (len(questions) - len(answers))
    out = []
    for q, a in zip(questions, answers):
        a = a.strip()
        out.append({"file": submission.name, "question": q, "answer": "(not answered)" if a == PLACEHOLDER else a})
    return out


PLACEHOLDER = "_Type your answer here, replacing this text._"  # what otter puts in a written answer cell


def _feedback_text(result, lesson: str) -> str:
    """One student's feedback as Markdown: per question the score, each check that failed and its message."""
    from kvlab.classroom.grading import clean

    lines = [f"# Feedback: {lesson}, {clean(result.file, 200)}", ""]
    if result.status != "Completed":
        lines += [f"**Not graded**: {result.status}", ""]
    possible = sum(q.points for q in result.questions.values())
    lines += [f"Autograded score: **{result.total:g} / {possible:g}** (written questions are graded by hand).", ""]
    for q in result.questions.values():
        lines.append(f"## {q.question}: {q.score:g} / {q.points:g}")
        for e in q.errors:
            lines.append(f"- {e}")
        for c in q.cases:
            kind = "hidden" if c.hidden else "public"
            mark = "passed" if c.passed else "FAILED"
            shown = c.message if not c.passed and c.message and not c.hidden else ""  # a hidden check's stays hidden
            lines.append(f"- {c.name} ({kind}, {c.points:g} pt): {mark}" + (f": {shown}" if shown else ""))
        lines.append("")
    if result.flags:
        lines += ["## Flagged for review by the instructor", ""] + [f"- {f}" for f in result.flags] + [""]
    return "\n".join(lines)


def read_seed_file(path: pathlib.Path) -> int:
    """The secret seed in ``path``; refuses (ValueError) a file that others than its owner may read."""
    path = pathlib.Path(path)
    if path.stat().st_mode & 0o077:
        raise ValueError(f"{path} may be read by others than its owner: `chmod 600 {path}` (it holds the secret of "
                         f"the hidden tests' inputs)")
    return _seed_in(path)


def _seed_in(path: pathlib.Path) -> int:
    """The whole number a seed file holds; a file holding anything else is named (its text is not shown: a seed is
    a secret)."""
    try:
        return int(path.read_text().strip())
    except (ValueError, UnicodeDecodeError):
        raise ValueError(f"{path} does not hold a whole number (the secret seed of the hidden tests' inputs): write "
                         f"one into it (e.g. `echo 1234 > {path}`), or make the assignment again with --seed") from None


REVIEW_LIMIT = 4000  # characters of the review column of one submission


def grade(assignment: Assignment | pathlib.Path, submissions: pathlib.Path, out: pathlib.Path,
          jobs: int = 1, timeout: float | None = None, seed: int | None = None,
          seed_file: pathlib.Path | None = None, trust_submissions: bool = False, cgroups: bool | None = None):
    """Grade every ``*.ipynb`` (or ``grader.export()`` ``*.zip``) in ``submissions`` with
    :func:`kvlab.classroom.grading.grade_submissions` (each question in a fresh process against the reference of the
    others, the tests from the autograder zip, tampering put back and flagged) and write into ``out``:

    - ``final_grades.csv``: the format of ``otter grade`` (a ``points-per-question`` row, then one row per
      submission with the score of each question, ``total_points_earned``, ``percent_correct``,
      ``grading_status``) plus ``review`` (why to look at the submission by hand; empty when nothing was found);
    - ``feedback.csv``: one row per submission and check (``file, question, check, hidden, points, earned,
      passed, message``), and ``feedback/<submission>.md``, the same for one student, to hand back;
    - ``written_answers.csv`` (``file, question, answer``) for the questions graded by hand.

    ``seed``: the secret of the hidden tests' inputs (default: read from ``seed_file``, a file only its owner
    may read, else from the one ``make --seed`` kept with the assignment, else 0); it reaches the judges only,
    never a student's process (not its environment, not a command line it could see). ``trust_submissions``:
    grade without the bubblewrap sandbox where none can be made (see :mod:`kvlab.classroom.grading`);
    ``cgroups=False``: the weaker per-process limits where no control group per child can be made. Returns the grades as a pandas DataFrame. ``assignment`` is an :class:`Assignment` or the folder that
    :func:`make` wrote for it."""
    from kvlab.classroom.grading import grade_submissions

    if not isinstance(assignment, Assignment):
        assignment = Assignment.at(pathlib.Path(assignment))
    changed = assignment.stale()
    if changed is not None:
        raise ValueError(f"{assignment.autograder.parent.parent} was made from an older {changed}: its tests and "
                         f"reference answers may no longer match; rebuild it with `python -m kvlab lessons make "
                         f"{assignment.name}` (and hand out the new student version if the questions changed)")
    from kvlab.outputs import OutputFolder

    if not pathlib.Path(submissions).is_dir():
        raise FileNotFoundError(f"the submissions folder {submissions} does not exist (or is not a folder): give the "
                                "folder holding the students' .ipynb files or export zips")
    paths = sorted(p for p in pathlib.Path(submissions).glob("*") if p.suffix in (".ipynb", ".zip"))
    if not paths:
        raise ValueError(f"no *.ipynb or *.zip submissions in {submissions} (it holds "
                         f"{sorted(p.name for p in pathlib.Path(submissions).iterdir())[:5] or 'nothing'}): put the "
                         "students' notebooks or the zips their export cell wrote there")
    out = pathlib.Path(out)
    outputs = OutputFolder(out, "kvlab lessons grade", recognise=_graded_here(out))
    if seed is None and seed_file is not None:
        seed = read_seed_file(seed_file)
    if seed is None:
        seed = assignment.seed()
    results = grade_submissions(assignment.solutions, assignment.autograder, paths, jobs=jobs, timeout=timeout,
                                seed=seed, trust_submissions=trust_submissions, cgroups=cgroups,
                                hide=[out.resolve(), _build_root(assignment)])
    # every file is written whole (an interrupt leaves the earlier file or the new one), the grades last: a
    # final_grades.csv newer than the feedback is never one whose feedback is missing
    _write_feedback(outputs, out, results, assignment.name)
    written = _written_of(assignment)

    def answers(path):
        with open(path, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=["file", "question", "answer"])
            writer.writeheader()
            for sub in paths:
                writer.writerows(_written_answers(sub, written))

    _write_whole(outputs, "written_answers.csv", answers)
    table = _write_grades(outputs, results)
    table.attrs["results"] = results  # per question: score, seconds and CPU time of its run (timing reads them)
    return table


def _write_whole(outputs, name: str, write) -> None:
    """``write(path)`` into a temporary sibling, renamed to ``name`` once complete (both claimed first)."""
    final, tmp = outputs.claim(name, str(pathlib.PurePosixPath(name).with_name(f".partial-{pathlib.Path(name).name}")))
    try:
        write(tmp)
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)


def _written_of(assignment: Assignment) -> list[str]:
    """The manually graded questions of the master ``make`` built the assignment from (kept beside its autograder
    zip; an older build without that file: the lesson of that name in lessons/)."""
    kept = assignment.autograder.parent / WRITTEN_FILE
    if kept.exists():
        return [str(q) for q in json.loads(kept.read_text())]
    masters = [m for m in lessons() if m.stem == assignment.name]  # otter drops the names from its copies
    return written_questions(masters[0]) if masters else []


def _build_root(assignment: Assignment) -> pathlib.Path:
    """The folder ``make`` built into (for a private variant, the one above ``private/``): hidden from children."""
    root = assignment.autograder.resolve().parent.parent.parent
    return root.parent if root.name == PRIVATE else root


def _write_grades(outputs, results):
    """``final_grades.csv`` (otter's format plus ``review``); returns it as a DataFrame."""
    import pandas as pd

    from kvlab.classroom.grading import clean

    questions = list(results[0].questions)
    possible = {q: results[0].questions[q].points for q in questions}
    total = sum(possible.values())
    rows = [{"file": "points-per-question", **possible, "total_points_earned": total, "percent_correct": "",
             "grading_status": "", "review": ""}]
    for r in results:
        review = " | ".join(r.flags)
        rows.append({"file": clean(r.file, 200), **{q: r.questions[q].score for q in questions},
                     "total_points_earned": r.total, "percent_correct": round(r.total / total, 4) if total else 0.0,
                     "grading_status": clean(r.status, 400), "review": clean(review, REVIEW_LIMIT)})
    table = pd.DataFrame(rows)
    _write_whole(outputs, "final_grades.csv", lambda path: table.to_csv(path, index=False))
    return table


def _write_feedback(outputs, out: pathlib.Path, results, name: str) -> None:
    """``feedback.csv`` and ``feedback/<submission>.md``: every check, and every error of the student's code."""
    from kvlab.classroom.grading import clean

    # a run replaces every feedback file it wrote: none stays from an earlier class (a file it did not write
    # stopped the run before grading began)
    outputs.remove_tree("feedback")
    (out / "feedback").mkdir()
    def table(path):
        with open(path, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=["file", "question", "check", "hidden", "points", "earned",
                                                   "passed", "message"])
            writer.writeheader()
            for r in results:
                for q in r.questions.values():
                    for e in q.errors:
                        writer.writerow({"file": clean(r.file, 200), "question": q.question, "check": "(your code)",
                                         "hidden": "", "points": "", "earned": "", "passed": "", "message": e})
                    for c in q.cases:
                        writer.writerow({"file": clean(r.file, 200), "question": q.question, "check": c.name,
                                         "hidden": c.hidden, "points": c.points,
                                         "earned": c.points if c.passed else 0.0, "passed": c.passed,
                                         "message": c.message})

    _write_whole(outputs, "feedback.csv", table)
    for r in results:  # keyed by the full name: x.ipynb and x.zip are two submissions with two feedback files
        text = _feedback_text(r, name)
        _write_whole(outputs, f"feedback/{r.file}.md", lambda path: path.write_text(text))


def _graded_here(out: pathlib.Path):
    """What ``grade`` wrote into ``out`` before its folder kept a manifest: its three CSV files and the feedback
    pages it writes (each starts with its heading). Anything else (an instructor's own notes) is the user's."""
    out = pathlib.Path(out)

    def recognise(path: pathlib.Path) -> bool:
        rel = path.relative_to(out).parts
        if rel in (("final_grades.csv",), ("feedback.csv",), ("written_answers.csv",)):
            return True
        return len(rel) == 2 and rel[0] == "feedback" and rel[1].endswith(".md") and \
            path.read_text(errors="replace").startswith("# Feedback: ")
    return recognise
