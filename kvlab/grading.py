"""Grading that a submission cannot talk its way through: each question in a fresh process, the others' reference.

``otter run`` executes a submission and then the tests in the student's own kernel, after the student's
code: a cell that replaces otter's doctest runner, a builtin the tests use or a ``grader.check`` cell
decides its own grade. Here the student's notebook is only a source of answer cells:

1. **The master is rebuilt, not the submission run.** The graded program is the instructor's solutions
   notebook (from ``otter assign``) cell by cell; the submission contributes only its answer cells (tagged
   ``otter_answer_cell`` by otter, matched to the master's by order) and the code cells the student added.
   The parameters, the set-up, the ``grader.check`` cells and the tests are the master's: editing,
   skipping or deleting them in the submission changes nothing, and tests in the notebook's metadata are
   never read (the tests come from the autograder zip).
2. **Each question on its own, in a fresh process.** A *zygote* process runs the master's cells (the
   reference answers included); just before question q's answer it forks one child per submission, and
   only the child runs student code (one child per distinct answer: identical code forked from the same state
   scores the same): the student's added cells, the student's answer to q, the master's
   cells up to q's check, then q's tests (public and hidden). Question q is graded against the reference
   of every other question, and nothing a student does for q reaches another question, the zygote or the
   grading process.
3. **The tests run on a restored world.** Before the student's first cell the child copies the namespace
   of every loaded module and Python class and the builtins; after each student cell and after the tests
   it compares, puts back what was replaced (``otter...run_doctest``, ``torch.allclose``, a kvlab
   function, ``builtins.abs``) and *flags* it. The tests are executed by code captured before the student's
   code ran, with the original builtins (a global ``def abs`` or ``list = ...`` is not seen by the tests),
   and names the master defined (parameters, imported modules, functions, the model) are put back when a
   student cell rebinds them.
4. **Flags for manual review.** A static scan of the student's cells flags the usual routes around
   the above (imports of otter, ``builtins``, ``gc``, ``inspect``, ``ctypes``...; ``exec``/``eval``;
   ``setattr``/attribute assignment on imported modules; ``__eq__`` overrides; ``os._exit``;
   assignments to parameters). A flag does not change the score: it puts the row up for review.

5. **The child is confined** (:func:`_confine`): its own session, killed whole at the end or on timeout;
   stdout/stderr on ``/dev/null``, every descriptor closed but its private result pipe (the zygote reads it:
   no result file a classmate could forge); an empty working folder; rlimits on CPU time, address space,
   core files and processes (no fork); as root, the user ``nobody`` (it cannot signal the grader, read its
   folders or the autograder folder, or write the build and lessons folders). The tests are compiled before
   the student's cells run; errors are reported by type and line, never with the student's text.
6. **Time limits from the reference**: each question's reference answer runs first in a child, and a
   student's run may take ``SLOWDOWN`` times as long (at least ``MIN_LIMIT`` s) unless ``timeout`` is given.

Not protected: the tests still run in the child after the student's cells, so the student's function, when a
test calls it, can dig into the child's own memory (frames, ``gc``, ``ctypes``) and forge that question's
result; the scan flags the usual routes. Not root: no user switch (see docs/guide/classroom.md).

Entry point: :func:`grade_submissions` (used by ``python -m kvlab lessons grade``).
"""

from __future__ import annotations

import ast
import builtins
import doctest
import io
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass, field

__all__ = ["CaseResult", "QuestionResult", "SubmissionResult", "grade_submissions", "load_tests", "scan"]

ANSWER_TAGS = ("otter_answer_cell", "otter_assign_solution_cell")


@dataclass
class CaseResult:
    """One test case of a question: ``name`` is ``q1 check 2``, ``message`` says why it failed."""

    name: str
    hidden: bool
    points: float
    passed: bool
    message: str = ""


@dataclass
class QuestionResult:
    question: str
    points: float  # possible
    score: float = 0.0
    cases: list[CaseResult] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # the student's cells that raised, and why


@dataclass
class SubmissionResult:
    file: str
    questions: dict[str, QuestionResult] = field(default_factory=dict)
    flags: list[str] = field(default_factory=list)  # reasons to review this submission by hand
    status: str = "Completed"

    @property
    def total(self) -> float:
        return sum(q.score for q in self.questions.values())


# ------------------------------------------------------------------------------------------ the master

def _kind(cell) -> str:
    """``answer``, ``otter`` (otter's init / check / export cells: never run) or ``given``."""
    tags = cell.get("metadata", {}).get("tags", [])
    if any(t in tags for t in ANSWER_TAGS):
        return "answer"
    src = cell.source
    if "otter.Notebook(" in src or "grader.check(" in src or "grader.export(" in src or "grader.check_all(" in src:
        return "otter"
    return "given"


def _check_question(source: str) -> str | None:
    import re

    m = re.search(r"""grader\.check\(\s*["']([^"']+)["']""", source)
    return m.group(1) if m else None


def _master_plan(solutions) -> tuple[list[dict], list[str]]:
    """The master's code cells as ``{"source", "kind", "question"}`` (an answer cell's question is that of the
    check cell after it; a check cell's is its own) and the autograded questions in order."""
    cells, pending, order = [], [], []
    for cell in solutions.cells:
        if cell.cell_type != "code":
            continue
        kind = _kind(cell)
        entry = {"source": cell.source, "kind": kind, "question": None}
        if kind == "answer":
            pending.append(entry)
        elif kind == "otter" and _check_question(cell.source):
            q = _check_question(cell.source)
            entry["kind"] = "check"
            entry["question"] = q
            order.append(q)
            for a in pending:
                a["question"] = q
            pending = []
        cells.append(entry)
    for a in pending:  # answer cells without a check (none in kvlab's lessons): graded by nothing
        a["kind"] = "given"
    return cells, order


def load_tests(autograder_zip: pathlib.Path) -> dict[str, dict]:
    """The tests of every question from otter's autograder zip (OK format: ``tests/qN.py``), hidden ones too."""
    tests = {}
    with zipfile.ZipFile(autograder_zip) as z:
        for name in z.namelist():
            if name.startswith("tests/") and name.endswith(".py"):
                env: dict = {}
                exec(compile(z.read(name).decode(), name, "exec"), env)  # the instructor's own file
                test = env["test"]
                cases = [c for s in test["suites"] for c in s["cases"]]
                given = sum(c.get("points") or 0 for c in cases)
                free = [c for c in cases if c.get("points") is None]
                for c in free:
                    c["points"] = (test.get("points", 0) - given) / len(free)
                tests[test["name"]] = {"points": test.get("points", given), "cases": [
                    {"name": f"{test['name']} check {i + 1}", "code": c["code"], "hidden": bool(c.get("hidden")),
                     "points": float(c["points"])} for i, c in enumerate(cases)]}
    return tests


# ------------------------------------------------------------------------------------------ the scan

_BAD_MODULES = {"otter", "builtins", "__builtin__", "gc", "inspect", "ctypes", "importlib", "subprocess",
                "signal", "atexit", "unittest", "doctest", "pytest", "kvlab.grading", "kvlab.lessons", "sys",
                "threading", "multiprocessing", "_thread", "pickle", "dill", "marshal", "types", "os", "shutil",
                "pathlib", "tempfile", "socket", "io"}
_BAD_NAMES = {"__builtins__", "__import__", "exec", "eval", "compile", "globals", "setattr", "delattr",
              "breakpoint", "__loader__", "__spec__", "open", "vars", "locals", "exit", "quit"}
_BAD_ATTRS = {"_exit", "_getframe", "settrace", "setprofile", "f_back", "f_globals", "f_locals", "__code__",
              "__globals__", "__subclasses__", "__builtins__", "kill", "fork", "execv", "system",
              "__dict__", "__closure__", "gi_frame", "tb_frame", "argv", "environ", "__setattr__"}
_COMPARISON_DUNDERS = {"__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__bool__",
                       "__instancecheck__", "__subclasshook__", "__hash__", "__float__", "__index__",
                       "__getattr__", "__getattribute__"}


SAFE_MODULES = {"math", "typing", "collections", "itertools", "functools", "dataclasses", "heapq", "bisect",
                "torch", "numpy", "random", "statistics", "operator", "enum", "__future__"}
_ALLOWED_DUNDERS = {"__init__", "__post_init__", "__repr__", "__str__", "__len__", "__iter__", "__slots__",
                    "__doc__", "__module__", "__qualname__", "__annotations__"}


def _scan_more(tree: ast.AST, allowed_imports: set[str] | None) -> list[str]:
    """Computed attribute names, dunders in class bodies, imports outside the allowlist (``allowed_imports``:
    modules and ``kvlab`` names the master itself imports; None skips that check)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in (
                "getattr", "hasattr", "setattr", "delattr") and len(node.args) >= 2:
            name = node.args[1]
            if not (isinstance(name, ast.Constant) and isinstance(name.value, str)):
                found.append(f"uses {node.func.id} with a computed attribute name")
            elif name.value.startswith("__") or name.value in _BAD_ATTRS:
                found.append(f"uses {node.func.id}(..., {name.value!r})")
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                names = []
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    names = [item.name]
                elif isinstance(item, (ast.Assign, ast.AnnAssign)):
                    targets = item.targets if isinstance(item, ast.Assign) else [item.target]
                    names = [t.id for t in targets if isinstance(t, ast.Name)]
                for n in names:
                    if n.startswith("__") and n.endswith("__") and n not in _ALLOWED_DUNDERS:
                        found.append(f"defines {n} in the class {node.name} (changes how its values compare, "
                                     f"convert or dispatch)")
            for base in node.bases:
                b = ast.unparse(base)
                if b.split(".")[-1] in ("float", "int", "list", "tuple", "dict", "str", "bool", "Tensor"):
                    found.append(f"subclasses {b} (an answer must be the plain type)")
        elif allowed_imports is not None and isinstance(node, (ast.Import, ast.ImportFrom)):
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            else:
                mods = [node.module or ""]
            for m in mods:
                top = m.split(".")[0]
                if top == "kvlab" and isinstance(node, ast.ImportFrom):
                    for a in node.names:
                        if f"kvlab:{a.name}" not in allowed_imports:
                            found.append(f"imports {a.name} from {m}, which the assignment does not use "
                                         f"(is it the class the question asks you to write?)")
                elif top not in allowed_imports and top not in SAFE_MODULES and top != "kvlab":
                    found.append(f"imports {m}, outside the modules the assignment uses")
        elif isinstance(node, ast.Attribute) and node.attr in ("__torch_function__", "__class__", "__mro__",
                                                                "__bases__", "__reduce__"):
            found.append(f"uses .{node.attr}")
    return found


def allowed_imports(sources: list[str]) -> set[str]:
    """What the master's own cells import: top-level modules, and ``kvlab:NAME`` for names taken from kvlab."""
    allowed = set()
    for src in sources:
        try:
            tree = ast.parse(src)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                allowed.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                allowed.add(node.module.split(".")[0])
                if node.module.split(".")[0] == "kvlab":
                    allowed.update(f"kvlab:{a.name}" for a in node.names)
    return allowed


def scan(source: str, label: str, parameters: set[str] = frozenset(), imported: set[str] = frozenset(),
         allowed_imports: set[str] | None = None) -> list[str]:
    """Reasons to look at a student's cell by hand (empty for ordinary code). ``imported``: names bound to
    modules or classes elsewhere in the notebook (assigning an attribute of one is monkeypatching);
    ``allowed_imports``: see :func:`allowed_imports` (None: imports are checked against the block list only)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []  # it fails when run, and scores what it scores
    found = []
    aliases = set(imported)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            for a in node.names:
                aliases.add((a.asname or a.name).split(".")[0])
            for m in mods:
                if m in _BAD_MODULES or m.split(".")[0] in _BAD_MODULES - {"kvlab"}:
                    found.append(f"imports {m}")
                if isinstance(node, ast.ImportFrom) and any(a.name in _BAD_NAMES or a.name in _BAD_ATTRS
                                                            for a in node.names):
                    found.append(f"imports {', '.join(a.name for a in node.names)} from {m}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in _BAD_NAMES:
            found.append(f"uses {node.id}")
        elif isinstance(node, ast.Attribute) and node.attr in _BAD_ATTRS:
            found.append(f"uses .{node.attr}")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in _COMPARISON_DUNDERS:
            found.append(f"defines {node.name} (an answer that compares equal to anything?)")
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            for t in targets:
                for sub in ast.walk(t):
                    if isinstance(sub, ast.Attribute):
                        root = sub
                        while isinstance(root, ast.Attribute):
                            root = root.value
                        if isinstance(root, ast.Name) and root.id in aliases:
                            found.append(f"assigns {ast.unparse(sub)} (monkeypatching {root.id})")
    for node in tree.body:  # top level only: a local variable of the same name is harmless
        targets = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        names = {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names = {node.name}
        for name in sorted(names):
            if name in parameters:
                found.append(f"assigns the parameter {name}")
            elif hasattr(builtins, name) and not name.startswith("_"):
                found.append(f"redefines the builtin {name}")
    found += _scan_more(tree, allowed_imports)
    seen, out = set(), []
    for f in found:
        if f not in seen:
            seen.add(f)
            out.append(f"{label}: {f}")
    return out


def _imported_names(sources: list[str]) -> set[str]:
    names = {"torch", "math", "kvlab", "np", "numpy", "otter", "grader", "builtins", "sys", "os"}
    for src in sources:
        try:
            tree = ast.parse(src)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def _parameters(solutions) -> set[str]:
    for cell in solutions.cells:
        if cell.cell_type == "code" and "parameters" in cell.get("metadata", {}).get("tags", []):
            tree = ast.parse(cell.source)
            return {n.id for node in tree.body for n in ast.walk(node) if isinstance(n, ast.Name)
                    and isinstance(node, (ast.Assign, ast.AnnAssign))}
    return set()


def _assigned(sources: list[str]) -> set[str]:
    """Top-level names the cells bind (a question's reference answer may rebind them)."""
    names = set()
    for src in sources:
        try:
            tree = ast.parse(src)
        except SyntaxError:
            continue
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
                names.add(node.name)
            for n in ast.walk(node):
                if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                    names.add(n.id)
    return names


# ------------------------------------------------------------------------------------------ a submission

def read_submission(path: pathlib.Path):
    """The notebook of a submission: an ``.ipynb``, or the zip that ``grader.export()`` wrote (one notebook)."""
    import nbformat

    path = pathlib.Path(path)
    if path.suffix == ".zip":
        with zipfile.ZipFile(path) as z:
            notebooks = [n for n in z.namelist() if n.endswith(".ipynb") and not n.startswith("__MACOSX")]
            if len(notebooks) != 1:
                raise ValueError(f"{path.name}: expected one .ipynb in the zip, found {notebooks}")
            return nbformat.reads(z.read(notebooks[0]).decode(), as_version=4)
    return nbformat.read(path, as_version=4)


def _student_plan(nb, master_cells: list[dict], order: list[str], label: str) -> tuple[dict, dict, list[str]]:
    """The submission's answer cells per question (matched to the master's by order) and its added cells per
    question (an added cell belongs to the question of the next answer cell), plus flags."""
    flags = []
    given = {c["source"].strip() for c in master_cells if c["kind"] in ("given", "otter", "check")}
    master_answers = [c["question"] for c in master_cells if c["kind"] == "answer"]
    answers_q: dict[str, list[str]] = {q: [] for q in order}
    extras_q: dict[str, list[str]] = {q: [] for q in order}
    pending_extras, i = [], 0
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        if any(t in cell.get("metadata", {}).get("tags", []) for t in ANSWER_TAGS):
            if i < len(master_answers):
                q = master_answers[i]
                answers_q[q].append(cell.source)
                extras_q[q].extend(pending_extras)
                pending_extras = []
            i += 1
            continue
        src = cell.source.strip()
        if not src or src in given or _kind(cell) == "otter":
            continue  # the master's own cells (the master's version runs) and otter's
        pending_extras.append(cell.source)
    if order:
        extras_q[order[-1]].extend(pending_extras)
    if i != len(master_answers):
        by_region = _answers_by_check(nb, order)
        if by_region is not None:  # a copied answer cell (its tag comes along): each check cell ends its question
            answers_q = by_region
            flags.append(f"{label}: {i} answer cells where the assignment has {len(master_answers)}; matched to "
                         f"the question whose check cell follows them")
        else:
            flags.append(f"{label}: {i} answer cells where the assignment has {len(master_answers)} (cells added, "
                         f"removed or their tags edited); matched by order")
    return answers_q, extras_q, flags


def _answers_by_check(nb, order: list[str]) -> dict[str, list[str]] | None:
    """Answer cells per question by the ``grader.check("qN")`` cell after them, when every check cell of the
    assignment is still there, once and in order; else None."""
    checks = [_check_question(c.source) for c in nb.cells if c.cell_type == "code" and _check_question(c.source)]
    if checks != order:
        return None
    answers: dict[str, list[str]] = {q: [] for q in order}
    pending = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        q = _check_question(cell.source)
        if q:
            answers[q].extend(pending)
            pending = []
        elif any(t in cell.get("metadata", {}).get("tags", []) for t in ANSWER_TAGS):
            pending.append(cell.source)
    return answers


# ------------------------------------------------------------------------------------------ the child's side

def _snapshot(watch_classes: bool = True) -> dict:
    """Shallow copies of every loaded module's namespace and of every Python class defined in one."""
    snap = {}
    for name, mod in list(sys.modules.items()):
        d = getattr(mod, "__dict__", None)
        if not isinstance(d, dict):
            continue
        snap[("m", name)] = (mod, dict(d))
        if not watch_classes:
            continue
        for value in list(d.values()):
            if isinstance(value, type) and getattr(value, "__module__", None) == name:
                try:
                    snap[("c", f"{name}.{value.__qualname__}")] = (value, dict(value.__dict__))
                except Exception:  # noqa: BLE001 - an odd class: not watched
                    pass
    return snap


def _callable_like(v) -> bool:
    return callable(v) or isinstance(v, (type(sys), property, staticmethod, classmethod))


def _restore(snap: dict) -> list[str]:
    """Put back every replaced or deleted callable of the snapshotted modules and classes (and anything
    added to a class); return what was changed. Lazily imported submodules and caches are left alone."""
    changed = []
    for (kind, name), (obj, old) in snap.items():
        now = obj.__dict__
        if now is None:
            continue
        for key, value in old.items():
            cur = now.get(key, _MISSING)
            if cur is value or not _callable_like(value):
                continue
            changed.append(f"{name}.{key}")
            try:
                setattr(obj, key, value)
            except Exception:  # noqa: BLE001 - reported all the same
                pass
        if kind == "c":
            for key in [k for k in list(now) if k not in old]:
                changed.append(f"{name}.{key} (added)")
                try:
                    delattr(obj, key)
                except Exception:  # noqa: BLE001
                    pass
    return changed


_MISSING = object()


def _protected(name: str, value, parameters: set[str]) -> bool:
    import types

    if name in parameters:
        return True
    if isinstance(value, (types.ModuleType, types.FunctionType, type)) or callable(value):
        return True
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def _compile_case(case: dict) -> tuple[str, list | str]:
    """A test case as ``(name, [(code object, expected output), ...])`` (or ``(name, why it cannot be parsed)``),
    compiled before any student code runs: rewriting the test's text afterwards changes nothing."""
    try:
        examples = doctest.DocTestParser().get_examples(case["code"])
        return case["name"], [(compile(ex.source, case["name"], "single" if ex.want else "exec"), ex.want)
                              for ex in examples]
    except (ValueError, SyntaxError) as exc:
        return case["name"], f"the test could not be parsed: {exc}"


def _run_case(case: tuple[str, list | str], env: dict, pristine: dict) -> tuple[bool, str]:
    """Run one compiled OK-format (doctest) test case in ``env`` (whose ``__builtins__`` are the original ones)."""
    checker = doctest.OutputChecker()
    name, examples = case
    if isinstance(examples, str):
        return False, examples
    if not examples:
        return False, "the test has no example to run"
    for code, want in examples:
        out = io.StringIO()
        old = sys.stdout
        try:
            sys.stdout = out
            exec(code, env)
        except BaseException as exc:  # noqa: BLE001 - a failing test is a result
            sys.stdout = old
            tb = exc.__traceback__
            while tb is not None and tb.tb_next is not None:
                tb = tb.tb_next
            raised_by_test = tb is not None and tb.tb_frame.f_code.co_filename == name
            text = str(exc).strip() if raised_by_test and isinstance(exc, AssertionError) else ""
            # the test's own assertion message is the instructor's hint; anything raised inside the student's code
            # is reported by its type only (its text is the student's, and could carry a file it read)
            return False, f"{type(exc).__name__}: {text}" if text else (
                type(exc).__name__ + ("" if raised_by_test else " raised in your code"))
        finally:
            sys.stdout = old
        if want and not checker.check_output(want, out.getvalue(), 0):
            return False, f"the check printed something else than the expected {want.strip()[:80]!r}"
    return True, ""


def _child(job: dict, sub: dict, q: str, ns: dict, pristine: dict, out_fd: int) -> None:
    """Run in the forked child: the student's cells for question ``q`` (``sub``: the added cells up to q and
    the answer cells of q), the master's cells up to q's check,
    then q's tests; write the result as JSON to the pipe ``out_fd`` (the zygote holds its other end). Never
    returns."""
    # every helper is bound here, before any student code runs: rebinding the module's names changes nothing
    snapshot, restore, run_case, protected, dumps = _snapshot, _restore, _run_case, _protected, json.dumps
    write, close, exit_ = os.write, os.close, os._exit
    flags, errors = [], []
    result = {"cases": [], "errors": errors, "flags": flags}
    compiled = [_compile_case(case) for case in job["tests"][q]["cases"]]
    try:
        torch = sys.modules.get("torch")
        if torch is not None:
            torch.set_num_threads(1)  # the zygote may have used OpenMP threads: not safe to reuse after fork
        parameters = set(job["parameters"])
        allowed = set(job["rebinds"][q])
        master_bound = set(ns)
        guarded = {k: v for k, v in ns.items() if protected(k, v, parameters)}
        cells = [("your added cell", s, True) for s in sub["extras"]]
        cells += [(f"your answer to {q}", s, True) for s in sub["answers"]]
        start = job["answer_start"][q]
        cells += [("the assignment's cell", c["source"], False) for c in job["cells"][start:job["check_index"][q]]
                  if c["kind"] == "given"]
        for label, source, student in cells:
            if student:
                before = snapshot()
            else:
                previous = dict(ns)
            try:
                exec(compile(source, f"<{label}>", "exec"), ns)
            except BaseException as exc:  # noqa: BLE001 - errors are allowed: the tests decide
                if student:
                    tb = exc.__traceback__
                    line = None
                    while tb is not None:
                        if tb.tb_frame.f_code.co_filename == f"<{label}>":
                            line = tb.tb_lineno
                        tb = tb.tb_next
                    where = f" (line {line})" if line else ""
                    # the type and line only: a message is text the student's code chose (it could carry a file)
                    errors.append(f"{label} raised {type(exc).__name__}{where}")
            if student:
                flags.extend(f"{label} replaced {name} (put back for the tests)" for name in restore(before))
                for name, value in guarded.items():
                    if ns.get(name, _MISSING) is not value and name not in allowed:
                        flags.append(f"{label} rebinds {name}, which the assignment defines (put back)")
                        ns[name] = value
            else:  # what the assignment's own cells bind is guarded from the next student cell on
                master_bound.update(ns)
                guarded.update({k: v for k, v in ns.items() if previous.get(k, _MISSING) is not v
                                and protected(k, v, parameters)})
        shadowed = sorted(k for k in ns if k in pristine and ns[k] is not pristine[k] and not k.startswith("__")
                          and k not in master_bound)
        env = {k: v for k, v in ns.items() if k not in shadowed}
        if shadowed:
            flags.append(f"defines {', '.join(shadowed)} over the builtins (the tests used the real ones)")
        changed = [k for k, v in pristine.items() if builtins.__dict__.get(k, _MISSING) is not v]
        if changed:
            flags.append(f"changed builtins {', '.join(sorted(changed))} (the tests used the real ones)")
        before = snapshot()
        env["__builtins__"] = pristine  # the tests of a question share one namespace, as in otter
        for case in compiled:
            passed, message = run_case(case, env, pristine)
            result["cases"].append({"name": case[0], "passed": passed, "message": message[:500]})
        flags.extend(f"the tests' run replaced {name}" for name in restore(before))
        data = dumps(result).encode()
        while data:
            data = data[write(out_fd, data):]
        close(out_fd)
    finally:
        exit_(0)


def _zygote(job_path: str) -> None:
    """Run the master cell by cell; before each question's first answer cell, fork one child per submission
    (``job["jobs"]`` at a time, each killed after ``job["timeout"]`` s). Writes ``zygote.json`` (errors of the
    master's own cells) into the results folder."""
    job = json.loads(pathlib.Path(job_path).read_text())
    os.remove(job_path)  # the hidden tests and the reference are not left where a student's code could read them
    results = pathlib.Path(job["results"])
    pristine = dict(builtins.__dict__)
    ns: dict = {"__name__": "__main__", "__builtins__": builtins}

    class _Grader:  # a student's stray grader.check(...) does nothing here: the tests run after the cells
        def __getattr__(self, name):
            return lambda *a, **k: None

    ns["grader"] = _Grader()
    master_errors = []
    forked = set()
    for index, cell in enumerate(job["cells"]):
        q = cell["question"]
        if cell["kind"] == "answer" and q not in forked:
            forked.add(q)
            _fork_all(job, q, ns, pristine, results)
        if cell["kind"] in ("given", "answer"):
            try:
                exec(compile(cell["source"], f"<master cell {index}>", "exec"), ns)
            except BaseException as exc:  # noqa: BLE001 - reported to the grading process
                master_errors.append(f"master cell {index}: {type(exc).__name__}: {exc}")
    (results / "zygote.json").write_text(json.dumps({"errors": master_errors}))


REFERENCE_LIMIT = 600.0  # seconds the reference answer may take (it sets the students' limit)
SLOWDOWN, MIN_LIMIT = 10.0, 5.0  # a student's run of a question may take 10x the reference's, at least 5 s
MEMORY = 4 << 30  # bytes a child may map beyond what the zygote had mapped
NOBODY = 65534  # the unprivileged user a child runs as when the grader is root


def _confine(keep_fd: int, workdir: str, cpu_seconds: float, memory_bytes: int) -> None:
    """In a forked child, before any student code: its own session (its process group is killed whole), stdin,
    stdout and stderr on /dev/null and every other descriptor closed but the result pipe ``keep_fd``, an empty
    working folder, limits on CPU time, memory, core files and processes (no fork, so no grandchild), and, when
    run as root, the unprivileged user ``nobody`` (it cannot signal the grader, read its private folders or
    write the build and lessons folders). Not root: the same without the user switch (see the guide)."""
    import resource

    os.setsid()
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.closerange(3, keep_fd)
    os.closerange(keep_fd + 1, 1 << 16)
    if os.geteuid() == 0:
        os.chown(workdir, NOBODY, NOBODY)
    os.chdir(workdir)
    cpu = max(1, int(cpu_seconds) + 1)
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    with open("/proc/self/statm") as f:  # the address space already mapped by the zygote, plus the budget
        mapped = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    resource.setrlimit(resource.RLIMIT_AS, (mapped + memory_bytes, mapped + memory_bytes))
    if os.geteuid() == 0:
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)
    resource.setrlimit(resource.RLIMIT_NPROC, (1, 1))  # counted per user: with this process there, no fork


def _kill_group(pid: int) -> None:
    import signal

    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _fork_all(job: dict, q: str, ns: dict, pristine: dict, results: pathlib.Path) -> None:
    """Fork one confined child per variant of ``q`` (``job["jobs"]`` at a time), read each one's result from
    its own pipe, kill its whole process group when it ends or runs over the time limit, and write what came
    back (or why nothing did) as ``V.q.json`` into the zygote's private ``results`` folder."""
    import select
    import shutil

    sys.stdout.flush()
    sys.stderr.flush()
    pending = list(range(len(job["variants"][q])))
    running: dict[int, tuple[float, int, int, bytearray, str]] = {}
    limit = job["timeout"] or REFERENCE_LIMIT
    measured = job["timeout"] is not None
    while pending or running:
        if not measured and not running and pending[0] != 0:
            # variant 0 is the reference answer: its time sets the limit of every student's run of q
            ref = json.loads((results / f"0.{q}.json").read_text())
            limit = max(MIN_LIMIT, SLOWDOWN * ref.get("seconds", REFERENCE_LIMIT))
            measured = True
        while pending and len(running) < (job["jobs"] if measured else 1):
            i = pending.pop(0)
            r, w = os.pipe()
            workdir = tempfile.mkdtemp(prefix="kvlab-child-")
            pid = os.fork()
            if pid == 0:
                try:
                    os.close(r)
                    _confine(w, workdir, limit, job["memory"])
                    _child(job, job["variants"][q][i], q, ns, pristine, w)
                finally:
                    os._exit(1)
            os.close(w)
            os.set_blocking(r, False)
            running[pid] = (time.monotonic(), i, r, bytearray(), workdir)
        readable, _, _ = select.select([v[2] for v in running.values()], [], [], 0.02)
        for pid, (t0, i, r, buf, workdir) in list(running.items()):
            if r in readable:
                try:
                    while chunk := os.read(r, 1 << 16):
                        buf += chunk
                        if len(buf) > 1 << 22:
                            break
                except BlockingIOError:
                    pass
            done, status = os.waitpid(pid, os.WNOHANG)
            over = not done and time.monotonic() - t0 > limit
            if not (done or over):
                continue
            _kill_group(pid)  # the child's session: anything it left behind goes with it
            if over:
                os.waitpid(pid, 0)
            try:
                while chunk := os.read(r, 1 << 16):
                    buf += chunk
            except BlockingIOError:
                pass
            os.close(r)
            shutil.rmtree(workdir, ignore_errors=True)
            del running[pid]
            outcome: dict = {}
            if over:
                outcome["status"] = f"the run of {q} took over {limit:g} s and was stopped"
            else:
                try:
                    outcome["result"] = json.loads(bytes(buf).decode())
                    if not isinstance(outcome["result"], dict) or set(outcome["result"]) != {"cases", "errors", "flags"}:
                        raise ValueError("not a result")
                except (ValueError, UnicodeDecodeError):
                    outcome = {"status": f"the run of {q} ended before its tests finished (exit status "
                                         f"{os.waitstatus_to_exitcode(status)})"}
            outcome["seconds"] = time.monotonic() - t0
            outcome["limit"] = limit
            (results / f"{i}.{q}.json").write_text(json.dumps(outcome))


# ------------------------------------------------------------------------------------------ the grading process

def grade_submissions(solutions: pathlib.Path, autograder_zip: pathlib.Path, submissions: list[pathlib.Path],
                      jobs: int = 1, timeout: float | None = None,
                      memory: int = MEMORY) -> list[SubmissionResult]:
    """Grade ``submissions`` (``.ipynb`` or ``grader.export()`` zips) against the master ``solutions``
    notebook (the one ``otter assign`` writes beside the autograder zip) and the tests in ``autograder_zip``.

    Every autograded question of every submission runs in its own forked process with the reference answers
    of the other questions; see the module docstring for what is protected. ``jobs`` children run at once;
    a child running over ``timeout`` seconds is stopped (the question scores zero). ``timeout=None`` (the
    default) runs the reference answer of each question first, in a child like the students', and gives each
    student's run ``SLOWDOWN`` times its time (at least ``MIN_LIMIT`` s). ``memory``: bytes a child may map.
    A child that dies, hangs or is killed costs its question only; a notebook that cannot be read or planned is
    one row with its reason; if the grading process itself dies, every row says so and the class goes on.
    """
    import nbformat

    if not hasattr(os, "fork"):
        raise RuntimeError("kvlab's grading forks one process per question: it needs Linux or macOS (or WSL)")
    if jobs < 1:
        raise ValueError(f"jobs={jobs}: must be at least 1 (submissions graded at once)")
    if timeout is not None and not timeout > 0:
        raise ValueError(f"timeout={timeout}: must be positive (seconds one question may run)")
    master = nbformat.read(solutions, as_version=4)
    cells, order = _master_plan(master)
    tests = load_tests(autograder_zip)
    missing = [q for q in order if q not in tests]
    if missing:
        raise ValueError(f"questions {missing} have no tests in {autograder_zip}: rebuild with `lessons make`")
    parameters = _parameters(master)
    imported = _imported_names([c["source"] for c in cells])
    allowed = allowed_imports([c["source"] for c in cells if c["kind"] != "answer"])
    allowed |= set(master.metadata.get("kvlab", {}).get("allowed_imports", []))  # what a question allows
    assignment = master.metadata.get("otter", {}).get("assignment_name")
    results = [SubmissionResult(pathlib.Path(p).name) for p in submissions]
    subs, gradable = [], []
    for path, res in zip(submissions, results):
        for q in order:
            res.questions[q] = QuestionResult(q, float(tests[q]["points"]))
        try:
            nb = read_submission(path)
            name = nb.metadata.get("otter", {}).get("assignment_name")
            if assignment and name and name != assignment:
                res.flags.append(f"the notebook is assignment {name!r}, not {assignment!r}")
            answers, extras, flags = _student_plan(nb, cells, order, "notebook")
        except Exception as exc:  # noqa: BLE001 - one unreadable or malformed notebook is a row, not a crash
            res.status = f"not graded: the notebook could not be read ({type(exc).__name__}: {str(exc)[:200]})"
            continue
        res.flags.extend(flags)
        for q in order:
            for src in answers[q]:
                res.flags.extend(scan(src, f"answer to {q}", parameters, imported, allowed))
            for src in extras[q]:
                res.flags.extend(scan(src, f"added cell before {q}", parameters, imported, allowed))
        subs.append({"answers": answers, "extras": extras})
        gradable.append(res)
    if not subs:
        return results
    reference = {"answers": {q: [c["source"] for c in cells if c["kind"] == "answer" and c["question"] == q]
                             for q in order}, "extras": {q: [] for q in order}}
    # one run per distinct (added cells up to q, answer to q): the same code forked from the same state scores
    # the same, so an unanswered question or an untouched reference runs once for the whole class
    variants: dict[str, list[dict]] = {q: [] for q in order}
    variant_of: list[dict[str, int]] = []
    for sub in [reference] + subs:  # variant 0 of each question: the reference answer (times the limit)
        picks = {}
        for k, q in enumerate(order):
            v = {"extras": [src for p in order[:k + 1] for src in sub["extras"][p]], "answers": sub["answers"][q]}
            if v not in variants[q]:
                variants[q].append(v)
            picks[q] = variants[q].index(v)
        variant_of.append(picks)
    rebinds = {q: sorted(_assigned([c["source"] for c in cells if c["kind"] == "answer" and c["question"] == q]))
               for q in order}
    with tempfile.TemporaryDirectory(prefix="kvlab-grade-") as tmp:
        tmp = pathlib.Path(tmp)
        job = {"cells": cells, "tests": tests, "variants": variants, "jobs": jobs, "timeout": timeout, "memory": memory,
               "results": str(tmp), "order": order, "parameters": sorted(parameters), "rebinds": rebinds,
               "answer_start": {q: min(i for i, c in enumerate(cells) if c["kind"] == "answer" and c["question"] == q)
                                + 1 for q in order},
               "check_index": {q: next(i for i, c in enumerate(cells) if c["kind"] == "check" and c["question"] == q)
                               for q in order}}
        # the child skips the master's answer cells of q (the student's replace them) and runs the given ones
        (tmp / "job.json").write_text(json.dumps(job))
        env = dict(os.environ, TOKENIZERS_PARALLELISM="false", MPLBACKEND="Agg")
        done = subprocess.run([sys.executable, "-c", "import sys; from kvlab.grading import _zygote; _zygote(sys.argv[1])",
                               str(tmp / "job.json")], cwd=str(solutions.parent), env=env, stdin=subprocess.DEVNULL,
                              capture_output=True, text=True)
        zygote = tmp / "zygote.json"
        died = None
        if done.returncode != 0 or not zygote.exists():
            died = f"the grading process ended early (exit {done.returncode}): {done.stderr.strip()[-300:]}"
        else:
            master_errors = json.loads(zygote.read_text())["errors"]
            if master_errors:
                raise RuntimeError("the master notebook's own cells raised, so nothing can be graded against it:\n"
                                   + "\n".join(master_errors))
        for q in order:
            ref = tmp / f"0.{q}.json"
            if died is None and ref.exists():
                got = json.loads(ref.read_text()).get("result") or {}
                if not got or not all(c["passed"] for c in got.get("cases", [])) or len(got["cases"]) != len(
                        tests[q]["cases"]):
                    raise RuntimeError(f"the reference answer of {q} does not pass its own tests in the grading child "
                                       f"({got or json.loads(ref.read_text())}): fix the master or raise the memory "
                                       f"limit")
        for i, res in enumerate(gradable):
            for q in order:
                qr = res.questions[q]
                v = variant_of[i + 1][q]
                path = tmp / f"{v}.{q}.json"
                outcome = json.loads(path.read_text()) if path.exists() else {}
                cases = tests[q]["cases"]
                if "result" in outcome:
                    data = outcome["result"]
                    by_name = {c["name"]: c for c in data["cases"]}
                    qr.errors = [str(e)[:300] for e in data["errors"]]
                    res.flags.extend(f"{q}: {str(f)[:300]}" for f in data["flags"])
                else:
                    by_name = {}
                    reason = outcome.get("status") or died or f"the run of {q} left no result"
                    qr.errors = [reason]
                    res.flags.append(f"{q}: {reason}")
                for case in cases:
                    got = by_name.get(case["name"])
                    if got is None:
                        qr.cases.append(CaseResult(case["name"], case["hidden"], case["points"], False,
                                                   "not run (the question's run ended early)"))
                    else:
                        qr.cases.append(CaseResult(case["name"], case["hidden"], case["points"],
                                                   got.get("passed") is True, str(got.get("message", ""))[:500]))
                qr.score = sum(c.points for c in qr.cases if c.passed)
    return results
