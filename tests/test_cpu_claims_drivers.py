"""The CPU drivers behind LaCache's Fig. 3 / Fig. 7 / Fig. 10 / Table 1 windows and DHSA's App. D timings: the records
pair with the GPU sweep by method name only if the expressions are the sweep's own, every round times every cell, and
Fig. 3's best random pattern is chosen on other windows than the ones it is scored on."""

from __future__ import annotations

import json

import pytest
from conftest import import_script


@pytest.fixture(scope="module")
def lacache_cpu():
    from kvlab.experiments.lacache import cpu_claims

    return cpu_claims


@pytest.fixture(scope="module")
def dhsa_cpu():
    from kvlab.experiments.dhsa import app_d_costs

    return app_d_costs


def test_ppl_windows_use_the_gpu_sweeps_policy_under_its_name(lacache_cpu):
    from kvlab.experiments.quality import runs

    sweep = {j.name: (j.args["policy"], j.args["chunk"]) for j in runs.jobs("full") if j.kind == "ppl"}
    for name, expr in lacache_cpu.PPL_POLICIES.items():
        assert sweep[name] == (expr, 16), name  # the ledger pairs the new windows with the sweep's by this name
        assert lacache_cpu.policy(expr) is not None


def test_rotated_order_puts_every_cell_once_in_every_position(dhsa_cpu):
    cells = ["a", "b", "c", "d"]
    rounds = [dhsa_cpu.rotated(cells, r) for r in range(4)]
    assert all(sorted(r) == cells for r in rounds)
    assert {r.index("c") for r in rounds} == {0, 1, 2, 3}


def test_decode_records_pair_by_round_and_the_compressed_cache_stays_small(dhsa_cpu, tiny_llama, monkeypatch, tmp_path):
    import torch

    from kvlab.experiments import records
    from kvlab.outputs import OutputFolder

    monkeypatch.setattr(dhsa_cpu, "_model_and_text", lambda tokens, device="cpu", smoke=False: (
        tiny_llama, torch.randint(0, 90, (1, tokens))))
    args = type("A", (), dict(out=str(tmp_path), contexts=[48, 96], cache=[16], rounds=3, steps=[2], device="cpu"))()
    path = dhsa_cpu.run_decode(args, OutputFolder(tmp_path, "test"))
    recs = records.read(path)
    assert all(r["config"]["device"] == "cpu" for r in recs)
    cells = {"dense@48", "dense@96", "streamingllm16@48", "streamingllm16@96"}
    for r in range(3):
        got = {x["method"] for x in recs if x["example"] == f"round{r:02d}" and x["metric"] == "decode_latency_ms"}
        assert got == cells
    mem = {x["method"]: x["value"] for x in recs if x["metric"] == "decode_cache_memory_bytes" and x["example"] == "round02"}
    assert mem["streamingllm16@96"] == mem["streamingllm16@48"] < mem["dense@48"] < mem["dense@96"]


def test_pareto_claim_selects_on_some_windows_and_scores_the_choice_on_others(tiny_llama, tmp_path, capsys):
    import torch

    from kvlab.lacache.coverage import pattern_perplexity

    from kvlab.experiments import records
    from kvlab.experiments.lacache import pareto

    ids = torch.randint(0, 96, (1, 6 * 56), generator=torch.Generator().manual_seed(1))
    argv = ["--out", str(tmp_path), "--model", "tiny-llama-of-the-test", "--context", "48", "--continuation", "8", "--sizes", "12,24", "--claim-size",
            "12", "--per-family", "2", "--selection", "2", "--heldout", "3", "--span", "2", "--overlap", "1"]
    loads = []
    args = pareto.parser().parse_args(argv)
    pareto.run(args, load=lambda p, device: loads.append(p) or (tiny_llama, ids))
    summary = json.loads((tmp_path / "summary.json").read_text())
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert loads == [plan]  # the plan on disk is what the model run was given
    sel = [w["example"] for w in plan["selection_windows"]]
    held = [w["example"] for w in plan["heldout_windows"]]
    assert plan["planned_n"] == 3 and not set(sel) & set(held)
    spans = sorted(tuple(w["tokens"]) for w in plan["selection_windows"] + plan["heldout_windows"])
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))  # disjoint windows of context + continuation
    recs = records.read(tmp_path / pareto.RECORDS)
    assert sorted((r["example"], r["method"]) for r in recs) == sorted(
        (e, m) for e in held for s in (12, 24) for m in pareto.method_names(s).values())
    chosen = json.loads((tmp_path / "selection.json").read_text())["sizes"]
    cands = pareto.candidates(4, plan)
    for size in (12, 24):
        scores = chosen[str(size)]["scores"]
        randoms = [r for r in scores if r["pattern"].startswith("random")]
        assert len(randoms) == 6 and {r["entries"] for r in randoms} == {float(size)}
        best = min(randoms, key=lambda r: r["selection_nll"])  # chosen on the selection windows only
        assert chosen[str(size)]["best_random"] == best["pattern"]
        pattern = cands[size]["random"][chosen[str(size)]["best_random_index"]][1]
        w = plan["heldout_windows"][1]
        lo, hi = w["tokens"]
        expect = float(pattern_perplexity(tiny_llama, ids[:, lo:hi], 48, [pattern]).log()[0])
        got = next(r["value"] for r in recs if r["example"] == w["example"] and r["method"] == f"best-random-{size}")
        assert got == pytest.approx(expect, rel=1e-6)
        d = summary["sizes"][str(size)]["ladder_minus_best_random"]
        assert d["n"] == 3 and d["ci_low"] <= d["estimate"] <= d["ci_high"]
    stamp = (tmp_path / pareto.RECORDS).read_bytes()
    pareto.run(args, load=lambda p, device: (tiny_llama, ids))  # resumed: nothing is scored twice
    assert (tmp_path / pareto.RECORDS).read_bytes() == stamp
    with pytest.raises(ValueError, match="another plan"):
        pareto.run(pareto.parser().parse_args(argv[:-2] + ["--overlap", "0"]),
                   load=lambda p, device: (tiny_llama, ids))


@pytest.mark.parametrize("argv, message", [
    (["--heldout", "0"], "argument --heldout: 0 must be >= 1"),
    (["--sizes", "64,128", "--claim-size", "256"], "--claim-size 256 is not one of --sizes [64, 128]"),
    (["--span", "4", "--overlap", "4"], "--overlap 4 must be below --span 4"),
    (["--sizes", "16,128"], "--sizes 16 with --span 8 --overlap 4: budget=16 is too small"),
])
def test_pareto_claim_checks_every_flag_before_it_loads_a_model(tmp_path, capsys, monkeypatch, argv, message):
    import kvlab
    from kvlab.experiments import registry

    monkeypatch.setattr(kvlab, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    with pytest.raises(SystemExit) as info:
        registry.run("lacache-pareto", ["--out", str(tmp_path / "run"), *argv])
    assert info.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_several_step_counts_make_one_cell_per_count_whose_total_time_is_its_steps(dhsa_cpu, tiny_llama, monkeypatch,
                                                                                   tmp_path):
    """Fig. 10's cells: every (context, method, count) is timed every round, named ``method@ctx+Nt``, and its
    ``decode_total_ms`` is the mean per token times its count (one decode, not two)."""
    import torch

    from kvlab.experiments import records
    from kvlab.outputs import OutputFolder

    monkeypatch.setattr(dhsa_cpu, "_model_and_text", lambda tokens, device="cpu", smoke=False: (
        tiny_llama, torch.randint(0, 90, (1, tokens))))
    args = type("A", (), dict(out=str(tmp_path), contexts=[48], cache=[16], rounds=2, steps=[2, 6], device="cpu",
                              shape=None, smoke=False))()
    path = dhsa_cpu.run_decode_fresh(args, OutputFolder(tmp_path, "test"), "cpu")
    recs = records.read(path)
    cells = {"dense@48+2t", "dense@48+6t", "streamingllm16@48+2t", "streamingllm16@48+6t"}
    for r in range(2):
        got = {x["method"] for x in recs if x["example"] == f"round{r:02d}" and x["metric"] == "decode_total_ms"}
        assert got == cells
    by = {(x["example"], x["method"], x["metric"]): x for x in recs}
    for (ex, method, metric), x in by.items():
        if metric == "decode_total_ms":
            steps = int(method.split("+")[1][:-1])
            assert x["config"]["steps"] == steps
            assert x["value"] == pytest.approx(by[(ex, method, "decode_latency_ms")]["value"] * steps)


def test_several_step_counts_on_the_cpu_path_are_refused_with_the_fix(tmp_path):
    from kvlab.experiments import registry

    with pytest.raises(registry.ParameterError, match="--device cuda or --shape"):
        registry.check_all("dhsa-app-d-costs", ["decode", "--steps", "8,64", "--out", str(tmp_path / "a")],
                           raise_errors=True)
    with pytest.raises(registry.ParameterError, match="twice"):
        registry.check_all("dhsa-app-d-costs", ["decode", "--steps", "8,8", "--smoke", "--out", str(tmp_path / "b")],
                           raise_errors=True)


def test_pareto_heldout_start_scores_fresh_windows_and_never_the_selection_ones(tmp_path):
    """A re-run on fresh text: ``--heldout-start`` moves the held-out windows past an earlier run's, keeps the
    selection windows, and is refused where it would score a selection window."""
    from kvlab.experiments import registry
    from kvlab.experiments.lacache import pareto

    base = ["--context", "48", "--continuation", "8", "--sizes", "12,24", "--claim-size", "12", "--selection", "2",
            "--heldout", "3"]
    first = pareto.plan(pareto.parser().parse_args(base + ["--out", str(tmp_path / "a")]))
    again = pareto.plan(pareto.parser().parse_args(base + ["--heldout-start", "5", "--out", str(tmp_path / "b")]))
    assert again["selection_windows"] == first["selection_windows"]
    assert [w["example"] for w in first["heldout_windows"]] == [f"wikitext-c48-w{k:03d}" for k in (2, 3, 4)]
    assert [w["example"] for w in again["heldout_windows"]] == [f"wikitext-c48-w{k:03d}" for k in (5, 6, 7)]
    assert again["heldout_windows"][0]["tokens"] == [5 * 56, 6 * 56]
    with pytest.raises(registry.ParameterError, match="falls on the selection windows 0-1"):
        pareto.plan(pareto.parser().parse_args(base + ["--heldout-start", "1", "--out", str(tmp_path / "c")]))
