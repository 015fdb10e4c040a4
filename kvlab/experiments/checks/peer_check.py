"""``python -m kvlab run peers``: the kvpress peer check, kvlab's presses against NVIDIA kvpress's kept positions.

kvpress needs an older transformers than kvlab pins, so the check runs in its own environment, ``.venv-peers``,
made (once) by ``scripts/peers.sh``; this runs that script and keeps pytest's report. Into ``--out``:

    peers.examples.jsonl.gz   one record per test of tests/test_peers.py: metric ``passed`` (1 or 0)
    junit.xml, peers.log      pytest's report and the script's output

It fails (exit 1) when a test fails. ``--smoke`` collects tests/test_peers.py in this environment (no kvpress
needed: the tests that need it are skipped there), in seconds.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

from kvlab.experiments import records, registry
from kvlab.experiments.checks import pytest_run
from kvlab.outputs import OutputFolder

NAME = "peers"
ROOT = pytest_run.ROOT
RECORDS = NAME + records.SUFFIX
TESTS = "tests/test_peers.py"


def parser():
    return registry.experiment_parser(NAME, __doc__.split("\n\n")[0])


def check(args) -> None:
    from kvlab.experiments.system.options import check_device, refuse_rerun

    check_device(args.device)
    refuse_rerun(args.out, RECORDS, "junit.xml", "peers.log")


def run(args) -> list[Path]:
    import sys

    from kvlab.experiments.system.options import device_string, resolve_device

    out = OutputFolder(args.out, f"python -m kvlab run {NAME}")
    junit, log_path = out.claim("junit.xml"), out.claim("peers.log")
    device = resolve_device(args.device)
    env = {**os.environ, **({"CUDA_VISIBLE_DEVICES": ""} if device == "cpu" else {})}
    if args.smoke:
        command = [sys.executable, "-m", "pytest", TESTS, "-q", "-p", "no:cacheprovider", "--collect-only"]
    else:
        command = ["bash", "scripts/peers.sh", f"--junitxml={junit}"]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    log_path.write_text(done.stdout + done.stderr, encoding="utf-8")
    outcomes = pytest_run._collected(done.stdout) if args.smoke else pytest_run._outcomes(junit)
    if args.smoke and not outcomes and done.returncode in (0, 5):  # kvpress absent here: the module skips itself
        outcomes, done.returncode = {TESTS: "skipped"}, 0
    config = {"smoke": args.smoke}
    recs = [records.record(node, "kvlab vs kvpress", "collected" if args.smoke else "passed",
                           float(state != "failed"), config=config, device=device_string(device), outcome=state)
            for node, state in sorted(outcomes.items())]
    if not recs or done.returncode != 0:
        raise SystemExit(f"kvlab run {NAME}: {' '.join(command)} exited {done.returncode} with {len(recs)} tests; "
                         f"see {log_path}")
    return [records.write(RECORDS, recs, out=out), junit, log_path]
