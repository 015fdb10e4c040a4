"""The SepLLM and headline experiments behind ``python -m kvlab run``: a zero or negative count, a misspelt name
or an impossible combination is refused before a model loads or a file is written, and a folder that holds an
earlier run's records is refused rather than overwritten."""

import pytest

import kvlab
from kvlab.experiments import records, registry


@pytest.fixture
def no_model(monkeypatch):
    import kvlab.models

    fail = lambda *a, **k: pytest.fail("loaded a model before the options were checked")  # noqa: E731
    monkeypatch.setattr(kvlab, "load_model", fail)
    monkeypatch.setattr(kvlab.models, "load_tokenizer", fail)


REFUSED = [
    ("sepllm-position-shift", ["--texts", "0"], "--texts: 0 must be >= 1"),
    ("sepllm-position-shift", ["--texts", "1"], "--texts must be >= 2"),
    ("sepllm-position-shift", ["--skip", "-1"], "--skip: -1 must be >= 0"),
    ("sepllm-architectures", ["--models", "qwen-nope"], "unknown model"),
    ("sepllm-architectures", ["--tokens", "300"], "--tokens must exceed --skip + 1"),
    ("sepllm-separator-cache", ["--capacities", "32,0"], "must be >= 1"),
    ("sepllm-separator-cache", ["--capacities", "128"], "s <= 96"),
    ("sepllm-flops-ratio", ["--texts", "0"], "--texts: 0 must be >= 1"),
    ("sepllm-flops-ratio", ["--tokens", "64"], "--tokens must exceed"),
    ("sepllm-separator-attention", ["--problems", "0"], "--problems: 0 must be >= 1"),
    ("sepllm-ablations", ["gsm8k", "--tables", "9,61"], "unknown table '61'"),
    ("sepllm-ablations", ["gsm8k", "--problems", "-2"], "--problems: -2 must be >= 1"),
    ("sepllm-ablations", ["needle", "--design", "basik"], "did you mean 'basic'?"),
    ("sepllm-ablations", ["needle", "--design", "n2048", "--lengths", "1024"], "must exceed 2048"),
    ("sepllm-gsm8k-matched", ["--problems", "0"], "--problems: 0 must be >= 1"),
    ("sepllm-gsm8k-matched", ["--problems", "5", "--generate", "6"], "--generate 6 exceeds --problems 5"),
    ("sepllm-prepare-separators", ["--text", "/nonexistent", "--gguf", "/nonexistent"], "--text"),
    ("sepllm-training-h", ["--steps", "0"], "--steps: 0 must be >= 1"),
    ("quality-runs", ["--only", "no-such-job-anywhere"], "matches no job"),
    ("quality-runs", ["--cpu-workers", "0"], "--cpu-workers: 0 must be >= 1"),
    ("headline-model-choice", ["--questions", "0"], "--questions: 0 must be >= 1"),
]


@pytest.mark.parametrize("name, argv, message", REFUSED, ids=[f"{n}:{' '.join(a)}" for n, a, _ in REFUSED])
def test_options_are_checked_before_a_model_loads(no_model, capsys, tmp_path, name, argv, message):
    with pytest.raises(SystemExit) as info:
        registry.run(name, argv + ["--out", str(tmp_path / "o")])
    assert info.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("name, argv, stem", [
    ("sepllm-position-shift", [], "position_shift"),
    ("sepllm-separator-attention", [], "separator_attention"),
    ("sepllm-ablations", ["gsm8k", "--tables", "9"], "table9_gsm8k_n256"),
    ("sepllm-gsm8k-matched", ["--neighbors", "128"], "gsm8k_matched_n128"),
])
def test_an_earlier_runs_records_are_never_replaced(no_model, tmp_path, name, argv, stem):
    from kvlab.outputs import OutputFolder

    out = OutputFolder(tmp_path, f"python -m kvlab run {name}")
    first = records.write(stem + records.SUFFIX, [records.record("e", "m", "v", 1.0, device="cpu")], out=out)
    before = first.read_bytes()
    with pytest.raises(registry.ParameterError, match="holds the records of an earlier run"):
        registry.run(name, argv + ["--out", str(tmp_path)])
    assert first.read_bytes() == before
