"""sepllm-headline (kvlab.experiments.sepllm.headline): Table 9's head-wise rows are matched to SepLLM's r.KV, Table
17's FixLLM rows run beside SepLLM, every method writes one record per question; and every option is checked before
a model loads (a misspelt method refused with the nearest name, a zero count refused, an earlier run's records never
replaced)."""

import pytest

import kvlab
from kvlab.experiments import records, registry


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("headline")
    registry.run("sepllm-headline", ["--part", "mmlu", "--model", "smollm2-135m", "--methods", "hw6,hw8,fix4",
                                     "--neighbors", "64", "--mmlu-subjects", "1", "--mmlu-questions", "2",
                                     "--threads", "1", "--device", "cpu", "--stem", "t9", "--out", str(out)])
    import json

    summary = json.loads((out / "t9.json").read_text())
    return summary, records.read(out / "t9.examples.jsonl.gz"), out


def test_headwise_rows_match_sepllms_kv_and_fixllm_runs_beside_them(run):
    summary, recs, _ = run
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
    answered = [r for r in recs if r["metric"] == "mmlu_correct"]
    assert len(answered) == 4 * 2 and {r["method"] for r in answered} == {k[5:] for k in methods}
    assert all(r["config"]["device"] == "cpu" for r in recs)


def test_a_second_run_into_the_same_folder_leaves_the_first_runs_records(run, monkeypatch, capsys):
    _, _, out = run
    before = (out / "t9.examples.jsonl.gz").read_bytes()
    monkeypatch.setattr(kvlab, "load_model", lambda *a, **k: pytest.fail("loaded a model for a refused run"))
    with pytest.raises(registry.ParameterError, match="holds the records of an earlier run"):
        registry.run("sepllm-headline", ["--part", "mmlu", "--methods", "fix4", "--stem", "t9", "--out", str(out)])
    assert (out / "t9.examples.jsonl.gz").read_bytes() == before


@pytest.fixture
def no_model(monkeypatch):
    monkeypatch.setattr(kvlab, "load_model", lambda *a, **k: pytest.fail("loaded the model before the flags"))


def _refused(argv, capsys) -> str:
    with pytest.raises(SystemExit) as info:
        registry.run("sepllm-headline", argv)
    assert info.value.code == 2
    return capsys.readouterr().err


def test_misspelt_methods_are_refused_with_the_nearest_names(no_model, capsys, tmp_path):
    err = _refused(["--part", "mmlu", "--methods", "vanila,HW8", "--out", str(tmp_path)], capsys)
    assert "'vanila' (did you mean 'vanilla'?)" in err and "'HW8' (did you mean 'hw8'?)" in err
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("argv, message", [
    (["--part", "gsm8k", "--gsm8k", "0"], "--gsm8k: 0 must be >= 1"),
    (["--part", "gsm8k", "--batch", "-3"], "--batch: -3 must be >= 1"),
    (["--part", "mmlu", "--mmlu-questions", "0"], "--mmlu-questions: 0 must be >= 1"),
    (["--part", "mmlu", "--mmlu-subjects", "58"], "MMLU has 57 subjects"),
    (["--part", "gsm8k", "--h2o-seconds", "0"], "must be > 0"),
    (["--part", "gsm8k", "--shots", "9"], "8 exemplars"),
    (["--part", "mmlu", "--methods", "h2o"], "not a method of --part mmlu"),
    (["--part", "gsm8k", "--methods", "hw8"], "not a method of --part gsm8k"),
    (["--part", "gsm8k", "--neighbors", "96"], "--neighbors applies to --part mmlu"),
    (["--part", "mmlu", "--meth", "hw8"], "unrecognized arguments"),
])
def test_every_option_is_checked_before_a_model_loads(no_model, capsys, tmp_path, argv, message):
    assert message in _refused(argv + ["--out", str(tmp_path / "o")], capsys)
    assert not (tmp_path / "o").exists()
