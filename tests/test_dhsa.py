"""DHSA: reference properties, labels and predictor, API checks, Triton and Flex against a float64 oracle.

Triton runs in the interpreter on CPU (``tests/conftest.py`` sets ``TRITON_INTERPRET=1``); shapes are tiny.
Tolerance: :func:`kvlab.testing.assert_close_to_oracle` (inputs drawn in the low-precision dtype and
promoted to float64 for the oracle; error at most the eager low-precision one plus ``sqrt(keys) * eps``).
The selection is computed in float32 from the inputs' values by every backend, so all keep the same keys.
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from kvlab.dhsa import reference as R
from kvlab.dhsa import boundary_predictor as B
from kvlab.dhsa.api import dhsa_attention, dhsa_decode
from kvlab.testing import assert_close_to_oracle

pytestmark = pytest.mark.usefixtures("one_thread")
needs_triton = pytest.mark.triton
CUDA = torch.cuda.is_available()
DEV = torch.device("cuda" if CUDA else "cpu")


def _qkv(b=2, h=4, hk=2, n=41, d=16, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, n, d, generator=g).to(dtype)
    k = torch.randn(b, hk, n, d, generator=g).to(dtype)
    v = torch.randn(b, hk, n, d, generator=g).to(dtype)
    return q, k, v


def _causal(q, k, v):
    g = q.shape[1] // k.shape[1]
    return F.scaled_dot_product_attention(q, k.repeat_interleave(g, 1), v.repeat_interleave(g, 1), is_causal=True)


BD41 = torch.tensor([0, 3, 9, 10, 20, 27, 33, 41])  # uneven chunks, one of length 1


# ------------------------------------------------------------------------------ chunkings
def test_fixed_boundaries_and_index():
    b = R.fixed_boundaries(10, 4)
    assert b.tolist() == [0, 4, 8, 10]
    assert R.chunk_index(b, 10).tolist() == [0, 0, 0, 0, 1, 1, 1, 1, 2, 2]
    assert R.split_long_chunks(torch.tensor([0, 10, 12]), 4).tolist() == [0, 4, 8, 10, 12]
    assert R.decode_boundaries(torch.tensor([0, 5, 8]), 9).tolist() == [0, 5, 8, 9]
    assert R.decode_boundaries(torch.tensor([0, 5, 8]), 12).tolist() == [0, 5, 8, 11, 12]


@pytest.mark.parametrize("bad", [[1, 5, 10], [0, 5, 9], [0, 5, 5, 10], [[0, 10]]])
def test_bad_boundaries_raise(bad):
    with pytest.raises(ValueError):
        R.check_boundaries(torch.tensor(bad), 10)


# ------------------------------------------------------------------------------ Eq. 4 and upsampling
def test_eq4_vs_mean_vs_padded_mean():
    x = torch.randn(1, 2, 10, 3, dtype=torch.float64)
    b = torch.tensor([0, 1, 4, 10])
    lens = torch.tensor([1.0, 3.0, 6.0], dtype=torch.float64)
    sums = torch.stack([x[..., s:e, :].sum(-2) for s, e in [(0, 1), (1, 4), (4, 10)]], dim=-2)
    torch.testing.assert_close(R.chunk_representation(x, b, "sum"), sums)
    torch.testing.assert_close(R.chunk_representation(x, b, "mean"), sums / lens[:, None])
    torch.testing.assert_close(R.chunk_representation(x, b, "eq4"), sums / lens.sqrt()[:, None])  # sqrt(n) * mean
    torch.testing.assert_close(R.chunk_representation(x, b, "padded_mean"), sums / 6.0)
    # equal-length chunks: Eq. 4 is the mean times one constant, so the ranking is the same
    bf = R.fixed_boundaries(10, 5)
    torch.testing.assert_close(R.chunk_representation(x, bf, "eq4"), R.chunk_representation(x, bf, "mean") * 5 ** 0.5)


def test_upsample_copies_chunk_scores():
    s = torch.arange(9.0).view(1, 1, 3, 3)
    b = torch.tensor([0, 2, 3, 5])
    t = R.upsample(s, b, 5)[0, 0]
    ci = R.chunk_index(b, 5)
    for i in range(5):
        for j in range(5):
            assert t[i, j] == s[0, 0, ci[i], ci[j]]


# ------------------------------------------------------------------------------ mask properties
@pytest.mark.parametrize("initial", [0, 4])
@pytest.mark.parametrize("share", [False, True])
def test_mask_causal_budget_initial_diagonal(initial, share):
    q, k, _ = _qkv()
    budget = 15 + initial
    m = R.dhsa_mask(q, k, BD41, budget, initial=initial, share_heads=share)
    n = q.shape[2]
    assert m.shape == (2, 1 if share else 4, n, n)
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    assert not (m & ~causal).any(), "a key after its query is kept"
    rows = torch.arange(n)
    torch.testing.assert_close(m.sum(-1), torch.clamp(rows + 1, max=budget).expand(m.shape[:-1]))  # exactly the budget
    ci = R.chunk_index(BD41, n)
    diag = (ci[:, None] == ci[None, :]) & causal
    init = (torch.arange(n)[None, :] < initial) & causal
    assert (m | ~diag).all(), "the diagonal chunk is not kept"
    assert (m | ~init).all(), "an initial token is not kept"


def test_mask_keeps_best_chunks_first():
    """Off the forced keys, a kept chunk never scores below a dropped one (TopK on upsampled scores)."""
    q, k, _ = _qkv(b=1, h=2, hk=2)
    m = R.dhsa_mask(q, k, BD41, 14)
    s = R.upsample(R.chunk_similarity(q, k, BD41), BD41, 41)
    ci = R.chunk_index(BD41, 41)
    for h in range(2):
        for i in range(20, 41):
            cand = (torch.arange(41) <= i) & (ci != ci[i])
            kept, dropped = m[0, h, i] & cand, ~m[0, h, i] & cand
            if kept.any() and dropped.any():
                assert s[0, h, i][kept].min() >= s[0, h, i][dropped].max()


def test_budget_at_least_length_is_dense():
    q, k, v = _qkv()
    for budget in (None, 41, 100):
        out = R.dhsa_attention_reference(q, k, v, BD41, budget, initial=2)
        torch.testing.assert_close(out, _causal(q, k, v))


def test_plan_is_the_mask():
    q, k, _ = _qkv()
    for share in (False, True):
        for initial in (0, 4, 12):
            plan = R.chunk_plan(q, k, [BD41, R.fixed_boundaries(41, 6)], 24, initial=initial, share_heads=share)
            m = R.dhsa_mask(q, k, [BD41, R.fixed_boundaries(41, 6)], 24, initial=initial, share_heads=share)
            assert torch.equal(R.plan_mask(plan), m)


def test_batch_rows_independent():
    q, k, v = _qkv()
    both = R.dhsa_attention_reference(q, k, v, [BD41, R.fixed_boundaries(41, 5)], 16)
    one = R.dhsa_attention_reference(q[1:], k[1:], v[1:], R.fixed_boundaries(41, 5), 16)
    torch.testing.assert_close(both[1:], one)


def test_decode_is_last_prefill_row():
    q, k, v = _qkv(n=30)
    prompt = torch.tensor([0, 4, 11, 19, 24])
    for total in (25, 30):
        bd = R.decode_boundaries(prompt, total)
        full = R.dhsa_attention_reference(q[:, :, :total], k[:, :, :total], v[:, :, :total], bd, 12, initial=2)
        step = dhsa_decode(q[:, :, total - 1:total], k[:, :, :total], v[:, :, :total], prompt_chunks=prompt,
                           budget=12, initial=2)
        torch.testing.assert_close(step, full[:, :, -1:])


# ------------------------------------------------------------------------------ labels, NMS, predictor
def test_label_ratio_code_rule_by_loops():
    g = torch.Generator().manual_seed(3)
    a = torch.softmax(torch.randn(30, 30, generator=g, dtype=torch.float64).masked_fill(
        ~torch.ones(30, 30, dtype=torch.bool).tril(), float("-inf")), -1)
    w = 3
    r = B.label_ratios(a, w)
    valid = B.label_valid(30, w)
    for t in range(30):
        if not valid[t]:
            assert r[t] == 1.0
            continue
        past = sum(a[j, i] for j in range(t + w, 30) for i in range(t - w + 1, t + 1))
        fut = sum(a[j, i] for j in range(t + w, 30) for i in range(t + 1, t + w + 1))
        want = (max(past, fut) + 1e-6) / (min(past, fut) + 1e-6)
        assert r[t].item() == pytest.approx(float(want), rel=1e-9)
    rn = B.label_ratios(a, w, rule="notes")
    for t in torch.nonzero(valid).flatten().tolist():
        right = sum(a[j, t + 1:j + 1].sum() for j in range(t + 1, t + w + 1))
        left = sum(a[j, t - w + 1:t + 1].sum() for j in range(t + 1, t + w + 1))
        assert rn[t].item() == pytest.approx(float(right / (left + 1e-6)), rel=1e-9)


def test_labels_find_a_planted_boundary():
    """Attention that stays inside two blocks [0, 20) and [20, 40): the ratio peaks at t = 19."""
    n = 40
    a = torch.zeros(n, n, dtype=torch.float64)
    for j in range(n):
        lo = 0 if j < 20 else 20
        a[j, lo:j + 1] = 1.0 / (j + 1 - lo)
    r = B.label_ratios(a, 4)
    assert int(r.argmax()) == 19
    b = B.oracle_boundaries(a, window=4, max_chunks=2)
    assert b.tolist() == [0, 20, 40]
    y = B.soft_labels(r)
    assert y[19] > 0.99 and y[10] < 0.21  # ratio 1 (no evidence) gives sigmoid(-2 ln 2) = 0.2


def test_select_boundaries_nms_and_cap():
    s = torch.zeros(50)
    s[[10, 12, 30, 40]] = torch.tensor([0.9, 0.95, 0.8, 0.7])
    b = B.select_boundaries(s, max_chunks=10, threshold=0.5, nms_window=3)
    assert b.tolist() == [0, 13, 31, 41, 50]  # 10 suppressed by 12 (higher, within 3)
    b = B.select_boundaries(s, max_chunks=3, threshold=0.5, nms_window=3)
    assert b.tolist() == [0, 13, 31, 50]  # at most 3 chunks: the two best boundaries
    assert B.select_boundaries(s, max_chunks=3, threshold=0.99, nms_window=3).tolist() == [0, 50]


def test_predictor_shapes_and_one_step_lowers_loss():
    torch.manual_seed(0)
    for enc in ("separate", "joint"):
        p = B.BoundaryPredictor(channels=32, window=4, heads=4, hidden=16, encoder=enc)
        k = torch.randn(2, 2, 40, 16)  # (batch, kv_heads, seq, dim): 2 x 16 = 32 channels
        x = B.key_features(k)
        assert x.shape == (2, 40, 32)
        logits = p(x)
        assert logits.shape == (2, 40)
        y = (torch.rand(2, 40) < 0.2).float() * 0.9
        mask = B.label_valid(40, 4).expand(2, 40)
        opt = torch.optim.Adam(p.parameters(), lr=1e-3)
        before = B.focal_bce_loss(p(x), y, mask=mask)
        before.backward()
        opt.step()
        with torch.no_grad():
            after = B.focal_bce_loss(p(x), y, mask=mask)
        assert after < before
        b = B.predict_boundaries(p, k, max_chunks=6, threshold=0.0, nms_window=2, max_len=10)
        assert len(b) == 2 and all(int(bb[-1]) == 40 and int((bb[1:] - bb[:-1]).max()) <= 10 for bb in b)


def test_focal_loss_matches_formula():
    z = torch.tensor([-2.0, 0.3, 1.5, 4.0], dtype=torch.float64)
    y = torch.tensor([0.0, 0.7, 1.0, 0.2], dtype=torch.float64)
    p = torch.sigmoid(z)
    pt = p * y + (1 - p) * (1 - y)
    want = ((1 - pt) ** 2 * -(1.3 * y * p.log() + (1 - y) * (1 - p).log())).mean()
    torch.testing.assert_close(B.focal_bce_loss(z, y), want)


def test_predictor_rejects_bad_window_and_heads():
    with pytest.raises(ValueError, match="window"):
        B.BoundaryPredictor(channels=32, window=0)
    with pytest.raises(ValueError, match="divide"):
        B.BoundaryPredictor(channels=30, heads=4)


# ------------------------------------------------------------------------------ recall
def test_recall_one_when_dense_and_bounded_by_best():
    q, k, _ = _qkv()
    n = q.shape[2]
    full = torch.ones(n, n, dtype=torch.bool).tril()[None, None]
    torch.testing.assert_close(B.attention_recall(q, k, full), torch.ones(2, 4, dtype=torch.float64))
    m = R.dhsa_mask(q, k, BD41, 16)
    assert (B.attention_recall(q, k, m) <= B.best_recall(q, k, 16) + 1e-12).all()


# ------------------------------------------------------------------------------ API checks
def test_api_torch_matches_reference_and_fixed_chunks():
    q, k, v = _qkv()
    out = dhsa_attention(q, k, v, chunks=8, budget=20, initial=2, backend="torch")
    torch.testing.assert_close(out, R.dhsa_attention_reference(q, k, v, R.fixed_boundaries(41, 8), 20, initial=2))


@pytest.mark.parametrize("kwargs, match", [
    (dict(chunks=8, budget=0), "budget must be >= 1"),
    (dict(chunks=8, budget=9, initial=2), "budget=9 must be >= .*initial .* longest chunk"),
    (dict(chunks=0, budget=20), "chunks must be >= 1"),
    (dict(chunks=torch.tensor([0, 5, 40]), budget=20), "end at seq=41"),
    (dict(chunks=8, budget=20, initial=-1), "initial must be >= 0"),
    (dict(chunks=8, budget=20, aggregation="max"), "aggregation must be one of"),
    (dict(chunks=8, budget=20, backend="cuda"), "backend must be one of"),
    (dict(chunks=8, budget=20, backend="flex", keep_diagonal=False), "keep_diagonal=True"),
])
def test_api_bad_inputs_raise(kwargs, match):
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=match):
        dhsa_attention(q, k, v, **kwargs)


def test_api_bad_shapes_raise():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="multiple of key/value heads"):
        dhsa_attention(q[:, :3], k, v, chunks=8, budget=20)
    with pytest.raises(ValueError, match="same shape"):
        dhsa_attention(q, k, v[..., :8], chunks=8, budget=20)
    with pytest.raises(TypeError, match="budget must be an int"):
        dhsa_attention(q, k, v, chunks=8, budget=20.0)
    with pytest.raises(ValueError, match="one query"):
        dhsa_decode(q, k, v, prompt_chunks=torch.tensor([0, 10]), budget=8)


# ------------------------------------------------------------------------------ backends vs oracle
def _check_backend(backend, dtype, b, h, hk, n, d, chunks, budget, initial, share, seed=0):
    q, k, v = (x.to(DEV) for x in _qkv(b, h, hk, n, d, dtype, seed))
    kw = dict(chunks=chunks, budget=budget, initial=initial, share_heads=share)
    with torch.no_grad():
        fast = dhsa_attention(q, k, v, backend=backend, **kw)
        oracle = dhsa_attention(q.double(), k.double(), v.double(), backend="torch", **kw)
        eager = dhsa_attention(q, k, v, backend="torch", **kw)
    assert fast.dtype == dtype
    assert_close_to_oracle(fast, eager, oracle, reduction=n if budget is None else budget)


CASES = [  # (dtype, batch, heads, kv_heads, seq, dim, chunks, budget, initial, share_heads)
    (torch.float32, 2, 4, 2, 41, 16, [BD41, torch.tensor([0, 16, 17, 30, 41])], 20, 3, False),
    (torch.bfloat16, 1, 2, 1, 41, 32, BD41, 14, 0, True),
    (torch.float16, 2, 2, 2, 50, 16, 7, 25, 5, False),
    (torch.float32, 1, 2, 2, 40, 16, 8, None, 2, False),  # dense through the backend
    (torch.bfloat16, 1, 3, 1, 64, 16, 16, 48, 20, False),  # initial tokens span a whole chunk
    (torch.float32, 1, 2, 2, 48, 16, 8, 20, 8, True),  # a chunk starts exactly at `initial`
    (torch.float32, 1, 2, 1, 64, 16, torch.tensor([0, 5, 40, 64]), 48, 2, False),  # chunks of several tiles
]


@needs_triton
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{str(c[0])[6:]}-n{c[4]}-b{c[7]}-i{c[8]}-s{int(c[9])}")
def test_triton_matches_oracle(case):
    _check_backend("triton", *case)


@needs_triton
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{str(c[0])[6:]}-n{c[4]}-b{c[7]}-i{c[8]}-s{int(c[9])}")
def test_triton_lists_variant_matches_oracle(case):
    from kvlab.dhsa.api import resolve_chunks
    from kvlab.dhsa.triton import dhsa_attention_triton, launch_tables

    dtype, b, h, hk, n, d, chunks, budget, initial, share = case
    q, k, v = (x.to(DEV) for x in _qkv(b, h, hk, n, d, dtype))
    per = resolve_chunks(chunks, b, n, DEV)
    kw = dict(initial=initial, share_heads=share)
    plan = R.chunk_plan(q, k, per, budget, **kw)
    tables = launch_tables(plan, "lists", dtype=dtype)
    work = tables.tiles[..., 3] > tables.tiles[..., 2]
    assert int(work.sum()) == int(((tables.tiles[..., 3] - tables.tiles[..., 2]) > 0).sum())
    assert not (work[:, 1:] & ~work[:, :-1]).any(), "empty tiles are not last"
    with torch.no_grad():
        fast = dhsa_attention_triton(q, k, v, per, budget, tables=tables, **kw)
        again = dhsa_attention_triton(q, k, v, per, budget, variant="lists", **kw)
        oracle = R.dhsa_attention_reference(q.double(), k.double(), v.double(), per, budget, **kw)
        eager = R.dhsa_attention_reference(q, k, v, per, budget, **kw)
    assert torch.equal(fast, again)
    assert_close_to_oracle(fast, eager, oracle, reduction=n if budget is None else budget)


@needs_triton
def test_triton_rejects_unknown_variant():
    from kvlab.dhsa.triton import dhsa_attention_triton

    q, k, v = _qkv(1, 1, 1, 16, 16, torch.float32)
    with pytest.raises(ValueError, match="variant must be one of"):
        dhsa_attention_triton(q, k, v, R.fixed_boundaries(16, 4), 8, variant="rows")


def test_reference_autograd_gradcheck():
    # The "torch" backend is what one would train through (the Triton kernel is forward only): its
    # gradients match finite differences (the selection is piecewise constant, away from ties).
    q, k, v = _qkv(1, 2, 1, 12, 4)
    for x in (q, k, v):
        x.requires_grad_(True)
    bd = torch.tensor([0, 3, 7, 12])
    fn = lambda q, k, v: dhsa_attention(q, k, v, chunks=bd, budget=6, initial=1, backend="torch")  # noqa: E731
    assert torch.autograd.gradcheck(fn, (q, k, v), eps=1e-6, atol=1e-7)


@pytest.mark.parametrize("case", CASES[:3], ids=lambda c: f"{str(c[0])[6:]}-n{c[4]}-b{c[7]}")
def test_flex_matches_oracle(case):
    if case[0] != torch.float32 and not torch.cuda.is_available():
        case = (torch.float32, *case[1:])  # CPU flex (eager) takes float32 here
    _check_backend("flex", *case)


@needs_triton
def test_triton_refuses_autograd():
    q, k, v = (x.to(DEV) for x in _qkv(1, 2, 2, 40, 16, torch.float32))
    q.requires_grad_(True)
    with pytest.raises(ValueError, match="forward only"):
        dhsa_attention(q, k, v, chunks=8, budget=16, backend="triton")


# ------------------------------------------------------------------------------ pattern (tiny models)
def test_pattern_dense_reproduces_model_and_sparse_differs(tiny_gemma, ids):
    from kvlab.core import use_pattern
    from kvlab.dhsa.pattern import DHSAPattern, dhsa_layers

    assert dhsa_layers(tiny_gemma) == [2]  # the one global layer of the tiny Gemma3
    with torch.no_grad():
        base = tiny_gemma(ids).logits
        with use_pattern(tiny_gemma, DHSAPattern(None, chunk_size=8), layers=dhsa_layers(tiny_gemma)):
            dense = tiny_gemma(ids).logits
        torch.testing.assert_close(dense, base, rtol=1e-4, atol=1e-4)
        p = DHSAPattern(16, chunking="oracle", chunk_size=4, initial=2, record=True)
        with use_pattern(tiny_gemma, p, layers=dhsa_layers(tiny_gemma)):
            sparse = tiny_gemma(ids).logits
    assert torch.isfinite(sparse).all() and not torch.allclose(sparse, base, atol=1e-4)
    assert 0 < p.recall[2] < 1 and int(p.boundaries[2][0][-1]) == ids.shape[1]


def test_pattern_refuses_sliding_layers_and_small_budgets(tiny_gemma, ids):
    from kvlab.core import use_pattern
    from kvlab.dhsa.pattern import DHSAPattern

    with pytest.raises(ValueError, match="sliding-window layer"):
        with use_pattern(tiny_gemma, DHSAPattern(16, chunk_size=4), layers=[0]), torch.no_grad():
            tiny_gemma(ids)
    with pytest.raises(ValueError, match="budget=8 must be >= initial"):
        DHSAPattern(8, chunk_size=8, initial=4)
    with pytest.raises(ValueError, match="needs predictor"):
        DHSAPattern(64, chunking="predictor")
    with pytest.raises(ValueError, match="chunking must be one of"):
        DHSAPattern(64, chunking="learned")


def test_pattern_decode_steps_follow_prefill(tiny_llama, ids):
    """Decode under the pattern: each step equals the last row of a prefill with App. A's chunks."""
    from kvlab.core import use_pattern
    from kvlab.dhsa.pattern import DHSAPattern

    p = DHSAPattern(12, chunk_size=6, initial=2)
    with torch.no_grad(), use_pattern(tiny_llama, p):
        out = tiny_llama(ids[:, :30], use_cache=True)
        step = tiny_llama(ids[:, 30:31], past_key_values=out.past_key_values, use_cache=True).logits[:, -1]
    assert p.boundaries[0][0].tolist() == [0, 6, 12, 18, 24, 30]
    # the same token through a prefill whose chunks are the decode chunks [0,6,...,30,31]
    q = DHSAPattern(12, chunk_size=6, initial=2)
    q.chunks = lambda query, key, scaling: [torch.tensor([0, 6, 12, 18, 24, 30, 31])] * query.shape[0]
    with torch.no_grad(), use_pattern(tiny_llama, q):
        full = tiny_llama(ids[:, :31]).logits[:, -1]
    torch.testing.assert_close(step, full, rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------------------------ training (tiny model)
def test_labels_training_and_save_load(tiny_llama, tmp_path):
    from kvlab.dhsa import training as T

    g = torch.Generator().manual_seed(0)
    samples = [torch.randint(0, 96, (48,), generator=g) for _ in range(3)]
    labels = T.make_labels(tiny_llama, samples, [0, 2], window=3)
    assert set(labels.ratios[0]) == {0, 2} and labels.ratios[0][0].shape == (48,)
    labels.save(tmp_path / "labels.pt")
    again = T.LabelSet.load(tmp_path / "labels.pt")
    assert torch.equal(again.ratios[1][2], labels.ratios[1][2])
    res = T.train_predictor(tiny_llama, labels, epochs=2, heads=4, hidden=16, lr=1e-3)
    assert len(res.losses) == 6 and all(math.isfinite(x) for x in res.losses)
    metrics = T.evaluate_predictor(tiny_llama, res.predictor, labels)
    assert 0 <= metrics["f1"] <= 1 and math.isfinite(metrics["loss"])
    sha = T.save_predictor(res.predictor, tmp_path / "p.pt", {"note": "test"})
    p2, meta = T.load_predictor(tmp_path / "p.pt")
    x = torch.randn(1, 20, res.predictor.channels)
    torch.testing.assert_close(p2(x), res.predictor(x))
    assert meta == {"note": "test"} and len(sha) == 64


# ------------------------------------------------------------------------------ theory
def test_eq4_has_length_free_null_scores():
    from kvlab.dhsa.theory import null_score_std, selection_rates

    std = null_score_std([4, 16, 64], trials=3000)
    assert std["eq4"].max() / std["eq4"].min() < 1.1
    assert std["mean"][0] / std["mean"][2] == pytest.approx(4.0, rel=0.1)  # 1 / sqrt(n)
    assert std["sum"][2] / std["sum"][0] == pytest.approx(4.0, rel=0.1)  # sqrt(n)
    rates = selection_rates([4, 16, 64], trials=3000)
    assert (rates["eq4"] - 1 / 3).abs().max() < 0.04
    assert rates["mean"][0] > rates["mean"][2] + 0.1 and rates["sum"][2] > rates["sum"][0] + 0.1


# ------------------------------------------------------------------------------ flex tiles, bench helpers
def test_flex_touched_tiles_cover_the_mask():
    from kvlab.dhsa.flex import touched_blocks

    q, k, _ = _qkv(2, 2, 1, 70, 16, torch.float32)
    bds = [torch.tensor([0, 5, 9, 20, 22, 30, 50, 70]), R.fixed_boundaries(70, 7)]
    for share in (False, True):
        plan = R.chunk_plan(q, k, bds, 24, initial=3, share_heads=share)
        m = R.dhsa_mask(q, k, bds, 24, initial=3, share_heads=share)
        tiles = touched_blocks(plan, 16)
        nb = tiles.shape[-1]
        pad = nb * 16 - 70
        need = F.pad(m, (0, pad, 0, pad)).view(2, m.shape[1], nb, 16, nb, 16).any(5).any(3)
        assert (tiles | ~need).all(), "a tile holding kept keys is skipped"


def test_bench_helpers():
    from kvlab.experiments.bench.dhsa import COMMANDS, kept_density, random_boundaries

    assert set(COMMANDS) >= {"ops", "prefill", "tune"}
    b = random_boundaries(1000, 16, 128, seed=1)
    lens = b[1:] - b[:-1]
    assert int(b[0]) == 0 and int(b[-1]) == 1000 and int(lens[:-1].min()) >= 16 and int(lens.max()) <= 128
    n, nb = 50, 10
    m = R.dhsa_mask(*_qkv(1, 1, 1, n, 8)[:2], R.fixed_boundaries(n, 5), nb)
    assert kept_density(n, nb) == pytest.approx(m.sum().item() / (n * (n + 1) / 2))


# ------------------------------------------------------------------------------ decode path and policy (App. A)
def test_decode_attention_dense_when_budget_covers_the_cache():
    from kvlab.dhsa.policy import decode_attention

    q, k, v = _qkv(2, 4, 2, 30, 8)
    prompt = torch.tensor([0, 5, 12, 20])
    out = decode_attention(q[:, :, 20:], k, v, prompt, budget=30, initial=2)
    torch.testing.assert_close(out, _causal(q, k, v)[:, :, 20:])


def test_decode_attention_rows_follow_the_budget():
    from kvlab.dhsa.policy import decode_attention

    q, k, v = _qkv(1, 2, 1, 40, 8, seed=3)
    prompt = torch.tensor([0, 7, 15, 30])
    out = decode_attention(q[:, :, 30:], k, v, prompt, budget=12, initial=3)
    for t in range(30, 40):  # each new token: <= 12 kept keys, initial and itself among them, equal to its row
        ref, mask = R.dhsa_decode_reference(q[:, :, t:t + 1], k[:, :, :t + 1], v[:, :, :t + 1], prompt, 12,
                                            initial=3, return_mask=True)
        assert int(mask.sum(-1).max()) == 12 and mask[..., :3].all() and mask[..., t].all()
        torch.testing.assert_close(out[:, :, t - 30:t - 29], ref)
    assert not torch.allclose(out, _causal(q, k, v)[:, :, 30:])


def test_dhsa_decode_policy_keeps_full_cache_and_matches_dense(tiny_llama, ids):
    from kvlab.core import KVCache, use_pattern
    from kvlab.dhsa.pattern import DHSAPattern
    from kvlab.dhsa.policy import DHSADecode

    pol = DHSADecode(64, initial=2)
    assert pol.budget is None and pol.attended(100) == 64 and pol.attended(10) == 10
    with torch.no_grad():
        dense = tiny_llama(ids).logits[:, 30:]
        with use_pattern(tiny_llama, DHSAPattern(64, chunk_size=6, initial=2)):  # budget >= length: dense
            cache = KVCache(tiny_llama, pol)
            tiny_llama(ids[:, :30], past_key_values=cache, use_cache=True)
            steps = [tiny_llama(ids[:, t:t + 1], past_key_values=cache, use_cache=True).logits for t in range(30, 48)]
    torch.testing.assert_close(torch.cat(steps, 1), dense, rtol=1e-4, atol=1e-4)
    assert cache.trace.per_layer[-1] == [48] * len(cache.trace.per_layer[-1])  # nothing dropped


@pytest.mark.parametrize("kwargs, match", [
    (dict(attend_budget=0), "attend_budget must be >= 1"),
    (dict(attend_budget=4, initial=4), "attend_budget=4 must be >= initial"),
    (dict(attend_budget=8, initial=-1), "initial must be >= 0"),
])
def test_dhsa_decode_policy_bad_inputs(kwargs, match):
    from kvlab.dhsa.policy import DHSADecode

    with pytest.raises(ValueError, match=match):
        DHSADecode(**kwargs)


def test_decode_attention_bad_inputs():
    from kvlab.dhsa.policy import decode_attention

    q, k, v = _qkv(1, 2, 1, 20, 8)
    with pytest.raises(ValueError, match="prompt_chunks end at 20"):
        decode_attention(q[:, :, 19:], k, v, torch.tensor([0, 10, 20]), budget=8)
    with pytest.raises(ValueError, match="budget must be >= 1"):
        decode_attention(q[:, :, 19:], k, v, torch.tensor([0, 10]), budget=0)
    with pytest.raises(ValueError, match="one per sequence"):
        decode_attention(q[:, :, 19:], k, v, [torch.tensor([0, 10])] * 2, budget=8)


def test_decode_memory_accounting():
    from kvlab.dhsa.policy import decode_memory
    from kvlab.memory import MODEL_SHAPES, kv_cache_bytes

    s = MODEL_SHAPES["smollm2-135m"]
    dense = decode_memory(s, 4000, 96, method="dense")
    assert dense["cache_bytes"] == kv_cache_bytes(s, 4096) == dense["read_bytes"]
    dhsa = decode_memory(s, 4000, 96, method="dhsa", budget=1024, chunk_size=64)
    per_chunk = s.kv_heads * s.head_dim * 2
    assert dhsa["entries"] == dense["entries"] and dhsa["read_entries"] == 1024 * s.layers
    assert dhsa["read_bytes"] == kv_cache_bytes(s, 1024) + s.layers * (63 + 2) * per_chunk
    stream = decode_memory(s, 4000, 96, method="streamingllm", budget=128)
    assert stream["cache_bytes"] == kv_cache_bytes(s, 128)
    h2o = decode_memory(s, 4000, 96, method="h2o", budget=128)
    assert h2o["cache_bytes"] == kv_cache_bytes(s, 128) + s.layers * 128 * s.heads * 4
    win = [512 if (i + 1) % 6 else None for i in range(s.layers)]  # local layers hold their window only
    local = decode_memory(s, 4000, 96, method="dense", sliding_window=win)
    assert local["entries"] == 25 * 512 + 5 * 4096
    assert decode_memory(s, 4000, 96, method="streamingllm", budget=128, sliding_window=win)["entries"] == 30 * 128
    with pytest.raises(ValueError, match="method must be one of"):
        decode_memory(s, 10, 1, method="pyramidkv")
    with pytest.raises(ValueError, match="generated must be >= 1"):
        decode_memory(s, 10, 0, method="dense")


# ------------------------------------------------------------------------------ experiments (Table 1, costs)
def test_qa_f1():
    from kvlab.eval.qa import qa_f1

    assert qa_f1("The France.\nmore", ["France", "Paris"]) == 1.0
    assert qa_f1("northern France", ["France"]) == pytest.approx(2 / 3)
    assert qa_f1("Germany", ["France"]) == 0.0


def test_qa_items_fit_and_hold_the_answer_source(monkeypatch):
    import kvlab.datasets
    from kvlab.eval.qa import qa_items

    class Tok:  # one token per word
        def __call__(self, text, add_special_tokens=False):
            return type("E", (), {"input_ids": text.split()})()

    paras = {f"A{i}": f"alpha {i} " * 30 for i in range(6)}
    squad = [dict(title=f"T{i % 3}", context=paras[f"A{i}"], question=f"q{i}?", answers=[f"{i}"], is_impossible=False)
             for i in range(6)]
    hotpot = [dict(question=f"h{i}?", answer=f"ans{i}", supporting_facts=[[f"g{i}", 0]],
                   context=[[f"g{i}", ["gold words " * 10]]] + [[f"d{i}{j}", ["other words " * 10]] for j in range(3)])
              for i in range(4)]
    monkeypatch.setattr(kvlab.datasets, "load_records", lambda name: squad if name == "squad" else hotpot)
    for task in ("single-doc", "multi-doc", "few-shot"):
        items = qa_items(Tok(), task, 2, 200, seed=1)
        assert len(items) == 2
        for it in items:
            assert it.tokens <= 200 and it.prompt.rstrip().endswith("Answer:")
    it = qa_items(Tok(), "multi-doc", 1, 200, seed=2)[0]
    assert f"g{it.answers[0][-1]}: gold" in it.prompt  # the supporting paragraph is never dropped
    with pytest.raises(ValueError, match="task must be one of"):
        qa_items(Tok(), "summarization", 1, 200)


def test_prefill_and_decode_cost_on_cpu():
    from kvlab.baselines import Full, StreamingLLM
    from kvlab.experiments.dhsa.measures import decode_cost, peak_bytes, prefill_cost, random_model
    from kvlab.dhsa.pattern import DHSAPattern, dhsa_layers

    x = {}
    assert peak_bytes(lambda: x.setdefault("t", torch.zeros(1000, 250)), torch.device("cpu")) >= 10**6
    model = random_model("tiny", attn_implementation="eager", device="cpu")
    assert dhsa_layers(model) == [5]
    ids = torch.randint(0, 96, (1, 64))
    c = prefill_cost(model, ids, DHSAPattern(24, chunk_size=8, initial=2), dhsa_layers(model), repeats=1)
    assert c["ms"] > 0 and c["peak_bytes"] > 0
    d = decode_cost(model, ids, StreamingLLM(2, cache_size=16), steps=3)
    full = decode_cost(model, ids, Full(), steps=3)
    assert len(d["step_ms"]) == 3 and d["peak_bytes"] is None
    assert full["cache_bytes"][-1] > d["cache_bytes"][-1] and full["cache_bytes"][1] > full["cache_bytes"][0]


def test_bench_prefill_and_decode_entry_points_on_cpu(tmp_path):
    import json

    from kvlab.experiments.bench.dhsa import COMMANDS

    assert {"prefill", "decode"} <= set(COMMANDS)
    common = ["--shapes", "tiny", "--seqs", "48", "--budget-keys", "24", "--chunk", "8", "--initial", "2",
              "--out", str(tmp_path)]
    assert COMMANDS["prefill"](common + ["--repeats", "1", "--attn", "eager,sdpa"]) == 0
    rec = json.loads((tmp_path / "dhsa_prefill.json").read_text())
    assert {(r["attn"], r["method"]) for r in rec["rows"]} == {(a, m) for a in ("eager", "sdpa")
                                                                for m in ("dense", "dhsa")}
    assert COMMANDS["decode"](common + ["--steps", "2", "--cache", "12"]) == 0
    rec = json.loads((tmp_path / "dhsa_decode.json").read_text())
    assert [r["method"] for r in rec["rows"]] == ["dense", "streamingllm", "h2o", "dhsa"]
    assert (tmp_path / "dhsa_decode.md").exists()


def test_shipped_predictor_loads_and_matches_its_checksum(tmp_path, monkeypatch):
    import hashlib
    import json

    from kvlab.dhsa import training as T

    p, info = T.shipped_predictor("smollm2-135m")
    assert info["layers"] == [0]  # the boundary layer of DHSA's experiments picks the layer-0 predictor
    pt = T.SHIPPED / info["file"]
    assert hashlib.sha256(pt.read_bytes()).hexdigest() == info["sha256"] and pt.stat().st_size < 2**21
    assert p.channels == 192 and p.config() == info["predictor"] and not p.training
    assert info["command"].split("PYTHONPATH=. ")[-1].startswith("python -m kvlab.dhsa.training")
    logits = p(torch.randn(1, 24, 192))
    assert logits.shape == (1, 24) and torch.isfinite(logits).all()
    with pytest.raises(ValueError, match="no shipped DHSA predictor for 'gemma3-270m'"):
        T.shipped_predictor("gemma3-270m")
    bad = tmp_path / "data"  # a damaged copy is refused, naming the command that rebuilds it
    bad.mkdir()
    (bad / "smollm2-135m.pt").write_bytes(pt.read_bytes()[:-1] + b"x")
    (bad / "smollm2-135m.json").write_text(json.dumps(info))
    monkeypatch.setattr(T, "SHIPPED", bad)
    with pytest.raises(ValueError, match="damaged"):
        T.shipped_predictor("smollm2-135m")


# ------------------------------------------------------------------------------ clear errors (robustness issue)
@pytest.mark.parametrize("scale, err, match", [
    ("x", TypeError, "scale must be a positive finite number"),
    (float("nan"), ValueError, "scale must be a positive finite number"),
    (-1.0, ValueError, "scale must be a positive finite number"),
])
def test_bad_scale_raises(scale, err, match):
    q, k, v = _qkv()
    with pytest.raises(err, match=match):
        dhsa_attention(q, k, v, chunks=8, budget=20, scale=scale, backend="torch")
    with pytest.raises(err, match=match):
        dhsa_decode(q[:, :, -1:], k, v, prompt_chunks=torch.tensor([0, 8, 32]), budget=20, scale=scale)


@pytest.mark.parametrize("kwargs, match", [
    (dict(threshold=2.0), r"threshold must be a probability in \[0, 1\)"),
    (dict(threshold=float("nan")), r"threshold must be a probability in \[0, 1\)"),
    (dict(max_len=0), "max_len must be None .* or an int >= 1"),
    (dict(max_chunks=0), "max_chunks must be an int >= 1"),
])
def test_predict_boundaries_bad_arguments_raise(kwargs, match):
    pred = B.BoundaryPredictor(32, window=4, heads=4, hidden=16).eval()
    kw = dict(max_chunks=8) | kwargs
    with pytest.raises(ValueError, match=match):
        B.predict_boundaries(pred, torch.randn(1, 2, 40, 16), **kw)


def test_share_heads_must_be_a_bool():
    from kvlab.dhsa.pattern import DHSAPattern

    q, k, v = _qkv()
    with pytest.raises(TypeError, match="share_heads must be True or False"):
        dhsa_attention(q, k, v, chunks=8, budget=20, share_heads="no", backend="torch")
    with pytest.raises(TypeError, match="share_heads must be True or False"):
        DHSAPattern(20, chunk_size=8, share_heads="no")
    with pytest.raises(ValueError, match="threshold=2.0 is a probability"):
        DHSAPattern(64, chunking="predictor", predictor=B.BoundaryPredictor(32, heads=4, hidden=8), threshold=2.0)
    with pytest.raises(ValueError, match="decode must be one of"):
        DHSAPattern(20, chunk_size=8, decode="sparse")


# ------------------------------------------------------------------------------ clear errors, round 3
def test_selection_for_another_batch_is_refused():
    from kvlab.dhsa.api import dhsa_attention, dhsa_selection

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 32, 8, generator=g) for _ in range(3))
    sel = dhsa_selection(q, k, chunks=8, budget=12, initial=2, backend="torch")
    with pytest.raises(ValueError, match="batch of 2 sequences, q holds 1"):
        dhsa_attention(q[:1], k[:1], v[:1], chunks=8, budget=12, initial=2, selection=sel, backend="torch")
    out = dhsa_attention(q, k, v, chunks=8, budget=12, initial=2, selection=sel, backend="torch")
    assert out.shape == q.shape


def test_nms_on_no_positions_and_decode_with_2d_chunks_say_what_is_wrong():
    from kvlab.dhsa.api import dhsa_decode
    from kvlab.dhsa.boundary_predictor import nms_boundaries

    with pytest.raises(ValueError, match="at least one position"):
        nms_boundaries(torch.zeros(1, 0), max_chunks=4, threshold=0.5)
    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(1, 2, 1, 8, generator=g), torch.randn(1, 2, 20, 8, generator=g), torch.randn(1, 2, 20, 8)
    with pytest.raises(ValueError, match="prompt_chunks must be one 1-d tensor"):
        dhsa_decode(q, k, v, prompt_chunks=torch.tensor([[0, 8, 19], [0, 10, 19]]), budget=8, initial=1)
