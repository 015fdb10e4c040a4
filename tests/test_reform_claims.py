"""REFORM claims runs: the code-completion set asks distinct questions, the claims plan's units and the
key-value retrieval rule (the whole value, not its first 16 characters)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from kvlab.eval import tasks as T
from kvlab.experiments.reform_compare import task_score

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
