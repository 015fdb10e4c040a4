"""DHSA as its authors run it (issue 24): local + initial keys, dense question tail, dense decode, boundaries
and masks shared across layers; the causal query for teacher-forced perplexity; the batched NMS of the
predictor's fast path (the clear errors of the robustness issue are in test_dhsa.py)."""
from __future__ import annotations

import math

import pytest
import torch

from kvlab.dhsa import reference as R
from kvlab.dhsa import boundary_predictor as B
from kvlab.dhsa.api import dhsa_attention, dhsa_decode

pytestmark = pytest.mark.usefixtures("one_thread")


def _qkv(b=1, h=4, hk=2, n=64, d=16, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, h, n, d, generator=g).to(dtype), torch.randn(b, hk, n, d, generator=g).to(dtype),
            torch.randn(b, hk, n, d, generator=g).to(dtype))


def _random_chunks(n, seed, lo=1, hi=9):
    g = torch.Generator().manual_seed(seed)
    ends = torch.cumsum(torch.randint(lo, hi, (n,), generator=g), 0)
    return torch.cat([torch.tensor([0]), ends[ends < n], torch.tensor([n])])


# ------------------------------------------------------------------------------ local window + initial keys
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("local, initial", [(5, 0), (12, 3), (40, 2)])
def test_local_keys_are_kept_and_the_plan_is_the_mask(seed, local, initial):
    q, k, _ = _qkv(seed=seed)
    n = q.shape[2]
    bd = _random_chunks(n, seed)
    budget = R.max_forced(bd, initial, local=local) + 3
    m = R.dhsa_mask(q, k, bd, budget, initial=initial, local=local)
    assert torch.equal(R.plan_mask(R.chunk_plan(q, k, bd, budget, initial=initial, local=local)), m)
    assert torch.equal(m.sum(-1), torch.minimum(torch.tensor(budget), torch.arange(n) + 1).expand(m.shape[:-1]))
    ls = R.local_starts(bd, local, initial)
    cidx = R.chunk_index(bd)
    for i in range(n):
        c = int(cidx[i])
        want = set(range(min(initial, i + 1))) | set(range(int(ls[c]), i + 1))
        kept = set(torch.nonzero(m[0, 0, i]).flatten().tolist())
        assert want <= kept, (i, want - kept)


def test_local_budget_error_names_local():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=r"local \(16\)"):
        dhsa_attention(q, k, v, chunks=8, budget=20, initial=2, local=16, backend="torch")


def test_local_decode_keeps_recent_keys():
    q, k, v = _qkv(n=40)
    prompt = torch.tensor([0, 6, 15, 22, 30])
    _, mask = R.dhsa_decode_reference(q[:, :, 39:40], k, v, prompt, 12, initial=2, local=5, return_mask=True)
    kept = set(torch.nonzero(mask[0, 0, 0]).flatten().tolist())
    assert {0, 1, 34, 35, 36, 37, 38, 39} <= kept and len(kept) == 12
    with pytest.raises(ValueError, match=r"local \(5\)"):
        dhsa_decode(q[:, :, 39:40], k, v, prompt_chunks=prompt, budget=7, initial=2, local=5)


@pytest.mark.triton
def test_triton_with_local_matches_reference():
    q, k, v = _qkv(n=96, d=16, dtype=torch.float32, seed=3)
    bd = _random_chunks(96, 3, 4, 17)
    want = R.dhsa_attention_reference(q.double(), k.double(), v.double(), bd, 48, initial=4, local=8)
    dev = "cuda" if torch.cuda.is_available() else "cpu"  # the interpreter on a CPU, the real kernel on a GPU
    got = dhsa_attention(q.to(dev), k.to(dev), v.to(dev), chunks=bd, budget=48, initial=4, local=8,
                         backend="triton").cpu()
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------------------------ dense question tail
def test_dense_tail_rows_are_dense_and_the_rest_sparse():
    q, k, v = _qkv()
    n = q.shape[2]
    g = q.shape[1] // k.shape[1]
    dense = torch.nn.functional.scaled_dot_product_attention(q, k.repeat_interleave(g, 1), v.repeat_interleave(g, 1),
                                                             is_causal=True)
    sparse = dhsa_attention(q, k, v, chunks=8, budget=20, initial=2, backend="torch")
    tail = dhsa_attention(q, k, v, chunks=8, budget=20, initial=2, dense_tail=10, backend="torch")
    torch.testing.assert_close(tail[:, :, n - 10:], dense[:, :, n - 10:])
    torch.testing.assert_close(tail[:, :, : n - 10], sparse[:, :, : n - 10])
    assert not torch.allclose(sparse[:, :, n - 10:], dense[:, :, n - 10:])
    m = R.dhsa_mask(q, k, R.fixed_boundaries(n, 8), 20, initial=2, dense_tail=10)
    assert bool(m[..., n - 10:, :].eq(torch.ones(n, n, dtype=torch.bool).tril()[n - 10:]).all())


# ------------------------------------------------------------------------------ pattern protocol (tiny models)
def _predictor(model):
    nk = model.config.num_key_value_heads * (model.config.hidden_size // model.config.num_attention_heads)
    torch.manual_seed(0)
    return B.BoundaryPredictor(nk, window=2, heads=2, hidden=16).eval()


@pytest.mark.parametrize("share, calls", [(True, 1), (False, 4)])
def test_shared_boundaries_are_predicted_once_per_forward(tiny_llama, ids, share, calls):
    from kvlab.core import use_pattern
    from kvlab.dhsa.pattern import DHSAPattern

    pred = _predictor(tiny_llama)
    seen = []
    hook = pred.register_forward_hook(lambda mod, inp, out: seen.append(inp[0].shape))
    p = DHSAPattern(24, chunking="predictor", predictor=pred, chunk_size=4, initial=2, share_boundaries=share)
    try:
        with torch.no_grad(), use_pattern(tiny_llama, p):
            for _ in range(2):  # two forward passes
                tiny_llama(ids)
    finally:
        hook.remove()
    assert len(seen) == 2 * calls and p.chunk_calls == 2 * calls
    bds = [b[0].tolist() for b in p.boundaries.values()]
    assert len(bds) == 4 and (all(b == bds[0] for b in bds) if share else True)


def test_shared_selection_is_built_once_and_reused(tiny_llama, ids, monkeypatch):
    import kvlab.dhsa.pattern as P
    from kvlab.core import use_pattern

    built = []
    real = P.dhsa_selection
    monkeypatch.setattr(P, "dhsa_selection", lambda *a, **kw: built.append(1) or real(*a, **kw))
    outs = {}
    for share in (False, True):
        built.clear()
        p = P.DHSAPattern(16, chunk_size=4, initial=2, share_boundaries=True, share_selection=share)
        with torch.no_grad(), use_pattern(tiny_llama, p):
            outs[share] = tiny_llama(ids).logits
        assert len(built) == (1 if share else 4)
    assert not torch.allclose(outs[True], outs[False])  # later layers keep the first layer's keys


def test_dense_decode_equals_the_models_own_step(tiny_llama, ids):
    from kvlab.core import use_pattern
    from kvlab.dhsa.pattern import DHSAPattern

    with torch.no_grad():
        with use_pattern(tiny_llama, DHSAPattern(12, chunk_size=4, initial=2, decode="dense")):
            out = tiny_llama(ids[:, :30], use_cache=True)
            import copy
            cache = copy.deepcopy(out.past_key_values)
            step = tiny_llama(ids[:, 30:31], past_key_values=out.past_key_values, use_cache=True).logits
        own = tiny_llama(ids[:, 30:31], past_key_values=cache, use_cache=True).logits  # no pattern: dense
        with use_pattern(tiny_llama, DHSAPattern(12, chunk_size=4, initial=2)):
            out2 = tiny_llama(ids[:, :30], use_cache=True)
            app_a = tiny_llama(ids[:, 30:31], past_key_values=out2.past_key_values, use_cache=True).logits
    torch.testing.assert_close(step, own, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(app_a, own, atol=1e-4)


def test_question_tail_needs_its_length(tiny_llama, ids):
    from kvlab.core import use_pattern
    from kvlab.dhsa.pattern import authors_pattern

    p = authors_pattern(16, chunking="fixed", chunk_size=4, initial=2, local=4)
    with pytest.raises(ValueError, match="question_tokens"):
        with torch.no_grad(), use_pattern(tiny_llama, p):
            tiny_llama(ids)
    p.question_tokens = 6
    with torch.no_grad(), use_pattern(tiny_llama, p):
        tiny_llama(ids)
    assert p.decode == "dense" and p.share_boundaries


def test_profile_times_the_phases(tiny_llama, ids):
    from kvlab.core import use_pattern
    from kvlab.dhsa.pattern import DHSAPattern

    p = DHSAPattern(16, chunking="predictor", predictor=_predictor(tiny_llama), chunk_size=4, initial=2,
                    share_boundaries=True, profile=True)
    with torch.no_grad(), use_pattern(tiny_llama, p):
        tiny_llama(ids)
    t = p.timings()
    assert set(t) == {"chunking", "selection", "attention"} and all(v > 0 for v in t.values())
    with pytest.raises(ValueError, match="profile=True"):
        DHSAPattern(16, chunk_size=4).timings()


@pytest.mark.slow
def test_authors_protocol_answers_the_needle_where_app_a_fails():
    """SmolLM2 + the shipped predictor, 1024 tokens: App. A (sparse question, sparse decode) at budget 64 loses
    the needle; the authors' protocol at 512 (128 initial + 128 recent + 256 ranked) finds it as dense attention
    does, and so does block-sparse under the same protocol: at this length the protocol (dense question and
    decode), not the chunking, finds the needle."""
    import kvlab
    from kvlab.experiments.dhsa.measures import needle_records
    from kvlab.dhsa.pattern import DHSAPattern, authors_pattern, dhsa_layers
    from kvlab.dhsa.training import shipped_predictor

    model, tok = kvlab.load_model("smollm2-135m", device="cpu", dtype=torch.float32)
    pred, _ = shipped_predictor("smollm2-135m")
    methods = {"dense": None,
               "app_a": DHSAPattern(64, chunking="predictor", predictor=pred, chunk_size=16, initial=4, max_len=32),
               "authors": authors_pattern(512, predictor=pred, chunk_size=32, max_len=64),
               "block-sparse authors": authors_pattern(512, chunking="fixed", chunk_size=32)}
    rec = needle_records(model, tok, methods, dhsa_layers(model), [1024], [0.5], max_new_tokens=16)
    acc = {r["method"]: r["value"] for r in rec if r["metric"] == "needle_recall"}
    assert acc["dense"] == 1.0 and acc["authors"] == 1.0 and acc["block-sparse authors"] == 1.0, acc
    assert acc["app_a"] < 0.5, acc


# ------------------------------------------------------------------------------ causal query (perplexity)
def test_causal_query_rows_ignore_later_queries():
    q, k, _ = _qkv(n=48, seed=5)
    bd = _random_chunks(48, 5, 3, 12)
    for causal in (False, True):
        base = R.dhsa_mask(q, k, bd, 14, initial=2, causal_query=causal)
        changed = 0
        for j in range(1, 48):
            q2 = q.clone()
            q2[:, :, j] = torch.randn_like(q2[:, :, j]) * 3  # another query at j: rows < j must not move
            m = R.dhsa_mask(q2, k, bd, 14, initial=2, causal_query=causal)
            changed += int((m[..., :j, :] != base[..., :j, :]).any())
        assert (changed == 0) if causal else (changed > 0), (causal, changed)


def test_causal_query_equals_whole_chunk_on_the_last_row():
    q, k, _ = _qkv(n=40, seed=2)
    bd = _random_chunks(40, 2, 3, 12)
    a = R.dhsa_mask(q, k, bd, 16, initial=2)
    b = R.dhsa_mask(q, k, bd, 16, initial=2, causal_query=True)
    last = bd[1:] - 1  # the last row of a chunk sees the whole chunk: the same vector
    assert torch.equal(a[..., last, :], b[..., last, :])


def test_teacher_forced_leak_and_its_fix(tiny_llama):
    """A token after position i changes the loss at i under the whole-chunk query (the leak), never under the
    causal query."""
    from kvlab.experiments.dhsa.measures import position_nll
    from kvlab.dhsa.pattern import DHSAPattern

    torch.manual_seed(3)
    ids = torch.randint(0, 96, (1, 64))
    for causal in (False, True):
        p = DHSAPattern(12, chunk_size=8, initial=2, aggregation="mean", causal_query=causal)
        base = position_nll(tiny_llama, ids, p, None)
        moved = 0.0
        for j in range(20, 64, 3):
            other = ids.clone()
            other[0, j] = (other[0, j] + 7) % 96
            nll = position_nll(tiny_llama, other, p, None)
            moved = max(moved, float((nll[: j - 1] - base[: j - 1]).abs().max()))  # losses before token j
        assert (moved < 1e-9) if causal else (moved > 1e-4), (causal, moved)


def test_perplexity_refuses_a_leaking_pattern(tiny_llama, ids):
    from kvlab.experiments.dhsa.measures import pattern_perplexity
    from kvlab.dhsa.pattern import DHSAPattern

    with pytest.raises(ValueError, match="causal_query=True"):
        pattern_perplexity(tiny_llama, ids, {"x": DHSAPattern(12, chunk_size=4, initial=2)}, None)
    ok = pattern_perplexity(tiny_llama, ids, {"x": DHSAPattern(12, chunk_size=4, initial=2, causal_query=True),
                                              "dense": None}, None)
    assert all(math.isfinite(v) for v in ok.values())
    from kvlab.dhsa.api import dhsa_selection

    with pytest.raises(ValueError, match="backend='torch'"):
        dhsa_selection(*_qkv()[:2], chunks=8, budget=20, causal_query=True, backend="flex")


# ------------------------------------------------------------------------------ predictor fast path
def test_batched_nms_is_the_greedy_loop():
    g = torch.Generator().manual_seed(0)
    for trial in range(200):
        n = int(torch.randint(2, 120, (1,), generator=g))
        sc = torch.rand(n, generator=g)
        if trial % 3 == 0:
            sc = (sc * 5).round() / 5  # ties
        valid = torch.rand(n, generator=g) > 0.2
        sure = (torch.rand(n, generator=g) > 0.9) if trial % 2 else None
        mc, w = int(torch.randint(1, 30, (1,), generator=g)), int(torch.randint(0, 10, (1,), generator=g))
        th = [None, 0.3, 0.7][trial % 3]
        want = B.select_boundaries(sc, max_chunks=mc, threshold=th, nms_window=w, valid=valid, sure=sure)
        got = B.nms_boundaries(sc[None], max_chunks=mc, threshold=th, nms_window=w, valid=valid, sure=sure)[0]
        assert torch.equal(want, got), trial


def test_split_long_chunks_vectorised():
    bd = torch.tensor([0, 3, 40, 41, 100])
    assert R.split_long_chunks(bd, 16).tolist() == [0, 3, 19, 35, 40, 41, 57, 73, 89, 100]
    assert R.split_long_chunks(bd, 100).tolist() == bd.tolist()


def test_predict_boundaries_batched_compiled_and_bf16():
    torch.manual_seed(0)
    pred = B.BoundaryPredictor(32, window=4, heads=4, hidden=16).eval()
    k = torch.randn(2, 2, 200, 16)
    loop = []
    with torch.no_grad():
        p = torch.sigmoid(pred(B.key_features(k)))
    valid = B.label_valid(200, 4)
    for b in range(2):
        loop.append(R.split_long_chunks(B.select_boundaries(p[b], max_chunks=40, threshold=0.5, valid=valid), 24))
    got = B.predict_boundaries(pred, k, max_chunks=40, max_len=24)
    assert all(torch.equal(a, b) for a, b in zip(loop, got))
    half = B.predict_boundaries(pred.to(torch.bfloat16), k.to(torch.bfloat16), max_chunks=40, max_len=24)
    assert all(int(b[-1]) == 200 for b in half)
    pred.float()
    with pytest.raises(TypeError, match="BoundaryPredictor"):
        B.predict_boundaries(torch.nn.Linear(2, 2), k, max_chunks=4)


# ------------------------------------------------------------------------------ Eq. 4 with non-centred keys
def test_key_mean_bias_and_real_key_rates_see_an_offset():
    from kvlab.dhsa.theory import key_mean_bias, real_key_selection_rates

    torch.manual_seed(0)
    q, k = torch.randn(1, 2, 400, 16), torch.randn(1, 1, 400, 16)
    shifted = k + 1.5 * torch.randn(16)  # every key gets the same offset: q . mean(k) no longer ~ 0
    centred, biased = key_mean_bias(q, k), key_mean_bias(q, shifted)
    assert float(centred["ratio"].median()) < 0.15 < 0.8 < float(biased["ratio"].median())
    i = 300  # the definition, for one query: q . mean(k_0..k_i) and std_j(q . k_j)
    s = q[0, 0, i].double() @ shifted[0, 0, : i + 1].double().T
    torch.testing.assert_close(biased["bias"][0, 0, i - 64], s.mean())
    torch.testing.assert_close(biased["spread"][0, 0, i - 64], s.std(unbiased=False))
    flat = real_key_selection_rates(q, k, [4, 16, 64], samples=300)["eq4"]
    tilted = real_key_selection_rates(q, shifted, [4, 16, 64], samples=300)["eq4"]
    assert float((flat - 1 / 3).abs().max()) < 0.08 and float((tilted - 1 / 3).abs().max()) > 0.15


def test_leaderboard_dhsa_perplexity_uses_the_causal_chunk_query():
    """The leaderboard's teacher-forced perplexity cell for DHSA scores with the causal chunk query: its ppl is the
    causal pattern's, not the leaking whole-chunk one's (issue 24)."""
    from kvlab.experiments import leaderboard as lb
    from kvlab.datasets import load_text
    from kvlab.experiments.dhsa.measures import pattern_perplexity
    from kvlab.dhsa.pattern import DHSAPattern, dhsa_layers
    from kvlab.eval import stream_ids

    g = lb.GRIDS["tiny"]
    model = g["models"][0]
    r = lb.run_cell("DHSA", "ppl", 0, g["kv_budgets"][0], g["flop_budgets"][0], model, lb.model_checksum(model), 0,
                    g["tokens"], g["lengths"], g["depths"], g["examples"], g["chunk"], g["max_new_tokens"])
    net, tok = lb._model(model)
    ids = stream_ids(net, tok, load_text("wikitext"), g["tokens"])
    nb = r["method_params"]["budget"]
    ppl = {causal: pattern_perplexity(net, ids, {"p": DHSAPattern(nb, chunking="fixed", chunk_size=16,
                                                                  causal_query=causal, backend="torch")},
                                      dhsa_layers(net), causal=causal)["p"] for causal in (True, False)}
    assert ppl[True] != pytest.approx(ppl[False], rel=1e-6)  # the leak shows at this size
    assert r["ppl"] == pytest.approx(ppl[True], rel=1e-4), (r["ppl"], ppl)


# ------------------------------------------------------------------------------ the authors' configuration
# The authors' code (github.com/xiongsiheng/DHSA, legacy/): helper.py::dhsa_sdpa and _obtain_dhsa_mask,
# gemma_model.py::gemma_sdpa_attn_forward_dhsa, scripts/run_needle_in_haystack.sh, utils/flags_config.py.
AUTHORS_CODE = {
    "query_block": 128,            # --block_size 128: queries in fixed blocks, one selection per block
    "share_heads": True,           # _obtain_dhsa_mask: query_states.mean(dim=1), key_states.mean(dim=1)
    "initial": 128,                # dhsa_sdpa(global_tokens=128)
    "local": 128,                  # dhsa_sdpa(local_tokens=128): the last keys before the block's end
    "budget": 1024,                # --budget_prefill 1024
    "aggregation": "eq4",          # --dhsa_chunk_repre_pooling avgpool_norm: mean * sqrt(length)
    "chunking": "predictor",       # --dhsa_ckpt_path: the boundary predictor
    "nms_window": 8,               # --dhsa_use_nms --dhsa_nms_window_size 8
    "share_boundaries": True,      # --dhsa_share_boundaries: predicted once (first layer's keys), shared
    "share_selection": False,      # no --dhsa_share_sparsity_masks: each layer selects again
    "dense_tail": "question",      # instruction_tokens: the question's queries attend densely
    "decode": "dense",             # "TODO: Add support for decoding stage": decode is plain SDPA
    "initial_rule": "authors",     # dhsa_sdpa: torch.cat([global_idx, topk_indices[..., global_tokens:]]) after the
                                   # ascending torch.sort: the 128 lowest-position entries become keys 0..127
    "ties": "topk",                # _obtain_dhsa_mask: torch.topk(scores_copy, k=k_select) on token-level scores
    "threshold": 1 / (1 + math.exp(-1.1)),  # predict_boundaries(theta=1.1): predictor logit > 1.1
    "max_len": 0,                  # no cut: the predicted chunks are used as they are
}


def test_authors_pattern_is_the_authors_configuration():
    from kvlab.dhsa.pattern import authors_pattern

    pred = B.BoundaryPredictor(channels=16, window=4, heads=2, hidden=8)
    got = authors_pattern(1024, predictor=pred).settings()
    diff = {k: (got.get(k), v) for k, v in AUTHORS_CODE.items() if got.get(k) != pytest.approx(v)}
    assert not diff, f"authors_pattern differs from the authors' code (ours, theirs): {diff}"
    for key in ("initial", "local", "budget", "predictor", "share_heads", "query_block"):
        assert key in got


def _block_mask_by_rows(q, k, bd, budget, qb, initial, local, tail):
    """block_query_mask row by row, from the definition: means over the block's queries and the chunk's keys."""
    n = q.shape[2]
    qm, km = q[0].mean(0), k[0].mean(0)  # heads shared
    st, en = bd[:-1].tolist(), bd[1:].tolist()
    kvec = [km[a:b].mean(0) * math.sqrt(b - a) for a, b in zip(st, en)]
    out = torch.zeros(n, n, dtype=torch.bool)
    for t in range(n):
        if t >= n - tail:
            out[t, :t + 1] = True
            continue
        s0 = (t // qb) * qb
        s1 = min(s0 + qb, n - tail)
        u = min(s0 + qb, n)
        qvec = qm[s0:s1].mean(0) * math.sqrt(s1 - s0)
        forced = {j for j in range(u) if j < initial or j >= u - local}
        cands = [j for j in range(u) if j not in forced]
        score = {j: float(qvec @ kvec[next(c for c in range(len(st)) if st[c] <= j < en[c])]) for j in cands}
        ranked = sorted(cands, key=lambda j: (-score[j], j))[:max(0, budget - len(forced))]
        for j in forced | set(ranked):
            if j <= t:
                out[t, j] = True
    return out


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("qb, initial, local, tail", [(8, 2, 8, 0), (8, 0, 4, 5), (16, 4, 16, 3)])
def test_block_query_mask_is_its_definition(seed, qb, initial, local, tail):
    q, k, _ = _qkv(n=50, seed=seed)
    bd = _random_chunks(50, seed + 10)
    budget = initial + local + 9
    m = R.block_query_mask(q, k, bd, budget, query_block=qb, initial=initial, local=local, share_heads=True,
                           dense_tail=tail, score_dtype=torch.float64)
    assert m.shape == (1, 1, 50, 50)
    assert torch.equal(m[0, 0], _block_mask_by_rows(q, k, bd, budget, qb, initial, local, tail))
    assert int(m[0, 0, :50 - tail].sum(-1).max()) <= budget
    assert not (m[0, 0] & ~torch.ones(50, 50, dtype=torch.bool).tril()).any()


def test_query_block_options_are_checked():
    from kvlab.dhsa.pattern import DHSAPattern, authors_pattern

    with pytest.raises(ValueError, match="backend='sdpa'"):
        DHSAPattern(64, chunk_size=8, query_block=16, backend="torch", decode="dense")
    with pytest.raises(ValueError, match=r"initial \(128\) \+ local \(128\)"):
        authors_pattern(200, chunking="fixed")
    with pytest.raises(ValueError, match="query_block must be an int"):
        R.block_query_mask(*_qkv()[:2], torch.tensor([0, 64]), 8, query_block=0)


def test_records_store_settings_and_ranked_keys(tiny_llama, ids):
    from kvlab.core import use_pattern
    from kvlab.dhsa.pattern import authors_pattern

    p = authors_pattern(20, chunking="fixed", chunk_size=4, initial=2, local=8, query_block=8)
    p.question_tokens = 4
    with torch.no_grad(), use_pattern(tiny_llama, p):
        tiny_llama(ids)
    st = p.stats()
    n = ids.shape[1]
    assert st["boundary_layer"] == min(p.boundaries) and st["cut_share"] == 0.0
    assert 0 < st["ranked_keys"] <= 20 - 10 and st["kept_keys"] <= 20
    m = R.block_query_mask(torch.zeros(1, 1, n, 4), torch.zeros(1, 1, n, 4), R.fixed_boundaries(n, 4), 20,
                           query_block=8, initial=2, local=8, dense_tail=4)
    assert st["kept_keys"] == pytest.approx(float(m[0, 0, :n - 4].sum(-1).float().mean()))


@pytest.mark.slow
def test_chunks_come_from_the_predictor_at_the_boundary_layer():
    """A 1K-token needle prompt under the authors' protocol: the boundaries are taken at layer 0, and the shipped
    predictor chosen for layer 0 places them there (the predictor trained on all layers places about one), so
    the chunks are its own: fewer than half of them come from the max_len cut (none: the authors' code has
    no cut), and there are at least four."""
    import kvlab
    from kvlab import datasets
    from kvlab.core import use_pattern
    from kvlab.experiments.dhsa.measures import needle_methods, question_tail_tokens
    from kvlab.dhsa.pattern import dhsa_layers
    from kvlab.dhsa.training import shipped_predictor

    model, tok = kvlab.load_model("smollm2-135m", device="cpu", dtype=torch.float32)
    p = datasets.niah_prompt(tok, datasets.load_text("paul-graham"), 1024, 0.5)
    ids = tok(p.prompt, return_tensors="pt").input_ids
    results = {}
    for file in (None, "smollm2-135m-h256"):
        pred, info = shipped_predictor("smollm2-135m", file=file)
        pat = needle_methods([512], predictor=pred, protocols=("authors",), baselines=())["DHSA authors 512"]
        pat.question_tokens = question_tail_tokens(tok, p.prompt)
        with torch.no_grad(), use_pattern(model, pat, dhsa_layers(model)):
            model(input_ids=ids, use_cache=False, logits_to_keep=1)
        results[info["file"]] = st = pat.stats()
        assert st["boundary_layer"] == 0 and pat.chunk_calls == 1
    chosen = results[shipped_predictor("smollm2-135m")[1]["file"]]
    assert chosen["cut_share"] < 0.5 and chosen["chunks"] >= 4, results
    assert results["smollm2-135m-h256.pt"]["chunks"] < chosen["chunks"], results


def test_perplexity_refuses_oracle_boundaries_and_measures_the_boundary_leak(tiny_llama, ids):
    from kvlab.experiments.dhsa.measures import boundary_leak, pattern_perplexity
    from kvlab.dhsa.pattern import DHSAPattern

    oracle = DHSAPattern(12, chunking="oracle", chunk_size=4, initial=2, causal_query=True, backend="torch")
    with pytest.raises(ValueError, match="chunking='oracle'"):
        pattern_perplexity(tiny_llama, ids, {"oracle": oracle}, None)
    fixed = DHSAPattern(12, chunk_size=4, initial=2, causal_query=True, backend="torch")
    assert boundary_leak(tiny_llama, ids, fixed, None, 40, skip=12) < 1e-9  # causal: nothing moves
    torch.manual_seed(3)
    long = torch.randint(0, 96, (1, 64))
    whole = DHSAPattern(12, chunk_size=8, initial=2, aggregation="mean")  # whole-chunk queries read later tokens
    leaks = [boundary_leak(tiny_llama, long, whole, None, j) for j in range(20, 64, 3)]
    assert max(leaks) > 1e-4, leaks
    with pytest.raises(ValueError, match="position must be in"):
        boundary_leak(tiny_llama, ids, fixed, None, 0)


# ------------------------------------------------------------------------------ kept keys against the authors' rule
def _authors_kept_keys(q, k, bd, budget, *, block=128, global_tokens=128, local_tokens=128, tail=0):
    """The keys each query block keeps in the authors' ``legacy/utils/helper.py`` (``dhsa_sdpa`` with
    ``_obtain_dhsa_mask``, ``pooling="avgpool_norm"``), re-derived from what that code does, one block at a time:

    1. query block vector: the heads' mean of its queries, averaged over ``block`` slots (a short last block is
       padded with zeros) and scaled by sqrt(real length); key chunk vector: the heads' mean of its keys, summed
       through a prefix sum, over its length, times sqrt(length);
    2. each key token gets its chunk's score; keys at or after the block's end are out;
    3. the ``min(local, budget, visible)`` last visible keys are forced; ``torch.topk`` picks the rest of the
       budget among the other visible keys; missing slots hold the last key;
    4. the list sorted by position; its ``global_tokens`` lowest entries become keys ``0 ..`` (capped at the
       block's last key).

    ``tail`` queries at the end are the dense instruction. Returns one set of kept keys per block (keys before the
    block's last sparse query)."""
    n = k.shape[2]
    sparse = n - tail
    qm = q[0].float().mean(0)[:sparse]
    km = k[0].float().mean(0)
    nqb = (sparse + block - 1) // block
    qpad = torch.cat([qm, qm.new_zeros(nqb * block - sparse, qm.shape[-1])])
    qlen = torch.tensor([min(block, sparse - i * block) for i in range(nqb)], dtype=torch.float32)
    qvec = qpad.view(nqb, block, -1).mean(1) * qlen.sqrt()[:, None]
    pref = torch.cat([km.new_zeros(1, km.shape[-1]), km.cumsum(0)])
    st, en = bd[:-1], bd[1:]
    clen = (en - st).clamp(min=1).float()[:, None]
    kvec = (pref[en] - pref[st]) / clen * clen.sqrt()
    owner = torch.searchsorted(bd, torch.arange(n), right=True) - 1
    scores = (qvec @ kvec.T)[:, owner]  # (nqb, n)
    out = []
    for i in range(nqb):
        upper = min((i + 1) * block, n)
        row = scores[i].clone()
        row[upper:] = float("-inf")
        recent = list(range(upper - min(local_tokens, budget, upper), upper))
        row[recent] = float("-inf")
        k_sel = min(budget - len(recent), upper - len(recent))
        chosen = torch.topk(row, k_sel).indices.tolist() if k_sel > 0 else []
        lst = sorted(chosen + [n - 1] * (budget - len(recent) - k_sel) + recent)
        for g in range(min(global_tokens, len(lst))):
            lst[g] = min(g, upper - 1)
        last = min((i + 1) * block, sparse) - 1
        out.append({j for j in lst if j <= last})
    return out


@pytest.mark.slow
def test_authors_rule_keeps_the_authors_keys_on_real_tensors():
    """SmolLM2's queries and keys on real text (2,048 tokens, a 40-token dense tail, the shipped predictor's chunks
    at the authors' threshold): at budgets 512 and 1024, >= 99 % of the keys the authors' selection keeps are kept
    by ``block_query_mask(initial_rule="authors", ties="topk")`` (the authors' configuration), in layer 0 and a
    middle layer. kvlab's own rule misses more than 1 % (the test can tell the rules apart)."""
    import kvlab
    from kvlab import datasets
    from kvlab.experiments.dhsa.measures import record_qk
    from kvlab.dhsa.pattern import AUTHORS_THRESHOLD
    from kvlab.dhsa.training import shipped_predictor

    model, tok = kvlab.load_model("smollm2-135m", device="cpu", dtype=torch.float32)
    text = datasets.load_text("wikitext")
    ids = tok(text[:40000], return_tensors="pt").input_ids[:, :2048]
    rec = record_qk(model, ids, [0, 15])
    pred, _ = shipped_predictor("smollm2-135m")
    bd = B.predict_boundaries(pred, rec.k[0], max_chunks=8 * 16, threshold=AUTHORS_THRESHOLD)[0]
    assert 8 < len(bd) < 8 * 16, bd  # the predictor's own chunks, neither none nor capped
    tail = 40
    for layer in (0, 15):
        q, k = rec.q[layer], rec.k[layer]
        for budget in (512, 1024):
            theirs = _authors_kept_keys(q, k, bd, budget, tail=tail)
            share = {}
            for rule, ties in (("authors", "topk"), ("kvlab", "position")):
                m = R.block_query_mask(q, k, bd, budget, query_block=128, initial=128, local=128, share_heads=True,
                                       dense_tail=tail, initial_rule=rule, ties=ties)[0, 0]
                same = total = 0
                for i, want in enumerate(theirs):
                    last = min((i + 1) * 128, 2048 - tail) - 1
                    ours = set(torch.nonzero(m[last]).flatten().tolist())
                    same += len(ours & want)
                    total += len(want)
                share[rule] = same / total
            assert share["authors"] >= 0.99, (layer, budget, share)
            assert share["kvlab"] < 0.99, (layer, budget, share)


def _first_layer_keys(model, ids):
    from kvlab.experiments.dhsa.measures import record_qk

    return record_qk(model, ids[None], [0]).k[0]


@pytest.mark.slow
def test_shipped_predictor_places_the_same_boundaries_wherever_the_text_sits():
    """Position invariance of the predictor the experiments pick for layer 0: 1,024 tokens of text no predictor was
    trained on, alone and as positions 3,072-4,095 of a 4,096-token input, at the authors' threshold. >= 80 % of the
    boundaries of each run lie within 2 tokens of one of the other (interior positions), with >= 3 boundaries per
    1K tokens (not an empty chunking). The earlier file on rotated keys (trained on 1,024-token windows) fails it
    at the threshold the earlier experiments used (its calibrated p > 0.5)."""
    import kvlab
    from kvlab import datasets
    from kvlab.dhsa.pattern import AUTHORS_THRESHOLD
    from kvlab.dhsa.training import load_predictor, shipped_predictor, SHIPPED

    model, tok = kvlab.load_model("smollm2-135m", device="cpu", dtype=torch.float32)
    model.model.layers = model.model.layers[:1]  # layer 0's keys need no other layer
    model.config.num_hidden_layers = 1
    text = datasets.load_text("wikitext")[600_000:]  # past every window the shipped files were trained on
    ids = tok(text[:40_000], return_tensors="pt", add_special_tokens=False).input_ids[0, :4096]
    k_long, k_alone = _first_layer_keys(model, ids), _first_layer_keys(model, ids[3072:])

    def agreement(pred, threshold):
        def ends(k):
            bd = B.predict_boundaries(pred, k, max_chunks=8 * math.ceil(k.shape[2] / 128), threshold=threshold)[0]
            return (bd[1:-1] - 1).tolist()

        alone = {t for t in ends(k_alone) if 8 <= t < 1016}
        inside = {t - 3072 for t in ends(k_long) if 3072 + 8 <= t < 4096 - 8}

        def near(a, b):
            return sum(any(abs(x - y) <= 2 for y in b) for x in a) / max(len(a), 1)
        return min(near(alone, inside), near(inside, alone)), len(alone)

    pred, info = shipped_predictor("smollm2-135m")
    agree, count = agreement(pred, AUTHORS_THRESHOLD)
    assert agree >= 0.8 and count >= 3, (info["file"], agree, count)
    old, _ = load_predictor(SHIPPED / "smollm2-135m-l0.pt")
    old_agree, old_count = agreement(old, old.calibrated_threshold)  # as the earlier experiments ran it
    assert old_agree < 0.8 or old_count < 3, (old_agree, old_count)
