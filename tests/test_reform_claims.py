"""REFORM claims runs: the code-completion set asks distinct questions, the claims plan's units and the
key-value retrieval rule (the whole value, not its first 16 characters)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from kvlab.eval import tasks as T
from kvlab.eval.tasks import task_score

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def tok():
    from kvlab.models import load_tokenizer

    return load_tokenizer("smollm2-135m")


@pytest.fixture(scope="module")
def reruns():
    from kvlab.experiments.reform import reruns

    return reruns


def test_seeds_alone_repeat_targets_and_repo_targets_does_not(tok):
    by_seed = {T.repo_task(tok, 8192, seed=s).answer.strip() for s in range(20)}
    assert len(by_seed) < 20  # the old set: seeds draw uses with replacement
    uses = T.repo_targets(tok, 8192, 12, package="click")
    answers = [T.repo_task(tok, 8192, seed=i, use=u).answer.strip() for i, u in enumerate(uses)]
    assert len(set(answers)) == len(answers) == 12


def test_repo_targets_refuses_more_than_the_package_has(tok):
    with pytest.raises(ValueError, match="count=500"):
        T.repo_targets(tok, 8192, 500, package="click")
    with pytest.raises(ValueError, match="use=9999"):
        T.repo_task(tok, 8192, use=9999)


def test_committed_code_set_has_distinct_targets():
    import gzip
    import json

    path = ROOT / "benchmarks" / "inputs" / "reform_repo_8192_distinct.json.gz"
    data = json.load(gzip.open(path, "rt"))
    answers = [t["answer"].strip() for t in data["tasks"].values()]
    assert len(answers) >= 40 and len(set(answers)) == len(answers) == data["distinct_targets"]
    assert sorted(map(int, data["tasks"])) == list(range(len(answers)))


def test_claims_plan_units_are_unique_and_new(reruns):
    units = reruns._units(reruns.SCALES["claims"], True, "claims")
    assert len(units) == len(set(units))
    kv = [u for u in units if u[0] == "kv"]
    assert {u[3] for u in kv} == {16384} and {u[1] for u in kv} == set(range(20))
    babilong = {u[1] for u in units if u[0].startswith("babilong")}
    assert min(babilong) == 20  # seeds 0-19 ran before: these are new prompts to pool with them
    assert reruns._kind_name("kv") == "kv" and reruns._kind_name("single") == "ruler-single"


def test_kv_task_is_scored_on_the_whole_value(reruns, tok):
    task = reruns._build_task(tok, "kv", 3, 2048, {})
    value = task.answer.strip()
    assert task.kind == "kv" and task.info["answers"] == [value]
    assert task_score(f" {value}.", task) == 1.0
    half = value[:16] + "0" * (len(value) - 16)  # the old rule's 16 characters, the rest wrong
    assert half != value and task_score(half, task) == 0.0


def test_repo_examples_are_named_by_their_number_in_the_file(reruns):
    """The file numbers its prompts 0..47 over four packages whose own seeds restart at 0: the example id must be
    the file's number, or the packages' examples would share ids (and pair with each other in the ledger)."""
    import gzip
    import json

    from kvlab.experiments.reform.tables import example_id

    repo = json.load(gzip.open(ROOT / "benchmarks" / "inputs" / "reform_repo_8192_distinct.json.gz", "rt"))["tasks"]
    tasks = [reruns._build_task(None, "repo", s, 8192, repo) for s in range(len(repo))]
    assert len({t.info["package"] for t in tasks}) == 4 and tasks[12].info["package_seed"] == 0
    assert [example_id(t, 8192) for t in tasks] == [f"repo/8192/{s}" for s in range(len(repo))]


def test_run_resumes_from_the_merged_records_and_keeps_them(reruns, tmp_path):
    from kvlab.experiments import records
    from kvlab.experiments import registry

    def rec(example, method, metric, value, device, **extra):
        return records.record(example, method, metric, value, config={"table": "4"}, device=device, output="x",
                              target="y", task="repo", context_tokens=1, seconds=1.0, **extra)

    old = [rec("repo/8192/0", m, k, 0.5, "cuda") for m in ("reform", "truncation") for k in ("answer_nll", "score")]
    records.write(tmp_path / reruns.RECORDS, old)
    (tmp_path / "parts").mkdir()
    new = [rec("repo/8192/12", "reform", "score", 0.25, "cpu", unit="repo/8192/12|reform"),
           rec("repo/8192/0", "reform", "score", 0.0, "cpu", unit="repo/8192/0|reform")]  # a repeat
    records.write(tmp_path / "parts" / f"worker0-1{records.SUFFIX}", new)
    assert reruns._done(tmp_path) == {"repo/8192/0|reform", "repo/8192/0|truncation", "repo/8192/12|reform"}
    reruns._summarise(tmp_path)
    merged = records.read(tmp_path / reruns.RECORDS)
    assert len(merged) == 5 and all("unit" not in r for r in merged)
    first = [r for r in merged if r["example"] == "repo/8192/0" and r["method"] == "reform" and r["metric"] == "score"]
    assert [r["config"]["device"] for r in first] == ["cuda"]  # the earlier record stays; the repeat is dropped
    args = reruns.parser().parse_args(["--kinds", "repo", "--rows", "truncation,reform", "--seeds", "12-13,47"])
    assert registry.seed_range("47,12-13,12")[:3] == [47, 12, 13]
    assert reruns._selected(("repo", 12, "reform", 8192), args)
    assert not reruns._selected(("repo", 12, "infinipot", 8192), args)
    assert not reruns._selected(("repo", 11, "reform", 8192), args)
    assert not reruns._selected(("kv", 12, "reform", 16384), args)
    args = reruns.parser().parse_args(["--scale", "claims", "--kinds", "repo", "--rows", "truncation,reform",
                                       "--seeds", "47,12-13", "--repo-file",
                                       str(ROOT / "benchmarks" / "inputs" / "reform_repo_8192_distinct.json.gz")])
    reruns.check(args)  # seeds run in the order named
    assert [u[1] for u in args.units] == [47, 47, 12, 12, 13, 13]


def test_committed_code_records_are_named_by_their_target(reruns):
    """Every code-completion record of the claims run carries the id of the prompt whose target line it scores."""
    import gzip
    import json

    data = json.load(gzip.open(ROOT / "benchmarks" / "inputs" / "reform_repo_8192_distinct.json.gz", "rt"))
    number = {t["answer"].strip(): k for k, t in data["tasks"].items()}
    from kvlab.experiments import records as records_file

    records = records_file.read(ROOT / "benchmarks" / "results" / "reform" / "claims" / "reform.examples.jsonl.gz")
    repo = [r for r in records if r["task"] == "repo"]
    assert repo and all(r["example"] == f"repo/8192/{number[r['target'].strip()]}" for r in repo)


def test_repo_ids_renames_by_target_and_refuses_an_unknown_one(reruns, tmp_path):
    import gzip
    import json
    from types import SimpleNamespace

    repo_file = tmp_path / "repo.json.gz"
    with gzip.open(repo_file, "wt") as f:
        json.dump({"length": 64, "tasks": {"0": {"answer": " a()"}, "1": {"answer": "b()\n"}}}, f)
    out = tmp_path / "run"
    out.mkdir()
    RECORDS_NAME = reruns.RECORDS

    from kvlab.experiments import records
    from kvlab.outputs import OutputFolder

    def write(*targets):
        records.write(RECORDS_NAME, [records.record(
            "repo/64/0", m, "score", 0.0, config={"table": "4"}, device="cpu", output="", target=t, task="repo",
            context_tokens=1, seconds=1.0) for m, t in zip(("reform", "truncation"), targets)],
            out=OutputFolder(out, "test"))

    write("b()", " a()")
    reruns.repo_ids(SimpleNamespace(repo_file=str(repo_file)), OutputFolder(out, "test"))
    got = {r["method"]: r["example"] for r in records.read(out / reruns.RECORDS)}
    assert got == {"reform": "repo/64/1", "truncation": "repo/64/0"}
    write("c()", "a()")
    with pytest.raises(ValueError, match="not in"):
        reruns.repo_ids(SimpleNamespace(repo_file=str(repo_file)), OutputFolder(out, "test"))


# ---- hostile options: refused with a clear error before any work (no folder, no model) ---------------------------
@pytest.mark.parametrize("argv, message", [
    (["--rows", "reform,truncaton"], "unknown row 'truncaton' (did you mean 'truncation'?)"),
    (["--kinds", "multikye"], "unknown kind 'multikye' (did you mean 'multikey'?)"),
    (["--seeds", "5-3"], "range '5-3' runs backwards; write 3-5"),
    (["--workers", "0"], "must be >= 1"),
])
def test_reruns_refuse_a_misspelt_or_reversed_selection(tmp_path, capsys, argv, message):
    from kvlab.experiments import registry

    out = tmp_path / "run"
    with pytest.raises(SystemExit) as info:
        registry.run("reform-reruns", ["run", "--out", str(out), *argv])
    assert info.value.code == 2 and message in capsys.readouterr().err
    assert not out.exists()


def test_reruns_refuse_a_selection_of_no_unit_instead_of_an_empty_results_file(tmp_path):
    from kvlab.experiments import registry

    out = tmp_path / "run"
    with pytest.raises(registry.ParameterError, match="select no unit of --scale full's plan"):
        registry.run("reform-reruns", ["run", "--out", str(out), "--kinds", "kv"], raise_errors=True)
    with pytest.raises(registry.ParameterError, match="select no unit"):
        registry.run("reform-reruns", ["run", "--out", str(out), "--scale", "claims", "--kinds", "babilong-qa1",
                                       "--seeds", "0-3"], raise_errors=True)  # the plan's babilong seeds are 20-99
    assert not out.exists()
