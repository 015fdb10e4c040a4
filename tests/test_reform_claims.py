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
    spec = importlib.util.spec_from_file_location("reform_reruns", ROOT / "benchmarks" / "reform_reruns.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["reform_reruns"] = mod
    spec.loader.exec_module(mod)
    return mod


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
    import json
    from types import SimpleNamespace

    def rec(example, method, metric, value, device):
        return {"example": example, "method": method, "output": "x", "target": "y", "task": "repo",
                "context_tokens": 1, "seconds": 1.0, "config": {"table": "4", "device": device}, "metric": metric,
                "value": value}

    old = [rec("repo/8192/0", m, k, 0.5, "cuda") for m in ("reform", "truncation") for k in ("answer_nll", "score")]
    (tmp_path / "reform.examples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in old))
    (tmp_path / "parts").mkdir()
    new = [{**rec("repo/8192/12", "reform", "score", 0.25, "cpu"), "unit": "repo/8192/12|reform"},
           {**rec("repo/8192/0", "reform", "score", 0.0, "cpu"), "unit": "repo/8192/0|reform"}]  # a repeat
    (tmp_path / "parts" / "worker0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in new) + '{"cut')
    assert reruns._done(tmp_path) == {"repo/8192/0|reform", "repo/8192/0|truncation", "repo/8192/12|reform"}
    reruns._summarise(tmp_path)
    merged = [json.loads(x) for x in (tmp_path / "reform.examples.jsonl").read_text().splitlines()]
    assert len(merged) == 5 and all("unit" not in r for r in merged)
    first = [r for r in merged if r["example"] == "repo/8192/0" and r["method"] == "reform" and r["metric"] == "score"]
    assert [r["config"]["device"] for r in first] == ["cuda"]  # the earlier record stays; the repeat is dropped
    args = SimpleNamespace(kinds="repo", rows="truncation,reform", seeds="12-13,47")
    assert reruns._seeds("47,12-13,12") == [47, 12, 13]
    assert reruns._selected(("repo", 12, "reform", 8192), args)
    assert not reruns._selected(("repo", 12, "infinipot", 8192), args)
    assert not reruns._selected(("repo", 11, "reform", 8192), args)
    assert not reruns._selected(("kv", 12, "reform", 16384), args)


def test_committed_code_records_are_named_by_their_target(reruns):
    """Every code-completion record of the claims run carries the id of the prompt whose target line it scores."""
    import gzip
    import json

    data = json.load(gzip.open(ROOT / "benchmarks" / "inputs" / "reform_repo_8192_distinct.json.gz", "rt"))
    number = {t["answer"].strip(): k for k, t in data["tasks"].items()}
    path = ROOT / "benchmarks" / "results" / "reform" / "claims" / "reform.examples.jsonl"
    records = [json.loads(x) for x in path.read_text().splitlines()]
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

    def write(*targets):
        (out / "reform.examples.jsonl").write_text("".join(json.dumps(
            {"example": "repo/64/0", "method": m, "output": "", "target": t, "task": "repo", "context_tokens": 1,
             "seconds": 1.0, "config": {"table": "4", "device": "cpu"}, "metric": "score", "value": 0.0}) + "\n"
            for m, t in zip(("reform", "truncation"), targets)))

    write("b()", " a()")
    reruns.repo_ids(SimpleNamespace(out=str(out), repo_file=str(repo_file)))
    got = {r["method"]: r["example"] for r in map(json.loads, (out / "reform.examples.jsonl").read_text().splitlines())}
    assert got == {"reform": "repo/64/1", "truncation": "repo/64/0"}
    write("c()", "a()")
    with pytest.raises(ValueError, match="not in"):
        reruns.repo_ids(SimpleNamespace(out=str(out), repo_file=str(repo_file)))
