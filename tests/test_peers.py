"""The kvpress peer check (kvlab.eval.peers). kvpress needs transformers<5.3, so it lives in .venv-peers
(``bash scripts/peers.sh`` makes it and runs this file there); in kvlab's main environment this file is skipped."""
from __future__ import annotations

import pytest

pytest.importorskip("kvpress", reason="kvpress is not installed here: it has its own environment, made and tested by "
                                      "`bash scripts/peers.sh` (pip install -c constraints-peers.txt -e '.[peers]')")

import torch  # noqa: E402

from kvlab.eval import peers  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def model_and_ids():
    import kvlab
    from kvlab.datasets import load_text

    model, tok = kvlab.load_model(device="cpu", dtype="float32")
    ids = tok(load_text("wikitext"), return_tensors="pt").input_ids[:, :256]
    return model, ids


@pytest.fixture(scope="module")
def kept(model_and_ids):
    model, ids = model_and_ids
    return {r.method: r for r in peers.compare_kept(model, ids, 48)}


def test_streaming_llm_keeps_exactly_what_kvpress_keeps(kept, model_and_ids):
    r = kept["StreamingLLM"]
    assert r.identical_layers == r.layers and r.min_overlap == 1.0
    # and both keep what the definition says: the 4 sinks and the last 44 positions
    model, ids = model_and_ids
    full, _ = peers.press_prefill(model, ids)
    pressed, _ = peers.press_prefill(model, ids, peers.make_press("StreamingLLMPress", 256, 48))
    expected = torch.cat([torch.arange(4), torch.arange(256 - 44, 256)])
    for layer in (0, 15, 29):
        assert torch.equal(peers.kvpress_kept(full, pressed, layer), expected.expand(3, -1))


def test_tova_same_definition_same_positions(kept):
    r = kept["TOVA"]
    assert r.same_definition and r.mean_overlap > 0.97, r


def test_h2o_and_observed_attention_differ_as_documented(kept):
    r = kept["H2O"]  # summed vs count-normalised attention, per layer vs per KV head, recent window vs none
    assert not r.same_definition and r.mean_overlap < 0.95, r


def test_bad_budget_names_the_constraint():
    with pytest.raises(ValueError, match=r"budget must be in \[1, n_tokens\)"):
        peers.make_press("KnormPress", 100, 100)
    with pytest.raises(ValueError, match="no press"):
        peers.make_press("NoSuchPress", 100, 10)


def test_leaderboard_scores_a_press_cache_at_the_uncompressed_positions(model_and_ids):
    """A kvpress cache holds fewer entries than the context had; the question must still sit right after the
    context (position 200 here), as without compression. kvlab's StreamingLLM with original positions keeps the
    same entries (test above) and places the question itself: both answer NLLs must agree."""
    from kvlab.baselines import StreamingLLM
    from kvlab.experiments.leaderboard import _nll_after

    model, ids = model_and_ids
    ctx, q, target = ids[:, :200], ids[:, 200:210], ids[:, 210:220]
    pressed, _ = peers.press_prefill(model, ctx, peers.make_press("StreamingLLMPress", 200, 48))
    ours, _ = peers.kvlab_prefill(model, ctx, StreamingLLM(sink=4, cache_size=48, positions="original"))
    want = _nll_after(model, ours, q, target)
    assert _nll_after(model, pressed, q, target, start=200) == pytest.approx(want, abs=1e-4)
    assert abs(_nll_after(model, pressed, q, target) - want) > 1e-3  # at the compressed length it is another NLL


def test_leaderboard_press_cell_runs():
    from kvlab.experiments.leaderboard import GRIDS, _kvpress_version, model_checksum, run_cell

    g = GRIDS["tiny"]
    cell = run_cell("kvpress:KnormPress", "kv_retrieval", 0, g["kv_budgets"][0], g["flop_budgets"][0], "smollm2-135m",
                    model_checksum("smollm2-135m"), 0, g["tokens"], g["lengths"], g["depths"], g["examples"],
                    g["chunk"], g["max_new_tokens"], kvpress=_kvpress_version())
    assert cell["status"] == "ok", cell
    assert 0.0 < cell["answer_nll"] < 20.0 and cell["mean_kv"] == g["kv_budgets"][0]
