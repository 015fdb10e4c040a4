"""LaCache claims runs: the perplexity streams give one record per window, paired across policies by window."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def reruns():
    from kvlab.experiments.lacache import reruns

    return reruns


def test_claims_units_streams_first_then_new_passkeys(reruns):
    units = reruns._units(reruns.SCALES["claims"])
    assert len(units) == len(set(units))
    streams = [u for u in units if u[0] == "ppl"]
    assert units[:len(streams)] == streams and {u[3] for u in streams} == set(reruns.PPL_POLICIES)
    assert {u[2] for u in streams} == {(0, 32768), (1, 32768)}  # 64 windows of 1,024 per policy
    seeds = {u[2] for u in units if u[0] == "passkey"}
    assert seeds == set(range(4, 24))  # seeds 0-3 ran before


def test_span_ablation_policies_use_the_spans_they_name(reruns):
    from kvlab.lacache.policy import LaCache

    for slug, expr in reruns.PPL_POLICIES.items():
        policy = reruns._policy(expr)
        if slug.startswith("lacache"):
            assert isinstance(policy, LaCache)
            span = int(slug.split("-s")[1])
            assert policy.settings(30)["span"] == span, slug


def test_ppl_records_are_window_means_of_the_stream(reruns, tiny_llama, monkeypatch):
    import torch

    from kvlab.eval import chunked_perplexity

    class Tok:  # a stand-in tokenizer of the tiny model: one id per character
        def __call__(self, text, return_tensors=None):
            return type("E", (), {"input_ids": torch.tensor([[ord(c) % 90 for c in text]])})()

    monkeypatch.setattr("kvlab.datasets.load_text", lambda corpus: "abcdefgh " * 200)
    monkeypatch.setitem(reruns.PPL_POLICIES, "strm-test", "StreamingLLM(sink=4, cache_size=32)")
    unit = ("ppl", "wikitext", (1, 256), "strm-test")
    recs = reruns._ppl_records(tiny_llama, Tok(), unit, "cpu", window=64)
    assert [r["example"] for r in recs] == [f"ppl-wikitext/256/seg1/w{w}" for w in range(3)]  # 255 NLLs: 3 windows
    ids = Tok()(("abcdefgh " * 200)[:8 * 512]).input_ids[:, 256:512]  # segment 1: the second 256 tokens
    from kvlab.policies import StreamingLLM
    nll = chunked_perplexity(tiny_llama, None, ids, StreamingLLM(sink=4, cache_size=32), max_tokens=None,
                             chunk_size=16).nll.double()
    for w, r in enumerate(recs):
        assert math.isclose(r["value"], float(nll[w * 64:(w + 1) * 64].mean()), rel_tol=1e-6)
        assert r["metric"] == "window_nll" and r["method"] == "strm-test"


def test_reruns_smoke_writes_records_in_the_one_format_and_a_second_call_resumes(tmp_path, monkeypatch):
    from kvlab.experiments import records, registry
    from kvlab.experiments.lacache import reruns

    calls = []
    monkeypatch.setattr(reruns, "_worker", lambda rank, units, args_d: calls.append(units) or _fake(units, args_d))

    def _fake(units, args_d):
        part = Path(args_d["out"]) / "parts" / f"worker0-1{records.SUFFIX}"
        length = reruns.SCALES[args_d["scale"]]["length"]
        records.write(part, [records.record(reruns._unit_id(u, length).split("|")[0], u[3], m, 0.5,
                                            config={"table": "t"}, device="cpu", output="x", target=None,
                                            unit=reruns._unit_id(u, length)) for u in units
                             for m in ("passkey_found", "answer_nll")])

    out = tmp_path / "run"
    registry.run("lacache-reruns", ["--smoke", "--scale", "passkey", "--out", str(out)])
    recs = records.read(out / reruns.RECORDS)
    assert len(recs) == 2 and {r["config"]["device"] for r in recs} == {"cpu"} and not (out / "parts").exists()
    registry.run("lacache-reruns", ["--smoke", "--scale", "passkey", "--out", str(out)])
    assert len(calls) == 1 and records.read(out / reruns.RECORDS) == recs  # resumed: nothing run twice
