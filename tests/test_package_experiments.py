"""The package-wide experiments behind the ledger's exact and notebook rows (``python -m kvlab run tests|notebook|
peers``) and the notebook tools' command line (``python -m kvlab notebooks ...``): every option checked before any
work, records in the one format, a second run into the same folder refused."""
from __future__ import annotations

import json

import pytest

from kvlab.experiments import records, registry

QUICK = "tests/test_complexity.py::test_the_check_reads_real_complexity"


def _run(name, *argv):
    return registry.run(name, list(argv), raise_errors=True)


def test_tests_runs_the_named_tests_and_writes_one_record_each(tmp_path):
    out = tmp_path / "t"
    written = _run("tests", "--tests", QUICK, "--out", str(out), "--device", "cpu")
    assert written[0].name == "tests.examples.jsonl.gz"
    (rec,) = records.read(written[0])
    assert rec["example"] == QUICK and rec["metric"] == "passed" and rec["value"] == 1.0
    assert rec["config"]["tests"] == [QUICK] and rec["config"]["device"] == "cpu"
    assert json.loads((out / "summary.json").read_text())["passed"] == 1
    with pytest.raises(registry.ParameterError, match="is there already"):  # never replaced silently
        _run("tests", "--tests", QUICK, "--out", str(out))


def test_tests_smoke_collects_the_same_tests(tmp_path):
    written = _run("tests", "--tests", "tests/test_complexity.py", "--smoke", "--out", str(tmp_path / "s"))
    recs = records.read(written[0])
    assert {r["metric"] for r in recs} == {"collected"} and QUICK in {r["example"] for r in recs}


@pytest.mark.parametrize("tests, message", [
    ("tests/test_complexty.py", "no test file tests/test_complexty.py.*did you mean 'tests/test_complexity.py'"),
    ("tests/test_complexity.py::test_nothing_like_it", "defines no test 'test_nothing_like_it'"),
    ("benchmarks/claims.csv", "no test file"),
])
def test_tests_refuses_a_test_that_is_not_there(tmp_path, tests, message):
    with pytest.raises(registry.ParameterError, match=message):
        registry.check_all("tests", ["--tests", tests, "--out", str(tmp_path / "o")], raise_errors=True)
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("argv, message", [
    (["--notebook", "99"], "no such notebook"),
    (["--notebook", "0"], "matches .*give one"),
    (["--notebook", "00", "--params", "full"], "has no notebooks/params/00_tour.full.yaml"),
    (["--notebook", "04", "--params", "huge"], "invalid choice"),
    (["--notebook", "04", "--runner", "jupyter"], "invalid choice"),
])
def test_notebook_refuses_a_notebook_or_set_that_is_not_there(tmp_path, argv, message):
    with pytest.raises(registry.ParameterError, match=message):
        registry.check_all("notebook", [*argv, "--out", str(tmp_path / "o")], raise_errors=True)
    assert not (tmp_path / "o").exists()


def test_notebook_smoke_takes_the_ci_set(tmp_path):
    _, args = registry.check_all("notebook", ["--notebook", "04_sepllm_training", "--params", "full", "--smoke",
                                              "--out", str(tmp_path / "o")], raise_errors=True)
    assert args.params == "ci" and args.path.name == "04_sepllm_training.ipynb" and args.device == "cpu"


def test_the_ledger_rows_of_the_package_experiments_check(tmp_path):
    """The configurations of the ledger's test, notebook and peer rows are options these experiments take."""
    rows = {"sepllm-mask-policy": ("tests", {"tests": ["tests/test_sepllm_mechanism.py"]}),
            "sepllm-training-curves": ("notebook", {"notebook": "04_sepllm_training", "params": "full",
                                                    "runner": "plain"}),
            "dhsa-eq4": ("notebook", {"notebook": "07_dhsa_chunks", "params": "full"}),  # its 4000 bias trials
            "kvpress-same-positions": ("peers", {})}
    for row, (name, config) in rows.items():
        argv = registry.config_argv(config) + ["--smoke", "--out", str(tmp_path / row)]
        registry.check_all(name, argv, raise_errors=True)


def test_notebooks_command_line_dispatches_and_names_an_unknown_command(capsys):
    from kvlab.notebooks import cli

    assert cli.main(["--help"]) == 0 and "prepare" in capsys.readouterr().out
    assert cli.main(["prepar"]) == 2 and "unknown command 'prepar'" in capsys.readouterr().err
