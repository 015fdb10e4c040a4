"""The mechanism stays readable: no function of a paper folder, the core or the shared kernels above cyclomatic
complexity 20 (radon's reading; grades D-F start at 21). The experiments (kvlab/experiments/) and the notebook tools
(kvlab/notebooks/) are held to the same limit: a driver reads as configuration, checks and a loop. The classroom
is not held to it."""
from pathlib import Path

import pytest

radon = pytest.importorskip("radon.complexity", reason="radon is a dev dependency: pip install -e .[dev]")

ROOT = Path(__file__).resolve().parents[1]
MECHANISM = ("sepllm", "lacache", "dhsa", "reform", "orthorank", "core", "kernels")
EXPERIMENTS = ("experiments", "notebooks")
LIMIT = 20


def _blocks(path: Path):
    """Functions, methods (radon lists them beside their class) and classes of one file."""
    return radon.cc_visit(path.read_text())


def test_mechanism_functions_stay_under_the_complexity_limit():
    over = []
    for folder in MECHANISM:
        for path in sorted((ROOT / "kvlab" / folder).rglob("*.py")):
            over += [f"{path.relative_to(ROOT)}:{b.lineno} {b.fullname} ({b.complexity})"
                     for b in _blocks(path) if b.complexity > LIMIT]
    assert not over, (f"functions above complexity {LIMIT} in the mechanism (split them, or make a constructor "
                      "with many options two named configurations):\n" + "\n".join(over))


def test_experiment_functions_stay_under_the_complexity_limit():
    over, unreadable = [], []
    for folder in EXPERIMENTS:
        for path in sorted((ROOT / "kvlab" / folder).rglob("*.py")):
            try:
                blocks = _blocks(path)
            except SyntaxError as err:
                unreadable.append(f"{path.relative_to(ROOT)}: {err}")
                continue
            over += [f"{path.relative_to(ROOT)}:{b.lineno} {b.fullname} ({b.complexity})"
                     for b in blocks if b.complexity > LIMIT]
    assert not unreadable, "radon cannot read:\n" + "\n".join(unreadable)
    assert not over, (f"functions above complexity {LIMIT} in kvlab/experiments/ and kvlab/notebooks/ (split each "
                      "into its checks, its steps and its output):\n" + "\n".join(over))


def test_the_check_reads_real_complexity():
    source = "def f(x):\n" + "".join(f"    if x == {i}:\n        return {i}\n" for i in range(25)) + "    return -1\n"
    (block,) = radon.cc_visit(source)
    assert block.complexity == 26
