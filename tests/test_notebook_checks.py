"""Checked notebook cells hold across machines: numbers compared with a stated tolerance (scripts/nbcheck.py).

The last test re-runs a checked notebook with one CPU thread (CI records the checks with two) and compares its
checked cells with the recorded ones: a check that only holds for one thread count fails here, not on the next
machine.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import nbformat
import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import nbcheck  # noqa: E402
import notebooks as nbscript  # noqa: E402


@pytest.mark.parametrize("expected, found", [
    ("answer NLL 0.846\n", "answer NLL 0.842\n"),  # the case a fresh machine hit
    ("ppl 41.243", "ppl 41.250"),
    ("share -90%", "share -91%"),
    ("n=1140", "n=1141"),
    ("  dense   37.243\n", "  dense    37.243\n"),  # a column that moved by one space
    ("1.5e-03", "1.51e-03"),
])
def test_numbers_within_tolerance_agree(expected, found):
    ok, why = nbcheck.texts_agree(expected, found)
    assert ok, why


@pytest.mark.parametrize("expected, found, reason", [
    ("accuracy 0.50", "accuracy 0.75", "number 1"),
    ("n=1140", "n=1160", "number 1"),
    ("dense 37.2", "sparse 37.2", "text differs"),
    ("0.1 0.2", "0.1 0.2 0.3", "numbers expected"),
    ("loss nan", "loss 1.0", "number 1"),
])
def test_real_differences_still_fail(expected, found, reason):
    ok, why = nbcheck.texts_agree(expected, found)
    assert not ok and reason in why


def _run_nbval(tmp_path: pathlib.Path, source: str, recorded: str) -> subprocess.CompletedProcess:
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell(source)
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=recorded)]
    cell.execution_count = 1
    nb.cells = [cell]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, tmp_path / "check.ipynb")
    (tmp_path / "conftest.py").write_text(nbscript.CONFTEST)
    return subprocess.run([sys.executable, "-m", "pytest", str(tmp_path), "--nbval-lax", "--nbval-current-env",
                           "-q", "-p", "no:cacheprovider"], capture_output=True, text=True, cwd=tmp_path,
                          timeout=300)


def test_nbval_uses_the_tolerance(tmp_path):
    """Through nbval itself: a last-digit difference passes, a real one fails with the reason."""
    ok = _run_nbval(tmp_path, "# NBVAL_CHECK_OUTPUT\nprint(f'answer NLL {0.8461:.3f}')", "answer NLL 0.842\n")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    bad = _run_nbval(tmp_path, "# NBVAL_CHECK_OUTPUT\nprint(f'accuracy {0.75:.2f}')", "accuracy 0.50\n")
    assert bad.returncode != 0 and "numbers compared with tolerance" in bad.stdout, bad.stdout


# The notebook whose check failed on a fresh machine (answer NLL 0.842 vs 0.846); CI records it with 2 threads.
THREAD_CHECK = "07_dhsa_chunks.ipynb"


@pytest.mark.skipif(not (ROOT / "notebooks" / THREAD_CHECK).exists(), reason="notebook not present")
def test_checked_cells_hold_with_one_thread(tmp_path):
    """Re-run a checked notebook with num_threads=1 and compare every checked cell with the recorded output."""
    recorded = json.loads((ROOT / "notebooks" / THREAD_CHECK.replace(".ipynb", ".checks.json")).read_text())
    assert nbscript._parameters(ROOT / "notebooks" / THREAD_CHECK).get("num_threads") != 1, \
        "the recorded run must use another thread count than this test"
    out = tmp_path / "run.ipynb"
    import papermill
    params = {**nbscript._parameters(ROOT / "notebooks" / THREAD_CHECK), "num_threads": 1}
    env_before = os.environ.get("TRITON_INTERPRET")
    papermill.execute_notebook(str(ROOT / "notebooks" / THREAD_CHECK), str(out), parameters=params,
                               kernel_name="python3", cwd=str(ROOT / "notebooks"), progress_bar=False)
    assert os.environ.get("TRITON_INTERPRET") == env_before
    nb = nbformat.read(out, as_version=4)
    cells = [c for c in nb.cells if c.cell_type == "code" and c.source.lstrip().startswith(nbscript.MARK)]
    assert len(cells) == len(recorded)
    for i, (cell, expected) in enumerate(zip(cells, recorded)):
        found = "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")
        ok, why = nbcheck.texts_agree(expected, found)
        assert ok, f"checked cell {i + 1} of {THREAD_CHECK} with one thread: {why}\n--- recorded\n{expected}--- found\n{found}"
