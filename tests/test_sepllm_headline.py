"""benchmarks/sepllm_headline.py's MMLU half: Table 9's head-wise rows are matched to SepLLM's r.KV, Table 17's
FixLLM rows run beside SepLLM, every method writes one record per question, and n is a parameter of MMLU only."""

import json

import pytest

from conftest import import_script


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("headline")
    headline = import_script("benchmarks/sepllm_headline.py")
    assert headline.main(["--part", "mmlu", "--model", "smollm2-135m", "--methods", "hw6,hw8,fix4",
                          "--neighbors", "64", "--mmlu-subjects", "1", "--mmlu-questions", "2", "--threads", "1",
                          "--device", "cpu", "--stem", "t9", "--out", str(out)]) == 0
    summary = json.loads((out / "t9.json").read_text())
    records = [json.loads(line) for line in (out / "t9.examples.jsonl").read_text().splitlines()]
    return summary, records


def test_headwise_rows_match_sepllms_kv_and_fixllm_runs_beside_them(run):
    summary, records = run
    methods = summary["methods"]
    sep = methods["mmlu/SepLLM (n=64)"]
    headwise = {k: v for k, v in methods.items() if "Headwise" in k}
    assert [k.split(" sliding")[0] for k in headwise] == ["mmlu/Headwise 6/9", "mmlu/Headwise 8/9"]
    for name, m in headwise.items():
        # the smallest window whose kept share over every 4th prompt reaches SepLLM's: close over all prompts
        assert m["mean_r_kv"] == pytest.approx(sep["mean_r_kv"], abs=3.0), name
        assert "init=0" in m["pattern"]  # the paper's naive baseline: the sliding heads keep no initial tokens
    assert "mmlu/FixLLM (interval=4, n=64)" in methods
    assert "mmlu/Vanilla" not in methods and summary["neighbors"] == 64
    assert {(p["a"], p["metric"]) for p in summary["pairs"]} == {("SepLLM (n=64)", "mmlu")}
    assert len(summary["pairs"]) == 3
    answered = [r for r in records if r["metric"] == "mmlu_correct"]
    assert len(answered) == 4 * 2 and {r["method"] for r in answered} == {k[5:] for k in methods}


def test_neighbors_is_refused_for_gsm8k():
    headline = import_script("benchmarks/sepllm_headline.py")
    with pytest.raises(SystemExit):
        headline.main(["--part", "gsm8k", "--neighbors", "96", "--out", "unused"])
