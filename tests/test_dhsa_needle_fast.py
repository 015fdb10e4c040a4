"""The needle grid's fast path (issue 24): the kept set built from the chunk ranking
(:func:`kvlab.dhsa.pattern.ranked_chunk_mask`) is the reference's token-sorted mask, the ``"sdpa"`` backend
gives the eager backend's logits, and the needle harness runs trial by trial."""
from __future__ import annotations

import itertools

import pytest
import torch

from kvlab.dhsa import reference as R
from kvlab.dhsa import boundary_predictor as B
from kvlab.dhsa.pattern import DHSAPattern, authors_pattern, ranked_chunk_mask

pytestmark = pytest.mark.usefixtures("one_thread")

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _chunks(n, seed, lo=1, hi=9):
    g = torch.Generator().manual_seed(seed)
    ends = torch.cumsum(torch.randint(lo, hi, (n,), generator=g), 0)
    return torch.cat([torch.tensor([0]), ends[ends < n], torch.tensor([n])])


CONFIGS = list(itertools.product([(0, 0), (3, 0), (4, 7), (0, 12), (2, 40)], ["eq4", "mean"], [False, True],
                                 [0, 5], [0, 3, 20]))


def _check_same_mask(device, seed, initial, local, agg, share, tail, extra, n=64):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 4, n, 16, generator=g, dtype=torch.float64).to(device)
    k = torch.randn(2, 2, n, 16, generator=g, dtype=torch.float64).to(device)
    bds = [_chunks(n, seed).to(device), _chunks(n, seed + 7).to(device)]
    budget = max(R.max_forced(b, initial, local=local) for b in bds) + extra
    kw = dict(initial=initial, local=local, aggregation=agg, share_heads=share, dense_tail=tail)
    ref = R.dhsa_mask(q, k, bds, budget, **kw)
    fast = ranked_chunk_mask(q, k, bds, budget, **kw)
    assert fast.shape == ref.shape and torch.equal(fast, ref)


@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize("config", CONFIGS[::3])
def test_ranked_chunk_mask_is_the_reference_mask(seed, config):
    (initial, local), agg, share, tail, extra = config
    _check_same_mask("cpu", seed, initial, local, agg, share, tail, extra)


@cuda
@pytest.mark.parametrize("config", CONFIGS[::5])
def test_ranked_chunk_mask_is_the_reference_mask_cuda(config):
    (initial, local), agg, share, tail, extra = config
    _check_same_mask("cuda", 3, initial, local, agg, share, tail, extra, n=200)


def test_ranked_chunk_mask_ties_go_to_the_earlier_chunk():
    """Equal chunk scores everywhere: a row keeps its earliest candidate tokens, as the stable token sort does."""
    q = torch.ones(1, 2, 40, 8)
    bd = torch.tensor([0, 8, 16, 24, 32, 40])
    for budget in (9, 15, 23):
        fast = ranked_chunk_mask(q, q, bd, budget, initial=1, aggregation="mean")
        assert torch.equal(fast, R.dhsa_mask(q, q, bd, budget, initial=1, aggregation="mean"))
        row = fast[0, 0, 39]  # last row: initial 1 + its chunk (8) + the earliest (budget - 9) candidates
        assert row.nonzero().flatten().tolist() == [0] + list(range(1, 1 + budget - 9)) + list(range(32, 40))


def test_ranked_chunk_mask_budget_error_names_the_fix():
    q = torch.randn(1, 2, 32, 8)
    with pytest.raises(ValueError, match="budget=6 is smaller .* raise budget"):
        ranked_chunk_mask(q, q, torch.tensor([0, 16, 32]), 6, initial=2)


def _logits(model, ids, pattern):
    from kvlab.core import use_pattern

    with torch.no_grad(), use_pattern(model, pattern):
        return model(ids).logits


def _predictor(model):
    nk = model.config.num_key_value_heads * (model.config.hidden_size // model.config.num_attention_heads)
    torch.manual_seed(0)
    return B.BoundaryPredictor(nk, window=2, heads=2, hidden=16).eval()


@pytest.mark.parametrize("protocol", ["block-sparse", "app_a fixed", "authors"])
def test_sdpa_backend_gives_the_eager_logits(tiny_llama, ids, protocol):
    """Same kept set, fused attention: the logits of the whole forward agree with the eager reference backend
    (boundaries shared or fixed, so both backends chunk the same keys)."""
    pred = _predictor(tiny_llama)

    def make(backend):
        if protocol == "block-sparse":
            return DHSAPattern(20, chunk_size=4, aggregation="mean", initial=2, backend=backend)
        if protocol == "app_a fixed":
            return DHSAPattern(20, chunk_size=4, initial=2, backend=backend)
        p = authors_pattern(30, predictor=pred, chunk_size=4, initial=4, local=8, max_len=8, backend=backend,
                            query_block=None)  # queries chunked like keys: both backends build this kept set
        p.question_tokens = 5
        return p

    ref, fast = _logits(tiny_llama, ids, make("torch")), _logits(tiny_llama, ids, make("sdpa"))
    dense = _logits(tiny_llama, ids, DHSAPattern(None, backend="torch"))
    assert not torch.allclose(ref, dense, atol=1e-3)  # the pattern is sparse here
    torch.testing.assert_close(fast, ref, atol=2e-5, rtol=1e-5)


def test_sdpa_backend_shares_its_mask_across_layers(tiny_llama, ids):
    p = DHSAPattern(16, chunk_size=4, initial=2, share_boundaries=True, share_selection=True, backend="sdpa")
    q = DHSAPattern(16, chunk_size=4, initial=2, share_boundaries=True, share_selection=True, backend="torch")
    torch.testing.assert_close(_logits(tiny_llama, ids, p), _logits(tiny_llama, ids, q), atol=2e-5, rtol=1e-5)


def test_sdpa_backend_refuses_what_it_cannot_express():
    with pytest.raises(ValueError, match="causal_query=True"):
        DHSAPattern(16, chunk_size=4, causal_query=True, backend="sdpa")
    with pytest.raises(ValueError, match="keep_diagonal=True"):
        DHSAPattern(16, chunk_size=4, keep_diagonal=False, backend="sdpa")
    with pytest.raises(ValueError, match="backend must be one of"):
        DHSAPattern(16, chunk_size=4, backend="fast")


@cuda
def test_sdpa_backend_on_cuda_matches_cpu(tiny_llama, ids):
    import copy

    model = copy.deepcopy(tiny_llama).cuda()
    p = DHSAPattern(20, chunk_size=4, initial=2, backend="sdpa")
    torch.testing.assert_close(_logits(model, ids.cuda(), p).cpu(), _logits(tiny_llama, ids, p), atol=1e-4,
                               rtol=1e-4)


def test_newline_ends_follow_every_newline_token():
    from kvlab.experiments.dhsa.measures import newline_ends
    from kvlab.models import load_tokenizer

    tok = load_tokenizer("smollm2-135m")
    ids = tok("one\ntwo three\n\nfour").input_ids
    ends = newline_ends(tok, ids)
    assert ends and all("\n" in tok.decode([ids[e - 1]]) for e in ends)
    assert sum("\n" in tok.decode([i]) for i in ids) == len(ends)


def test_newline_boundaries_join_the_predicted_ones(tiny_llama, ids):
    pred = _predictor(tiny_llama)
    plain = DHSAPattern(24, chunking="predictor", predictor=pred, chunk_size=4, initial=2, share_boundaries=True)
    nl = DHSAPattern(24, chunking="predictor", predictor=pred, chunk_size=4, initial=2, share_boundaries=True,
                     newlines=True)
    with pytest.raises(ValueError, match="newline_ends"):
        _logits(tiny_llama, ids, nl)
    nl.newline_ends = [5, 17, 30]
    _logits(tiny_llama, ids, plain)
    _logits(tiny_llama, ids, nl)
    a, b = plain.boundaries[0][0].tolist(), nl.boundaries[0][0].tolist()
    assert sorted(set(a) | {5, 17, 30}) == b
    with pytest.raises(ValueError, match="dynamic chunking"):
        DHSAPattern(24, chunking="fixed", chunk_size=4, newlines=True)


def test_needle_table_means_per_depth_and_counts():
    from kvlab.experiments.dhsa.measures import needle_table

    def rec(method, depth, trial, value):
        return {"example": f"niah/m/L64/d{depth}/t{trial}", "method": method, "metric": "needle_recall",
                "value": value, "config": {"model": "m", "length": 64, "depth": depth, "seconds": 0.5}}

    recs = [rec("dense", 0.1, 0, 1.0), rec("dense", 0.1, 1, 0.5), rec("dense", 0.9, 0, 0.0),
            rec("DHSA", 0.9, 0, 1.0)]
    lines = needle_table(recs).splitlines()
    assert lines[1].split()[3:] == ["0.75", "0.00", "0.50", "3", "0.50"]  # d=0.1, d=0.9, all, n, s/prompt
    assert lines[2].split()[3:] == ["-", "1.00", "1.00", "1", "0.50"]
    with pytest.raises(ValueError, match="no 'answer_nll' records"):
        needle_table(recs, "answer_nll")


DECODE_CONFIGS = list(itertools.product([(0, 0), (3, 0), (4, 7), (2, 30)], ["eq4", "mean", "sum"], [False, True],
                                        [1, 30], [(40, 0, 1), (40, 0, 6), (40, 5, 1), (40, 5, 4)]))


@pytest.mark.parametrize("config", DECODE_CONFIGS[::7])
def test_decode_mask_is_the_reference_step_by_step(config):
    """All new tokens at once (prompt chunks, the generated tokens as one chunk, the token itself) keep what
    dhsa_decode_reference keeps one token after the other."""
    from kvlab.dhsa.policy import decode_mask

    (initial, local), agg, share, extra, (n0, gen, q_len) = config
    g = torch.Generator().manual_seed(len(DECODE_CONFIGS) + extra)
    n = n0 + gen + q_len
    q = torch.randn(1, 4, q_len, 8, generator=g, dtype=torch.float64)
    k = torch.randn(1, 2, n, 8, generator=g, dtype=torch.float64)
    bd = _chunks(n0, extra)
    budget = initial + local + 1 + extra
    fast = decode_mask(q, k, bd, budget=budget, initial=initial, local=local, aggregation=agg, share_heads=share)
    for i in range(q_len):
        t = n - q_len + i
        _, ref = R.dhsa_decode_reference(q[:, :, i:i + 1], k[:, :, :t + 1], k[:, :, :t + 1], bd, budget,
                                         initial=initial, local=local, aggregation=agg, share_heads=share,
                                         return_mask=True)
        assert torch.equal(fast[:, :, i, :t + 1], ref[:, :, 0]) and not fast[:, :, i, t + 1:].any()


def test_sdpa_backend_decodes_as_the_reference(tiny_llama, ids):
    """App. A decode through decode_attention_sdpa: the logits of a teacher-forced continuation and of a
    one-token step equal the reference loop's."""
    import copy

    from kvlab.core import use_pattern

    outs = {}
    for backend in ("torch", "sdpa"):
        p = DHSAPattern(14, chunk_size=4, initial=2, local=3, backend=backend)
        with torch.no_grad(), use_pattern(tiny_llama, p):
            cache = tiny_llama(ids[:, :30], use_cache=True).past_key_values
            forked = copy.deepcopy(cache)
            several = tiny_llama(ids[:, 30:36], past_key_values=forked, use_cache=True).logits
            one = tiny_llama(ids[:, 30:31], past_key_values=cache, use_cache=True).logits
            two = tiny_llama(ids[:, 31:32], past_key_values=cache, use_cache=True).logits
        outs[backend] = torch.cat([several, one, two], 1)
    torch.testing.assert_close(outs["sdpa"], outs["torch"], atol=2e-5, rtol=1e-5)


def test_recorded_recall_uses_the_reference_mask(tiny_llama, ids):
    """record=True measures the attention mass of the reference's kept set (built without the token sort)."""
    from kvlab.experiments.dhsa.measures import record_qk

    p = DHSAPattern(20, chunk_size=4, initial=2, local=3, record=True, backend="sdpa")
    _logits(tiny_llama, ids, p)
    rec = record_qk(tiny_llama, ids, [0])  # layer 0 sees the same inputs with or without the pattern
    m = R.dhsa_mask(rec.q[0], rec.k[0], p.boundaries[0][0], 20, initial=2, local=3)
    assert p.recall[0] < 1.0
    assert p.recall[0] == pytest.approx(float(B.attention_recall(rec.q[0], rec.k[0], m, rec.scaling[0]).mean()))


def test_table2_accuracy_joins_the_needle_records():
    from kvlab.experiments.dhsa.measures import table2_accuracy, table2_markdown

    recs = [{"example": f"e{i}", "method": "DHSA authors 512", "metric": "needle_recall", "value": float(i % 2),
             "config": {}} for i in range(10)]
    table = {"model": "m", "device": "cpu", "command": "c", "rows": [
        {"method": "DHSA authors 512 [sdpa]", "accuracy_of": "DHSA authors 512", "ms": 3.0, "peak_bytes": 2**30,
         "tokens": 64},
        {"method": "dense [sdpa]", "accuracy_of": "dense", "ms": 2.0, "peak_bytes": None, "tokens": 64}]}
    out = table2_accuracy(table, recs)
    assert out["rows"][0]["needle_recall"] == 0.5 and out["rows"][0]["n"] == 10
    assert out["rows"][0]["ci_low"] < 0.5 < out["rows"][0]["ci_high"]
    assert out["rows"][1]["needle_recall"] is None and out["rows"][1]["n"] == 0
    md = table2_markdown(out, out["rows"]).splitlines()
    assert md[-2].startswith("| DHSA authors 512 [sdpa] | 3.0 | 1.00 | 0.500 | 10 | [")
    assert md[-1] == "| dense [sdpa] | 2.0 | 0.00 | - | 0 | - |"
