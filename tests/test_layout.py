"""The layout rules of docs/guide/design.md "Layout": one folder per paper, a small core, no import cycles.

Imports are read from the source (every ``import``/``from`` statement, function-level ones included), so
a cycle hidden inside a function body is caught too.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

import kvlab

ROOT = Path(kvlab.__file__).parent
PAPERS = {"sepllm", "lacache", "dhsa", "reform", "orthorank"}
# what each shared part may import from kvlab (besides itself)
ALLOWED = {
    "core": set(),
    "baselines": {"core"},
    "kernels": {"core"},
    "eval": {"core", "baselines", "datasets", "assets"},
}


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _imports(path: Path, typing: bool = False) -> set[str]:
    tree = ast.parse(path.read_text())
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    typing_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If)
                   and getattr(block.test, "id", getattr(block.test, "attr", "")) == "TYPE_CHECKING"
                   for n in ast.walk(block)}
    for node in ast.walk(tree):
        if id(node) in typing_only and not typing:  # annotations only: not imported at run time
            continue
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("kvlab")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod.startswith("kvlab"):
                found.add(mod)
                found |= {f"{mod}.{a.name}" for a in node.names}
    return found


MODULES = {_module_name(p): p for p in ROOT.rglob("*.py")}
# the root package imports nothing at import time (lazy attributes), so "from kvlab import x" is an edge to x
GRAPH = {m: {i for i in _imports(p) if i in MODULES and i not in (m, "kvlab")} for m, p in MODULES.items()}


def _part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_paper_folders_never_import_each_other():
    bad = [(m, i) for m, deps in GRAPH.items() for i in deps
           if _part(m) in PAPERS and _part(i) in PAPERS and _part(i) != _part(m)]
    assert not bad, f"paper folders import each other: {bad}"


@pytest.mark.parametrize("part", sorted(ALLOWED))
def test_shared_parts_import_only_what_they_may(part):
    bad = [(m, i) for m, deps in GRAPH.items() if _part(m) == part for i in deps
           if _part(i) != part and _part(i) not in ALLOWED[part]]
    assert not bad, f"kvlab.{part} imports {bad}"


def test_no_import_cycles():
    """No module reaches itself through imports (function-level imports included)."""
    def reach(start):
        seen, todo = set(), list(GRAPH[start])
        while todo:
            m = todo.pop()
            if m in seen:
                continue
            seen.add(m)
            todo += GRAPH.get(m, ())
        return seen
    cycles = [m for m in GRAPH if m in reach(m) and not m.endswith(("__main__",))]
    assert not cycles, f"import cycles through: {sorted(cycles)}"


@pytest.mark.parametrize("name", kvlab.__all__)
def test_every_top_level_name_resolves(name):
    assert getattr(kvlab, name) is not None


def test_every_package_module_imports():
    for module in sorted(MODULES):
        if module.endswith("__main__") or ".triton" in module or module.endswith((".bench", ".flex")):
            continue
        importlib.import_module(module)


def test_readme_import_paths_work():
    readme = "\n".join(p.read_text() for p in [ROOT.parent / "README.md",  # and the guide pages moved out of it
                                                *sorted((ROOT.parent / "docs" / "guide").glob("*.md"))])
    blocks = "\n".join(re.findall(r"```python\n(.*?)```", readme, flags=re.S))
    for mod, names in re.findall(r"^\s*from (kvlab[\w.]*) import ([\w, ]+)", blocks, flags=re.M):
        module = importlib.import_module(mod)
        for n in names.split(","):
            assert hasattr(module, n.strip()), f"README: from {mod} import {n.strip()}"
    for dotted in set(re.findall(r"`(kvlab(?:\.\w+)+)", readme)):
        obj, parts = kvlab, dotted.split(".")[1:]
        for i, part in enumerate(parts):
            if not hasattr(obj, part):
                obj = importlib.import_module(".".join(["kvlab"] + parts[: i + 1]))
            else:
                obj = getattr(obj, part)


def test_core_has_no_import_circle_even_for_type_hints():
    """kvlab.core reads bottom-up: a module that another imports does not name it back, not even under
    TYPE_CHECKING (state sits below pattern and router, which install their objects in it)."""
    core = {m: p for m, p in MODULES.items() if _part(m) == "core"}
    graph = {m: {i for i in _imports(p, typing=True) if i in core and i != m} for m, p in core.items()}
    back = sorted((m, i) for m, deps in graph.items() for i in deps if m in graph.get(i, ()))
    assert not back, f"kvlab.core modules that import each other: {back}"
