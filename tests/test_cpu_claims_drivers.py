"""The CPU drivers behind LaCache's Fig. 7 / Fig. 10 / Table 1 windows and DHSA's App. D timings: the records pair
with the GPU sweep by method name only if the expressions are the sweep's own, and every round times every cell."""

from __future__ import annotations

import json

import pytest
from conftest import import_script


@pytest.fixture(scope="module")
def lacache_cpu():
    return import_script("benchmarks/lacache_cpu_claims.py")


@pytest.fixture(scope="module")
def dhsa_cpu():
    return import_script("benchmarks/dhsa_app_d_costs.py")


def test_ppl_windows_use_the_gpu_sweeps_policy_under_its_name(lacache_cpu):
    runs = import_script("benchmarks/quality_runs.py")
    sweep = {j.name: (j.args["policy"], j.args["chunk"]) for j in runs.jobs("full") if j.kind == "ppl"}
    for name, expr in lacache_cpu.PPL_POLICIES.items():
        assert sweep[name] == (expr, 16), name  # the ledger pairs the new windows with the sweep's by this name
        assert lacache_cpu._policy(expr) is not None


def test_rotated_order_puts_every_cell_once_in_every_position(dhsa_cpu):
    cells = ["a", "b", "c", "d"]
    rounds = [dhsa_cpu.rotated(cells, r) for r in range(4)]
    assert all(sorted(r) == cells for r in rounds)
    assert {r.index("c") for r in rounds} == {0, 1, 2, 3}


def test_decode_records_pair_by_round_and_the_compressed_cache_stays_small(dhsa_cpu, tiny_llama, monkeypatch, tmp_path):
    import torch

    monkeypatch.setattr(dhsa_cpu, "_model_and_text", lambda tokens, device="cpu": (tiny_llama, torch.randint(0, 90, (1, tokens))))
    args = type("A", (), dict(out=str(tmp_path), contexts="48,96", cache="16", rounds=3, steps=2,
                                 device="cpu"))()
    dhsa_cpu.run_decode(args)
    recs = [json.loads(x) for x in (tmp_path / "decode.examples.jsonl").read_text().splitlines()]
    cells = {"dense@48", "dense@96", "streamingllm16@48", "streamingllm16@96"}
    for r in range(3):
        got = {x["method"] for x in recs if x["example"] == f"round{r:02d}" and x["metric"] == "decode_latency_ms"}
        assert got == cells
    mem = {x["method"]: x["value"] for x in recs if x["metric"] == "decode_cache_memory_bytes" and x["example"] == "round02"}
    assert mem["streamingllm16@96"] == mem["streamingllm16@48"] < mem["dense@48"] < mem["dense@96"]
