"""Ctrl-C (SIGINT to the command's whole process group, as a terminal sends it) during a sweep, a leaderboard run, a
ledger row's smoke rerun and a grading run: the command says it was interrupted and exits 130, no process it started
survives, no file is left half-written (results, cells, records and grades are whole or absent, no temporary file
stays), and the same command goes on (the sweep skips what it finished) or starts clean (its folder is still its own).
Each test starts the command as a subprocess at tiny size and interrupts it once it is working."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

psutil = pytest.importorskip("psutil")

REPO = Path(__file__).resolve().parents[1]


def _start(argv: list[str], cwd: Path, log: Path, env: dict | None = None) -> subprocess.Popen:
    # SIGINT back to its default in the child: a shell's background job (how a CI runner may start pytest) ignores
    # it, Python keeps an inherited "ignore", and a terminal's Ctrl-C would then be lost on the command under test
    return subprocess.Popen([sys.executable, "-m", "kvlab", *argv], cwd=cwd, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
                            stdout=log.open("w"), stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})


def _interrupt(proc: subprocess.Popen, log: Path, ready, *, limit: float = 40.0) -> tuple[int, str, list]:
    """Wait until ``ready()`` (the command is working), send SIGINT to its process group, wait for it to end; returns
    (exit code, its output, the processes it had started that are still alive a moment later)."""
    start = time.time()
    try:
        while not ready():
            if proc.poll() is not None:
                pytest.fail(f"the command ended before it was interrupted:\n{log.read_text()[-3000:]}")
            if time.time() - start > limit:
                pytest.fail(f"the command did not get to work within {limit} s:\n{log.read_text()[-3000:]}")
            time.sleep(0.1)
        children = psutil.Process(proc.pid).children(recursive=True)
        os.killpg(proc.pid, signal.SIGINT)
        code = proc.wait(timeout=60)
        deadline = time.time() + 5
        alive = children
        while alive and time.time() < deadline:
            alive = [c for c in alive if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
            time.sleep(0.1)
        return code, log.read_text(), alive
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # only the group this test started
            proc.wait()


def _assert_clean_exit(code: int, output: str, alive: list, command: str) -> None:
    assert code == 130, output[-3000:]
    assert f"kvlab {command}: interrupted; " in output
    assert "Traceback" not in output, output[-3000:]
    assert not alive, f"still running after Ctrl-C: {[(p.pid, p.name()) for p in alive]}"


def _only_manifest_files(folder: Path) -> None:
    """Every file in ``folder`` (and below, sub-folders with their own manifest aside) is one its command wrote and
    listed, so the same command may run there again; no temporary file is left."""
    from kvlab.outputs import MANIFEST, OutputFolder

    leftovers = [p.name for p in folder.rglob("*") if ".partial" in p.name or ".tmp" in p.name]
    assert not leftovers, f"temporary files left: {leftovers}"
    assert (folder / MANIFEST).is_file()
    OutputFolder(folder, "the same command again")  # refuses a folder holding anything it did not write


# ================================================================================================ sweep
def test_ctrl_c_during_a_sweep_keeps_whole_results_and_the_rerun_goes_on(tmp_path):
    (tmp_path / "slow_task.py").write_text(textwrap.dedent("""
        import os, time

        def wait(i):
            time.sleep(float(os.environ.get("SLOW_TASK_SECONDS", "0")))
            return {"i": i}
    """))
    (tmp_path / "grid.yaml").write_text("target: slow_task:wait\nout: out\nname: 't{i}'\ngrid: {i: [0, 1, 2, 3]}\n")
    out, log = tmp_path / "out", tmp_path / "log.txt"
    proc = _start(["sweep", "grid.yaml", "--workers", "1"], tmp_path, log, env={"SLOW_TASK_SECONDS": "1.5"})
    code, output, alive = _interrupt(proc, log, lambda: any(out.glob("t*.json")))
    _assert_clean_exit(code, output, alive, "sweep")
    finished = sorted(p.name for p in out.glob("t*.json"))
    assert 1 <= len(finished) < 4
    for path in out.glob("t*.json"):  # each result whole: it parses and holds its task's result
        record = json.loads(path.read_text())
        assert record["result"] == {"i": int(path.stem[1:])}
    # the same command goes on: the finished tasks are skipped, the others run
    again = subprocess.run([sys.executable, "-m", "kvlab", "sweep", "grid.yaml", "--workers", "1"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"{4 - len(finished)} done, {len(finished)} already done (skipped), 0 failed" in again.stdout
    assert sorted(p.name for p in out.glob("t*.json")) == ["t0.json", "t1.json", "t2.json", "t3.json"]
    _only_manifest_files(out)


# ================================================================================================ leaderboard
def test_ctrl_c_during_a_leaderboard_run_leaves_whole_cells_and_no_half_table(tmp_path):
    from kvlab.experiments import leaderboard as lb

    out, log = tmp_path / "board", tmp_path / "log.txt"
    argv = ["leaderboard", "--grid", "tiny", "--tasks", "ppl", "--methods", "Full,StreamingLLM", "--workers", "1",
            "--out", str(out)]
    proc = _start(argv, tmp_path, log)

    def working():  # the cells' folder is claimed and a worker process runs
        kids = psutil.Process(proc.pid).children(recursive=True) if proc.poll() is None else []
        return (out / "cells" / ".kvlab-outputs").is_file() and len(kids) >= 1

    code, output, alive = _interrupt(proc, log, working)
    _assert_clean_exit(code, output, alive, "leaderboard")
    assert not [p.name for p in out.glob("*") if p.name.startswith(("leaderboard.", "pareto.", ".partial"))]
    for cell in (out / "cells").glob("*.json"):
        assert isinstance(json.loads(cell.read_text())["result"], dict)
    _only_manifest_files(out / "cells")
    # the folder is still the leaderboard's: a table from the finished cells (maybe none) is written without a run
    report, rows = lb.run_leaderboard("tiny", out, tasks=["ppl"], methods=["Full", "StreamingLLM"], run=False,
                                      progress=False)
    assert not report.failed and len(rows) == len(list((out / "cells").glob("*.json")))
    assert (out / "leaderboard.csv").is_file() == bool(rows)


# ================================================================================================ claims --rerun
def test_ctrl_c_during_a_smoke_rerun_of_a_ledger_row_leaves_no_partial_records(tmp_path):
    from kvlab.experiments import records

    out, log = tmp_path / "rerun", tmp_path / "log.txt"
    proc = _start(["claims", "--rerun", "sepllm-t3-attention-map", "--smoke", "--out", str(out)], REPO, log)
    began = []

    def working():  # the experiment has started (its command is printed first) and has been at it a moment
        if not began and "python -m kvlab run" in log.read_text():
            began.append(time.time())
        return bool(began) and time.time() - began[0] > 1.0

    code, output, alive = _interrupt(proc, log, working)
    _assert_clean_exit(code, output, alive, "claims")
    assert not (out / "rerun.json").exists()  # the comparison is written only after a whole run
    if out.exists():
        for path in out.glob(f"*{records.SUFFIX}"):
            records.read(path)  # whole: every line a checked record
        _only_manifest_files(out)


# ================================================================================================ lessons grade
def _one_built_lesson(tmp_path: Path):
    """Lesson 01 as ``make`` builds it: the session's build where this process has one, else built here."""
    try:
        import test_lessons

        built = test_lessons._BUILT.get("01_streaming_llm")
    except (ImportError, AttributeError):
        built = None
    if built is None:
        from kvlab.classroom.lessons import make

        built = make(["01"], out=tmp_path / "built")[0]
    return built


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="grading runs each submission in a bubblewrap sandbox")
def test_ctrl_c_during_grading_stops_every_child_and_writes_no_grade_file(tmp_path):
    assignment = _one_built_lesson(tmp_path)
    subs = tmp_path / "subs"
    subs.mkdir()
    shutil.copy(assignment.solutions, subs / "master.ipynb")
    shutil.copy(assignment.student, subs / "student.ipynb")
    built = assignment.autograder.parent.parent.parent
    out, log = tmp_path / "grades", tmp_path / "log.txt"
    proc = _start(["lessons", "grade", "01", str(subs), "--built", str(built), "--out", str(out), "--jobs", "2"],
                  tmp_path, log)

    def grading():  # sandboxed children are running the submissions
        return proc.poll() is None and len(psutil.Process(proc.pid).children(recursive=True)) >= 2

    code, output, alive = _interrupt(proc, log, grading)
    _assert_clean_exit(code, output, alive, "lessons")
    written = [p.name for p in out.rglob("*") if p.name != ".kvlab-outputs"] if out.exists() else []
    assert not written, f"an interrupted grading wrote {written}"
    if out.exists():
        _only_manifest_files(out)
