"""The fast suite and the --full run (tests/conftest.py): every long test named there exists, says what the fast
suite still checks, and is skipped only without --full."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import conftest

ROOT = Path(__file__).resolve().parents[1]


def _defines(nodeid: str) -> bool:
    path, name = nodeid.split("::", 1)
    name = name.split("[", 1)[0]
    file = ROOT / path
    return file.is_file() and re.search(rf"^def {re.escape(name)}\(", file.read_text(), re.M) is not None


def test_every_long_test_exists_and_says_what_the_fast_suite_checks():
    for nodeid, why in {**conftest.FULL_ONLY, **conftest.FULL_ONLY_PREFIXES}.items():
        assert _defines(nodeid), f"{nodeid}: no such test (renamed?): update tests/conftest.py FULL_ONLY"
        assert len(why) > 20, f"{nodeid}: say what the fast suite still checks"
    for nodeid in conftest.FAST_KEPT:
        assert _defines(nodeid) and conftest.full_only(nodeid) is None


def test_full_only_marks_exactly_the_named_tests():
    long = next(iter(conftest.FULL_ONLY))
    assert conftest.full_only(long) == conftest.FULL_ONLY[long]
    assert conftest.full_only("tests/test_eval.py::test_full_streaming_equals_parallel_forward") is None
    engine = next(iter(conftest.FULL_ONLY_PREFIXES))
    assert conftest.full_only(engine + "StreamingLLM(positions='cache', sink=2, window=6)-physical]")


def test_without_full_a_long_test_is_skipped_with_its_reason(tmp_path):
    (tmp_path / "tests").mkdir()
    shutil.copy(ROOT / "tests" / "conftest.py", tmp_path / "tests" / "conftest.py")
    long = "tests/test_ragged_decode.py::test_triton_chunking_does_not_change_the_result"
    (tmp_path / "tests" / "test_ragged_decode.py").write_text(
        "def test_triton_chunking_does_not_change_the_result():\n    pass\n")

    def pytest(*args):
        return subprocess.run([sys.executable, "-m", "pytest", "tests", "-rs", "-p", "no:cacheprovider", *args],
                              cwd=tmp_path, capture_output=True, text=True, timeout=300).stdout

    fast, full = pytest(), pytest("--full")
    assert "1 skipped" in fast and "runs with --full" in fast and conftest.FULL_ONLY[long][:30] in fast, fast
    assert "1 passed" in full, full
