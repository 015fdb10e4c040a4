"""The leaderboard's grid options for sizing a multi-GPU run, and the report that compares a 1-GPU run with a
2-GPU run (`python -m kvlab leaderboard scaling report`): cells per device from the records, identical cells, differences."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvlab.experiments.leaderboard import GRIDS, cell_tasks, sized_grid

ROOT = Path(__file__).resolve().parents[1]


def test_sized_grid_subsets_models_and_sets_examples():
    spec = sized_grid("full", models=["smollm2-135m"], examples=4)
    assert spec["models"] == ["smollm2-135m"] and spec["examples"] == 4
    assert GRIDS["full"]["examples"] == 2 and len(GRIDS["full"]["models"]) == 2  # the named grid is untouched
    cells = cell_tasks(sized_grid("tiny", examples=3), methods=("Full",), tasks=("passkey",))
    assert [c.params["examples"] for c in cells] == [3]


def test_seeds_replicate_every_cell_under_its_own_name():
    one = cell_tasks(sized_grid("tiny"), methods=("Full", "H2O"), tasks=("ppl", "passkey"))
    three = cell_tasks(sized_grid("tiny", seeds=[0, 1, 2]), methods=("Full", "H2O"), tasks=("ppl", "passkey"))
    assert len(three) == 3 * len(one) and len({t.name for t in three}) == len(three)
    assert {t.name for t in one} <= {t.name for t in three}  # seed 0 keeps the committed cells' names
    assert sorted({t.params["seed"] for t in three}) == [0, 1, 2]


def test_leaderboard_cli_refuses_bad_seeds(capsys):
    from kvlab.experiments.leaderboard import main

    assert main(["--seeds", "0,x", "--report-only"]) == 2
    assert "--seeds must be comma-separated whole numbers" in capsys.readouterr().err


@pytest.mark.parametrize("kw, words", [(dict(models=["llama-70b"]), "subset of this grid's models"),
                                       (dict(seeds=[]), "seeds must be a non-empty list"),
                                       (dict(seeds=[0, 0]), "distinct ints"),
                                       (dict(seeds=[-1]), "ints >= 0"),
                                       (dict(models=[]), "non-empty subset"),
                                       (dict(examples=0), "examples must be an int >= 1"),
                                       (dict(examples=True), "examples must be an int >= 1")])
def test_sized_grid_refuses_bad_sizes(kw, words):
    with pytest.raises(ValueError, match=words):
        sized_grid("full", **kw)


def _cells(folder: Path, results: dict, devices: dict):
    (folder / "cells").mkdir(parents=True)
    for i, (name, result) in enumerate(results.items()):
        rec = dict(name=name, key=f"k{name}", result=result, started=1000.0 + i, wall_seconds=2.0,
                   worker=dict(host="h", pid=1, cuda_visible_devices=devices[name]))
        (folder / "cells" / f"{name}.json").write_text(json.dumps(rec))


def _report(*runs, extra=()):
    return subprocess.run([sys.executable, "-m", "kvlab", "leaderboard", "scaling", "report", *extra,
                           *[a for r in runs for a in ("--run", r)]], capture_output=True, text=True)


def test_report_counts_cells_per_device_and_finds_identical_cells(tmp_path):
    results = {"a": {"ppl": 17.1}, "b": {"ppl": 18.0}, "c": {"accuracy": 0.5}}
    _cells(tmp_path / "one", results, {"a": "0", "b": "0", "c": "0"})
    _cells(tmp_path / "two", results, {"a": "0", "b": "1", "c": "1"})
    r = _report(f"1 GPU={tmp_path / 'one'}:40", f"2 GPUs={tmp_path / 'two'}:20")
    assert r.returncode == 0, r.stderr
    row = next(line for line in r.stdout.splitlines() if line.startswith("| 2 GPUs"))
    assert "2.00x" in row and "GPU 0: 1, GPU 1: 2" in row and "yes, all" in row


def test_report_fails_on_a_changed_number_or_a_missing_cell(tmp_path):
    _cells(tmp_path / "one", {"a": {"ppl": 17.1}, "b": {"ppl": 18.0}}, {"a": "0", "b": "0"})
    _cells(tmp_path / "two", {"a": {"ppl": 17.100001}}, {"a": "1"})
    r = _report(f"1 GPU={tmp_path / 'one'}:40", f"2 GPUs={tmp_path / 'two'}:20")
    assert r.returncode == 1
    assert "missing: b" in r.stdout and "a: result differs in ppl" in r.stdout
    sub = _report(f"1 GPU={tmp_path / 'one'}:40", f"2 GPUs={tmp_path / 'two'}:20", extra=("--subset",))
    assert sub.returncode == 1 and "missing" not in sub.stdout  # a subset run: only the changed number counts
