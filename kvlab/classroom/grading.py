"""Grading that a submission cannot talk its way through: each question in a fresh process against the others'
reference, the student's code in a confined child that only computes, the verdict in a judge that never runs it.

``otter run`` executes a submission and then the tests in the student's own kernel, after the student's
code: a cell that replaces otter's doctest runner, a builtin the tests use or a ``grader.check`` cell
decides its own grade. Here the student's notebook is only a source of answer cells:

1. **The master is rebuilt, not the submission run.** The graded program is the instructor's solutions
   notebook (from ``otter assign``) cell by cell; the submission contributes only its answer cells (tagged
   ``otter_answer_cell`` by otter, matched to the master's by order) and the code cells the student added.
   The parameters, the set-up, the ``grader.check`` cells and the tests are the master's: editing,
   skipping or deleting them in the submission changes nothing, and tests in the notebook's metadata are
   never read (the tests come from the autograder zip).
2. **Each question on its own, the student's code in a child, the verdict in a judge.** A *zygote* process
   runs the master's cells (the reference answers included; it never reads a test); just before question q's
   answer it forks, per distinct answer (identical code forked from the same state scores the same), a
   confined *child* and a *judge* joined by a socket. The child runs the student's added cells, the
   student's answer to q and the master's cells up to q's check, then only answers the judge. The judge reads
   q's tests (public and hidden) from a memory file of the grading process and runs them; where a test calls a
   function or reads a value of the student's, it asks the child, sending the inputs and getting back plain
   data (:func:`_encode`: exact ``int``/``float``/``str``, lists, dicts, tensors converted with
   ``.as_subclass(torch.Tensor)`` and sent as dtype, shape and bytes; a subclass of a plain type comes back
   as a marker that equals nothing). The assertions and the score are computed in the judge, which never runs
   student code; nothing a student does for q reaches another question, the zygote or the grading process.
   Before its first student cell the child empties the zygote's plan in place (:func:`_forget`): no other
   question's reference answer, no classmate's code and no test is in its memory.
3. **What a student cell changed is put back and flagged.** The child copies the namespace of every loaded
   module and Python class and the builtins before each student cell, puts back what was replaced
   (``torch.allclose``, a kvlab function, ``builtins.abs``) and reports it; names the master defined are put
   back when a student cell rebinds them. The judge turns the child's report into flags, taking only names
   from it (never text the student's code chose).
4. **Flags for manual review.** A static scan of the student's cells flags the usual routes around
   the above (imports of otter, ``builtins``, ``gc``, ``inspect``, ``ctypes``...; ``exec``/``eval``;
   ``setattr``/attribute assignment on imported modules; ``__eq__`` overrides; ``os._exit``;
   assignments to parameters). A flag does not change the score: it puts the row up for review.

5. **The child is sandboxed** (:class:`_Sandbox`, :func:`_enter`, :func:`_confine`): bubblewrap makes, per child,
   new pid, network, IPC and UTS namespaces and a filesystem of read-only binds (the system, the Python
   installation, the project, the model cache) with private size-capped tmpfs for ``/tmp``, ``/dev/shm`` and the
   working folder; the child, forked from the zygote, joins them with ``setns`` and forks once more into the
   sandbox's pid namespace (it sees and can signal only its own sandbox). Then: its own session, stdout/stderr
   on ``/dev/null``, every descriptor closed but its socket to the judge, a cleared environment, rlimits on
   CPU time, address space and core files, as root the user ``nobody``, no capability, and a seccomp filter
   that kills it when it starts a process or makes a system call of another ABI (i386, x32); threads run. The
   zygote runs under ``python -I`` with a cleared environment. Where bubblewrap cannot run, grading refuses
   unless ``trust_submissions``. Errors are reported by type and line, never with the student's text.
6. **Time limits from the reference**: each question's reference answer runs first in a child and judge like
   the students', and a student's run may take ``SLOWDOWN`` times as long (at least ``MIN_LIMIT`` s) unless
   ``timeout`` is given; a run whose child and judge both sleep is stopped once the student's ``IDLE_BUDGET``
   is spent, and a student whose runs take far more CPU time than the reference's is flagged slow.
7. **Hidden inputs from a secret**: the judge gives the tests ``HIDDEN_SEED`` (the instructor's seed, see
   :func:`grade_submissions`); hidden tests draw their random inputs from it. The tests and the seed reach the
   judges in a memory file; no child can see them, nor the grader's command line or environment.
8. **Nothing comes back but plain data and fixed words**: the judge's inputs are copied per call (what the
   student's code does to its arguments stays in the child), a message over ``MAX_MESSAGE`` scores the
   question 0, the judge has a memory limit, outcomes reach the grader over a pipe (never a file a child could
   write), and every message is escaped (:func:`clean`) and capped.

Not protected: what the child sends back is what the student's code computed, so a test checks values, not
how they were found (kvlab's own implementation imported and called gets the points; the scan flags the
import). The child's heap may still hold freed bytes of what it emptied (reachable with ``ctypes``, which
the scan flags). See docs/guide/classroom.md.

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
    seconds: float = 0.0  # wall time of its run (child and judge), a slot of --jobs held that long
    cpu: float = 0.0  # CPU time of its run (child and judge)


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
                "signal", "atexit", "unittest", "doctest", "pytest", "kvlab.classroom.grading", "kvlab.classroom.lessons", "sys",
                "threading", "multiprocessing", "_thread", "pickle", "dill", "marshal", "types", "os", "shutil",
                "pathlib", "tempfile", "socket", "io"}
_BAD_NAMES = {"__builtins__", "__import__", "exec", "eval", "compile", "globals", "setattr", "delattr",
              "breakpoint", "__loader__", "__spec__", "open", "vars", "locals", "exit", "quit"}
_BAD_ATTRS = {"_exit", "_getframe", "settrace", "setprofile", "f_back", "f_globals", "f_locals", "__code__",
              "__globals__", "__subclasses__", "__builtins__", "kill", "fork", "execv", "system",
              "__dict__", "__closure__", "gi_frame", "tb_frame", "argv", "environ", "__setattr__",
              # names reachable from allowed modules (random._os, operator.attrgetter("kill"), a module's time)
              "_os", "attrgetter", "methodcaller", "import_module", "sleep", "_posixsubprocess", "posix"}
_COMPARISON_DUNDERS = {"__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__bool__",
                       "__instancecheck__", "__subclasshook__", "__hash__", "__float__", "__index__",
                       "__getattr__", "__getattribute__"}


SAFE_MODULES = {"math", "typing", "collections", "itertools", "functools", "dataclasses", "heapq", "bisect",
                "torch", "numpy", "random", "statistics", "operator", "enum", "__future__"}
_ALLOWED_DUNDERS = {"__init__", "__post_init__", "__repr__", "__str__", "__len__", "__iter__", "__slots__",
                    "__doc__", "__module__", "__qualname__", "__annotations__"}


def _scan_call(node: ast.Call) -> list[str]:
    """``getattr``/``hasattr``/``setattr``/``delattr`` with a computed or a dunder name."""
    if not (isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr", "setattr", "delattr")
            and len(node.args) >= 2):
        return []
    name = node.args[1]
    if not (isinstance(name, ast.Constant) and isinstance(name.value, str)):
        return [f"uses {node.func.id} with a computed attribute name"]
    if name.value.startswith("__") or name.value in _BAD_ATTRS:
        return [f"uses {node.func.id}(..., {name.value!r})"]
    return []


def _scan_class(node: ast.ClassDef) -> list[str]:
    """Dunders in a class body (other than the harmless ones) and subclasses of plain types."""
    found = []
    for item in node.body:
        names = []
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names = [item.name]
        elif isinstance(item, (ast.Assign, ast.AnnAssign)):
            targets = item.targets if isinstance(item, ast.Assign) else [item.target]
            names = [t.id for t in targets if isinstance(t, ast.Name)]
        found += [f"defines {n} in the class {node.name} (changes how its values compare, convert or dispatch)"
                  for n in names if n.startswith("__") and n.endswith("__") and n not in _ALLOWED_DUNDERS]
    for base in node.bases:
        b = _name(ast.unparse(base), "a base")
        if b.split(".")[-1] in ("float", "int", "list", "tuple", "dict", "str", "bool", "Tensor"):
            found.append(f"subclasses {b} (an answer must be the plain type)")
    return found


def _scan_allowed(node: ast.Import | ast.ImportFrom, allowed_imports: set[str]) -> list[str]:
    """Imports outside the master's modules and the allowlist, and kvlab names the master does not import."""
    mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
    found = []
    for m in mods:
        top = m.split(".")[0]
        if top == "kvlab" and isinstance(node, ast.ImportFrom):
            found += [f"imports {a.name} from {m}, which the assignment does not use (is it the class the question "
                      f"asks you to write?)" for a in node.names if f"kvlab:{a.name}" not in allowed_imports]
        elif top not in allowed_imports and top not in SAFE_MODULES and top != "kvlab":
            found.append(f"imports {m}, outside the modules the assignment uses")
    return found


def _scan_more(tree: ast.AST, allowed_imports: set[str] | None) -> list[str]:
    """Computed attribute names, dunders in class bodies, imports outside the allowlist (``allowed_imports``:
    modules and ``kvlab`` names the master itself imports; None skips that check)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            found += _scan_call(node)
        elif isinstance(node, ast.ClassDef):
            found += _scan_class(node)
        elif allowed_imports is not None and isinstance(node, (ast.Import, ast.ImportFrom)):
            found += _scan_allowed(node, allowed_imports)
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


def _scan_imports(tree: ast.AST, aliases: set[str]) -> list[str]:
    """Imports of blocked modules or names; adds every imported name to ``aliases``."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
        aliases.update((a.asname or a.name).split(".")[0] for a in node.names)
        for m in mods:
            if m in _BAD_MODULES or m.split(".")[0] in _BAD_MODULES - {"kvlab"}:
                found.append(f"imports {m}")
            if isinstance(node, ast.ImportFrom) and any(a.name in _BAD_NAMES or a.name in _BAD_ATTRS
                                                        for a in node.names):
                found.append(f"imports {', '.join(a.name for a in node.names)} from {m}")
    return found


def _scan_assign(node: ast.AST, aliases: set[str]) -> list[str]:
    """An assignment to an attribute of an imported module or class (monkeypatching)."""
    targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
    found = []
    for t in targets:
        for sub in ast.walk(t):
            if isinstance(sub, ast.Attribute):
                root = sub
                while isinstance(root, ast.Attribute):
                    root = root.value
                if isinstance(root, ast.Name) and root.id in aliases:
                    found.append(f"assigns {_name(ast.unparse(sub), 'an attribute')} (monkeypatching {root.id})")
    return found


def _scan_nodes(tree: ast.AST, aliases: set[str]) -> list[str]:
    """Blocked names and attributes, comparison dunders, monkeypatching."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in _BAD_NAMES:
            found.append(f"uses {node.id}")
        elif isinstance(node, ast.Attribute) and node.attr in _BAD_ATTRS:
            found.append(f"uses .{node.attr}")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in _COMPARISON_DUNDERS:
            found.append(f"defines {node.name} (an answer that compares equal to anything?)")
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            found += _scan_assign(node, aliases)
    return found


def _scan_top(tree: ast.Module, parameters: set[str]) -> list[str]:
    """Top-level rebinding of a parameter or a builtin (a local variable of the same name is harmless)."""
    found = []
    for node in tree.body:
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
    return found


def scan(source: str, label: str, parameters: set[str] = frozenset(), imported: set[str] = frozenset(),
         allowed_imports: set[str] | None = None) -> list[str]:
    """Reasons to look at a student's cell by hand (empty for ordinary code). ``imported``: names bound to
    modules or classes elsewhere in the notebook (assigning an attribute of one is monkeypatching);
    ``allowed_imports``: see :func:`allowed_imports` (None: imports are checked against the block list only)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []  # it fails when run, and scores what it scores
    aliases = set(imported)
    found = _scan_imports(tree, aliases)
    found += _scan_nodes(tree, aliases)
    found += _scan_top(tree, parameters)
    found += _scan_more(tree, allowed_imports)
    return [f"{label}: {f}" for f in dict.fromkeys(found)]


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

MAX_SUBMISSION = 32 << 20  # bytes of one submission file (a notebook, or the export zip)
MAX_NOTEBOOK = 32 << 20  # bytes of the notebook inside an export zip, as declared and as read
MAX_ZIP_ENTRIES = 64  # files an export zip may hold


class SubmissionRefused(ValueError):
    """A submission refused before it is parsed (too large, a zip that declares too much, not a file): the
    message is the grader's own words."""


def _read_bounded(path: pathlib.Path, limit: int) -> bytes:
    """The bytes of the regular file ``path`` (a link is not followed), refused over ``limit`` before reading."""
    import stat

    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise SubmissionRefused(f"the file could not be opened ({_word(type(exc).__name__)})") from None
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise SubmissionRefused("not a regular file")
        if info.st_size > limit:
            raise SubmissionRefused(f"{info.st_size >> 20} MiB, over the {limit >> 20} MiB a submission may be")
        data = f.read(limit + 1)
    if len(data) > limit:
        raise SubmissionRefused(f"over the {limit >> 20} MiB a submission may be")
    return data


def _notebook_in_zip(data: bytes) -> bytes:
    """The one notebook of an export zip, its declared size checked before a byte of it is inflated and the
    inflated bytes capped (a zip's header may lie)."""
    try:
        z = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, ValueError):
        raise SubmissionRefused("not a zip file") from None
    with z:
        infos = z.infolist()
        if len(infos) > MAX_ZIP_ENTRIES:
            raise SubmissionRefused(f"the zip holds {len(infos)} files (at most {MAX_ZIP_ENTRIES})")
        notebooks = [i for i in infos if i.filename.endswith(".ipynb") and not i.filename.startswith("__MACOSX")]
        if len(notebooks) != 1:
            raise SubmissionRefused(f"expected one .ipynb in the zip, found {len(notebooks)}")
        info = notebooks[0]
        if info.file_size > MAX_NOTEBOOK:
            raise SubmissionRefused(f"the zip's notebook declares {info.file_size >> 20} MiB, over the "
                                    f"{MAX_NOTEBOOK >> 20} MiB a notebook may be (refused before reading)")
        try:
            with z.open(info) as f:
                raw = f.read(MAX_NOTEBOOK + 1)
        except (zipfile.BadZipFile, NotImplementedError, RuntimeError, ValueError, OSError, EOFError):
            raise SubmissionRefused("the zip's notebook could not be read") from None
        if len(raw) > MAX_NOTEBOOK:
            raise SubmissionRefused(f"the zip's notebook is over {MAX_NOTEBOOK >> 20} MiB")
        return raw


def read_submission(path: pathlib.Path):
    """The notebook of a submission: an ``.ipynb``, or the zip that ``grader.export()`` wrote (one notebook).
    Every read is bounded: the file by :data:`MAX_SUBMISSION` before it is read, a zip's notebook by its declared
    size (:data:`MAX_NOTEBOOK`) before it is inflated; raises :class:`SubmissionRefused` otherwise."""
    import nbformat

    path = pathlib.Path(path)
    data = _read_bounded(path, MAX_SUBMISSION)
    if path.suffix == ".zip":
        data = _notebook_in_zip(data)
    try:
        text = data.decode()
    except UnicodeDecodeError:
        raise SubmissionRefused("the notebook is not UTF-8 text") from None
    return nbformat.reads(text, as_version=4)


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


# ------------------------------------------------------------------------------------------ what a cell changed

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
            if isinstance(exc, StudentCodeRaised):
                return False, f"{exc} raised in your code"
            if isinstance(exc, (NotSendable, ConnectionError)):
                return False, str(exc)[:300]
            raised_by_test = tb is not None and tb.tb_frame.f_code.co_filename == name
            text = str(exc).strip() if raised_by_test and isinstance(exc, AssertionError) else ""
            # the test's own assertion message is the instructor's hint; anything raised inside the student's code
            # is reported by its type only (its text is the student's, and could carry a file it read)
            kind = _word(type(exc).__name__, "an error")
            return False, f"{kind}: {text}" if text else (kind + ("" if raised_by_test else " raised in your code"))
        finally:
            sys.stdout = old
        if want and not checker.check_output(want, out.getvalue(), 0):
            return False, f"the check printed something else than the expected {want.strip()[:80]!r}"
    return True, ""


# ------------------------------------------------------------------------------------------ plain data

_IDENT = __import__("re").compile(r"[A-Za-z_][A-Za-z0-9_.]{0,120}")
MAX_MESSAGE = 8 << 20  # bytes one message between a child and its judge may hold (over it: the question scores 0)


# the only names of exceptions a judge writes: Python's own (a student's exception class is reported as "an
# exception", whatever its name: a name is text the student chose, and could carry what the child found)
EXCEPTION_WORDS = frozenset(n for n, v in vars(builtins).items() if isinstance(v, type)
                            and issubclass(v, BaseException)) | {"NotSendable", "MessageTooLarge"}


def _word(value, default: str = "an error") -> str:
    """``value`` when it is one of :data:`EXCEPTION_WORDS`, else ``default``."""
    return value if type(value) is str and value in EXCEPTION_WORDS else default


def _name(value, default: str = "object") -> str:
    """A name taken from the child (a type's, an exception's): kept only when it is an identifier."""
    value = str(value)[:80]
    return value if _IDENT.fullmatch(value) else default


class NotSendable(TypeError):
    """A value the test passes to the student's code that is not plain data (numbers, strings, lists, tensors)."""


def _encode(value, handles: dict | None = None, names: dict | None = None, depth: int = 0):
    """``value`` as JSON-able plain data: exact ``int``/``float``/``bool``/``str``/``None``, lists, tuples, dicts,
    sets, tensors (``.as_subclass(torch.Tensor)``: dtype, shape, bytes) and numpy arrays. On the child's side
    (``handles`` given) anything else (a function, a class, an instance) becomes a handle the judge can call; a
    subclass of a plain type becomes a marker that equals nothing. On the judge's side (``names``: id -> name of
    the master's values) a master object is sent by name, a handle as itself, anything else raises NotSendable."""
    if depth > 50:
        raise NotSendable("nested too deeply")
    t = type(value)
    if value is None or t in (bool, int, str):
        return value
    if t is float:
        return {"F": repr(value)}  # nan, inf and -0.0 survive
    if t in (list, tuple, set, frozenset, dict):
        return _encode_container(value, handles, names, depth)
    if t is _Remote:
        return {"H": object.__getattribute__(value, "_h")}
    got = _encode_array(value)
    if got is not None:
        return got
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(value, numpy.generic) and t.__module__ == "numpy":
        return _encode(value.item(), handles, names, depth)
    if handles is not None:
        return _handle(value, handles)
    return _encode_master(value, names, depth)


def _encode_container(value, handles, names, depth: int):
    t = type(value)
    if t is dict:
        return {"D": [[_encode(k, handles, names, depth + 1), _encode(v, handles, names, depth + 1)]
                      for k, v in value.items()]}
    items = sorted(value, key=repr) if t in (set, frozenset) else value
    return {{list: "L", tuple: "T", set: "S", frozenset: "S"}[t]: [_encode(v, handles, names, depth + 1) for v in items]}


def _encode_array(value):
    """A tensor, a torch Size or dtype, or a numeric numpy array as plain data (None: none of those)."""
    import base64

    t = type(value)
    torch = sys.modules.get("torch")
    numpy = sys.modules.get("numpy")
    if torch is not None and isinstance(value, torch.Tensor):
        plain = value.as_subclass(torch.Tensor) if t is not torch.Tensor else value
        plain = plain.detach().cpu().contiguous()
        out = {"X": str(plain.dtype).replace("torch.", ""), "shape": list(plain.shape),
               "b": base64.b64encode(plain.reshape(-1).view(torch.uint8).numpy().tobytes()).decode()
               if plain.numel() else ""}
        if t is not torch.Tensor and t.__name__ != "Parameter":
            out["sub"] = 1  # never its name: a name the child chose is text the child chose
        return out
    if torch is not None and t is torch.Size:
        return {"Z": [int(v) for v in value]}
    if torch is not None and t is torch.dtype:
        return {"dtype": str(value).replace("torch.", "")}
    if numpy is not None and t is numpy.ndarray and value.dtype.kind in "biuf":
        return {"N": value.dtype.str, "shape": list(value.shape),
                "b": base64.b64encode(numpy.ascontiguousarray(value).tobytes()).decode()}
    return None


def _handle(value, handles: dict) -> dict:
    """The child's side: a subclass of a plain type is not that type; anything else becomes a handle."""
    for base in (bool, int, float, str, list, tuple, dict, set):
        if isinstance(value, base):
            return {"bad": 1, "base": base.__name__}
    key = len(handles) + 1
    handles[key] = value
    kind = "class" if isinstance(value, type) else "function" if callable(value) else "object"
    return {"H": key, "type": kind, "callable": callable(value)}


def _encode_master(value, names, depth: int):
    """The judge's side: a master object by name, a kvlab record field by field; anything else is refused."""
    t = type(value)
    if names is not None and id(value) in names:
        return {"G": names[id(value)]}
    if names is not None and _kvlab_record(t):  # a value object of kvlab's (a LayerView): sent field by field
        import dataclasses

        return {"O": [t.__module__, t.__qualname__], "f": {f.name: _encode(getattr(value, f.name), None, names,
                                                                          depth + 1) for f in dataclasses.fields(value)}}
    raise NotSendable(f"the test passed a {t.__name__} to your code, which the judge sends only as plain data")


def _kvlab_record(cls) -> bool:
    """A dataclass defined in kvlab (not in a notebook): the judge may send it, and the child rebuild it, by value."""
    import dataclasses

    return isinstance(cls, type) and dataclasses.is_dataclass(cls) and str(cls.__module__).startswith("kvlab.")


class Unconvertible:
    """What the judge gets for an answer that is not plain data (a subclass of float, list...): equals nothing."""

    def __init__(self, what: str):
        self.what = what

    def __eq__(self, other):
        return False

    __hash__ = object.__hash__

    def __repr__(self):
        return f"<{self.what}>"


def _decode(data, remote=None, depth: int = 0, found: list | None = None):
    """The inverse of :func:`_encode` on the judge's side (``remote``: the channel to the child, for handles) and
    on the child's (``remote`` None: ``G`` names and handles are resolved by the caller's ``resolve``)."""
    if depth > 60:
        raise ValueError("nested too deeply")
    if data is None or type(data) in (bool, int, str):
        return data
    if type(data) is dict and len(data) >= 1:
        for key, decode in _DECODERS:
            if key in data:
                return decode(data, remote, depth, found)
    raise ValueError("not plain data")


def _decode_container(data, remote, depth, found):
    if "L" in data:
        return [_decode(v, remote, depth + 1, found) for v in data["L"]]
    if "T" in data:
        return tuple(_decode(v, remote, depth + 1, found) for v in data["T"])
    if "S" in data:
        return set(_decode(v, remote, depth + 1, found) for v in data["S"])
    return {_decode(k, remote, depth + 1, found): _decode(v, remote, depth + 1, found) for k, v in data["D"]}


def _torch_dtype(name):
    import torch

    dtype = getattr(torch, str(name))
    if not isinstance(dtype, torch.dtype):
        raise ValueError("not a dtype")
    return dtype


def _decode_tensor(data, remote, depth, found):
    import base64

    import torch

    dtype = _torch_dtype(data["X"])
    raw = bytearray(base64.b64decode(data["b"]))
    flat = torch.frombuffer(raw, dtype=torch.uint8).view(dtype) if raw else torch.empty(0, dtype=dtype)
    if "sub" in data and found is not None:
        found.append("returned a tensor of a subclass (compared as a plain tensor)")
    return flat.reshape([int(s) for s in data["shape"]]).clone()


def _decode_numpy(data, remote, depth, found):
    import base64

    import numpy

    return numpy.frombuffer(base64.b64decode(data["b"]), dtype=numpy.dtype(str(data["N"]))).reshape(
        [int(s) for s in data["shape"]]).copy()


def _decode_size(data, remote, depth, found):
    import torch

    return torch.Size([int(v) for v in data["Z"]])


def _decode_bad(data, remote, depth, found):
    base = str(data.get("base", ""))
    what = f"a subclass of {base}" if base in _PLAIN else "a subclass of a plain type"
    if found is not None:
        found.append(f"returned {what} (not the plain type: it equals nothing)")
    return Unconvertible(what)


def _decode_handle(data, remote, depth, found):
    if remote is None:
        return data  # the child resolves a handle itself
    kind = data.get("type") if data.get("type") in ("class", "function", "object") else "object"
    return _Remote(remote, int(data["H"]), kind, bool(data.get("callable")))


def _decode_record(data, remote, depth, found):
    if remote is not None:
        raise ValueError("not plain data")
    module, qualname = (str(v) for v in data["O"])  # the child: a kvlab value object the judge sent
    cls = getattr(sys.modules.get(module), qualname, None)
    if not _kvlab_record(cls):
        raise ValueError("not a kvlab record")
    obj = object.__new__(cls)
    for key, v in data["f"].items():
        object.__setattr__(obj, str(key), _decode(v, None, depth + 1, found))
    return obj


def _decode_name(data, remote, depth, found):
    if remote is not None:
        raise ValueError("not plain data")
    return data  # the child resolves a master name itself


_DECODERS = (("F", lambda d, r, depth, f: float(d["F"])), ("L", _decode_container), ("T", _decode_container),
             ("S", _decode_container), ("D", _decode_container), ("Z", _decode_size), ("X", _decode_tensor),
             ("N", _decode_numpy), ("dtype", lambda d, r, depth, f: _torch_dtype(d["dtype"])), ("bad", _decode_bad),
             ("H", _decode_handle), ("O", _decode_record), ("G", _decode_name))


_PLAIN = ("bool", "int", "float", "str", "list", "tuple", "dict", "set")


class MessageTooLarge(ConnectionError):
    """The child sent the judge a message over :data:`MAX_MESSAGE`: the question scores 0, flagged."""


class StudentCodeRaised(Exception):
    """Raised in the judge when the student's code, called by a test in the child, raised."""


class _Channel:
    """The judge's end of the socket to its child: one request, one answer, length-prefixed JSON."""

    def __init__(self, sock):
        self.sock = sock
        self.found: list[str] = []
        self.broken = False
        self.oversize = False
        self.names: dict = {}

    def send(self, message: dict) -> None:
        data = json.dumps(message).encode()
        self.sock.sendall(len(data).to_bytes(8, "big") + data)

    def receive(self) -> dict:
        head = self._exactly(8)
        size = int.from_bytes(head, "big")
        if size > MAX_MESSAGE:
            self.oversize = True
            self.broken = True
            raise MessageTooLarge(f"the answer of your code's process is over {MAX_MESSAGE >> 20} MiB")
        message = json.loads(self._exactly(size).decode())
        if type(message) is not dict:
            raise ConnectionError("not an answer")
        return message

    def _exactly(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(min(n - len(buf), 1 << 20))
            if not chunk:
                self.broken = True
                raise ConnectionError("your code's process ended before the tests finished")
            buf += chunk
        return bytes(buf)

    def ask(self, message: dict):
        self.send(message)
        answer = self.receive()
        if "raised" in answer:
            raise StudentCodeRaised(_word(answer["raised"], "an exception"))
        # what the student's code did to its arguments stays in the child: the judge's objects, the test's inputs
        # and its expected values are never written from an answer
        return _decode(answer.get("ok"), self, found=self.found)


class _Remote:
    """In the judge, a function, class or object that lives in the child: calling it, reading an attribute or an
    item, iterating or taking ``len`` asks the child, which runs the student's code and answers plain data."""

    def __init__(self, channel: _Channel, handle: int, kind: str, is_callable: bool):
        object.__setattr__(self, "_c", channel)
        object.__setattr__(self, "_h", handle)
        object.__setattr__(self, "_kind", kind)

    def _ask(self, op: str, **extra):
        return object.__getattribute__(self, "_c").ask({"op": op, "h": object.__getattribute__(self, "_h"), **extra})

    def __call__(self, *args, **kwargs):
        channel = object.__getattribute__(self, "_c")
        names = channel.names
        sent = [_encode(a, names=names) for a in args]  # a copy per call: the child gets its own objects
        kw = {str(k): _encode(v, names=names) for k, v in kwargs.items()}
        return self._ask("call", args=sent, kwargs=kw)

    def __getattr__(self, name):
        return self._ask("getattr", name=str(name))

    def __getitem__(self, key):
        return self._ask("getitem", key=_encode(key, names=object.__getattribute__(self, "_c").names))

    def __len__(self):
        return int(self._ask("len"))

    def __iter__(self):
        return iter(self._ask("list"))

    def __repr__(self):
        return f"<your {object.__getattribute__(self, '_kind')}>"

    __str__ = __repr__


# ------------------------------------------------------------------------------------------ the child's side

def _serve(sock, ns: dict, handles: dict, write) -> None:
    """In the child, after its cells ran: answer the judge's requests (call a function of the student's, read an
    attribute, an item, a length) with plain data until the judge closes the socket."""

    def receive():
        head = b""
        while len(head) < 8:
            chunk = sock.recv(8 - len(head))
            if not chunk:
                return None
            head += chunk
        size = int.from_bytes(head, "big")
        buf = bytearray()
        while len(buf) < size:
            chunk = sock.recv(min(size - len(buf), 1 << 20))
            if not chunk:
                return None
            buf += chunk
        return json.loads(buf.decode())

    def resolve(v):
        if type(v) is dict and "G" in v:
            return ns[v["G"]]
        if type(v) is dict and "H" in v:
            return handles[int(v["H"])]
        if type(v) is list:
            return [resolve(x) for x in v]
        if type(v) is tuple:
            return tuple(resolve(x) for x in v)
        if type(v) is dict:
            return {resolve(k): resolve(x) for k, x in v.items()}
        return v

    def arg(data):
        if type(data) is dict and ("G" in data or "H" in data):
            return resolve(data)
        return resolve(_decode(data))

    while True:
        request = receive()
        if request is None:
            return
        try:
            op = request["op"]
            target = handles[int(request["h"])]
            answer = {}
            if op == "call":
                args = [arg(a) for a in request["args"]]
                kwargs = {k: arg(v) for k, v in request["kwargs"].items()}
                result = target(*args, **kwargs)
                answer["ok"] = _encode(result, handles)
            elif op == "getattr":
                answer["ok"] = _encode(getattr(target, request["name"]), handles)
            elif op == "getitem":
                answer["ok"] = _encode(target[arg(request["key"])], handles)
            elif op == "len":
                answer["ok"] = int(len(target))
            elif op == "list":
                answer["ok"] = _encode(list(target), handles)
            else:
                answer = {"raised": "ValueError"}
        except BaseException as exc:  # noqa: BLE001 - the student's code raised: its type goes back, never its text
            answer = {"raised": type(exc).__name__}
        write(answer)


def _child(job: dict, sub: dict, q: str, ns: dict, pristine: dict, sock) -> None:
    """Run in the forked, confined child: the student's cells for question ``q`` (``sub``: the added cells up to q
    and the answer cells of q) and the master's cells up to q's check; then send the judge what it asked for (the
    names q's tests read: plain data, or a handle for a function or an object) and answer its calls until it is
    done. The child never sees a test. Never returns."""
    dumps, leftovers, encode, serve, exit_ = json.dumps, _leftover_flags, _encode, _serve, os._exit  # kept
    handles: dict = {}

    def write(message):
        data = dumps(message).encode()
        sock.sendall(len(data).to_bytes(8, "big") + data)

    try:
        torch = sys.modules.get("torch")
        if torch is not None:
            torch.set_num_threads(1)  # the zygote may have used OpenMP threads: not safe to reuse after fork
        flags, errors, master_bound = _run_cells(job, sub, q, ns)
        flags.extend(leftovers(ns, pristine, master_bound))
        names = {}
        for name in job["remote"][q]:
            if name in ns:
                try:
                    names[name] = encode(ns[name], handles)
                except BaseException:  # noqa: BLE001 - a value that cannot be sent is missing
                    pass
        write({"names": names, "errors": errors, "flags": flags})
        serve(sock, ns, handles, write)
    finally:
        exit_(0)


def _run_cells(job: dict, sub: dict, q: str, ns: dict) -> tuple[list, list, set]:
    """In the child: the student's cells then the master's up to q's check, each student cell's changes to the
    loaded modules, classes and the master's names put back and reported. Returns the flags, the errors (label,
    type, line) and the names the master's cells bound."""
    snapshot, restore, protected, line_of = _snapshot, _restore, _protected, _error_line  # before student code
    flags, errors = [], []
    parameters = set(job["parameters"])
    allowed = set(job["rebinds"][q])
    master_bound = set(ns)
    guarded = {k: v for k, v in ns.items() if protected(k, v, parameters)}
    cells = [("your added cell", s, True) for s in sub["extras"]]
    cells += [(f"your answer to {q}", s, True) for s in sub["answers"]]
    cells += [("the assignment's cell", source, False) for source in job["given"]]
    for label, source, student in cells:
        before = snapshot() if student else dict(ns)
        try:
            exec(compile(source, f"<{label}>", "exec"), ns)
        except BaseException as exc:  # noqa: BLE001 - errors are allowed: the tests decide
            if student:
                errors.append([label, type(exc).__name__, line_of(exc, label)])
        if student:
            flags.extend(["replaced", label, name] for name in restore(before))
            for name, value in guarded.items():
                if ns.get(name, _MISSING) is not value and name not in allowed:
                    flags.append(["rebinds", label, name])
                    ns[name] = value
        else:
            master_bound.update(ns)
            guarded.update({k: v for k, v in ns.items() if before.get(k, _MISSING) is not v
                            and protected(k, v, parameters)})
    return flags, errors, master_bound


def _error_line(exc: BaseException, label: str) -> int | None:
    """The last line of the student's cell ``label`` in ``exc``'s traceback."""
    tb, line = exc.__traceback__, None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == f"<{label}>":
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


def _leftover_flags(ns: dict, pristine: dict, master_bound: set) -> list[list]:
    """Builtins the student's names shadow, and builtins replaced, after every cell ran."""
    flags = []
    shadowed = sorted(k for k in ns if k in pristine and ns[k] is not pristine[k] and not k.startswith("__")
                      and k not in master_bound)
    if shadowed:
        flags.append(["shadowed", "", ", ".join(shadowed)])
    changed = [k for k, v in pristine.items() if builtins.__dict__.get(k, _MISSING) is not v]
    if changed:
        flags.append(["builtins", "", ", ".join(sorted(changed))])
    return flags


# ------------------------------------------------------------------------------------------ the judge

def _known_attribute(name: str) -> str | None:
    """``name`` (``module.attr`` or ``module.Class.attr``) when the judge, forked from the same zygote, knows the
    module and the class and (``attr``) the attribute: the child reports names; only those that were there before
    any student code are written, so no text the student chose reaches a flag."""
    parts = name.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        module = sys.modules.get(".".join(parts[:cut]))
        if module is None:
            continue
        obj = module
        for part in parts[cut:-1]:
            obj = getattr(obj, "__dict__", {}).get(part, _MISSING)
            if not isinstance(obj, type):
                return None
        return name if parts[-1] in getattr(obj, "__dict__", {}) else None
    return None


def _known_class(name: str) -> str | None:
    """``name`` when it is ``module.Class`` of a class the judge knows (for "added to a class")."""
    return name if _known_attribute(name) is not None and isinstance(_resolve(name), type) else None


def _resolve(name: str):
    parts = name.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        obj = sys.modules.get(".".join(parts[:cut]))
        if obj is not None:
            for part in parts[cut:]:
                obj = getattr(obj, "__dict__", {}).get(part)
            return obj
    return None


def _child_notes(ready: dict, q: str, known: set[str] = frozenset(), pristine: dict | None = None
                 ) -> tuple[list[str], list[str]]:
    """The child's report of its own cells as text written here, every name from a fixed list: exception types
    from :data:`EXCEPTION_WORDS`, replaced names only where the judge knows them (:func:`_known_attribute`), rebound
    names only the master's (``known``), builtins only real ones (``pristine``)."""
    pristine = pristine if pristine is not None else builtins.__dict__
    labels = {"your added cell", f"your answer to {q}"}
    errors, flags = [], []
    for item in ready.get("errors", [])[:20]:
        try:
            label, kind, line = item
        except (TypeError, ValueError):
            continue
        if label in labels:
            where = f" (line {int(line)})" if type(line) is int and 0 < line < 10 ** 6 else ""
            errors.append(f"{label} raised {_word(kind, 'an exception')}{where}")
    unknown = 0
    for item in ready.get("flags", [])[:200]:
        try:
            what, label, name = (str(v) for v in item)
        except (TypeError, ValueError):
            continue
        if label and label not in labels:
            continue
        text = _flag_text(what, label, name, known, pristine)
        if text is None:
            unknown += 1
        else:
            flags.append(text)
    if unknown:
        flags.append(f"changed {unknown} more name(s) the assignment does not define (put back where they existed)")
    return errors[:20], flags[:20]


def _flag_text(what: str, label: str, name: str, known: set[str], pristine: dict) -> str | None:
    """One flag of the child's report in the grader's words, or None where a name is not on a fixed list."""
    if what == "replaced" and name.endswith(" (added)"):
        cls = _known_class(name[:-len(" (added)")].rsplit(".", 1)[0])
        return f"{label} added an attribute to {cls} (removed for the tests)" if cls else None
    if what == "replaced":
        return f"{label} replaced {name} (put back for the tests)" if _known_attribute(name) else None
    if what == "rebinds":
        return f"{label} rebinds {name}, which the assignment defines (put back)" if name in known else None
    names = [n.strip() for n in name.split(",")]
    if what in ("shadowed", "builtins") and names and all(n in pristine for n in names):
        return (f"defines {name} over the builtins (the tests used the real ones)" if what == "shadowed" else
                f"changed builtins {name} (the tests used the real ones)")
    return None


def _judge(job: dict, q: str, ns: dict, pristine: dict, sock, out_fd: int) -> None:
    """Run in a process forked from the zygote beside each child, never running student code: read q's tests
    (public and hidden) from the grading process's memory file, take the child's answers as plain data, run
    the tests here (the student's functions called through the child), write the verdict to ``out_fd``."""
    result = {"cases": [], "errors": [], "flags": []}
    try:
        torch = sys.modules.get("torch")
        if torch is not None:
            torch.set_num_threads(1)  # the zygote's OpenMP threads are not in this fork: their locks would hang it
        tests = json.loads(os.pread(job["tests_fd"], job["tests_size"], 0).decode())[q]
        compiled = [_compile_case(case) for case in tests["cases"]]
        channel = _Channel(sock)
        channel.names = {id(v): k for k, v in ns.items() if not k.startswith("__")}
        env = dict(ns)
        try:
            ready = channel.receive()
        except (ConnectionError, ValueError) as exc:
            result["ended"] = "ended" if isinstance(exc, ConnectionError) else "not an answer"
            ready = None
        if ready is not None:
            known = set(job.get("master_names", ())) | {k for k in ns if not k.startswith("__")}
            result["errors"], result["flags"] = _child_notes(ready, q, known, pristine)
            sent = ready.get("names", {}) if type(ready.get("names")) is dict else {}
            for name in job["remote"][q]:
                env.pop(name, None)  # the reference's value of a name the student's code binds is never used
                if name in sent:
                    try:
                        env[name] = _decode(sent[name], channel, found=channel.found)
                    except (ValueError, TypeError, KeyError, AttributeError):
                        channel.found.append(f"{name} is not plain data")
            env["HIDDEN_SEED"] = int(tests.get("seed", 0))
            env["__builtins__"] = pristine
            for case in compiled:
                passed, message = _run_case(case, env, pristine)
                result["cases"].append({"name": case[0], "passed": passed, "message": message[:500]})
            result["flags"].extend(sorted(set(channel.found))[:20])
            if channel.broken:
                result["ended"] = "the child's socket closed"
        if channel.oversize:
            result["oversize"] = True
        try:
            sock.close()
        except OSError:
            pass
    except BaseException as exc:  # noqa: BLE001 - reported to the zygote as the judge's own failure
        result["judge_error"] = _word(type(exc).__name__, "an error")
    data = json.dumps(result).encode()
    while data:
        data = data[os.write(out_fd, data):]
    os._exit(0)


def _zygote() -> None:
    """Run the master cell by cell; before each question's first answer cell, fork one confined child and one
    judge per distinct answer (``job["jobs"]`` pairs at a time). The job comes on stdin, the tests are in a
    memory file only the judges read (the zygote never reads a test), and every outcome goes back to the grading
    process as one JSON line on the pipe ``job["out_fd"]``: the grader reads no file a child could write."""
    job = json.loads(sys.stdin.buffer.read().decode())
    out_fd = job["out_fd"]
    pristine = dict(builtins.__dict__)
    ns: dict = {"__name__": "__main__", "__builtins__": builtins}

    class _Grader:  # a student's stray grader.check(...) does nothing here: the tests run in the judge
        def __getattr__(self, name):
            return lambda *a, **k: None

    ns["grader"] = _Grader()
    master_errors = []
    forked = set()
    state = {"idle": {}}  # seconds each student spent waiting without computing, over all questions
    job["_groups"] = _zygote_groups(job)
    try:
        for index, cell in enumerate(job["cells"]):
            q = cell["question"]
            if cell["kind"] == "answer" and q not in forked:
                forked.add(q)
                _fork_all(job, q, ns, pristine, out_fd, state)
            if cell["kind"] in ("given", "answer"):
                try:
                    exec(compile(cell["source"], f"<master cell {index}>", "exec"), ns)
                except BaseException as exc:  # noqa: BLE001 - reported to the grading process
                    master_errors.append(f"master cell {index}: {type(exc).__name__}: {exc}")
    finally:
        if job["_groups"] is not None:
            job["_groups"].close()
    _emit(out_fd, {"master_errors": master_errors})


def _zygote_groups(job: dict):
    """The zygote's folder of its children's control groups (None where the job asks for none)."""
    if not job.get("cgroups"):
        return None
    from kvlab.classroom import cgroups

    got = cgroups.probe()
    if isinstance(got, str):
        raise RuntimeError(f"no control group could be made: {got}")
    return got


def _emit(fd: int, message: dict) -> None:
    data = json.dumps(message).encode() + b"\n"
    while data:
        data = data[os.write(fd, data):]


REFERENCE_LIMIT = 600.0  # seconds the reference answer may take (it sets the students' limit)
SLOWDOWN, MIN_LIMIT = 10.0, 5.0  # a student's run of a question may take 10x the reference's, at least 5 s
IDLE_BUDGET, IDLE_FLOOR = 3.0, 0.5  # seconds a student's runs may wait without computing, over all questions
# (a run gets what is left of the budget, at least IDLE_FLOOR): sleeping holds a slot but burns no CPU time
CPU_FACTOR, CPU_MARGIN, CPU_FLOOR = 1.5, 0.25, 0.5  # a student's run of a question may use 1.5x the reference
# child's CPU time plus 0.25 s (at least 0.5 s, at most its wall limit): a busy student is cut there, not only
# flagged, so that one busy student costs a class of 8 at most ~20 % (issue 47's bound)
CPU_GRACE = 0.05  # seconds over the CPU budget before the grader kills a group (read every 20 ms)
PIDS = 64  # processes and threads one child's control group may hold (its own code fails past it, nobody else's)
SLOW_FACTOR, SLOW_MARGIN = 3.0, 2.0  # flagged slow: more CPU time than 3x the reference's, plus 2 s
MEMORY = 4 << 30  # bytes a child may map beyond what the zygote had mapped
JUDGE_MEMORY = 2 << 30  # bytes a judge may map beyond what the zygote had mapped
SCRATCH = 64 << 20  # bytes of each private tmpfs of a child's sandbox (/tmp, /dev/shm, its working folder)
WORKDIR = "/home/student"  # the child's working folder inside its sandbox
NOBODY = 65534  # the unprivileged user a child runs as when the grader is root
MAX_FLAGS = 40  # reasons to review kept per submission (the rest are counted)


# ------------------------------------------------------------------------------------------ the sandbox

def _project() -> pathlib.Path:
    """The folder holding the ``kvlab`` package this grader runs from (the project, or site-packages)."""
    import kvlab

    return pathlib.Path(kvlab.__file__).resolve().parent.parent


class SandboxUnavailable(RuntimeError):
    """bubblewrap cannot start a sandbox here: untrusted submissions are not graded (see the message)."""


def sandbox_spec(hide: list[pathlib.Path] = ()) -> dict:
    """What a child's bubblewrap sandbox holds: read-only the system's libraries, the Python installation, the
    project and kvlab's model cache; private size-capped tmpfs for /tmp, /dev/shm and :data:`WORKDIR`; ``hide``
    (the autograder folder, the submissions, the output) covered by an empty tmpfs where a read-only path holds
    them."""
    from kvlab.assets.integrity import cache_dir

    project = _project()
    ro = ["/usr", "/lib", "/lib32", "/lib64", "/libx32", "/bin", "/sbin", "/etc/ld.so.cache", "/etc/localtime",
          sys.base_prefix, sys.prefix, str(pathlib.Path(os.path.realpath(sys.executable)).parent.parent), str(project)]
    ro += [p for p in sys.path if p and os.path.isdir(p)]
    for cache in (cache_dir(), pathlib.Path(os.environ.get("HF_HOME", pathlib.Path.home() / ".cache" / "huggingface"))):
        ro.append(str(cache))
    paths = []
    for p in sorted({os.path.abspath(p) for p in ro if os.path.lexists(p)}, key=len):
        if not any(p.startswith(q.rstrip("/") + "/") for q in paths if not os.path.islink(q)):
            paths.append(p)  # a folder inside one already bound comes with it
    hide = [*hide, project / "build"]  # earlier grades and built assignments: nothing a child needs
    inside = [str(h.resolve()) for h in hide if h.is_dir() and any(str(h.resolve()).startswith(p.rstrip("/") + "/") or
                                                    str(h.resolve()) == p for p in paths)]
    return {"ro": paths, "hide": sorted(set(inside)), "scratch": SCRATCH}


def _bwrap_args(spec: dict, info_fd: int) -> list[str]:
    """bubblewrap's command line for one child's sandbox: new pid, network, IPC, UTS (and cgroup) namespaces, a
    cleared environment, dies with the zygote; its only process a holder that says when the sandbox is ready."""
    args = ["bwrap", "--die-with-parent", "--new-session", "--unshare-pid", "--unshare-net", "--unshare-ipc",
            "--unshare-uts", "--unshare-cgroup-try", "--clearenv"]
    for d in _parents(spec["ro"] + [WORKDIR]):  # bubblewrap makes them 0700: nobody could not reach the binds
        args += ["--perms", "0755", "--dir", d]
    for p in spec["ro"]:
        if os.path.islink(p) and p.count("/") == 1:  # a merged /usr: /bin -> usr/bin
            args += ["--symlink", os.readlink(p), p]
        else:
            args += ["--ro-bind-try", p, p]
    args += ["--proc", "/proc", "--dev", "/dev"]
    for p in ("/tmp", "/dev/shm", WORKDIR):
        args += ["--perms", "1777", "--size", str(int(spec["scratch"])), "--tmpfs", p]
    for p in spec["hide"]:
        args += ["--tmpfs", p]
    return args + ["--chdir", "/", "--info-fd", str(info_fd), "--", "/bin/sh", "-c", "echo ready; exec sleep infinity"]


def _parents(paths: list[str]) -> list[str]:
    """The folders above ``paths`` that no bind brings (they are made in the sandbox's root), outermost first."""
    bound = set(paths)
    found = set()
    for p in paths:
        parent = os.path.dirname(p.rstrip("/"))
        while parent not in ("", "/") and parent not in bound:
            found.add(parent)
            parent = os.path.dirname(parent)
    return sorted(found, key=lambda d: (d.count("/"), d))


class _Sandbox:
    """One child's bubblewrap sandbox, held open by a sleeping process until :meth:`close`; ``pid`` is its first
    process (pid 1 of its pid namespace, seen from outside), whose namespaces the child joins."""

    def __init__(self, spec: dict, timeout: float = 20.0):
        import select

        info_r, info_w = os.pipe()
        # the arguments (every hidden folder's path) come on a memory file: the sandbox's /proc/1/cmdline is
        # only "bwrap --args N"
        args_fd = os.memfd_create("kvlab-bwrap-args", 0)
        args = _bwrap_args(spec, info_w)
        cut = args.index("--")  # the options on the memory file, the holder's command on the command line
        os.write(args_fd, b"".join(a.encode() + b"\0" for a in args[1:cut]))
        os.lseek(args_fd, 0, 0)
        try:
            self.proc = subprocess.Popen(["bwrap", "--args", str(args_fd)] + args[cut:], pass_fds=(info_w, args_fd),
                                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        finally:
            os.close(info_w)
            os.close(args_fd)
        ready_r = self.proc.stdout.fileno()  # the holder says "ready" on its stdout once the sandbox is made
        try:
            readable, _, _ = select.select([ready_r], [], [], timeout)
            ready = os.read(ready_r, 16) if readable else b""
            info = os.read(info_r, 1 << 12) if ready else b""
            if not ready:
                self.close()
                why = self.proc.stderr.read().decode(errors="replace").strip()[-300:] if self.proc.stderr else ""
                raise SandboxUnavailable(f"bubblewrap did not start a sandbox: {why or 'no message'}")
            self.pid = int(json.loads(info.decode())["child-pid"])
        finally:
            self.proc.stdout.close()
            os.close(info_r)
            if self.proc.stderr is not None:
                self.proc.stderr.close()

    def close(self) -> None:
        """Kill the sandbox: its pid namespace goes, and with it every process in it; its tmpfs are freed."""
        try:
            self.proc.kill()
        except OSError:
            pass
        self.proc.wait()


def sandbox_problem() -> str | None:
    """Why a child cannot run in a bubblewrap sandbox here (None: it can). Starts one and enters it."""
    if sys.platform != "linux":
        return "the sandbox needs Linux (namespaces, seccomp) and bubblewrap"
    import platform
    import shutil

    if platform.machine() != "x86_64":
        return f"the sandbox's system-call filter is written for x86-64 Linux, not {platform.machine()}"
    if shutil.which("bwrap") is None:
        return ("bubblewrap is not installed: `apt-get install bubblewrap` (Debian/Ubuntu; `bash scripts/setup.sh` "
                "does it when run as root) or your system's bubblewrap package")
    try:
        box = _Sandbox(sandbox_spec())
    except (SandboxUnavailable, OSError) as exc:
        return (f"bubblewrap is installed but cannot start a sandbox here ({exc}): it needs user namespaces, or "
                f"root; inside Docker run the grader as root with `--cap-add SYS_ADMIN` or "
                f"`--security-opt seccomp=unconfined`")
    try:
        pid = os.fork()
        if pid == 0:
            try:
                _enter(box.pid)
                os._exit(0 if os.listdir("/proc") is not None and os.path.isdir(WORKDIR) else 3)
            finally:
                os._exit(4)
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
    finally:
        box.close()
    return None if code == 0 else f"a process could not join a bubblewrap sandbox here (exit status {code})"


_NAMESPACES = ("ipc", "uts", "net", "pid", "mnt")


def _enter(pid: int) -> None:
    """In a forked child, before any student code (single-threaded, as setns needs): join the namespaces of the
    sandbox whose first process is ``pid`` and fork. Returns in the new process, which is inside the sandbox's
    pid namespace (it sees and can signal only the sandbox's processes); the forked child itself waits for it
    and exits with its status (``128 + signal`` when it was killed), holding no descriptor."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    names = list(_NAMESPACES)
    if os.readlink(f"/proc/{pid}/ns/user") != os.readlink("/proc/self/ns/user"):
        names.insert(0, "user")  # bubblewrap without root made a user namespace: join it first
    fds = [os.open(f"/proc/{pid}/ns/{name}", os.O_RDONLY) for name in names]  # before mnt hides our /proc
    for name, fd in zip(names, fds):
        if libc.setns(fd, 0) != 0:
            raise OSError(ctypes.get_errno(), f"setns({name})")
        os.close(fd)
    inner = os.fork()
    if inner == 0:
        return
    os.closerange(0, 1 << 16)
    while True:
        try:
            _, status = os.waitpid(inner, 0)
            break
        except ChildProcessError:
            os._exit(1)
        except InterruptedError:
            continue
    os._exit(128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status))


# system calls a child may not make (x86-64 numbers), refused with EPERM: new namespaces and joining others
# (unshare, setns), mounts of every kind (mount, umount2, pivot_root, chroot, the new mount API), tracing or
# reading another process (ptrace, process_vm_readv/writev), and kernel facilities no answer needs (bpf,
# perf_event_open, userfaultfd, keys, modules, kexec, swap, reboot)
REFUSED_CALLS = {"unshare": 272, "setns": 308, "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161,
                 "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
                 "mount_setattr": 442, "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "bpf": 321,
                 "perf_event_open": 298, "userfaultfd": 323, "add_key": 248, "request_key": 249, "keyctl": 250,
                 "init_module": 175, "finit_module": 313, "delete_module": 176, "kexec_load": 246,
                 "kexec_file_load": 320, "swapon": 167, "swapoff": 168, "reboot": 169}
KILLED_CALLS = {"fork": 57, "vfork": 58, "execve": 59, "execveat": 322}


def _filter_program() -> list[tuple[int, int, int, int]]:
    """The seccomp program of :func:`_no_new_processes` as ``(code, jt, jf, k)``, jumps resolved."""
    LD, JEQ, JGE, JSET, RET = 0x20, 0x15, 0x35, 0x45, 0x06
    ALLOW, KILL, ENOSYS, EPERM = 0x7FFF0000, 0x80000000, 0x00050000 | 38, 0x00050000 | 1
    code: list = [(LD, 0, 0, 4), (JEQ, 1, 0, 0xC000003E), (RET, 0, 0, KILL),  # another ABI (i386, int 0x80)
                  (LD, 0, 0, 0), (JGE, "kill", 0, 0x40000000)]  # x32 system calls: killed
    code += [(JEQ, "kill", 0, nr) for nr in KILLED_CALLS.values()]
    code += [(JEQ, "enosys", 0, 435)]  # clone3: "not implemented", so the C library falls back to clone
    code += [(JEQ, "eperm", 0, nr) for nr in sorted(REFUSED_CALLS.values())]
    code += [(JEQ, "clone", 0, 56), (RET, 0, 0, ALLOW)]
    labels = {"clone": len(code)}
    code += [(LD, 0, 0, 16), (JSET, "allow", 0, 0x00010000)]  # clone: a thread (CLONE_THREAD) is allowed
    labels["kill"] = len(code)
    code += [(RET, 0, 0, KILL)]
    labels["allow"] = len(code)
    code += [(RET, 0, 0, ALLOW)]
    labels["enosys"] = len(code)
    code += [(RET, 0, 0, ENOSYS)]
    labels["eperm"] = len(code)
    code += [(RET, 0, 0, EPERM)]
    resolved = []
    for at, (op, jt, jf, k) in enumerate(code):
        jt = labels[jt] - at - 1 if isinstance(jt, str) else jt
        jf = labels[jf] - at - 1 if isinstance(jf, str) else jf
        resolved.append((op, jt, jf, k))
    return resolved


def _no_new_processes() -> bool:
    """A seccomp filter (x86-64 Linux) that kills the calling process when it tries to start another one (fork,
    vfork, clone without CLONE_THREAD, execve, execveat) or makes a system call of another ABI (i386 through
    ``int 0x80``, x32), and refuses (EPERM) :data:`REFUSED_CALLS`: threads are allowed. False where it could not
    be installed."""
    import ctypes
    import platform
    import struct

    if sys.platform != "linux" or platform.machine() != "x86_64":
        return False
    prog = _filter_program()
    raw = b"".join(struct.pack("HBBI", *ins) for ins in prog)
    buf = ctypes.create_string_buffer(raw, len(raw))

    class Fprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = Fprog(len(prog), ctypes.cast(buf, ctypes.c_void_p))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
        return False
    return libc.prctl(22, 2, ctypes.byref(fprog), 0, 0) == 0  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER


def _drop_capabilities() -> None:
    """No capability left (a child that joined a user namespace has them all inside it): none in the bounding
    set, none effective, permitted or inheritable."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    for cap in range(64):
        libc.prctl(24, cap, 0, 0, 0)  # PR_CAPBSET_DROP (fails harmlessly past the last capability)
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    data = (ctypes.c_uint32 * 6)()
    libc.capset(header, data)


def _forget(job: dict, q: str, i: int) -> tuple[dict, dict]:
    """In a forked child, before any student code: keep only what it needs (its own submission's cells for ``q``,
    the master's given cells up to q's check, the names to guard and to send) and empty the zygote's job in place,
    so that no other question's reference answer, no classmate's code and no path of the grader's is left in a
    structure the student's code could reach (the zygote's frames still point at ``job`` and its cells)."""
    sub = {"extras": list(job["variants"][q][i]["extras"]), "answers": list(job["variants"][q][i]["answers"])}
    start, end = job["answer_start"][q], job["check_index"][q]
    mine = {"parameters": list(job["parameters"]), "rebinds": {q: list(job["rebinds"][q])},
            "remote": {q: list(job["remote"][q])}, "memory": job["memory"], "nproc": job["nproc"],
            "given": [str(c["source"]) for c in job["cells"][start:end] if c["kind"] == "given"]}
    for cell in job["cells"]:
        cell.clear()
    for variants in job["variants"].values():
        for v in variants:
            v.clear()
    job.clear()
    return sub, mine


def _confine(keep_fd: int, cpu_seconds: float, memory_bytes: int, workdir: str, nproc: int | None = None) -> None:
    """In the child, before any student code: its own session, stdin, stdout and stderr on /dev/null and every
    other descriptor closed but the socket to its judge ``keep_fd``, an empty working folder, a cleared
    environment, limits on CPU time, memory and core files, as root the unprivileged user ``nobody``, no
    capability, and a seccomp filter that kills it if it tries to start a process or uses another system-call
    ABI, and refuses namespaces, mounts and tracing (see the guide). ``nproc``: as root, the processes and threads
    the user ``nobody`` may hold (the weaker mode's bound where no control group can be made)."""
    import math
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
    os.environ.clear()
    os.environ.update({"HOME": workdir, "TMPDIR": "/tmp", "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8",
                       "MPLBACKEND": "Agg", "MPLCONFIGDIR": workdir, "TOKENIZERS_PARALLELISM": "false",
                       "OMP_NUM_THREADS": "1"})
    cpu = max(1, math.ceil(cpu_seconds))  # SIGXCPU at the budget (the grader reads the group's time too)
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    with open("/proc/self/statm") as f:  # the address space already mapped by the zygote, plus the budget
        mapped = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    resource.setrlimit(resource.RLIMIT_AS, (mapped + memory_bytes, mapped + memory_bytes))
    if os.geteuid() == 0:
        if nproc is not None:
            resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)
    _drop_capabilities()
    _no_new_processes()


def _limit_memory(extra: int) -> None:
    import resource

    with open("/proc/self/statm") as f:
        mapped = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    resource.setrlimit(resource.RLIMIT_AS, (mapped + extra, mapped + extra))


def _kill_group(pid: int) -> None:
    import signal

    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _sleeping(pid: int | None) -> bool:
    """Whether process ``pid`` is asleep (waiting on something other than the disk), from /proc/PID/stat."""
    if pid is None:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state in ("S", "T", "t", "Z", "X")


def _inner(pid: int) -> int | None:
    """The process a sandboxed child forked inside its sandbox (it runs the student's code)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            kids = f.read().split()
    except OSError:
        return None
    return int(kids[0]) if kids else None


def _fork_all(job: dict, q: str, ns: dict, pristine: dict, out_fd: int, state: dict) -> None:
    """Fork, per variant of ``q``, a confined child (runs the student's code, in its own bubblewrap sandbox and its
    own control group) and its judge (runs the tests, never student code), joined by a socket; ``job["jobs"]``
    pairs at a time. The judge's verdict comes back over its own pipe; the child's sandbox and group are killed
    whole when the judge is done, the time limit or the CPU budget is reached or the pair has waited too long
    without computing. Each outcome goes to the grading process as a line on ``out_fd``."""
    import select

    sys.stdout.flush()
    sys.stderr.flush()
    pending = list(range(len(job["variants"][q])))
    running: dict[int, dict] = {}
    limits = {"wall": job["timeout"] or REFERENCE_LIMIT, "cpu": job["timeout"] or REFERENCE_LIMIT,
              "measured": job["timeout"] is not None}
    while pending or running:
        if not limits["measured"] and not running and pending[0] != 0:
            _set_limits(limits, state)  # variant 0 (the reference answer) sets the limits of every student's run
        while pending and len(running) < (job["jobs"] if limits["measured"] else 1):
            i = pending.pop(0)
            started = _start_run(job, q, i, ns, pristine, limits, state)
            if "judge" in started:
                running[started["judge"]] = started
            else:
                _emit(out_fd, started)
        readable, _, _ = select.select([v["r"] for v in running.values()], [], [], 0.02)
        for judge, run in list(running.items()):
            outcome = _poll(run, readable, state["idle"], job["owners"][q])
            if outcome is not None:
                del running[judge]
                if run["i"] == 0:
                    state["reference"], state["reference_cpu"] = outcome["seconds"], run["child_cpu"]
                _emit(out_fd, outcome)


def _set_limits(limits: dict, state: dict) -> None:
    """The students' limits of a question from its reference run: wall time ``SLOWDOWN`` times the reference's (at
    least ``MIN_LIMIT``), CPU time ``CPU_FACTOR`` times the reference child's plus ``CPU_MARGIN`` (at least
    ``CPU_FLOOR``)."""
    limits["wall"] = max(MIN_LIMIT, SLOWDOWN * state.get("reference", REFERENCE_LIMIT))
    limits["cpu"] = min(limits["wall"], max(CPU_FLOOR, CPU_FACTOR * state.get("reference_cpu", REFERENCE_LIMIT)
                                            + CPU_MARGIN))
    limits["measured"] = True


def _fork(retries: int = 20) -> int:
    """``os.fork``, retried for a second when the system is short of processes (a fork the grader makes never
    fails because a child holds many: each child's group has its own ``pids.max``)."""
    for attempt in range(retries):
        try:
            return os.fork()
        except BlockingIOError:
            if attempt == retries - 1:
                raise
            time.sleep(0.05)
    raise BlockingIOError("fork")


def _start_run(job: dict, q: str, i: int, ns: dict, pristine: dict, limits: dict, state: dict) -> dict:
    """Fork variant ``i``'s child (in its sandbox and group) and its judge; the run's record, or an outcome
    (``status``, ``word``) when it could not be started: that costs this run only."""
    import socket

    owners, idle = job["owners"][q], state["idle"]
    allowed_idle = None if i == 0 else max(IDLE_FLOOR, min(IDLE_BUDGET - idle.get(s, 0.0) for s in owners[i]))
    run = {"i": i, "box": None, "workdir": None, "group": None, "allowed_idle": allowed_idle, "inner": None,
           "child_status": None, "child_cpu": 0.0, "idle": 0.0, "limits": dict(limits), "q": q,
           "sandboxed": job["sandbox"] is not None, "memory": int(job["memory"])}
    try:
        _prepare(run, job)
        mine, theirs = socket.socketpair()
        r, w = os.pipe()
        child = _fork()
    except (SandboxUnavailable, OSError) as exc:
        _release(run)
        return {"v": i, "q": q, "status": f"the run of {q} could not be started ({_word(type(exc).__name__)})",
                "word": "no-result"}
    if child == 0:
        try:
            mine.close()
            os.close(r)
            os.close(w)
            sub, mine_only = _forget(job, q, i)
            if run["group"] is not None:
                run["group"].join()
            if run["box"] is not None:
                _enter(run["box"].pid)
            # the kernel's RLIMIT_CPU: the wall limit as a backstop where the group counts the CPU budget (the
            # grader cuts there), the budget itself where there is no group
            _confine(theirs.fileno(), limits["wall"] if run["group"] is not None else limits["cpu"],
                     mine_only["memory"], WORKDIR if run["box"] is not None else run["workdir"], mine_only["nproc"])
            _child(mine_only, sub, q, ns, pristine, theirs)
        finally:
            os._exit(1)
    theirs.close()
    try:
        judge = _fork()
    except OSError:
        _kill_run(run, child)
        mine.close()
        os.close(r)
        os.close(w)
        os.waitpid(child, 0)
        _release(run)
        return {"v": i, "q": q, "status": f"the judge of {q} could not be started", "word": "no-result"}
    if judge == 0:
        try:
            import signal

            os.close(r)
            signal.signal(signal.SIGALRM, signal.SIG_DFL)
            _limit_memory(job["judge_memory"])
            _judge(job, q, ns, pristine, mine, w)
        finally:
            os._exit(1)
    mine.close()
    os.close(w)
    os.set_blocking(r, False)
    now = time.monotonic()
    run.update(judge=judge, child=child, r=r, buf=bytearray(), t0=now, seen=now)
    return run


def _prepare(run: dict, job: dict) -> None:
    """The run's sandbox (or, trusted, its working folder) and its control group."""
    if job["sandbox"] is not None:
        run["box"] = _Sandbox(job["sandbox"])
    else:
        run["workdir"] = tempfile.mkdtemp(prefix="kvlab-child-")  # a full TMPDIR costs this run, not the class
    groups = job.get("_groups")
    if groups is not None:
        run["group"] = groups.make(pids=PIDS, memory=job["memory"], cpus=1.0)


def _release(run: dict) -> None:
    """Remove what :func:`_prepare` made: the sandbox, the working folder, the group."""
    import shutil

    if run["box"] is not None:
        run["box"].close()
        run["box"] = None
    if run["workdir"]:
        shutil.rmtree(run["workdir"], ignore_errors=True)
        run["workdir"] = None
    if run["group"] is not None:
        run["group"].remove()


def _kill_run(run: dict, child: int) -> None:
    """Kill a run's child and everything it started: its group, its sandbox (the pid namespace), its session."""
    if run["group"] is not None:
        run["group"].kill()
    if run["box"] is not None:
        run["box"].close()  # the sandbox's pid namespace, and every process in it, goes
        run["box"] = None
    else:
        _kill_group(child)  # the child's session: anything it left behind goes with it


def _poll(run: dict, readable: list, idle: dict, owners: list) -> dict | None:
    """Look at one running pair: read the judge's pipe, account the child's idle time, and when the judge is done
    or a limit is reached, stop the pair and return its outcome (None: still running)."""
    if run["r"] in readable:
        _drain(run)
    if run["child_status"] is None:
        done, status, usage = os.wait4(run["child"], os.WNOHANG)
        if done:
            run["child_status"], run["child_cpu"] = status, usage.ru_utime + usage.ru_stime
    now = time.monotonic()
    _account_idle(run, now)
    done, _, jusage = os.wait4(run["judge"], os.WNOHANG)
    stop = None if done else _over(run, now)
    if not (done or stop):
        return None
    return _stop(run, stop, idle, owners, now, jusage if done else None)


def _account_idle(run: dict, now: float) -> None:
    """Add the time since the last look to the run's idle time when its student process and judge both sleep."""
    if run["child_status"] is None and run["allowed_idle"] is not None:
        if run["box"] is not None and run["inner"] is None:
            run["inner"] = _inner(run["child"])
        student = run["inner"] if run["box"] is not None else run["child"]
        if student is not None and _sleeping(student) and _sleeping(run["judge"]):
            run["idle"] += now - run["seen"]
    run["seen"] = now


def _let_child_end(run: dict, grace: float = 0.25) -> None:
    """The judge is done: give the child a moment to end by itself before it is killed. A sandboxed process stopped
    by seccomp (SIGSYS) ends its judge's input at once, while the child that relays its signal may still be exiting;
    killing that child then would report SIGKILL, and the run would lose why it was stopped."""
    deadline = time.monotonic() + grace
    while run["child_status"] is None and time.monotonic() < deadline:
        done, status, usage = os.wait4(run["child"], os.WNOHANG)
        if done:
            run["child_status"], run["child_cpu"] = status, usage.ru_utime + usage.ru_stime
        else:
            time.sleep(0.005)


def _stop(run: dict, stop: str | None, idle: dict, owners: list, now: float, jusage) -> dict:
    """End a run (its judge done, or ``stop``: the limit it is over): kill its child's group and sandbox, reap,
    release, and return its outcome."""
    events = run["group"].events() if run["group"] is not None else {}
    group_cpu = run["group"].cpu_seconds() if run["group"] is not None else 0.0
    if not stop:
        _let_child_end(run)
    _kill_run(run, run["child"])
    if stop:
        import signal

        os.kill(run["judge"], signal.SIGKILL)
        os.waitpid(run["judge"], 0)
    if run["child_status"] is None:
        _, run["child_status"], usage = os.wait4(run["child"], 0)
        run["child_cpu"] = usage.ru_utime + usage.ru_stime
    run["child_cpu"] = max(run["child_cpu"], group_cpu)
    _drain(run)
    os.close(run["r"])
    _release(run)
    for s in owners[run["i"]] if run["allowed_idle"] is not None else []:
        idle[s] = idle.get(s, 0.0) + run["idle"]
    outcome = _outcome(run, stop, events)
    outcome.update(seconds=now - run["t0"], limit=run["limits"]["wall"], cpu_limit=run["limits"]["cpu"],
                   cpu=run["child_cpu"] + (jusage.ru_utime + jusage.ru_stime if jusage is not None else 0.0))
    return outcome


def _over(run: dict, now: float) -> str | None:
    """Which limit a running pair is over: ``timeout`` (wall), ``cpu`` (the child's group's CPU time), ``slow``
    (waited without computing past the student's idle budget); None."""
    if now - run["t0"] > run["limits"]["wall"]:
        return "timeout"
    if run["group"] is not None and run["child_status"] is None and run["allowed_idle"] is not None \
            and run["group"].cpu_seconds() > run["limits"]["cpu"] + CPU_GRACE:
        return "cpu"
    if run["allowed_idle"] is not None and run["idle"] > run["allowed_idle"]:
        return "slow"
    return None


def _drain(run: dict) -> None:
    try:
        while chunk := os.read(run["r"], 1 << 16):
            run["buf"] += chunk
    except BlockingIOError:
        pass


def _outcome(run: dict, stop: str | None, events: dict) -> dict:
    """The outcome line of a finished run, in words of the grader's (nothing the child chose but its verdict)."""
    import signal

    q, limits = run["q"], run["limits"]
    outcome: dict = {"v": run["i"], "q": q}
    code = os.waitstatus_to_exitcode(run["child_status"])
    if run["sandboxed"] and code > 128:
        code = -(code - 128)  # the sandboxed process's signal, relayed by the child that forked it
    if stop == "timeout":
        outcome.update(status=f"the run of {q} took over {limits['wall']:g} s and was stopped", word="timeout")
    elif stop == "cpu" or code == -signal.SIGXCPU:
        outcome.update(status=f"the run of {q} used its CPU budget of {limits['cpu']:.1f} s and was stopped",
                       word="cpu")
    elif stop == "slow":
        outcome.update(status=f"the run of {q} waited {run['idle']:.1f} s without computing (sleeping) and was "
                              f"stopped: a student's runs may wait {IDLE_BUDGET:g} s in all", word="slow")
    elif events.get("pids"):
        outcome.update(status=f"the run of {q} tried to start more than {PIDS} threads or processes and was "
                              f"stopped", word="pids")
    elif events.get("memory"):
        outcome.update(status=f"the run of {q} used more than its {run['memory'] >> 20} MiB of memory and was "
                              f"stopped", word="memory")
    elif code == -signal.SIGSYS:  # only seccomp sends it (the grader kills with SIGKILL)
        outcome.update(status=f"the run of {q} tried to start a process (fork, exec or a shell) or to make a "
                              f"system call of another ABI, and was stopped", word="process")
    else:
        outcome.update(_verdict(run, code))
    return outcome


def _verdict(run: dict, code: int) -> dict:
    """The judge's verdict as an outcome (its cases), or why there is none."""
    q = run["q"]
    try:
        got = json.loads(bytes(run["buf"]).decode())
        if not isinstance(got, dict) or "cases" not in got:
            raise ValueError("not a result")
    except (ValueError, UnicodeDecodeError):
        got = {"judge_error": "the judge left no verdict"}
    if "judge_error" in got:
        return {"status": f"the judge of {q} failed ({_word(got['judge_error'])})", "word": "judge-failed",
                "judge_error": True}
    if "oversize" in got:
        return {"status": f"the run of {q} sent the judge a message over {MAX_MESSAGE >> 20} MiB (scored 0)",
                "word": "oversize"}
    if "ended" in got:
        return {"status": f"the run of {q} ended before its tests finished (exit status {code})", "word": "ended"}
    return {"result": {k: got[k] for k in ("cases", "errors", "flags")}}


# ------------------------------------------------------------------------------------------ the grading process

_UNSAFE = __import__("re").compile(r"[\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2066-\u2069\ufeff]")


def clean(text, limit: int = 300) -> str:
    """``text`` safe to put in a CSV cell, a Markdown file or a terminal: control characters (escape codes, line
    breaks, bidirectional overrides) written as ``\\xNN``, at most ``limit`` characters."""
    text = _UNSAFE.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 256 else f"\\u{ord(m.group()):04x}",
                       str(text))
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _zygote_env() -> dict:
    """The zygote's environment: what Python, torch and kvlab need, nothing else (no secret of the grader's)."""
    keep = {"PATH", "HOME", "LANG", "LC_ALL", "HF_HOME", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "OMP_NUM_THREADS",
            "MKL_NUM_THREADS", "KVLAB_CACHE", "KVLAB_THREADS", "TMPDIR"}
    env = {k: v for k, v in os.environ.items() if k in keep}
    env.update(TOKENIZERS_PARALLELISM="false", MPLBACKEND="Agg")
    return env


def _run_zygote(job: dict, tests: dict, cwd: pathlib.Path) -> tuple[list[dict], str | None]:
    """Start the zygote (``python -I``: no current folder on its path, no ``PYTHON*`` variable, a cleared
    environment), hand it the job on stdin and the tests in a memory file, and collect its outcome lines from a
    pipe until it ends. Returns the messages and, when it ended badly, why."""
    import threading

    tests_fd = os.memfd_create("kvlab-tests", 0)  # no file on disk: a full TMPDIR cannot stop the grading
    data = json.dumps(tests).encode()
    os.write(tests_fd, data)
    out_r, out_w = os.pipe()
    project = str(_project())
    job = dict(job, tests_fd=tests_fd, tests_size=len(data), out_fd=out_w)
    code = f"import sys; sys.path.insert(0, {project!r}); from {__name__} import _zygote; _zygote()"
    proc = subprocess.Popen([sys.executable, "-I", "-c", code], cwd=str(cwd), env=_zygote_env(),
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            pass_fds=(tests_fd, out_w))
    os.close(out_w)
    os.close(tests_fd)
    tail = bytearray()

    def drain():  # the master's own errors, the last few KiB
        for chunk in iter(lambda: proc.stderr.read(1 << 14), b""):
            tail.extend(chunk)
            del tail[:-8192]

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()

    def feed():
        try:
            proc.stdin.write(json.dumps(job).encode())
            proc.stdin.close()
        except OSError:
            pass

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    messages = []
    with os.fdopen(out_r, "rb") as pipe:
        for line in pipe:
            try:
                message = json.loads(line.decode())
            except (ValueError, UnicodeDecodeError):
                continue  # a garbled line: its student's question has no outcome, and scores 0 with that reason
            if type(message) is dict:
                messages.append(message)
    proc.wait()
    reader.join(timeout=5)
    feeder.join(timeout=5)
    died = None
    if proc.returncode != 0 or not any("master_errors" in m for m in messages):
        # the grader's own traceback is for the instructor's terminal: a student's feedback gets fixed words
        print(f"kvlab grading: the zygote ended early (exit {proc.returncode}); its last words:\n"
              f"{clean(bytes(tail).decode(errors='replace').strip()[-2000:], 2000)}", file=sys.stderr)
        died = f"the grading process ended early (exit {proc.returncode}): this question was not graded"
    return messages, died


class CgroupsUnavailable(SandboxUnavailable):
    """No control group can be made here for the children: untrusted submissions are not graded unless the weaker
    per-process limits are accepted (``cgroups=False``, ``--no-cgroups``)."""


def cgroups_problem() -> str | None:
    """Why no control group per child can be made here (None: one can; the probe's groups are removed)."""
    from kvlab.classroom import cgroups

    got = cgroups.probe()
    if isinstance(got, str):
        return got
    got.close()
    return None


def _check_arguments(jobs: int, timeout: float | None) -> None:
    if not hasattr(os, "fork"):
        raise RuntimeError("kvlab's grading forks one process per question: it needs Linux")
    if jobs < 1:
        raise ValueError(f"jobs={jobs}: must be at least 1 (submissions graded at once)")
    if timeout is not None and not timeout > 0:
        raise ValueError(f"timeout={timeout}: must be positive (seconds one question may run)")


def _isolation(trust: bool, cgroups: bool | None, hide: list[pathlib.Path]) -> tuple[dict | None, bool]:
    """The sandbox spec (None: trusted, no sandbox) and whether each child gets a control group; refuses
    (:class:`SandboxUnavailable`, :class:`CgroupsUnavailable`) where what untrusted code needs cannot be made."""
    sandbox = None
    if not trust:
        problem = sandbox_problem()
        if problem is not None:
            raise SandboxUnavailable(f"student code runs only in a sandbox, and none can be made here: {problem}. "
                                     f"Fix that, or grade submissions you trust with --trust-submissions "
                                     f"(trust_submissions=True)")
        sandbox = sandbox_spec(hide)
    if cgroups is False:
        return sandbox, False
    problem = cgroups_problem()
    if problem is None:
        return sandbox, True
    if cgroups is None and trust:
        return sandbox, False
    raise CgroupsUnavailable(
        f"each student's code runs in a control group of its own (its threads, memory and CPU bounded by the kernel), "
        f"and none can be made here: {problem}. Run the grader as root, or in a cgroup v2 sub-tree delegated to "
        f"you (`systemd-run --user --scope -p Delegate=yes python -m kvlab lessons grade ...`), or accept the weaker "
        f"per-process limits with --no-cgroups (cgroups=False; see docs/guide/classroom.md)")


def _read_class(submissions, cells, order, tests, master) -> tuple[list, list, list]:
    """Every submission read (bounded) and planned: the results (one per submission), the plans of the gradable
    ones and their results; a submission that cannot be read is a row with the grader's reason."""
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
                res.flags.append(f"notebook: the notebook is assignment {clean(name, 60)!r}, not {assignment!r}")
            answers, extras, flags = _student_plan(nb, cells, order, "notebook")
        except SubmissionRefused as exc:
            res.status = f"not graded: the submission was refused ({exc})"
            continue
        except Exception as exc:  # noqa: BLE001 - one unreadable or malformed notebook is a row, not a crash
            res.status = f"not graded: the notebook could not be read ({_word(type(exc).__name__)})"
            continue
        res.flags.extend(flags)
        for q in order:
            for src in answers[q]:
                res.flags.extend(scan(src, f"answer to {q}", parameters, imported, allowed))
            for src in extras[q]:
                res.flags.extend(scan(src, f"added cell before {q}", parameters, imported, allowed))
        subs.append({"answers": answers, "extras": extras})
        gradable.append(res)
    return results, subs, gradable


def _variants(cells: list[dict], order: list[str], subs: list[dict]) -> tuple[dict, dict, list]:
    """One run per distinct (added cells up to q, answer to q): the same code forked from the same state scores the
    same, so an unanswered question or an untouched reference runs once for the whole class. Variant 0 of each
    question is the reference answer (it times the limits). Returns the variants, their owners (students 1, 2,
    ...) and each submission's variant per question (index 0: the reference)."""
    reference = {"answers": {q: [c["source"] for c in cells if c["kind"] == "answer" and c["question"] == q]
                             for q in order}, "extras": {q: [] for q in order}}
    variants: dict[str, list[dict]] = {q: [] for q in order}
    owners: dict[str, list[list[int]]] = {q: [] for q in order}
    variant_of: list[dict[str, int]] = []
    for k, sub in enumerate([reference] + subs):
        picks = {}
        for n, q in enumerate(order):
            v = {"extras": [src for p in order[:n + 1] for src in sub["extras"][p]], "answers": sub["answers"][q]}
            if v not in variants[q]:
                variants[q].append(v)
                owners[q].append([])
            picks[q] = variants[q].index(v)
            if k:
                owners[q][picks[q]].append(k)
        variant_of.append(picks)
    return variants, owners, variant_of


def _job(cells, order, master, variants, owners, options: dict) -> dict:
    """What the zygote needs: the master's cells, the variants, the names each question guards and sends."""
    rebinds = {q: sorted(_assigned([c["source"] for c in cells if c["kind"] == "answer" and c["question"] == q]))
               for q in order}
    answer_start = {q: min(i for i, c in enumerate(cells) if c["kind"] == "answer" and c["question"] == q) + 1
                    for q in order}
    check_index = {q: next(i for i, c in enumerate(cells) if c["kind"] == "check" and c["question"] == q)
                   for q in order}
    # what the judge takes from the child: the names q's reference answer binds and those the master's cells
    # between that answer and q's check bind (they ran on the student's code)
    remote = {q: sorted(set(rebinds[q]) | _assigned([c["source"] for c in cells[answer_start[q]:check_index[q]]
                                                     if c["kind"] == "given"])) for q in order}
    return {"cells": cells, "variants": variants, "owners": owners, "order": order,
            "judge_memory": JUDGE_MEMORY, "parameters": sorted(_parameters(master)), "rebinds": rebinds,
            "remote": remote, "answer_start": answer_start, "check_index": check_index,
            "master_names": sorted(_assigned([c["source"] for c in cells])), **options}


def _check_reference(outcomes: dict, tests: dict, order: list[str], died: str | None) -> None:
    for q in order:
        ref = outcomes.get((q, 0))
        if died is None and ref is not None:
            got = ref.get("result") or {}
            if not got or not all(c.get("passed") for c in got.get("cases", [])) or len(got["cases"]) != len(
                    tests[q]["cases"]):
                raise RuntimeError(f"the reference answer of {q} does not pass its own tests in the grading child "
                                   f"({got or ref}): fix the master or raise the memory limit")


def _number(value) -> float:
    return float(value) if type(value) in (int, float) else 0.0


def _fill_question(qr: QuestionResult, outcome: dict, cases: list[dict], died: str | None, flags: list[str]) -> None:
    """One question's result from its run's outcome: the cases by name, the errors, the flags."""
    q = qr.question
    qr.cpu, qr.seconds = _number(outcome.get("cpu")), _number(outcome.get("seconds"))
    data = outcome.get("result") if type(outcome.get("result")) is dict else None
    if data is not None:
        by_name = {c["name"]: c for c in data.get("cases", []) if type(c) is dict and "name" in c}
        qr.errors = [clean(e) for e in data.get("errors", [])[:20]]
        flags.extend(f"{q}: {clean(f)}" for f in data.get("flags", [])[:MAX_FLAGS])
    else:
        by_name = {}
        reason = clean(outcome.get("status") or died or f"the run of {q} left no result (no-result)")
        qr.errors = [reason]
        flags.append(f"{q}: {clean(outcome.get('word', 'no-result'), 20)}: {reason}")
    for case in cases:
        got = by_name.get(case["name"])
        if got is None:
            qr.cases.append(CaseResult(case["name"], case["hidden"], case["points"], False,
                                       "not run (the question's run ended early)"))
        else:
            qr.cases.append(CaseResult(case["name"], case["hidden"], case["points"], got.get("passed") is True,
                                       clean(got.get("message", ""), 500)))
    qr.score = sum(c.points for c in qr.cases if c.passed)


def _fill_results(gradable, outcomes, variant_of, order, tests, died) -> None:
    reference_cpu = sum(_number((outcomes.get((q, 0)) or {}).get("cpu")) for q in order)
    for i, res in enumerate(gradable):
        for q in order:
            _fill_question(res.questions[q], outcomes.get((q, variant_of[i + 1][q]), {}), tests[q]["cases"], died,
                           res.flags)
        cpu = sum(qr.cpu for qr in res.questions.values())
        if cpu > SLOW_FACTOR * reference_cpu + SLOW_MARGIN:
            res.flags.append(f"slow: the answers took {cpu:.1f} s of CPU time, the reference's {reference_cpu:.1f} s")
        seen, kept = set(), []
        for f in res.flags:
            f = clean(f)
            if f not in seen:
                seen.add(f)
                kept.append(f)
        res.flags = kept[:MAX_FLAGS] + ([f"flags: {len(kept) - MAX_FLAGS} more not shown"]
                                        if len(kept) > MAX_FLAGS else [])


def grade_submissions(solutions: pathlib.Path, autograder_zip: pathlib.Path, submissions: list[pathlib.Path],
                      jobs: int = 1, timeout: float | None = None, memory: int = MEMORY, seed: int | None = None,
                      trust_submissions: bool = False, hide: list[pathlib.Path] = (),
                      cgroups: bool | None = None) -> list[SubmissionResult]:
    """Grade ``submissions`` (``.ipynb`` or ``grader.export()`` zips) against the master ``solutions``
    notebook (the one ``otter assign`` writes beside the autograder zip) and the tests in ``autograder_zip``.

    Every autograded question of every submission runs in its own forked process, in its own bubblewrap sandbox
    and its own control group, with the reference answers of the other questions; see the module docstring for
    what is protected. ``jobs`` children run at once; a child running over ``timeout`` seconds is stopped (the
    question scores zero). ``timeout=None`` (the default) runs the reference answer of each question first, in a
    child like the students', and gives each student's run ``SLOWDOWN`` times its wall time (at least
    ``MIN_LIMIT`` s) and ``CPU_FACTOR`` times its CPU time plus ``CPU_MARGIN`` (at least ``CPU_FLOOR``).
    ``memory``: bytes a child may hold (its group's limit, counting shared memory and memfd) and map beyond the
    zygote. ``seed``: the instructor's secret, given to the tests as ``HIDDEN_SEED`` (hidden tests draw their
    inputs from it; default 0); it reaches the judges only. Where bubblewrap cannot start a sandbox, raises
    :class:`SandboxUnavailable` unless ``trust_submissions``. ``cgroups``: None (default) gives every child a
    control group where one can be made and, for untrusted submissions, refuses (:class:`CgroupsUnavailable`)
    where none can; False: the weaker per-process limits only. ``hide``: more folders no child may see (the
    output, the built assignments); the autograder folder and the submissions' folders are hidden always. A child
    that dies, hangs or is killed costs its question only; a submission that cannot be read (or is over
    :data:`MAX_SUBMISSION`) is one row with its reason; if the grading process itself dies, every row says so.
    """
    import nbformat

    _check_arguments(jobs, timeout)
    hide = [pathlib.Path(autograder_zip).parent, pathlib.Path(solutions).parent] + [pathlib.Path(h) for h in hide]
    hide += sorted({pathlib.Path(p).resolve().parent for p in submissions})
    sandbox, groups = _isolation(trust_submissions, cgroups, hide)
    master = nbformat.read(solutions, as_version=4)
    cells, order = _master_plan(master)
    tests = load_tests(autograder_zip)
    missing = [q for q in order if q not in tests]
    if missing:
        raise ValueError(f"questions {missing} have no tests in {autograder_zip}: rebuild with `lessons make`")
    results, subs, gradable = _read_class(submissions, cells, order, tests, master)
    if not subs:
        return results
    variants, owners, variant_of = _variants(cells, order, subs)
    job = _job(cells, order, master, variants, owners, {
        "jobs": jobs, "timeout": timeout, "memory": memory, "sandbox": sandbox, "cgroups": groups,
        "nproc": None if groups else PIDS * jobs + 16})
    # the tests (and the seed) for the judges only: the zygote, and so every child, never reads them
    messages, died = _run_zygote(job, {q: {"seed": int(seed or 0), "cases": tests[q]["cases"]} for q in order},
                                 pathlib.Path(solutions).parent)
    outcomes = {(m.get("q"), m.get("v")): m for m in messages if "q" in m and "v" in m}
    master_errors = next((m["master_errors"] for m in messages if "master_errors" in m), [])
    if master_errors:
        raise RuntimeError("the master notebook's own cells raised, so nothing can be graded against it:\n"
                           + "\n".join(str(e) for e in master_errors))
    _check_reference(outcomes, tests, order, died)
    _fill_results(gradable, outcomes, variant_of, order, tests, died)
    return results
