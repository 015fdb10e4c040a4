"""The experiments of the papers' speed rows (benchmarks/gpu/paper_speed_rows.sh) on the CPU: SepLLM Table 10's
training-iteration timing (its checks and a smoke run), the instrument that measures attention's own allocations
(dhsa-prefill-e2e --attention-memory), and the launcher's refusal of an unknown step."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kvlab.experiments import records, registry
from kvlab.experiments.registry import ParameterError

ROOT = Path(__file__).resolve().parents[1]


# ---- sepllm-training-speed ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("argv, message", [
    (["--methods", "vanila"], "did you mean 'vanilla'"),
    (["--device", "cpu"], "--backend triton runs on CUDA"),
    (["--device", "cpu", "--backend", "torch", "--seq", "64"], "--seq 64 must exceed --neighbors 64"),
    (["--rounds", "0"], "0 must be >= 1"),
    (["--lr", "0", "--smoke"], "--lr must be > 0"),
])
def test_training_speed_refuses_bad_options(argv, message, tmp_path):
    with pytest.raises(ParameterError, match=message.replace("(", r"\(")):
        registry.check_all("sepllm-training-speed", argv + ["--out", str(tmp_path / "o")], raise_errors=True)


def test_training_speed_registered_with_its_needs():
    e = registry.get("sepllm-training-speed")
    assert (e.needs, e.model) == ("gpu", "none") and "H200" in e.minutes and "Table 10" in e.summary


def test_training_speed_smoke_writes_paired_rounds(tmp_path):
    out = tmp_path / "speed"
    written = registry.run("sepllm-training-speed", ["--smoke", "--out", str(out)], raise_errors=True)
    recs = records.read(written[0])
    keys = {(r["example"], r["method"], r["metric"]) for r in recs}
    assert keys == {(f"pythia-160m/2048/round{i:02d}", m, metric) for i in range(2) for m in ("vanilla", "sepllm")
                    for metric in ("iteration_ms", "samples_per_s")}
    assert all(r["value"] > 0 and r["config"]["device"] == "cpu" for r in recs)
    cfg = recs[0]["config"]
    assert cfg["stands_in_for"] == ["pythia-160m", 2048] and cfg["shape"] == "tiny" and 0 < cfg["kept_share"] < 1
    orders = {r["example"]: [] for r in recs}
    for r in recs:
        if r["metric"] == "iteration_ms":
            orders[r["example"]].append(r["method"])
    assert list(orders.values()) == [["vanilla", "sepllm"], ["sepllm", "vanilla"]]  # the order rotates
    with pytest.raises(ParameterError, match="earlier run"):  # a second run into the same folder is refused
        registry.check_all("sepllm-training-speed", ["--smoke", "--out", str(out)], raise_errors=True)


# ---- attention's own memory ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny():
    from kvlab.dhsa.pattern import dhsa_layers
    from kvlab.experiments.dhsa.measures import random_model

    model = random_model("tiny-global", device="cpu")
    return model, dhsa_layers(model), torch.randint(0, model.config.vocab_size, (1, 128))


def test_attention_peaks_measure_each_call_and_restore_the_function(tiny):
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from kvlab.experiments.dhsa.attention_memory import attention_peak_bytes

    model, layers, ids = tiny
    before = ALL_ATTENTION_FUNCTIONS["kvlab"]
    seen = []

    def fake(fn, device):  # a stand-in for the allocator: 100 bytes per call, the calls in order
        fn()
        seen.append(1)
        return 100 * len(seen)

    res = attention_peak_bytes(model, ids, None, layers, measure=fake)
    assert res == {"attention_peak_bytes": 100 * len(layers), "per_layer": [100 * (i + 1) for i in layers]}
    assert ALL_ATTENTION_FUNCTIONS["kvlab"] is before


def test_attention_peaks_see_a_pattern_that_materialises_more(tiny):
    from kvlab.dhsa.pattern import DHSAPattern
    from kvlab.experiments.dhsa.attention_memory import attention_peak_bytes

    model, layers, ids = tiny
    dense = attention_peak_bytes(model, ids, None, layers)
    sparse = attention_peak_bytes(model, ids, DHSAPattern(32, chunking="fixed", chunk_size=16, initial=4,
                                                          backend="torch"), layers)
    # the eager reference builds a (seq, seq) mask per head group; SDPA allocates little beyond its output
    assert sparse["attention_peak_bytes"] > dense["attention_peak_bytes"] > 0


def test_round_records_carry_attention_peak_only_when_measured():
    from kvlab.experiments.dhsa.prefill_e2e import _round_records

    plain = _round_records("s/8192/round00", "sdpa", {"ms": 1.0, "peak_bytes": None}, {"seq": 8192}, "cpu")
    assert [r["metric"] for r in plain] == ["prefill_latency_ms"]
    full = _round_records("s/8192/round00", "sdpa", {"ms": 1.0, "peak_bytes": 5, "attention_peak_bytes": 3,
                                                     "per_layer": [3, 2]}, {"seq": 8192}, "cuda (X)")
    assert [(r["metric"], r["value"]) for r in full] == [("prefill_latency_ms", 1.0), ("prefill_peak_memory_bytes", 5),
                                                         ("attention_peak_bytes", 3)]
    assert full[2]["per_layer"] == [3, 2] and "per_layer" not in full[0]


def test_prefill_attention_memory_needs_rounds(tmp_path):
    with pytest.raises(ParameterError, match="--attention-memory measures each round"):
        registry.check_all("dhsa-prefill-e2e", ["--attention-memory", "--out", str(tmp_path / "o")],
                           raise_errors=True)
    _, args = registry.check_all("dhsa-prefill-e2e", ["--attention-memory", "--rounds", "20", "--seqs", "8192",
                                                      "--out", str(tmp_path / "o")], raise_errors=True)
    assert args.seqs == [8192] and args.attention_memory


# ---- the launcher ------------------------------------------------------------------------------------------------
def test_launcher_refuses_an_unknown_step(tmp_path):
    env = dict(os.environ, SMOKE="1", KVLAB_RESULTS=str(tmp_path), PY=sys.executable, STEPS="sepllm-typo")
    proc = subprocess.run(["bash", "benchmarks/gpu/paper_speed_rows.sh"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 1 and "unknown step sepllm-typo" in proc.stdout
    assert (tmp_path / "paper_speed_rows.log").is_file()


def test_launcher_fig10_step_writes_one_cell_per_new_token_count(tmp_path):
    """The Fig. 10 step (SMOKE: tiny model, counts cut to 2 and 4) writes the cells the ledger's Fig. 10 rows pair."""
    from kvlab.experiments import records

    env = dict(os.environ, SMOKE="1", KVLAB_RESULTS=str(tmp_path), PY=sys.executable, STEPS="fig10")
    proc = subprocess.run(["bash", "benchmarks/gpu/paper_speed_rows.sh"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:]
    recs = records.read(tmp_path / "benchmarks/results/dhsa/decode_new_tokens_gpu/decode.examples.jsonl.gz")
    methods = {r["method"] for r in recs if r["metric"] == "decode_total_ms"}
    assert methods == {"dense@8192+2t", "dense@8192+4t", "streamingllm128@8192+2t", "streamingllm128@8192+4t"}
