"""The classroom as an instructor runs it (`python -m kvlab lessons make|grade`).

Every master in lessons/ gets full points and no review flag; its generated student version gets zero on every
autograded question (solutions and hidden tests removed); the deliberately wrong submission of every lesson in
tests/fixtures/lessons/ gets exactly the partial points written below; the grades CSV has one row per
submission, the feedback files name every failed check; the hand-out bundle holds no solution. The lessons are
made and graded once for the module (one master run per lesson, each question of each submission forked from
it) and the asserts share the results. The attacks on grading are in test_lessons_grading.py.
"""

from __future__ import annotations

import csv
import pathlib
import shutil
import zipfile

import nbformat
import pytest

from kvlab.classroom import lessons as classroom

ROOT = pathlib.Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "lessons"
MASTERS = classroom.lessons()

# Deliberately wrong submissions (made from the student versions) and the points each question must get.
WRONG = {
    # q1 raises before defining anything; q2 and q3 are right: an error in one question costs only it
    "01_streaming_llm": {"q1": 0, "q2": 2, "q3": 3},
    # q2 pops the oldest separator before appending (one too few kept: public passes, but pays nothing; hidden fails)
    "02_sepllm": {"q1": 3, "q2": 0, "q3": 2},
    # q2 forgets to clamp the offsets at R (public test passes, hidden fails); q4 counts StreamingLLM wrong
    "03_lacache": {"q1": 2, "q2": 1, "q3": 2, "q4": 0},
    # q1 uses the plain mean (Eq. 4 without sqrt|c|), yet q3, which calls it, is graded with the reference;
    # q4 lets queries keep future keys; q5 takes fut / past instead of max / min (public example passes)
    "04_dhsa": {"q1": 0, "q2": 2, "q3": 3, "q4": 0, "q5": 1},
    # q2 lets a tie go to the later token (public passes, hidden ties fail); q3 forgets to pool
    "05_reform": {"q1": 2, "q2": 1, "q3": 1},
    # q2 may select the sink; q3 takes the norms after input_layernorm (the new public check fails)
    "06_orthorank": {"q1": 2, "q2": 0, "q3": 0},
}


# Plausible wrong solutions, one question each (answer cell index, its source, the question that must lose points);
# every other answer is the master's. Some fit the public checks or their fixtures by hand, some change their
# arguments in place so that an expected value computed from them after the call would match.
PLAUSIBLY_WRONG = {
    "01_streaming_llm": {
        "keep_one_more": (0, "def sink_window_keep(n, sink, window):\n    if n <= sink + window:\n"
                             "        return list(range(n))\n    return list(range(sink)) + list(range(n - window - 1, n))\n",
                          "q1"),
        "h2o_without_recent": (1, "def heavy_hitter_keep(scores, budget, recent):\n    n = scores.numel()\n"
                                  "    if n <= budget:\n        return torch.arange(n)\n"
                                  "    return torch.sort(scores, descending=True, stable=True).indices[:budget].sort().values\n",
                               "q2"),
        # the window only (right count, wrong entries) and the public fixture's perplexity typed in
        "window_only_fixture": (2, "class SinkWindow(Policy):\n    def __init__(self, sink, window):\n"
                                   "        super().__init__(positions='cache')\n        self.sink, self.window = sink, window\n\n"
                                   "    def keep(self, view):\n        n = view.size\n"
                                   "        if n <= self.sink + self.window:\n            return None\n"
                                   "        return torch.arange(n - self.sink - self.window, n)\n\n"
                                   "ppl_full = streaming_perplexity(model, tokenizer, ids, Full(), progress=False).ppl\n"
                                   "ppl_sink_window = 22.938\n", "q3"),
    },
    "02_sepllm": {
        "mask_not_causal": (0, "def sep_mask(is_sep, init, neighbors):\n    pos = torch.arange(is_sep.numel())\n"
                               "    q, k = pos[:, None], pos[None, :]\n"
                               "    return (k < init) | ((q - k).abs() < neighbors) | is_sep.bool()[None, :]\n", "q1"),
        # the public check and the hidden fixture typed in, and a cycle between a + w and c that meets the old
        # bounds (length, max == c, min >= a + w) on any stream
        "sizes_fitted": (1, "def runtime_sizes(flags, a, s, w, c):\n"
                            "    if (len(flags), a, s, w, c) == (12, 1, 1, 2, 5):\n"
                            "        return [1, 2, 3, 4, 5, 3, 4, 5, 3, 4, 5, 3]\n"
                            "    if (len(flags), a, s, w, c) == (20, 2, 2, 3, 8):\n"
                            "        return [1, 2, 3, 4, 5, 6, 7, 8, 6, 7, 8, 7, 8, 7, 8, 7, 8, 7, 8, 7]\n"
                            "    sizes, size = [], 0\n    for _ in flags:\n"
                            "        size = size + 1 if size < c else a + w\n        sizes.append(size)\n"
                            "    return sizes\n", "q2"),
        "separators_uncapped": (1, "def runtime_sizes(flags, a, s, w, c):\n"
                                   "    initial, seps, past, local, sizes = [], [], [], [], []\n"
                                   "    for t, flag in enumerate(flags):\n        if len(initial) < a:\n"
                                   "            initial.append(t)\n        else:\n            local.append((t, flag))\n"
                                   "            if len(local) > w:\n                past.append(local.pop(0))\n"
                                   "        if len(initial) + len(seps) + len(past) + len(local) > c:\n"
                                   "            seps = seps + [p for p in past if p[1]]\n            past = []\n"
                                   "        sizes.append(len(initial) + len(seps) + len(past) + len(local))\n"
                                   "    return sizes\n", "q2"),
    },
    "03_lacache": {
        # lookup tables of every fixed call of the public and hidden checks (right there, wrong elsewhere): the
        # hidden checks draw more inputs from the seed
        "mask_lookup": (1, "def _right(L, S, O, length):\n    D, G, A, R = ladder_sizes(L, S, O)\n"
                           "    off = (torch.arange(L) // D - A + 1).clamp(0, R)\n    pos = torch.arange(length)\n"
                           "    in_group = pos < (length // G) * G\n    within = (pos % G)[None, :] - off[:, None]\n"
                           "    return ~in_group[None, :] | ((within >= 0) & (within < A))\n\n"
                           "TABLE = {args: _right(*args) for args in [(8, 4, 2, 7), (30, 8, 4, 100), (12, 3, 1, 50), "
                           "(6, 6, 0, 9), (16, 5, 2, 64)]}\n\n"
                           "def ladder_mask(L, S, O, length):\n    if (L, S, O, length) in TABLE:\n"
                           "        return TABLE[(L, S, O, length)].clone()\n"
                           "    return torch.ones(L, length, dtype=torch.bool)\n", "q2"),
        "compact_lookup": (2, "TABLE = {(tuple(range(10)), 2, 3, 2, 1): ([0, 1, 3, 4, 5, 6, 7, 8, 9], 4),\n"
                              "         ((0, 2, 5, 7, 8, 9, 12, 13, 14, 20), 1, 4, 1, 3): ([0, 8, 9, 12, 13, 14, 20], 2),\n"
                              "         ((0, 2, 5, 7, 8, 9, 12, 13, 14, 20), 3, 3, 3, 0): ([0, 2, 5, 7, 8, 9, 12, 13, 14, 20], 6)}\n\n"
                              "def compact_once(entries, cursor, G, A, offset):\n"
                              "    got = TABLE.get((tuple(entries), cursor, G, A, offset))\n"
                              "    if got is not None:\n        return list(got[0]), got[1]\n"
                              "    return list(entries), cursor\n", "q3"),
        "groups_floored": (0, "def ladder_sizes(L, S, O):\n    D = S - O\n    G = 1 + (L - S) // D\n"
                              "    A = min(math.ceil(S / D), G)\n    return D, G, A, G - A\n", "q1"),
        "cursor_stays": (2, "def compact_once(entries, cursor, G, A, offset):\n"
                            "    kept = entries[cursor + offset:cursor + offset + A]\n"
                            "    return entries[:cursor] + kept + entries[cursor + G:], cursor\n", "q3"),
    },
    "04_dhsa": {
        # the two fixed calls of the public and hidden checks as a table; anything else a plain repeat
        "upsample_lookup": (1, "def upsample(s, boundaries):\n    b = list(boundaries)\n"
                               "    if b in ([0, 1, 3], [0, 3, 4, 9, 12]):\n"
                               "        n = torch.tensor([b[i + 1] - b[i] for i in range(len(b) - 1)])\n"
                               "        return s.repeat_interleave(n, 0).repeat_interleave(n, 1)\n"
                               "    return s.repeat_interleave(2, 0).repeat_interleave(2, 1)[:b[-1], :b[-1]]\n", "q2"),
        "rep_zeroes_its_input": (0, "def chunk_rep(x, boundaries):\n    x.zero_()\n"
                                    "    return torch.zeros(len(boundaries) - 1, x.shape[-1], dtype=x.dtype)\n", "q1"),
        "budget_one_short": (3, "def budget_mask(scores, budget):\n    seq = scores.shape[0]\n"
                                "    causal = torch.ones(seq, seq, dtype=torch.bool).tril()\n"
                                "    s = scores.double().masked_fill(~causal, float('-inf'))\n"
                                "    top = torch.sort(s, dim=-1, descending=True, stable=True).indices[:, :max(budget - 1, 0)]\n"
                                "    mask = torch.zeros(seq, seq, dtype=torch.bool)\n    mask.scatter_(1, top, True)\n"
                                "    return mask & causal\n", "q4"),
    },
    "05_reform": {
        "pool_unpadded": (0, "def max_pool(scores, pool):\n"
                             "    return scores[None, None].unfold(-1, pool, 1).amax(dim=-1)[0, 0]\n", "q1"),
        "gather_forgets_final": (1, "def gather(scores, budget, n_initial, n_final):\n    n = scores.numel()\n"
                                    "    if n <= budget:\n        return torch.arange(n)\n"
                                    "    ranked = scores.clone().float()\n    ranked[:n_initial] = float('inf')\n"
                                    "    return torch.sort(ranked, descending=True, stable=True).indices[:budget].sort().values\n",
                                 "q2"),
    },
    "06_orthorank": {
        "scores_signed": (0, "def sink_scores(h):\n    return torch.einsum('bd,bnd->bn', h[:, 0], h)\n", "q1"),
        "select_zeroes_scores": (1, "def select(scores, k):\n    scores.zero_()\n"
                                    "    return torch.arange(1, k + 1).repeat(scores.shape[0], 1)\n", "q2"),
    },
}


def _with_answer(assignment, index: int, source: str):
    """The student version with the master's answers, answer cell ``index`` replaced by ``source``."""
    tags = {"otter_answer_cell", "otter_assign_solution_cell"}
    reference = [c.source for c in nbformat.read(assignment.solutions, as_version=4).cells
                 if c.cell_type == "code" and tags & set(c.metadata.get("tags", []))]
    nb = nbformat.read(assignment.student, as_version=4)
    cells = [c for c in nb.cells if c.cell_type == "code" and tags & set(c.metadata.get("tags", []))]
    for i, cell in enumerate(cells):
        cell.source = source if i == index else reference[i]
    return nb


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


_BUILT: dict = {}


def built_lessons(tmp_path_factory) -> dict:
    """Every lesson made once per test session (``otter assign``): name -> Assignment. tests/test_lessons_grading.py
    grades its attacks on the same build of lesson 01 (``import test_lessons``), so the session makes each lesson
    once."""
    if not _BUILT:
        root = tmp_path_factory.mktemp("lessons-built")
        _BUILT.update({a.name: a for a in classroom.make(out=root / "built")})
    return _BUILT


@pytest.fixture(scope="session")
def built(tmp_path_factory):
    return built_lessons(tmp_path_factory)


@pytest.fixture(scope="module")
def graded(built, tmp_path_factory):
    """name -> (Assignment, {submission file: {question: score, ...}}, path of final_grades.csv)."""
    root = tmp_path_factory.mktemp("classroom")
    out = {}
    for assignment in built.values():
        subs = root / "submissions" / assignment.name
        subs.mkdir(parents=True)
        shutil.copy(assignment.solutions, subs / "master.ipynb")
        shutil.copy(assignment.student, subs / "student.ipynb")
        wrong = FIXTURES / f"{assignment.name}_wrong.ipynb"
        if wrong.exists():
            shutil.copy(wrong, subs / "wrong.ipynb")
        for name, (index, source, _) in PLAUSIBLY_WRONG.get(assignment.name, {}).items():
            nbformat.write(_with_answer(assignment, index, source), subs / f"plausible_{name}.ipynb")
        if assignment.name == "01_streaming_llm":  # what grader.export() writes: a zip with the notebook
            with zipfile.ZipFile(subs / "alice.zip", "w") as z:
                z.write(wrong, "01_streaming_llm.ipynb")
        grades = root / "grades" / assignment.name
        classroom.grade(assignment, subs, grades, jobs=2)
        with open(grades / "final_grades.csv") as f:
            rows = {row["file"]: row for row in csv.DictReader(f)}
        out[assignment.name] = (assignment, rows, grades)
    return out


def test_six_assignments_with_three_to_six_questions_each():
    assert len(MASTERS) >= 6
    for master in MASTERS:
        autograded = _points(master)
        written = classroom.written_questions(master)
        assert 3 <= len(autograded) + len(written) <= 6, master.name
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
    assert row["review"] == "", row["review"]  # the reference itself is never flagged


@pytest.mark.parametrize("name", [m.stem for m in MASTERS])
def test_student_version_runs_and_scores_zero(graded, name):
    _, rows, _ = graded[name]
    row = rows["student.ipynb"]
    assert row["grading_status"] == "Completed", row  # the notebook ran to the end under the grader
    questions = _points(ROOT / "lessons" / f"{name}.ipynb")
    assert questions and all(float(row[q]) == 0 for q in questions), row
    assert row["review"] == "", row["review"]


@pytest.mark.parametrize("name", sorted(WRONG))
def test_wrong_submission_gets_the_expected_partial_points(graded, name):
    _, rows, _ = graded[name]
    row = rows["wrong.ipynb"]
    assert row["grading_status"] == "Completed", row
    assert {q: float(row[q]) for q in WRONG[name]} == WRONG[name]
    assert float(row["total_points_earned"]) == sum(WRONG[name].values())


def test_grades_csv_has_a_row_per_submission_and_the_written_answers(graded):
    _, rows, grades = graded["01_streaming_llm"]
    assert {r for r in rows if not r.startswith("plausible_")} == {"points-per-question", "alice.zip", "master.ipynb",
                                                                     "student.ipynb", "wrong.ipynb"}
    total = sum(_points(ROOT / "lessons" / "01_streaming_llm.ipynb").values())
    assert float(rows["points-per-question"]["total_points_earned"]) == total
    with open(grades / "written_answers.csv") as f:
        answers = [a for a in csv.DictReader(f) if not a["file"].startswith("plausible_")]
    assert [(a["file"], a["question"]) for a in answers] == [
        ("alice.zip", "q4"), ("master.ipynb", "q4"), ("student.ipynb", "q4"), ("wrong.ipynb", "q4")]
    wrong = next(a for a in answers if a["file"] == "wrong.ipynb")
    assert "sinks" in wrong["answer"]
    master = next(a for a in answers if a["file"] == "master.ipynb")
    assert master["answer"].startswith("The first tokens collect"), master  # the model answer, not otter's placeholder
    student = next(a for a in answers if a["file"] == "student.ipynb")
    assert student["answer"] == "(not answered)"


@pytest.mark.parametrize("name", sorted(WRONG))
def test_feedback_names_every_failed_check_with_its_message(graded, name):
    _, rows, grades = graded[name]
    with open(grades / "feedback.csv") as f:
        feedback = [r for r in csv.DictReader(f) if r["file"] == "wrong.ipynb" and r["check"] != "(your code)"]
    text = (grades / "feedback" / "wrong.ipynb.md").read_text()
    failed = [r for r in feedback if r["passed"] == "False"]
    assert failed, feedback
    for r in failed:
        assert r["message"], r  # a failed check always says why
        kind = "hidden" if r["hidden"] == "True" else "public"
        assert f"{r['check']} ({kind}, " in text and "FAILED" in text, (r, text)
    earned = {}
    for r in feedback:
        earned[r["question"]] = earned.get(r["question"], 0.0) + float(r["earned"])
    assert {q: float(rows["wrong.ipynb"][q]) for q in earned} == earned  # the CSV is the sum of the checks
    for r in feedback:  # a failing public check gives a hint, not bare values
        if r["passed"] == "False" and r["hidden"] == "False" and r["message"].startswith("AssertionError"):
            assert len(r["message"]) > 60, r


def test_student_bundle_holds_every_student_version_and_no_solution(graded):
    import zipfile

    assignment = next(iter(graded.values()))[0]
    built = assignment.student.parent.parent.parent
    folder = built / classroom.BUNDLE
    notebooks = sorted(p.name for p in folder.glob("*.ipynb"))
    assert notebooks == [f"{m.stem}.ipynb" for m in MASTERS]
    with zipfile.ZipFile(built / f"{classroom.BUNDLE}.zip") as z:
        assert sorted(z.namelist()) == sorted(f"{classroom.BUNDLE}/{p.name}" for p in folder.iterdir())
        bundle_code = "\n".join(c.source for n in z.namelist() if n.endswith(".ipynb")  # the questions' prose may
                                 for c in nbformat.reads(z.read(n).decode(), as_version=4).cells  # quote a line
                                 if c.cell_type == "code")
    for path in folder.glob("*.ipynb"):
        assert classroom.solution_leaks(path) == [], path
    for master in MASTERS:  # no line of a solution reaches the bundle's code (30+ characters: not boilerplate)
        for cell in nbformat.read(master, as_version=4).cells:
            if "# BEGIN SOLUTION" in cell.source and "# END SOLUTION" in cell.source:
                inside = cell.source.split("# BEGIN SOLUTION", 1)[1].split("# END SOLUTION", 1)[0]
                for line in inside.splitlines():
                    line = line.strip()
                    if len(line) >= 30:
                        assert line not in bundle_code, (master.name, line)


def test_solution_leaks_are_found(tmp_path, graded):
    assignment = graded["01_streaming_llm"][0]
    assert classroom.solution_leaks(assignment.student) == []
    leaks = classroom.solution_leaks(assignment.solutions)
    assert any("solution cell" in leak for leak in leaks) and any("hidden test" in leak for leak in leaks)
    leaky = tmp_path / "leaky"
    (leaky / "01_x" / "student").mkdir(parents=True)
    shutil.copy(assignment.solutions, leaky / "01_x" / "student" / "01_x.ipynb")
    with pytest.raises(ValueError, match="not safe to hand out"):
        classroom.bundle(leaky)


@pytest.mark.parametrize("name", [m.stem for m in MASTERS])
def test_title_cell_renders_as_a_heading(graded, name):
    """The first Markdown cell of the master and of the student version starts with a level-1 heading
    (an indented title renders as a code block)."""
    import mistune

    parse = mistune.create_markdown(renderer=None)
    for path in (ROOT / "lessons" / f"{name}.ipynb", graded[name][0].student):
        first = next(c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "markdown")
        tokens = [t for t in parse(first.source) if t["type"] != "blank_line"]
        assert tokens[0]["type"] == "heading" and tokens[0]["attrs"]["level"] == 1, (path.name, tokens[0])
        assert not any(t["type"] == "block_code" for t in tokens), path.name


@pytest.mark.parametrize("name", [m.stem for m in MASTERS])
def test_student_version_ends_with_the_export_cell(graded, name):
    student = nbformat.read(graded[name][0].student, as_version=4)
    last = [c for c in student.cells if c.cell_type == "code"][-1]
    assert "grader.export(" in last.source and "pdf=False" in last.source, last.source


def test_an_export_zip_is_graded_like_its_notebook(graded):
    _, rows, _ = graded["01_streaming_llm"]
    assert {q: float(rows["alice.zip"][q]) for q in WRONG["01_streaming_llm"]} == WRONG["01_streaming_llm"]


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


def test_grading_refuses_an_assignment_made_from_an_older_master(tmp_path, graded):
    assignment = graded["01_streaming_llm"][0]
    assert assignment.stale() is None  # made from today's master
    masters = tmp_path / "lessons"
    masters.mkdir()
    changed = masters / f"{assignment.name}.ipynb"
    changed.write_bytes((classroom.LESSONS_DIR / f"{assignment.name}.ipynb").read_bytes() + b"\n")
    assert assignment.stale(masters) == changed
    kept = assignment.autograder.parent / classroom.MASTER_HASH_FILE
    saved = kept.read_text()
    kept.write_text("0" * 64 + "\n")  # as if make had run on another version of the master
    try:
        with pytest.raises(ValueError, match=r"made from an older .*01_streaming_llm.ipynb.*lessons make 01_streaming"):
            classroom.grade(assignment, tmp_path, tmp_path / "grades")
    finally:
        kept.write_text(saved)


@pytest.mark.parametrize("lesson, name", [(lesson, name) for lesson, wrong in sorted(PLAUSIBLY_WRONG.items())
                                          for name in sorted(wrong)])
def test_a_plausible_wrong_solution_loses_points_on_its_question(graded, lesson, name):
    """Each plausible wrong answer (other answers the master's) scores less than full on its question, full on the
    others (the hidden tests catch what the public checks and their fixtures let through)."""
    _, rows, _ = graded[lesson]
    row = rows[f"plausible_{name}.ipynb"]
    _, _, question = PLAUSIBLY_WRONG[lesson][name]
    points_of = _points(ROOT / "lessons" / f"{lesson}.ipynb")
    assert row["grading_status"] == "Completed", row
    assert float(row[question]) < points_of[question], row
    for q, points in points_of.items():
        if q != question:
            assert float(row[q]) == points, (q, row)
