"""``python -m kvlab run tests --tests tests/test_x.py[,tests/test_y.py::name]``: the ledger's exact rows, re-run.

An *exact* row of the claims ledger (a masking policy, the four-block mask) is an identity that named tests check.
This runs pytest on those tests in a subprocess (``--device cpu`` hides the GPUs from it) and writes into ``--out``:

    tests.examples.jsonl.gz   one record per test: example = its node id, metric ``passed`` (1 or 0)
    junit.xml, pytest.log     pytest's own report and output
    summary.json              how many passed, failed, were skipped; the command

It fails (exit 1) when a test fails. ``--smoke`` collects the same tests (``--collect-only``): every one named must
exist and import, in seconds; its records say ``collected``.
"""
from __future__ import annotations

import argparse
import difflib
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from kvlab.experiments import records, registry
from kvlab.outputs import OutputFolder

NAME = "tests"
ROOT = Path(__file__).resolve().parents[3]
RECORDS = NAME + records.SUFFIX
OUTPUTS = (RECORDS, "junit.xml", "pytest.log", "summary.json")


def parser():
    p = registry.experiment_parser(NAME, __doc__.split("\n\n")[0])
    p.add_argument("--tests", required=True, type=_test_list,
                   help="comma list of test files or tests: tests/test_x.py, tests/test_x.py::test_name")
    return p


def _test_list(text: str) -> list[str]:
    items = [t.strip() for t in str(text).split(",") if t.strip()]
    if not items:
        raise argparse.ArgumentTypeError("empty list; give one or more of tests/test_x.py[::name]")
    return items


def check(args) -> None:
    """Every named test file exists under tests/ and every named test is defined in it; nothing is run."""
    for item in args.tests:
        file, _, name = item.partition("::")
        path = ROOT / file
        if not (file.startswith("tests/") and Path(file).name.startswith("test_") and path.is_file()):
            known = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "tests").glob("test_*.py"))
            near = difflib.get_close_matches(file, known, n=1, cutoff=0.6)
            raise registry.ParameterError(f"--tests {item!r}: no test file {file} (a tests/test_*.py of this "
                                          "repository)" + (f"; did you mean {near[0]!r}?" if near else ""))
        func = re.sub(r"\[.*\]$", "", name.split("::")[-1])
        if func and not re.search(rf"^\s*(async\s+)?def {re.escape(func)}\(|^class {re.escape(func)}\b",
                                  path.read_text(encoding="utf-8"), re.M):
            raise registry.ParameterError(f"--tests {item!r}: {file} defines no test {func!r}")
    from kvlab.experiments.system.options import check_device, refuse_rerun

    check_device(args.device)
    refuse_rerun(args.out, *OUTPUTS)


def _outcomes(junit: Path) -> dict[str, str]:
    """Node id -> passed / failed / skipped, from pytest's junit report."""
    found = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        parts = case.get("classname", "").split(".")  # tests.test_x[.TestClass]
        cut = next((i for i in range(len(parts), 0, -1) if (ROOT / ("/".join(parts[:i]) + ".py")).is_file()), 1)
        node = "::".join(["/".join(parts[:cut]) + ".py", *parts[cut:], case.get("name", "")])
        kinds = {child.tag for child in case}
        found[node] = "failed" if kinds & {"failure", "error"} else "skipped" if "skipped" in kinds else "passed"
    return found


def _collected(log: str) -> dict[str, str]:
    return {line.strip(): "collected" for line in log.splitlines() if "::" in line and not line.startswith(" ")}


def run(args) -> list[Path]:
    from kvlab.experiments.system.options import device_string, resolve_device, write_json

    out = OutputFolder(args.out, f"python -m kvlab run {NAME}")
    junit, log_path = out.claim("junit.xml"), out.claim("pytest.log")
    command = [sys.executable, "-m", "pytest", *args.tests, "-q", "-p", "no:cacheprovider", f"--junitxml={junit}"]
    command += ["--collect-only"] if args.smoke else []
    device = resolve_device(args.device)
    env = {**os.environ, **({"CUDA_VISIBLE_DEVICES": ""} if device == "cpu" else {})}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    log_path.write_text(done.stdout + done.stderr, encoding="utf-8")
    outcomes = _collected(done.stdout) if args.smoke else _outcomes(junit)
    config = {"tests": args.tests, "smoke": args.smoke}
    recs = [records.record(node, "pytest", "collected" if args.smoke else "passed", float(state != "failed"),
                           config=config, device=device_string(device), outcome=state)
            for node, state in sorted(outcomes.items())]
    if not recs:
        raise SystemExit(f"kvlab run {NAME}: pytest ran no test of {args.tests} (exit {done.returncode}); see "
                         f"{log_path}")
    written = [records.write(RECORDS, recs, out=out)]
    counts = {k: sum(1 for s in outcomes.values() if s == k) for k in ("passed", "failed", "skipped", "collected")}
    written += [write_json(out, "summary.json", {"command": " ".join(command[1:]), "exit": done.returncode,
                                                 **counts}), junit, log_path]
    if done.returncode != 0:
        raise SystemExit(f"kvlab run {NAME}: pytest exited {done.returncode} ({counts['failed']} failed); see "
                         f"{log_path}")
    return written
