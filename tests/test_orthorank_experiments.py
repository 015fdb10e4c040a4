"""OrthoRank's experiment drivers (kvlab.experiments.orthorank: Table 2 zero-shot, Table 4, Table 1 over one window
per C4 document with paired intervals, Table 3's row 4 with and without the sink's K/V) and the BOS option of
the calibration windows."""

from __future__ import annotations

import math

import pytest
import torch

from kvlab.eval import zeroshot
from kvlab.eval.zeroshot import Question, evaluate_task
from kvlab.orthorank.layers import text_windows
from test_zeroshot import CharTokenizer

pytestmark = pytest.mark.usefixtures("one_thread")


def test_zero_shot_table_runs_each_plan(tiny_llama, monkeypatch):
    """Table 2's driver: the dense plan scores what evaluate_task scores; a plan that removes every layer changes
    the log-likelihoods; mean_accuracy averages acc (acc_norm where the task has it)."""
    from kvlab.orthorank import Plan, use_plan
    from kvlab.experiments.orthorank.studies import mean_accuracy, zero_shot

    tok = CharTokenizer()
    questions = [Question(("ab",) * 2, (" a", " cc"), 0, (1, 2)), Question(("ca", "cb"), (" b", " b"), 1, None)]
    monkeypatch.setattr(zeroshot, "load_task", lambda task, n=None: questions[:n])
    table = zero_shot(tiny_llama, tok, {"Dense": Plan(), "none": Plan(removed=(0, 1, 2, 3))}, tasks=("piqa",),
                      questions=2)
    direct = evaluate_task(tiny_llama, tok, questions)
    assert table["Dense"]["piqa"]["acc"] == direct.acc and table["Dense"]["piqa"]["n"] == 2
    with use_plan(tiny_llama, Plan(removed=(0, 1, 2, 3))):
        skipped = evaluate_task(tiny_llama, tok, questions)
    assert skipped.lls != direct.lls
    assert table["none"]["piqa"]["acc"] == skipped.acc
    row = {"a": {"acc": 0.5, "acc_norm": 0.75}, "b": {"acc": 0.25, "acc_norm": None}}
    assert mean_accuracy(row) == pytest.approx(0.375) and mean_accuracy(row, "acc_norm") == pytest.approx(0.5)
    with pytest.raises(ValueError, match="questions must be"):
        zero_shot(tiny_llama, tok, {"Dense": Plan()}, tasks=("piqa",), questions=0)


def test_layer_token_table_reuses_known_orders(tiny_llama):
    """Table 4's driver: the fewest layers reaching the sparsity per token ratio; a known greedy order is used
    as its prefix (no search), a missing one is searched."""
    from kvlab.experiments.orthorank.studies import layer_token_table

    g = torch.Generator().manual_seed(0)
    calib, evaluation = torch.randint(0, 96, (2, 24), generator=g), torch.randint(0, 96, (2, 24), generator=g)
    rows = layer_token_table(tiny_llama, calib, evaluation, [1, 2, 3], sparsity=0.25, token_ratios=(0.0, 0.5),
                             known={0.0: [3, 1, 2]})
    assert rows[0]["layers"] == 1 and rows[0]["chosen"] == [3] and rows[0]["sparsity"] == pytest.approx(0.25)
    assert rows[1]["layers"] == 2 and rows[1]["sparsity"] == pytest.approx(0.25)
    assert set(rows[1]["chosen"]) <= {1, 2, 3} and all(r["ppl"] > 1 for r in rows)


class WordTokenizer:
    """Word ``wN`` -> id ``10 + N`` (any other word: 5); ``adds_bos`` puts BOS (id 1) first, as Gemma3's does."""

    eos_token_id = None

    def __init__(self, bos_token_id=1, adds_bos=False):
        self.bos_token_id, self.adds_bos = bos_token_id, adds_bos

    def __call__(self, text, return_tensors=None, add_special_tokens=True):
        ids = [10 + int(w[1:]) if w[:1] == "w" and w[1:].isdigit() else 5 for w in text.split()]
        if add_special_tokens and self.adds_bos:
            ids = [self.bos_token_id] + ids
        ids = torch.tensor([ids]) if return_tensors == "pt" else ids
        return type("Encoding", (), {"input_ids": ids})()


def test_text_windows_bos():
    text = " ".join(f"w{i}" for i in range(40))
    plain = text_windows(WordTokenizer(), text, 5, 3)
    assert plain.tolist() == [[10, 11, 12, 13, 14], [15, 16, 17, 18, 19], [20, 21, 22, 23, 24]]
    assert torch.equal(text_windows(WordTokenizer(), text, 5, 3, bos=None), plain)  # adds no BOS: unchanged
    with_bos = text_windows(WordTokenizer(adds_bos=True), text, 5, 2, bos=None)
    assert with_bos.tolist() == [[1, 10, 11, 12, 13], [1, 14, 15, 16, 17]]
    assert torch.equal(text_windows(WordTokenizer(), text, 5, 2, bos=True), with_bos)
    with pytest.raises(ValueError, match="no BOS token"):
        text_windows(WordTokenizer(bos_token_id=None), text, 5, 2, bos=True)
    with pytest.raises(ValueError, match="seq_len >= 3"):
        text_windows(WordTokenizer(), text, 2, 2, bos=True)



def _layer_on_subsequence(call, keys, queries):
    """The layer computed for every token of the subsequence ``keys`` alone (original positions; the routed layer
    with every token selected is the dense layer, tested in test_orthorank.py); its output rows at ``queries``."""
    from kvlab.orthorank.reference import routed_layer

    pe = tuple(t[:, keys] for t in call.kwargs["position_embeddings"])
    out = routed_layer(call.layer, call.hidden_states[:, keys], torch.arange(len(keys))[None],
                       position_embeddings=pe, positions=call.position_ids[:, keys])
    return out[:, [keys.index(q) for q in queries]]


@pytest.mark.parametrize("kv, keys_of", [("selected", lambda sel: [0] + sel), ("selected_no_sink", lambda sel: sel)])
def test_table3_row4_keeps_the_sinks_kv_and_the_confounded_variant_drops_it(tiny_llama, kv, keys_of):
    """Table 3 row 4 changes one thing against row 5: the unselected tokens give no K/V. The sink is never
    selected (Algorithm 1), yet its K/V stay (``kv="selected"``: selected queries attend to the sink and the
    selected tokens); ``kv="selected_no_sink"`` also drops the sink's K/V (two changes: its own named row)."""
    from kvlab.core import LayerRouter, use_router
    from kvlab.orthorank.reference import routed_layer

    torch.manual_seed(4)
    ids = torch.randint(0, 96, (1, 30))
    selected = [3, 4, 9, 15, 16, 22, 29]  # the sink (0) is not selected, as under Algorithm 1
    unselected = [i for i in range(30) if i not in selected]
    checked = []

    class Compare(LayerRouter):
        def __call__(self, call):
            out = routed_layer(call.layer, call.hidden_states, torch.tensor([selected]),
                               position_embeddings=call.kwargs["position_embeddings"], positions=call.position_ids,
                               kv=kv)
            expected = _layer_on_subsequence(call, keys_of(selected), selected)
            torch.testing.assert_close(out[:, selected], expected, rtol=0, atol=1e-10)
            assert torch.equal(out[:, unselected], call.hidden_states[:, unselected])
            checked.append(call.layer_idx)
            return out

    tiny_llama.double()
    try:
        with torch.no_grad(), use_router(tiny_llama, Compare()):
            tiny_llama(input_ids=ids, use_cache=False)
    finally:
        tiny_llama.float()
    assert checked == list(range(tiny_llama.config.num_hidden_layers))


def test_document_windows_one_per_long_enough_document():
    from kvlab.experiments.orthorank.studies import document_windows

    docs = {"a": "w1 w2 w3 w4 w5 w6", "short": "w7 w8", "b": "w9 w10 w11 w12", "c": "w13 w14 w15 w16 w17"}
    ids, names = document_windows(WordTokenizer(), docs, 4)
    assert names == ["a", "b", "c"] and ids.tolist() == [[11, 12, 13, 14], [19, 20, 21, 22], [23, 24, 25, 26]]
    ids, names = document_windows(WordTokenizer(), docs, 4, 2)
    assert names == ["a", "b"]
    ids, names = document_windows(WordTokenizer(adds_bos=True), docs, 5, bos=None)  # BOS + 4 tokens
    assert names == ["a", "b", "c"] and ids[:, 0].tolist() == [1, 1, 1] and ids[1].tolist() == [1, 19, 20, 21, 22]
    with pytest.raises(ValueError, match="shorter seq_len"):
        document_windows(WordTokenizer(), docs, 6)


def test_window_nll_is_the_perplexity_per_window(tiny_llama):
    """exp(mean of the per-window NLLs) is the perplexity of the same windows, for the dense model and a plan
    that routes layers; the windows are independent (one window alone scores the same)."""
    from kvlab.orthorank import Plan, perplexity
    from kvlab.experiments.orthorank.studies import window_nll

    g = torch.Generator().manual_seed(1)
    windows = torch.randint(0, 96, (5, 20), generator=g)
    for plan in (Plan(), Plan(routed=(1, 2), router={"token_ratio": 0.33}), Plan(removed=(3,))):
        values = window_nll(tiny_llama, windows, plan, batch_size=2)
        assert len(values) == 5
        assert math.exp(sum(values) / 5) == pytest.approx(perplexity(tiny_llama, windows, plan), rel=1e-6)
        assert window_nll(tiny_llama, windows[3:4], plan)[0] == pytest.approx(values[3], rel=1e-6)
    with pytest.raises(ValueError, match="windows must be"):
        window_nll(tiny_llama, windows[0])


def test_paired_ppl_ratio_interval():
    from kvlab.experiments.orthorank.studies import paired_ppl_ratio

    base = [2.0, 3.0, 4.0, 2.5, 3.5, 1.0]
    shifted = [v - 0.1 for v in base]  # a constant difference: the interval is that one point
    r = paired_ppl_ratio(shifted, base)
    assert r["n"] == 6 and r["ratio"] == pytest.approx(math.exp(-0.1))
    assert r["low"] == pytest.approx(r["ratio"]) and r["high"] == pytest.approx(r["ratio"])
    g = torch.Generator().manual_seed(0)
    noisy = (torch.tensor(base * 10) + 0.3 * torch.randn(60, generator=g, dtype=torch.float64)).tolist()
    r, swapped = paired_ppl_ratio(noisy, base * 10), paired_ppl_ratio(base * 10, noisy)
    assert r["low"] < r["ratio"] < r["high"]
    assert swapped["ratio"] == pytest.approx(1 / r["ratio"]) and swapped["low"] == pytest.approx(1 / r["high"])
    half = paired_ppl_ratio(noisy[:15], (base * 10)[:15])
    assert half["high"] / half["low"] > r["high"] / r["low"]  # fewer windows, wider interval
    with pytest.raises(ValueError, match="same >= 2 windows"):
        paired_ppl_ratio([1.0, 2.0], [1.0])


def test_plans_from_notebook11_results_and_table3_rows():
    from kvlab.experiments.orthorank.studies import plans_from_results, table3_plans

    found = {"table": [{"method": "Dense", "target": 0.0, "removed": [], "routed": []},
                       {"method": "SLEB", "target": 0.1, "removed": [3, 5], "routed": []},
                       {"method": "+OrthoRank", "target": 0.2, "removed": [], "routed": [12, 13]},
                       {"method": "+OrthoRank (one-shot)", "target": 0.1, "removed": [], "routed": [14]}]}
    plans = plans_from_results(found)
    assert list(plans) == ["Dense", "SLEB 10%", "OrthoRank 20%", "OrthoRank one-shot 10%"]
    assert plans["SLEB 10%"].removed == (3, 5) and plans["OrthoRank 20%"].router == {"token_ratio": 0.33}
    rows = table3_plans((12, 13))
    assert rows["T3 4 no KV for unselected (sink K/V kept)"].router == {"token_ratio": 0.33, "kv": "selected"}
    assert rows["T3 4b no KV for unselected nor the sink"].router["kv"] == "selected_no_sink"
    assert all(p.routed == (12, 13) for p in rows.values())
