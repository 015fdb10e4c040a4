"""The suite's time guard (``--max-test-seconds``, set by scripts/test.sh): a test over the limit fails the run."""
import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def _run(tmp_path, limit):
    (tmp_path / "test_probe.py").write_text("import time\n\ndef test_slow():\n    time.sleep(1.2)\n\n"
                                            "def test_fast():\n    pass\n")
    env = {**os.environ, "PYTHONPATH": str(TESTS) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "conftest",
                           "-c", os.devnull, "--rootdir", str(tmp_path), str(tmp_path / "test_probe.py"),
                           "--max-test-seconds", str(limit)], capture_output=True, text=True, env=env)


def test_a_test_over_the_limit_fails_the_run_and_is_named(tmp_path):
    r = _run(tmp_path, 0.5)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "1 test(s) took more than 0.5 s" in r.stdout
    assert "test_probe.py::test_slow" in r.stdout and "test_fast" not in r.stdout.split("took more than")[1]


def test_under_the_limit_the_run_passes(tmp_path):
    r = _run(tmp_path, 30)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "took more than" not in r.stdout
