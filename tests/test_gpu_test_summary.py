"""The committed GPU test run (``benchmarks/results/gpu_tests/summary.json``, written by
``benchmarks/gpu/gpu_tests.sh``) finished green: every set ran on a GPU, none was stopped by its limit, none failed.

A GPU run that fails or is cut off must not sit in the repository unnoticed: this CPU test reads what the run
wrote, so a red or partial run makes the CPU suite red until a green one is committed.
"""
from __future__ import annotations

import json
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
SUMMARY = ROOT / "benchmarks" / "results" / "gpu_tests" / "summary.json"
SETS = ("static_engine", "triton", "cuda")


def summary_problems(summary: dict) -> list[str]:
    """Why a GPU test summary does not show a complete green run (empty: it does)."""
    problems = []
    if summary.get("smoke"):
        problems.append("the summary is of a SMOKE=1 run (CPU, interpreter), not of a GPU run")
    device = str(summary.get("device", ""))
    if "NVIDIA" not in device:
        problems.append(f"the run names no NVIDIA device (device.txt: {device!r})")
    sets = summary.get("sets") or {}
    for name in SETS:
        s = sets.get(name)
        if s is None:
            problems.append(f"set {name!r} did not run")
            continue
        if s.get("stopped"):
            problems.append(f"set {name!r} was stopped by its limit ({s.get('limit_s')} s) after {s.get('seconds')} s")
        if s.get("exit") != 0:
            problems.append(f"set {name!r} ended with exit code {s.get('exit')}")
        for key in ("failed", "errors"):
            if s.get(key) is None or s.get(key) > 0:
                problems.append(f"set {name!r}: {key} = {s.get(key)}")
        if not s.get("passed"):
            problems.append(f"set {name!r}: no test passed ({s.get('passed')})")
    return problems


def test_committed_gpu_test_run_is_complete_and_green():
    assert SUMMARY.exists(), (f"no {SUMMARY.relative_to(ROOT)}: run `bash benchmarks/gpu/run.sh TAG gpu_tests=2700` "
                              "on a GPU host and commit benchmarks/results/gpu_tests/")
    problems = summary_problems(json.loads(SUMMARY.read_text()))
    assert not problems, "the committed GPU test run is not green:\n" + "\n".join(problems)


@pytest.mark.parametrize("change, expected", [
    (lambda s: s["sets"]["triton"].update(stopped=True, exit=124), "stopped by its limit"),
    (lambda s: s["sets"]["triton"].update(failed=13, exit=1), "failed = 13"),
    (lambda s: s["sets"].pop("cuda"), "'cuda' did not run"),
    (lambda s: s.update(smoke=True), "SMOKE=1"),
])
def test_summary_check_catches_a_red_or_partial_run(change, expected):
    good = {"device": "torch 2.11 triton 3.6 device NVIDIA H100 80GB HBM3", "smoke": False,
            "sets": {n: {"exit": 0, "seconds": 100, "limit_s": 600, "stopped": False, "tests": 40, "passed": 40,
                         "failed": 0, "errors": 0, "skipped": 0} for n in SETS}}
    assert summary_problems(good) == []
    change(good)
    assert any(expected in p for p in summary_problems(good))
