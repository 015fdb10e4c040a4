"""kvlab.results_dir: notebooks find the committed results from their own folder or CI's copy under build/."""

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
