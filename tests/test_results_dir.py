"""The committed results: kvlab.results_dir finds them (from the notebooks' folder or CI's copy under build/), and
they stay small data: at most TOPIC/RUN/FILE deep, records gzip-compressed, every ledger file there, the tracked tree
at most 20 MB (what a GPU call has left for a model: benchmarks/gpu/README.md)."""

import csv
import json
import subprocess
from pathlib import Path

import pytest

import kvlab


def test_found_from_the_notebooks_folder_and_from_a_copy_below_build(monkeypatch, tmp_path):
    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    for where in (tmp_path / "notebooks", tmp_path / "build" / "notebooks"):
        where.mkdir(parents=True)
        monkeypatch.chdir(where)
        assert kvlab.results_dir("dhsa", "x.json") == (tmp_path / "benchmarks" / "results" / "dhsa" / "x.json").resolve()


def test_environment_variable_wins_and_a_missing_folder_says_how_to_fix(monkeypatch, tmp_path):
    monkeypatch.setenv("KVLAB_RESULTS", str(tmp_path))
    assert kvlab.results_dir("a") == tmp_path / "a"
    monkeypatch.delenv("KVLAB_RESULTS")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match="KVLAB_RESULTS"):
        kvlab.results_dir()


# ------------------------------------------------------------------------------ the committed results as small data
ROOT = Path(__file__).resolve().parents[1]
RESULTS = "benchmarks/results/"
MAX_TREE_BYTES = 20_000_000  # a GPU call carries 64 MiB: the tree leaves the rest for a model (benchmarks/gpu/README.md)


def _tracked() -> list[str]:
    """The tracked files that exist in the work tree (a file deleted but not yet committed is not counted)."""
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [f for f in out.decode().split("\0") if f and (ROOT / f).is_file()]


def test_results_are_at_most_three_levels_deep():
    deep = [f for f in _tracked() if f.startswith(RESULTS) and len(f[len(RESULTS):].split("/")) > 3]
    assert not deep, (f"{len(deep)} files below {RESULTS} are deeper than TOPIC/RUN/FILE, e.g. {deep[:5]}: name the "
                      "run folder after its parents (leaderboard/gpus_seeds3_one_gpu/) or pack a folder of records into "
                      "one file, and list the move in benchmarks/results/README.md")


def test_every_ledger_results_file_exists():
    with (ROOT / "benchmarks" / "claims.csv").open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    # a plan awaiting its run (kind "not run" with a planned n, committed before the data) names the file to come
    waiting = {r["id"] for r in rows if r["kind"] == "not run" and r["planned_n"].strip()}
    missing = [(r["id"], p.strip()) for r in rows for p in r["results_file"].split(";")
               if p.strip() and r["id"] not in waiting and not (ROOT / p.strip()).exists()]
    assert not missing, f"ledger rows name results files that are not there: {missing[:5]}"


def test_no_uncompressed_records_are_tracked():
    plain = [f for f in _tracked() if f.endswith(".examples.jsonl")]
    assert not plain, (f"{plain[:5]}: per-example records are committed gzip-compressed in the one format "
                       "(kvlab.experiments.records.write(NAME.examples.jsonl.gz, ...))")


def test_tracked_tree_is_at_most_20_mb():
    files = _tracked()
    total = sum((ROOT / f).stat().st_size for f in files)
    largest = sorted(files, key=lambda f: -(ROOT / f).stat().st_size)[:5]
    assert total <= MAX_TREE_BYTES, (f"the tracked tree is {total / 1e6:.1f} MB (at most {MAX_TREE_BYTES / 1e6:.0f}): "
                                     f"compress or leave out build outputs; the largest files are {largest}")


def test_a_committed_leaderboard_run_reads_its_packed_cells(tmp_path):
    """A committed run keeps its cells in one cells.jsonl.gz; --report-only reads them as it reads cells/*.json, and
    pack_cells writes the same file back from the cell files."""
    from kvlab.experiments import leaderboard

    committed = ROOT / RESULTS / "leaderboard" / "default"
    rows = leaderboard.collect(committed)
    with (committed / "leaderboard.csv").open(newline="") as f:
        assert len(rows) == len(list(csv.DictReader(f))) > 0
    (tmp_path / "cells").mkdir()
    for name, _, rec in leaderboard._packed_cells(committed):
        (tmp_path / "cells" / f"{name}.json").write_text(json.dumps(rec))
    assert leaderboard.collect(tmp_path) == rows
    packed = leaderboard.pack_cells(tmp_path, tmp_path / "again")
    assert packed.read_bytes() == (committed / leaderboard.CELLS_PACK).read_bytes()
