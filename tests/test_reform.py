"""REFORM (kvlab.reform): Algorithm 1's pieces pinned on tiny random models and synthetic inputs.

The Triton kernels (``-k triton``) run in the interpreter on CPU (``tests/conftest.py`` sets
``TRITON_INTERPRET=1``) and on CUDA where there is one; shapes are tiny.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch

from kvlab.reform import api, heads as H, reference as R
from kvlab.experiments.reform import compare as compare
from kvlab.reform.reference import Head
from kvlab.testing import assert_close_to_oracle

pytestmark = pytest.mark.usefixtures("one_thread")
needs_triton = pytest.mark.triton
DEV = "cuda" if torch.cuda.is_available() else "cpu"


class Tok:
    """Token ids stand for text: decode joins them, no special tokens."""

    eos_token_id = None
    all_special_ids: list[int] = []

    def decode(self, ids, skip_special_tokens=False):
        return " ".join(str(int(i)) for i in ids)


def _ids(n: int, seed: int = 1, high: int = 96) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, high, (1, n), generator=g)


# --------------------------------------------------------------------------- recurrent chunked forwarding


@pytest.mark.parametrize("exit_layer", [2, 4])
def test_unbounded_budget_equals_one_full_forward(tiny_model, exit_layer):
    """Chunks conditioned on an unbounded cache are one forward pass, up to the exit layer (and the
    saved embeddings are the full pass's projections)."""
    ids = _ids(50)
    ctx, query = ids[:, :44], ids[:, 44:]
    heads = [Head("v", exit_layer - 1, 1), Head("q", 0, 2), Head("k", exit_layer - 1, 0)]
    trace = R.reform(tiny_model, ctx, query, heads=heads, chunk_size=12, budget=None, early_exit_layer=exit_layer,
                     recompute_budget=20, n_initial=2, n_recent=2, n_final=2, pool=3, keep_hidden=True,
                     emb_dtype=torch.float32)
    with torch.no_grad():
        full = tiny_model(ids, output_hidden_states=True).hidden_states
    chunked = torch.cat(trace.hidden, dim=1)
    if exit_layer == len(full) - 1:  # transformers hands out the last layer's states after the final norm
        chunked = R.decoder_of(tiny_model).norm(chunked)
    torch.testing.assert_close(chunked, full[exit_layer], atol=2e-5, rtol=1e-4)
    layers = R.decoder_of(tiny_model).layers
    cols = []
    for h in sorted(set(heads)):
        normed = layers[h.layer].input_layernorm(full[h.layer])
        states = R.head_states(layers[h.layer], normed, h.kind, [h.head])[0, 0]
        cols.append(torch.nn.functional.normalize(states, dim=-1))
    torch.testing.assert_close(trace.embeddings, torch.cat(cols, dim=-1).detach(), atol=2e-5, rtol=1e-4)


def test_layers_above_the_exit_never_run_and_hold_no_cache(tiny_llama):
    calls = []
    layers = R.decoder_of(tiny_llama).layers
    hooks = [layers[i].register_forward_pre_hook(lambda m, a, i=i: calls.append(i)) for i in range(4)]
    try:
        trace = R.reform(tiny_llama, _ids(60), _ids(6, 2), heads=[Head("v", 1, 0)], chunk_size=16, budget=20,
                         early_exit_layer=2, recompute_budget=24, n_initial=2, n_recent=4, n_final=2, pool=5)
    finally:
        for h in hooks:
            h.remove()
    assert set(calls) == {0, 1}
    assert trace.cache.allocated() == [True, True, False, False]
    assert trace.cache.nbytes(2) == trace.cache.nbytes(3) == 0
    assert trace.cache.nbytes() == trace.cache.nbytes(0) + trace.cache.nbytes(1) > 0
    # every running layer holds the budget after compression, plus the (uncompressed) query chunk
    assert trace.cache.size == 20 + 6
    assert trace.cache_bytes_peak >= trace.cache.nbytes()


def test_positions_are_consecutive_after_eviction(tiny_model):
    """After each compression entry j of every layer is the key of token origin[j] rotated at position j."""
    model = tiny_model
    layers = R.decoder_of(model).layers
    cache, rec = R.CompressedCache(len(layers)), R.StateRecorder()
    ids = _ids(70, 3)
    for start, end in R.chunk_spans(70, 16):
        R.forward_chunk(model, ids[:, start:end], cache, rec, early_exit_layer=3, budget=12, n_initial=2,
                        n_recent=3, score_window=8, chunk_start=start)
        assert cache.size == min(end, 12)
        for l in range(3):
            origin = cache.origin[l]
            assert bool((origin[1:] > origin[:-1]).all()) and origin[:2].tolist() == [0, 1]
            assert origin[-3:].tolist() == list(range(end - 3, end))
            layer = layers[l]
            k = R.head_states(layer, rec.input(l)[origin][None], "k")
            if hasattr(layer.self_attn, "k_norm"):
                k = layer.self_attn.k_norm(k)
            pos = torch.arange(origin.numel())[None]
            cos, sin = R.rope_at(model, l, k, pos)
            expected = k * cos[:, None] + R._rotate_half(k) * sin[:, None]
            torch.testing.assert_close(cache.keys[l], expected.detach(), atol=1e-5, rtol=1e-4)


def test_h2o_keep_initial_recent_and_heavy_hitters():
    scores = torch.tensor([0.0, 0, 9, 1, 8, 0, 7, 0, 0, 0])
    keep = R.h2o_keep(scores, budget=6, n_initial=1, n_recent=2)
    assert keep.tolist() == [0, 2, 4, 6, 8, 9]
    assert R.h2o_keep(scores, budget=10, n_initial=1, n_recent=2).tolist() == list(range(10))


def test_h2o_scores_are_the_attention_of_the_last_queries():
    torch.manual_seed(0)
    q, k = torch.randn(1, 4, 3, 8), torch.randn(1, 2, 10, 8)
    s = R.h2o_scores(q, k, 8 ** -0.5, torch.arange(7, 10), torch.arange(10))
    assert s.shape == (1, 10)
    torch.testing.assert_close(s.sum(), torch.tensor(12.0))  # 4 heads x 3 queries, each a distribution
    logits = q[0, 0, 0] @ k[0, 0].T * 8 ** -0.5  # head 0 reads KV head 0; query 0 sits at position 7
    p = torch.softmax(logits[:8], dim=0)
    assert float(s[0, 9]) > 0 and p.sum() == pytest.approx(1.0)


# --------------------------------------------------------------------------- gather


def test_significance_is_mean_cosine_max_over_query_then_max_pooled():
    torch.manual_seed(0)
    a, b = torch.nn.functional.normalize(torch.randn(2, 300, 4), dim=-1)
    ctx = torch.cat([a, b], dim=-1)  # two heads of 4 dims
    qa, qb = torch.nn.functional.normalize(torch.randn(2, 5, 4), dim=-1)
    query = torch.cat([qa, qb], dim=-1)
    raw = ((a @ qa.T + b @ qb.T) / 2).max(dim=1).values
    torch.testing.assert_close(R.significance(ctx, query, 2, pool=1), raw)
    pooled = R.significance(ctx, query, 2, pool=129)
    for t in (0, 100, 299):
        assert float(pooled[t]) == pytest.approx(float(raw[max(0, t - 64):t + 65].max()))


def test_gather_keeps_a_needle_at_a_known_position():
    torch.manual_seed(0)
    n, needle = 2000, 1234
    ctx = torch.nn.functional.normalize(torch.randn(n, 16), dim=-1)
    query = ctx[needle:needle + 3].clone()
    scores = R.significance(ctx, query, 1, pool=129)
    keep = R.gather_indices(scores, recompute_budget=200, n_initial=8, n_final=8)
    assert needle in keep.tolist() and needle + 2 in keep.tolist()
    assert keep[:8].tolist() == list(range(8)) and keep[-8:].tolist() == list(range(n - 8, n))


def test_reform_gathers_the_needle_of_a_token_sequence(tiny_llama):
    """Layer 0 value states depend on the token alone: a query repeating the needle's tokens finds it."""
    filler = _ids(300, 5, high=80)
    needle = torch.tensor([[80, 91, 85, 88, 93]])
    at = 170
    ctx = torch.cat([filler[:, :at], needle, filler[:, at:]], dim=1)
    trace = R.reform(tiny_llama, ctx, needle, heads=[Head("v", 0, 0), Head("v", 0, 1)], chunk_size=64, budget=32,
                     early_exit_layer=1, recompute_budget=40, n_initial=4, n_recent=8, n_final=4, pool=9)
    kept = trace.gathered.tolist()
    assert all(at + i in kept for i in range(5))
    assert trace.input_ids.shape[1] == 40 + 5
    assert torch.equal(trace.input_ids[0, -5:], needle[0])


def test_gather_breaks_pooled_ties_by_the_unpooled_score():
    raw = torch.zeros(1000)
    raw[600] = 1.0  # one matching token: max-pooling gives its 129-token window the same score
    raw[590:600] = 0.5
    pooled = torch.nn.functional.max_pool1d(raw[None, None], 129, 1, 64)[0, 0]
    keep = R.gather_indices(pooled, 30, 4, 4, tiebreak=raw)
    assert 600 in keep.tolist() and all(t in keep.tolist() for t in range(590, 600))
    assert 600 not in R.gather_indices(pooled, 30, 4, 4).tolist()  # by position alone the window's start wins


@pytest.mark.parametrize("budget", [1, 20, 37, 500])
def test_recompute_budget_respected(budget):
    torch.manual_seed(budget)
    scores = torch.rand(300)
    scores[100:140] = 2.0  # a plateau, as max-pooling makes
    keep = R.gather_indices(scores, recompute_budget=max(budget, 10), n_initial=4, n_final=6)
    m = min(300, max(budget, 10))
    assert keep.numel() == m
    assert bool((keep[1:] > keep[:-1]).all())
    assert keep[:4].tolist() == [0, 1, 2, 3] and keep[-6:].tolist() == list(range(294, 300))


def test_api_recompute_budget_and_stats(tiny_llama):
    out = api.reform_gather(tiny_llama, Tok(), _ids(120), _ids(6, 9), heads=["v:1:0", "k:0:1"], chunk_size=32,
                            budget=24, recompute_budget=30, n_initial=2, n_recent=4, n_final=4, pool=5,
                            progress=False)
    assert out.settings["early_exit_layer"] == 2
    assert out.gathered.numel() == 30 and out.input_ids.shape == (1, 36)
    assert out.stats["layers_with_cache"] == 2
    assert out.stats["embedding_bytes_per_token"] == 2 * 16 * 2  # two heads of 16 dims in float16
    nll, _ = api.reform_answer_nll(tiny_llama, _TextTok(), "a" * 60, "b" * 5, " c", heads=["v:1:0"], chunk_size=16,
                                   budget=20, recompute_budget=24, n_initial=2, n_recent=4, n_final=4, pool=5,
                                   progress=False)
    assert nll == nll and nll > 0


class _TextTok(Tok):
    """One token a character (ids = ord % 96): enough for the text entry points."""

    pad_token_id = 0

    def __call__(self, text, return_tensors=None, add_special_tokens=True):
        ids = torch.tensor([[ord(c) % 96 for c in text]])

        class Enc(dict):
            input_ids = ids
        e = Enc(input_ids=ids[0].tolist())
        e.input_ids = ids
        return e


def test_reform_generate_returns_text(tiny_llama):
    out = api.reform_generate(tiny_llama, _TextTok(), "x" * 80, "yz", answer_prefix=" w", heads=["v:0:1"],
                              chunk_size=32, budget=24, recompute_budget=30, n_initial=2, n_recent=4, n_final=4,
                              pool=5, max_new_tokens=3, progress=False)
    assert isinstance(out.text, str) and len(out.text.split()) == 3
    assert out.input_ids.shape[1] == 30 + 4  # query "yz" and answer prefix " w"


# --------------------------------------------------------------------------- bad inputs


@pytest.mark.parametrize("kwargs, match", [
    (dict(budget=8, n_initial=4, n_recent=4), r"budget \(8\) must be larger than n_initial \+ n_recent"),
    (dict(recompute_budget=6, n_initial=4, n_final=4), r"recompute_budget \(6\) must be >= n_initial \+ n_final"),
    (dict(early_exit_layer=5), r"early_exit_layer \(5\) must be in \[2, 4\]"),
    (dict(early_exit_layer=1), r"early_exit_layer \(1\) must be in \[2, 4\]"),
    (dict(heads="/nonexistent/heads.json"), r"heads file .* does not exist"),
    (dict(heads=["v:9:0"]), r"layer of v:9:0 must be in \[0, 3\]"),
    (dict(heads=["x:1:0"]), r"kind must be one of"),
    (dict(pool=4), r"pool must be odd"),
])
def test_bad_inputs_name_the_constraint(tiny_llama, kwargs, match):
    settings = dict(heads=["v:1:0"], chunk_size=16, budget=20, recompute_budget=24, n_initial=2, n_recent=4,
                    n_final=4, pool=5, progress=False)
    settings.update(kwargs)
    with pytest.raises(ValueError, match=match):
        api.reform_gather(tiny_llama, Tok(), _ids(64), _ids(4), **settings)


def test_query_longer_than_the_input(tiny_llama):
    with pytest.raises(ValueError, match=r"query \(40 tokens\) must be shorter than the input context \(30 tokens\)"):
        api.reform_gather(tiny_llama, Tok(), _ids(30), _ids(40), heads=["v:1:0"], chunk_size=16, budget=20,
                          recompute_budget=24, n_initial=2, n_recent=4, n_final=4, progress=False)


def test_heads_files(tiny_llama, tmp_path):
    good = tmp_path / "heads.json"
    good.write_text(json.dumps({"signature": api.model_signature(tiny_llama), "heads": ["v:1:0", "q:0:3"]}))
    assert api.load_heads(str(good), tiny_llama) == [Head("q", 0, 3), Head("v", 1, 0)]
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"signature": {**api.model_signature(tiny_llama), "num_layers": 30}, "heads": []}))
    with pytest.raises(ValueError, match="chosen for a different model"):
        api.load_heads(str(other), tiny_llama)
    junk = tmp_path / "junk.json"
    junk.write_text("[1, 2]")
    with pytest.raises(ValueError, match="is not a heads file"):
        api.load_heads(str(junk), tiny_llama)
    with pytest.raises(ValueError, match="ships no heads file"):
        api.load_heads(None, tiny_llama)


# --------------------------------------------------------------------------- head choice (MNR)


def test_normalised_ranks_and_mnr():
    s = torch.tensor([0.1, 0.9, 0.5, 0.5, 0.0])
    torch.testing.assert_close(R.normalised_ranks(s), torch.tensor([3.0, 0.0, 1.5, 1.5, 4.0]) / 5)
    gold = torch.zeros(100, dtype=torch.bool)
    gold[40:45] = True
    perfect = torch.zeros(100)
    perfect[40:45] = 1.0
    assert R.mean_normalised_rank(perfect, gold, neighbours=0) == pytest.approx(2.0)  # ranks 0..4 of 100, in %
    assert R.mean_normalised_rank(-perfect, gold, neighbours=0) > 90
    with pytest.raises(ValueError, match="at least one golden token"):
        R.mean_normalised_rank(perfect, torch.zeros(100, dtype=torch.bool))


def test_choose_heads_respects_depth_and_distinctness():
    def grid(best):
        g = {k: torch.full((10, 2), 50.0) for k in ("q", "k", "v", "attention")}
        g["hidden"] = torch.full((10, 1), 50.0)
        for kind, layer, head, value in best:
            g[kind][layer, head] = value
        return H.MNRResult(g, 1)

    pattern = grid([("v", 9, 0, 1.0), ("q", 2, 1, 2.0), ("k", 3, 0, 3.0), ("attention", 1, 1, 0.5)])
    multihop = grid([("q", 2, 1, 1.0), ("v", 5, 1, 2.0), ("k", 6, 0, 2.5)])
    chosen = H.choose_heads(pattern, multihop, max_depth=0.7)
    assert chosen == [Head("q", 2, 1), Head("k", 3, 0), Head("v", 5, 1), Head("k", 6, 0)]
    table = H.best3_table(pattern)
    assert table["attention"][0] == 0.5 and table["v"][0] == 1.0


def test_mnr_on_a_tiny_model_finds_token_identity(tiny_llama):
    """Layer 0 Q/K/V states depend on the token alone: the gold tokens (repeated by the question) rank first."""
    filler = _ids(200, 4, high=80)
    needle = torch.tensor([[81, 90, 86, 84]])
    ctx = torch.cat([filler[:, :120], needle, filler[:, 120:]], dim=1)
    rec = H.collect_states(tiny_llama, ctx, needle, chunk_size=64, budget=32, n_initial=2, n_recent=8)
    scores = H.retrieval_scores(tiny_llama, rec, ctx.shape[1], torch.ones(4, dtype=torch.bool))
    gold = torch.zeros(ctx.shape[1], dtype=torch.bool)
    gold[120:124] = True
    for kind in ("q", "k", "v"):
        assert R.mean_normalised_rank(scores[kind][0, 0], gold, neighbours=0) < 2.1
    assert set(scores) == set(H.SCORE_KINDS) and scores["hidden"].shape == (4, 1, ctx.shape[1])


# --------------------------------------------------------------------------- baselines


def test_compress_only_with_room_for_everything_is_full_attention(tiny_llama):
    ctx, query, target = _ids(40, 6), _ids(5, 7), _ids(4, 8)
    text_c, nll_c, held = compare._answer_compressed(tiny_llama, Tok(), ctx, query, target, chunk_size=16, budget=64,
                                                     n_initial=2, n_recent=4, max_new_tokens=4)
    text_f, nll_f = compare._answer_with_cache(tiny_llama, Tok(), torch.cat([ctx, query], 1), target, None, 16, 4)
    assert held == 40 and text_c == text_f
    assert nll_c == pytest.approx(nll_f, rel=1e-4)


def test_truncation_drops_the_middle():
    ids = torch.arange(10)[None]
    assert compare.truncation_ids(ids, 5).tolist() == [[0, 1, 2, 8, 9]]
    assert compare.truncation_ids(ids, 20).tolist() == ids.tolist()


def test_rag_keeps_input_order_within_the_budget(tiny_llama):
    ctx, question = _ids(300, 11), _ids(5, 12)
    ids, chosen = compare.rag_ids(tiny_llama, ctx, question, 100, chunk=32, layer=2)
    assert chosen.tolist() == sorted(chosen.tolist()) and ids.shape[1] <= 100
    expected = torch.cat([ctx[:, 32 * i:32 * (i + 1)] for i in chosen.tolist()], dim=1)
    assert torch.equal(ids, expected)


def test_shipped_heads_file_is_consistent():
    data = json.loads((api.HEADS_DIR / "smollm2-135m.json").read_text())
    heads = api.parse_heads(data["heads"])
    assert len(heads) == 4 and data["early_exit_layer"] == max(h.layer for h in heads) + 1
    assert max(h.layer for h in heads) < 0.7 * data["signature"]["num_layers"]
    grids = H.MNRResult.from_json(data["mnr"]["multihop_qa"]).grids
    assert grids["q"].shape == (30, 9) and grids["v"].shape == (30, 3) and grids["hidden"].shape == (30, 1)
    worst = H.worst_heads(data)
    assert len(worst) == 4 and not set(worst) & set(heads)
    table = H.best3_table(H.MNRResult.from_json(data["mnr"]["multihop_qa"]))  # grids are stored to 3 decimals
    for kind, row in data["table"]["multihop_qa"].items():
        assert table[kind] == pytest.approx(row, abs=0.011)


# --------------------------------------------------------------------------- Triton kernels vs the fp64 reference


SCORE_CASES = [  # (dtype, batch, heads, kv_heads, queries w, cached keys n, dim, sliding window)
    (torch.float32, 1, 4, 2, 7, 37, 16, None),  # GQA 2, odd lengths
    (torch.bfloat16, 1, 6, 2, 20, 53, 32, None),  # GQA 3, more queries than one interpreter tile
    (torch.float16, 2, 3, 3, 5, 29, 16, None),  # no grouping, batch 2
    (torch.float32, 1, 8, 1, 33, 70, 16, 9),  # one KV head (GQA 8), Gemma3's sliding window
    (torch.bfloat16, 1, 9, 3, 16, 16, 64, None),  # SmolLM2's heads; every key is one of the queries
]


@needs_triton
@pytest.mark.parametrize("case", SCORE_CASES, ids=lambda c: f"{str(c[0])[6:]}-h{c[2]}/{c[3]}-w{c[4]}-n{c[5]}")
def test_triton_h2o_scores_match_the_fp64_reference(case):
    from kvlab.reform.triton import h2o_scores_triton

    dtype, b, h, hk, w, n, d, window = case
    g = torch.Generator().manual_seed(n)
    q = (torch.randn(b, h, w, d, generator=g) * 2).to(dtype).to(DEV)  # x2: peaked rows, a few heavy hitters
    k = torch.randn(b, hk, n, d, generator=g).to(dtype).to(DEV)
    q_pos, k_pos = torch.arange(n - w, n, device=DEV), torch.arange(n, device=DEV)
    scale = d ** -0.5
    fast = h2o_scores_triton(q, k, scale, q_pos, k_pos, window)
    eager = R.h2o_scores(q, k, scale, q_pos, k_pos, window)
    oracle = R.h2o_scores(q.double(), k.double(), scale, q_pos, k_pos, window)
    assert fast.dtype == torch.float32 and fast.shape == (b, n)
    assert_close_to_oracle(fast, eager, oracle, reduction=n, name="h2o scores")
    torch.testing.assert_close(fast.sum(dim=1).cpu(), torch.full((b,), float(h * w)))  # each row sums to 1


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_compress_matches_the_fp64_reference(tiny_model, dtype):
    """The fused gather + re-rotation equals CompressedCache.compress (per-layer RoPE frequencies: Gemma3's
    local and global layers differ)."""
    from kvlab.reform.triton import compress_kv_triton

    n, keep = 45, torch.tensor([0, 1, 5, 6, 17, 30, 31, 40, 41, 42, 43, 44])
    layers = len(R.decoder_of(tiny_model).layers)
    g = torch.Generator().manual_seed(3)
    dim = R.decoder_of(tiny_model).layers[0].self_attn.head_dim
    keys = [torch.randn(1, 2, n, dim, generator=g) for _ in range(layers)]
    values = [torch.randn(1, 2, n, dim, generator=g) for _ in range(layers)]

    def compressed(cast, compress_fn=None):
        cache = R.CompressedCache(layers, compress_fn)
        cache.keys = [cast(x) for x in keys]
        cache.values = [cast(x) for x in values]
        cache.origin = [torch.arange(n) for _ in range(layers)]
        cache.compress(tiny_model, {l: keep.to(DEV) for l in range(layers)})
        return cache

    fast = compressed(lambda x: x.to(dtype).to(DEV), compress_kv_triton)
    eager = compressed(lambda x: x.to(dtype).to(DEV))
    oracle = compressed(lambda x: x.to(dtype).double().to(DEV))
    for l in range(layers):
        assert fast.keys[l].dtype == dtype and fast.keys[l].shape == (1, 2, keep.numel(), dim)
        assert_close_to_oracle(fast.keys[l], eager.keys[l], oracle.keys[l], reduction=dim, name=f"keys {l}")
        assert torch.equal(fast.values[l], eager.values[l])
        assert fast.origin[l].tolist() == keep.tolist()


@needs_triton
def test_reform_with_triton_backend_equals_torch_backend(tiny_model):
    """End to end through the API: the same tokens gathered, the same compressed cache."""
    model = copy.deepcopy(tiny_model).to(DEV)
    kw = dict(heads=["v:1:0", "k:0:1"], chunk_size=24, budget=20, recompute_budget=30, n_initial=2, n_recent=4,
              n_final=4, pool=5, progress=False)
    ctx, query = _ids(90, 21), _ids(6, 22)
    torch_out = api.reform_gather(model, Tok(), ctx, query, backend="torch", **kw)
    triton_out = api.reform_gather(model, Tok(), ctx, query, backend="triton", **kw)
    assert (torch_out.stats["backend"], triton_out.stats["backend"]) == ("torch", "triton")
    assert triton_out.gathered.tolist() == torch_out.gathered.tolist()
    for l in range(2):
        assert triton_out.trace.cache.origin[l].tolist() == torch_out.trace.cache.origin[l].tolist()
        torch.testing.assert_close(triton_out.trace.cache.keys[l], torch_out.trace.cache.keys[l], atol=1e-5,
                                   rtol=1e-4)
    torch.testing.assert_close(triton_out.scores, torch_out.scores, atol=1e-5, rtol=1e-4)


def test_backend_choice_and_its_checks(tiny_llama):
    kw = dict(heads=["v:1:0"], chunk_size=16, budget=20, recompute_budget=24, n_initial=2, n_recent=4, n_final=4,
              pool=5, progress=False)
    out = api.reform_gather(tiny_llama, Tok(), _ids(40), _ids(4), **kw)
    assert out.stats["backend"] == "torch"  # auto is the eager code on every device (api docstring: measured)
    with pytest.raises(ValueError, match=r"backend must be one of \('auto', 'torch', 'triton'\)"):
        api.reform_gather(tiny_llama, Tok(), _ids(40), _ids(4), backend="cuda", **kw)
    double = copy.deepcopy(tiny_llama).double()
    with pytest.raises(ValueError, match=r"backend='triton' takes .* got torch.float64; use backend='torch'"):
        api.reform_gather(double, Tok(), _ids(40), _ids(4), backend="triton", **kw)
    assert api.reform_gather(double, Tok(), _ids(40), _ids(4), backend="auto", **kw).stats["backend"] == "torch"
