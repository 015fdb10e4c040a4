"""The drivers behind the committed full-size results: the quality-runs and quality-report experiments
(kvlab/experiments/quality/), run_plain.py, dhsa_needle_separating.py."""

from __future__ import annotations

import json
import math

import pytest
from conftest import import_script


@pytest.fixture(scope="module")
def runs():
    from kvlab.experiments.quality import runs

    return runs


@pytest.fixture(scope="module")
def report():
    from kvlab.experiments.quality import report

    return report


def test_job_names_unique_and_every_policy_valid(runs):
    import kvlab
    from kvlab.sepllm.separators import separator_ids

    tok = kvlab.models.load_tokenizer()
    runs._STATE["seps"], runs._STATE["seps_broad"] = separator_ids(tok), separator_ids(tok, match="suffix")
    full = runs.jobs("full")
    assert len({j.name for j in full}) == len(full)
    assert {j.kind for j in full} == {"ppl", "niah", "passkey", "gsm8k", "throughput", "mmlu", "longtask"}
    for j in full:
        if "policy" in j.args:  # longtask policies read n (the prompt's tokens) and sink
            runs._policy(j.args["policy"], n=j.args.get("length", 0), sink=j.args.get("sink", 4))  # bad spans raise
    # the lengths the issues ask for are in the list
    assert max(j.args["tokens"] for j in full if j.name.startswith("sepllm-") and j.kind == "ppl") >= 65536
    assert max(j.args["tokens"] for j in full if j.name.startswith("lacache-t2")) >= 32768
    assert {j.args["tokens"] for j in full if j.name.startswith("lacache-t1")} == {16384}
    smoke = runs.jobs("smoke")
    assert [j.name for j in smoke if j.kind == "ppl"] == [j.name for j in full if j.kind == "ppl"]
    assert all(j.args.get("tokens", 0) <= 384 for j in smoke)


def test_run_one_job_resume_and_report(runs, report, tmp_path):
    out = tmp_path / "res"
    from kvlab.experiments import registry

    argv = ["--out", str(out), "--only", "lacache-t1-(strm|lacache)256-16k$", "--scale", "smoke",
            "--cpu-workers", "1", "--gpu-workers", "0", "--quiet"]
    registry.run(runs.NAME, argv, raise_errors=True)
    files = sorted(p.name for p in out.glob("*.json"))
    assert files == ["lacache-t1-lacache256-16k.json", "lacache-t1-strm256-16k.json"]
    rec = json.loads((out / files[1]).read_text())
    res = rec["result"]
    assert len(res["nll"]) == 383 and math.isfinite(res["ppl"]) and res["max_kv"] <= 256
    assert res["ppl_at"]["384"] == pytest.approx(res["ppl"])
    stamp = (out / files[1]).stat().st_mtime_ns
    registry.run(runs.NAME, argv, raise_errors=True)  # everything done: nothing is run again
    assert (out / files[1]).stat().st_mtime_ns == stamp

    summary = tmp_path / "report" / "summary.json"
    registry.run(report.NAME, ["--source", str(out), "--out", str(summary.parent), "--summary", "summary"],
                 raise_errors=True)
    again = report.load(summary)
    assert again == report.load(out)
    assert "nll" not in again["lacache-t1-strm256-16k"]["result"]
    text = report.lacache(again)
    assert "| StreamingLLM (256) | not run |" not in text  # the row has numbers ...
    assert "| Full (100%) | not run |" in text  # ... and what did not run says so


def test_run_plain_parameters_outputs_and_figures(tmp_path):
    nb = {"cells": [
        {"cell_type": "code", "metadata": {"tags": ["parameters"]}, "outputs": [], "execution_count": None,
         "source": ["n: int = 2  # how many\n", "word: str = 'a'\n"]},
        {"cell_type": "markdown", "metadata": {}, "source": ["text"]},
        {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
         "source": ["import matplotlib.pyplot as plt\n", "print(word * n)\n", "plt.plot([1, 2]); plt.show()\n"]},
    ], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    path = tmp_path / "demo.ipynb"
    path.write_text(json.dumps(nb))
    params = tmp_path / "p.yaml"
    params.write_text("n: 3\n")
    out = tmp_path / "out"
    from kvlab.notebooks import plain_run as plain
    import matplotlib.pyplot as plt

    plt.figure()  # a figure another test left open is not saved as this notebook's
    assert plain.main([str(path), "-f", str(params), "-p", "word", "xy", "--out", str(out)]) == 0
    done = json.loads((out / "demo.ipynb").read_text())
    assert done["cells"][2]["outputs"][0]["text"] == "xyxyxy\n"
    assert (out / "fig_01_1.png").stat().st_size > 0
    assert "xyxyxy" in (out / "demo.log").read_text()
    assert sorted(p.name for p in out.glob("*.png")) == ["fig_01_1.png"]


def test_pareto_table_counts_and_front(report):
    pts = [{"family": "scattered", "size": 64, "ppl": p} for p in (10.0, 12.0, 14.0)]
    pts += [{"family": "StreamingLLM", "size": 64, "ppl": 13.0}, {"family": "LaCache (bands)", "size": 60, "ppl": 9.0}]
    text = report.pareto({"context": 1024, "continuation": 128, "points": pts})
    row = next(line for line in text.splitlines() if line.startswith("| 64 |"))
    assert "| 10.00 | 12.00 |" in row  # best and median random
    assert "13.00 (2/3, dominated)" in row  # 10 and 12 are better, and no larger
    assert "9.00 (0/3, on the front)" in row  # nothing at most 60 entries is better


def _needle_records(values: dict) -> list[dict]:
    """``{(method, depth): [recall per trial]}`` -> needle records of 8K prompts (answer NLL = 1 - recall)."""
    out = []
    for (method, depth), vals in values.items():
        for t, v in enumerate(vals):
            ex = f"niah/m/L8192/d{depth:.2f}/t{t}"
            out += [{"example": ex, "method": method, "metric": "needle_recall", "value": v, "config": {"device": "cpu"}},
                    {"example": ex, "method": method, "metric": "answer_nll", "value": 1 - v, "config": {"device": "cpu"}}]
    return out


def test_needle_grid_keeps_only_depths_that_separate_and_judges_the_control():
    from kvlab.experiments.dhsa import needle_separating as sep

    bs = ("block-sparse authors 512", "block-sparse authors 1024")
    recs = _needle_records({("dense", 0.1): [1.0] * 4, (bs[0], 0.1): [0.0] * 4, (bs[1], 0.1): [0.0] * 4,  # prefix
                            ("dense", 0.4): [1.0, 1.0, 0.0, 1.0], (bs[0], 0.4): [0.0] * 4, (bs[1], 0.4): [0.25] * 4,
                            ("dense", 0.9): [1.0] * 4, (bs[0], 0.9): [1.0] * 4, (bs[1], 0.9): [1.0] * 4})  # ceiling
    assert sep.pick_depths(recs, [512, 1024], gap=0.15, ceiling=0.95, min_token=1152) == [0.4]
    n = 40
    grid = _needle_records({("dense", 0.4): [1.0] * n, (bs[0], 0.4): [0.0, 1.0] * (n // 2),
                            (bs[1], 0.4): [1.0] * n, ("DHSA authors 512", 0.4): [0.0, 1.0] * (n // 2),
                            ("DHSA authors 1024", 0.4): [1.0] * (n - 1) + [0.0]})
    s = sep.summary(grid, [512, 1024])
    assert s["control"]["diff"] == pytest.approx(0.5) and s["control_detects"]
    assert s["verdicts"][512].startswith("inconclusive")
    row = next(r for r in s["rows"]
               if r["budget"] == 1024 and r["metric"] == "needle_recall" and r["a"].startswith("DHSA"))
    assert row["differ_on"] == 1 and row["diff"] == pytest.approx(-1 / n)


@pytest.mark.parametrize("low, high, p, words", [
    # the committed 8K grid at 512: the interval excludes 0 but the sign test does not, and +0.05 is inside it
    (0.001, 0.083, 0.17, ("inconclusive (the interval excludes 0, the sign test does not: p = 0.17)",
                          "cannot exclude a gap of +0.05")),
    (-0.03, 0.04, 0.6, ("inconclusive;", "excludes a gap of 0.05 either way")),
    (0.02, 0.09, 0.001, ("DHSA above block-sparse;", "cannot exclude a gap of +0.05")),
    (-0.07, 0.06, 0.9, ("inconclusive;", "cannot exclude a gap of +0.05 or -0.05")),
    (-0.2, -0.06, 0.0001, ("DHSA below block-sparse;", "cannot exclude a gap of -0.05")),
])
def test_needle_grid_summary_words_follow_from_the_interval_ends_and_the_sign_test(low, high, p, words):
    """The summary once said "narrow enough to exclude a 0.05 gap either way" of +0.041 [+0.001, +0.083] (half-width
    below 0.05, but +0.05 inside): a gap is excluded only when the whole interval lies inside (-0.05, +0.05)."""
    from kvlab.experiments.dhsa import needle_separating as sep

    got = sep.verdict_words({"low": low, "high": high, "sign_p": p, "diff": (low + high) / 2})
    assert all(w in got for w in words), got
