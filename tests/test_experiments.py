"""Every experiment of the registry runs at smoke size, and every live ledger row names one that can rerun it.

``python -m kvlab claims --rerun ROW --smoke`` is run (in-process) for one row of each distinct experiment: the
row's configuration is accepted by the experiment, the run writes only inside its output folder, its records follow
the one schema, and the row can be recomputed from them (the records hold the row's methods and metric).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvlab.experiments import claims, ledger_cli, records, registry, rerun

ROWS = claims.load()
LIVE = [r for r in ROWS if not r["superseded"].strip()]


def _first_row_per_experiment() -> dict[str, dict]:
    first: dict[str, dict] = {}
    for r in LIVE:
        if r["experiment"].strip():
            key = r["experiment"].strip()  # one row per distinct run list ("a" or "a;b")
            first.setdefault(key, r)
    return first


FIRST = _first_row_per_experiment()


def test_every_ledger_experiment_is_registered_and_its_config_is_json():
    for r in ROWS:
        if r["experiment"].strip():
            runs = rerun.plan(r)  # raises for an unknown experiment or a config that is not JSON
            assert runs and all(isinstance(c, dict) for _, c in runs)


def test_every_live_measured_row_names_its_experiment():
    """A live row with results (statistical, exact) is rerun by one command; the others say why they cannot be."""
    missing = sorted(r["id"] for r in LIVE if r["kind"] == "statistical" and not r["experiment"].strip())
    assert not missing, (f"live statistical rows with no experiment: {missing}; write each row's experiment and "
                         "config columns in benchmarks/claims.csv, so that `claims --rerun ROW` reruns it")
    for r in LIVE:
        if r["kind"] == "exact":
            assert rerun.plan(r)


def test_ledger_configs_pass_every_experiments_checks(monkeypatch):
    """Every live row's configuration is accepted as options, before anything runs (no model, no file). A row
    measured on a GPU is checked as on the machine it names: here CUDA reads as present, so a CPU machine checks
    the rest of its options instead of stopping at "this machine has no CUDA device"."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for r in LIVE:
        if not r["experiment"].strip():
            continue
        for name, config in rerun.plan(r):
            registry.check_all(name, registry.config_argv(config) + ["--out", "build/never-written"],
                               raise_errors=True)


def _models_not_fetched(row: dict) -> list[str]:
    """Models a row's smoke run needs the tokenizer of (its configs' ``model``) that are not in the asset cache: a
    smoke run keeps the row's tokenizer (method names hold windows computed from it), and fetching a 1 GB model
    inside the test suite is not a smoke test. The README's lab command fetches the defaults."""
    from kvlab.assets.integrity import asset_path
    from kvlab.assets.registry import list_assets

    names = {c.get("model") for _, c in rerun.plan(row)} - {None}
    return sorted(n for n in names if n in list_assets() and not asset_path(n).exists())


@pytest.mark.parametrize("name", sorted(FIRST))
def test_rerun_smoke_for_each_experiment(name, tmp_path, capsys):
    row = FIRST[name]
    missing = _models_not_fetched(row)
    if missing:
        pytest.skip(f"{row['id']}'s smoke run needs the tokenizer of {missing} (`python -m kvlab fetch NAME`)")
    out = tmp_path / "rerun"
    report = rerun.rerun(row["id"], out=out, smoke=True, rows=ROWS)
    assert report["written"], f"{name} wrote nothing"
    for path in map(Path, report["written"]):
        assert out in path.parents or path == out, f"{name} wrote {path} outside its --out {out}"
        if path.name.endswith(records.SUFFIX):
            recs = records.read(path)
            assert recs and all("device" in rec["config"] for rec in recs)
    if row["kind"] == "statistical":
        assert int(report["rerun"]["n"]) >= 1, report
    assert json.loads((out / "rerun.json").read_text())["row"] == row["id"]


USED = {n.strip() for key in FIRST for n in key.split(";")}


@pytest.mark.parametrize("name", sorted(set(registry.EXPERIMENTS) - USED))
def test_smoke_run_of_experiments_no_row_uses(name, tmp_path):
    written = registry.run(name, ["--smoke", "--out", str(tmp_path / "out")], raise_errors=True)
    assert written
    assert all(tmp_path in Path(p).parents for p in written)


def test_rerun_refuses_unknown_row_and_row_without_experiment():
    with pytest.raises(rerun.RerunError, match="did you mean"):
        rerun.rerun(LIVE[0]["id"] + "x", rows=ROWS)
    bare = {**dict.fromkeys(claims.FIELDS, ""), "id": "t-none", "kind": "summary", "command": "read off a figure"}
    with pytest.raises(rerun.RerunError, match="names no experiment.*read off a figure"):
        rerun.plan(bare)


def test_rerun_refuses_a_config_the_experiment_refuses(tmp_path):
    name = next(iter(FIRST), None)
    if name is None:
        pytest.skip("no ledger row names an experiment yet")
    row = {**FIRST[name], "config": json.dumps({"no_such_option": 1})}
    with pytest.raises(rerun.RerunError, match="refused by experiment"):
        rerun.rerun(row["id"], out=tmp_path / "o", smoke=True, rows=[row])
    assert not (tmp_path / "o").exists()  # nothing ran, nothing was written


def test_claims_cli_rerun_options_need_a_row(capsys):
    with pytest.raises(SystemExit):
        ledger_cli.main(["--smoke"])
    assert "go with --rerun" in capsys.readouterr().err
