"""The static decode engine (kvlab.core.static, kvlab.eval.fast) against today's hooks engine.

Equal NLL to 1e-5 relative in fp32, the same entries kept in every layer after every step, each policy's
static keep rule equal to its ``keep`` on random views, batches equal to single runs, a visible fallback,
and (on CUDA) graph replays equal to eager steps.
"""

from __future__ import annotations

import shutil
import warnings

import pytest
import torch

from conftest import _tiny
from kvlab.baselines.h2o import H2O
from kvlab.core import KVCache, LayerView, StaticKVCache, StaticView
from kvlab.eval import FastDecoder, streaming_perplexity, streaming_perplexity_batch
from kvlab.policies import FixLLM, Full, LaCache, SepLLM, SepLLMStreaming, StreamingLLM

pytestmark = pytest.mark.usefixtures("one_thread")

SEPS = list(range(0, 96, 7))  # separator ids of the tiny vocabulary (96 tokens)


def _policies():
    return [
        Full(),
        StreamingLLM(2, 6),
        StreamingLLM(2, 6, positions="original"),
        StreamingLLM(2, 6, positions="insertion"),
        SepLLMStreaming(2, 3, 4, 12, separators=SEPS),
        SepLLMStreaming(1, 2, 3, 9, separators=SEPS, positions="insertion"),
        SepLLMStreaming(2, 0, 4, 9, separators=SEPS, positions="original"),
        LaCache(12, 2, 1, 2),
        LaCache.official(10, 2, 0, 2),
        LaCache(11, 4, 0, 2),  # span = layers: one rung, StreamingLLM
        SepLLM(2, 5, separators=SEPS),
        SepLLM(1, 4, separators=SEPS, full_layers=(0,)),
        FixLLM(2, 5, 3),
    ]


def _ids(n: int, seed: int, rows: int = 1) -> torch.Tensor:
    return torch.randint(0, 96, (rows, n), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def model(request):
    return _tiny(request.param)


@pytest.mark.parametrize("policy", _policies(), ids=repr)
def test_static_engine_equals_hooks_engine(model, policy):
    ids = _ids(48, 1)
    hooks = streaming_perplexity(model, None, ids, policy, None, progress=False, engine="hooks")
    static = streaming_perplexity(model, None, ids, policy, None, progress=False, engine="static")
    assert (hooks.engine, static.engine) == ("hooks", "static")
    torch.testing.assert_close(static.nll, hooks.nll, rtol=1e-5, atol=0)
    assert torch.equal(static.kv_trace_per_layer, hooks.kv_trace_per_layer)
    assert static.peak_memory == hooks.peak_memory > 0


@pytest.mark.parametrize("policy", _policies(), ids=repr)
def test_graph_arithmetic_equals_hooks_on_cpu(model, policy):
    """The GPU path's arithmetic (every slot, slot mask, re-rotation by zero, compaction every step), run
    eagerly on the CPU with the CPU's host-read shortcuts turned off."""
    ids = _ids(40, 7)
    hooks = streaming_perplexity(model, None, ids, policy, None, progress=False, engine="hooks")
    decoder = FastDecoder(model, policy, max_steps=39, record=39, graph=False)
    decoder.cache.shortcuts = False
    nll = torch.stack([torch.nn.functional.cross_entropy(decoder.step(ids[:, t:t + 1]), ids[:, t + 1])
                       for t in range(39)]).double()
    torch.testing.assert_close(nll, hooks.nll, rtol=1e-5, atol=0)
    assert torch.equal(decoder.trace()[:, 0], hooks.kv_trace_per_layer)


@pytest.mark.parametrize("policy", _policies()[1:], ids=repr)
def test_static_cache_holds_the_same_entries_every_step(policy):
    """A real decode trace: after every step, every layer holds the same positions, token ids and rotations."""
    model = _tiny("llama")
    ids = _ids(40, 2)
    cache = KVCache(model, policy)
    decoder = FastDecoder(model, policy, graph=False, max_steps=None if policy.budget else ids.shape[1])
    with torch.no_grad():
        for t in range(ids.shape[1]):
            model(input_ids=ids[:, t:t + 1], past_key_values=cache, use_cache=True)
            decoder.step(ids[:, t:t + 1])
            for i, layer in enumerate(cache.layers):
                held = decoder.cache.held(i)
                assert torch.equal(held["positions"], layer.positions[0]), (t, i)
                assert torch.equal(held["token_ids"], layer.token_ids[0]), (t, i)
                assert torch.equal(held["rot"], layer.rot[0]), (t, i)


def _random_view(policy, gen: torch.Generator, rows: int, capacity: int, num_layers: int = 4):
    """Rows of a static view drawn at random: a live prefix of sorted positions, token ids, a layer, a state."""
    length = torch.randint(0, capacity + 1, (rows,), generator=gen)
    positions = torch.zeros((rows, capacity), dtype=torch.long)
    for b in range(rows):
        n = int(length[b])
        start = int(torch.randint(0, 3, (1,), generator=gen))
        positions[b, :n] = torch.randperm(3 * capacity, generator=gen)[:n].sort().values + start
    token_ids = torch.randint(0, 96, (rows, capacity), generator=gen)
    seen = torch.tensor(int(positions.max()) + 1)
    state = policy.static_state(rows, "cpu")
    for t in state.values():
        t.copy_(torch.randint(int(t[0]), capacity + 1, (rows,), generator=gen))
    layer = torch.randint(0, num_layers, (rows,), generator=gen)
    return StaticView(layer, num_layers, seen, length, positions, token_ids, state)


@pytest.mark.parametrize("policy", _policies(), ids=repr)
def test_static_keep_equals_keep_on_random_views(policy):
    policy.check_model(4)
    capacity = (policy.budget or 12) + 1  # one-token steps: a layer holds at most budget + 1 entries
    gen = torch.Generator().manual_seed(3)
    for _ in range(40):
        view = _random_view(policy, gen, 8, capacity)
        before = {k: t.clone() for k, t in view.state.items()}
        mask = policy.static_keep(view)
        mask = view.live if mask is None else mask & view.live
        for b in range(8):
            n = int(view.length[b])
            state = {"past_start": int(before["past_start"][b])} if "past_start" in before else {}
            if "cursor" in before:
                state["lacache_cursor"] = int(before["cursor"][b])
            row = LayerView(int(view.layer[b]), 4, int(view.seen), view.positions[b:b + 1, :n],
                            view.token_ids[b:b + 1, :n], None, None, state)
            index = policy.keep(row)
            expected = torch.arange(n) if index is None else index.reshape(-1)
            assert torch.equal(mask[b].nonzero().squeeze(1), expected), (b, n, before)
            if "past_start" in state:
                assert int(view.state["past_start"][b]) == state["past_start"]
            if "cursor" in before:
                assert int(view.state["cursor"][b]) == state["lacache_cursor"]


@pytest.mark.parametrize("policy", [StreamingLLM(2, 6), SepLLMStreaming(2, 3, 4, 12, separators=SEPS),
                                    LaCache(12, 2, 1, 2), Full(), SepLLM(2, 5, separators=SEPS)], ids=repr)
def test_batch_of_three_equals_three_single_runs(model, policy):
    texts = [_ids(40, 10)[0], _ids(44, 11)[0], _ids(52, 12)[0]]  # ragged: cut to 40 tokens, as asked
    batch = streaming_perplexity_batch(model, None, texts, policy, None, progress=False, truncate=True)
    assert len(batch) == 3
    for text, result in zip(texts, batch):
        single = streaming_perplexity(model, None, text[:40], policy, None, progress=False, engine="hooks")
        assert result.engine == "static"
        torch.testing.assert_close(result.nll, single.nll, rtol=1e-5, atol=0)
        assert torch.equal(result.kv_trace_per_layer, single.kv_trace_per_layer)


def test_fallback_is_visible(model):
    ids = _ids(12, 4)
    with pytest.warns(UserWarning, match="hooks engine: it ranks entries by attention scores"):
        result = streaming_perplexity(model, None, ids, H2O(6, 3), None, progress=False)
    assert result.engine == "hooks"
    with pytest.raises(NotImplementedError, match="engine='static' cannot run H2O"):
        streaming_perplexity(model, None, ids, H2O(6, 3), None, progress=False, engine="static")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a capturable policy runs static without a word
        assert streaming_perplexity(model, None, ids, StreamingLLM(2, 4), None, progress=False).engine == "static"


def test_unsupported_architecture_falls_back():
    gemma = _tiny("gemma3")
    with pytest.warns(UserWarning, match="supports Llama and Qwen2"):
        result = streaming_perplexity(gemma, None, _ids(10, 5), StreamingLLM(2, 4), None, progress=False)
    assert result.engine == "hooks"


def test_capacity_is_checked():
    model = _tiny("llama")
    with pytest.raises(ValueError, match=r"capacity \(7\) must be >= policy budget \+ 1 = 9"):
        StaticKVCache(model, StreamingLLM(2, 6), 1, 7)
    StaticKVCache(model, StreamingLLM(2, 6), 1, 7, max_steps=7)  # a stream of 7 tokens fits
    with pytest.raises(ValueError, match=r"capacity \(3\) must be >= max_steps \(4\)"):
        StaticKVCache(model, Full(), 1, 3, max_steps=4)
    with pytest.raises(ValueError, match="pass capacity= \\(or max_steps=\\) the number of tokens"):
        FastDecoder(model, Full())
    assert FastDecoder(model, StreamingLLM(2, 600), max_steps=20, graph=False).cache.capacity == 20
    for decoder in (FastDecoder(model, Full(), capacity=2, graph=False),
                    FastDecoder(model, StreamingLLM(2, 6), max_steps=2, graph=False)):
        decoder.step(_ids(1, 0))
        decoder.step(_ids(1, 1))
        with pytest.raises(ValueError, match="exceeds the 2 steps this decoder was made for"):
            decoder.step(_ids(1, 2))
    with pytest.raises(ValueError, match="engine must be one of"):
        streaming_perplexity(model, None, _ids(4, 0), Full(), None, progress=False, engine="fast")


def test_real_smollm2_static_equals_hooks():
    import kvlab
    from kvlab.sepllm import separator_ids

    model, tok = kvlab.load_model("smollm2-135m", dtype=torch.float32, device="cpu")
    text = kvlab.datasets.load_text("wikitext")
    for policy in (StreamingLLM(4, 28), SepLLMStreaming(3, 8, 16, 40, separators=separator_ids(tok))):
        hooks = streaming_perplexity(model, tok, text, policy, 64, progress=False, engine="hooks")
        static = streaming_perplexity(model, tok, text, policy, 64, progress=False)
        assert static.engine == "static"
        torch.testing.assert_close(static.nll, hooks.nll, rtol=1e-5, atol=0)
        assert torch.equal(static.kv_trace_per_layer, hooks.kv_trace_per_layer)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("policy", _policies(), ids=repr)
def test_cuda_graph_replay_equals_eager_and_hooks(policy):
    model = _tiny("llama").to("cuda")
    ids = _ids(48, 6).cuda()
    hooks = streaming_perplexity(model, None, ids, policy, None, progress=False, engine="hooks")
    graphed = streaming_perplexity(model, None, ids, policy, None, progress=False, engine="static")
    torch.testing.assert_close(graphed.nll, hooks.nll, rtol=1e-5, atol=0)
    assert torch.equal(graphed.kv_trace_per_layer, hooks.kv_trace_per_layer)
    decoder = FastDecoder(model, policy, max_steps=48)
    with torch.no_grad():
        decoder.step(ids[:, :1])
    assert decoder._graph is not None  # the step really was captured


@pytest.mark.skipif(not (shutil.which("g++") or shutil.which("clang++")),
                    reason="torch.compile on a CPU needs a C++ compiler (inductor's CPU backend)")
def test_compiled_layers_equal_eager_on_cpu():
    """engine="compiled": the layers through torch.compile (inductor) give the eager step's logits; run with the
    GPU path's arithmetic (shortcuts off), as on a GPU before the graph is captured."""
    model = _tiny("llama")
    policy = StreamingLLM(2, 6)
    ids = _ids(20, 3)
    logits = []
    for compile in (False, True):
        decoder = FastDecoder(model, policy, max_steps=19, graph=False, compile=compile)
        decoder.cache.shortcuts = False
        with torch.no_grad():
            logits.append(torch.stack([decoder.step(ids[:, t:t + 1]) for t in range(19)]))
    torch.testing.assert_close(logits[1], logits[0], rtol=1e-5, atol=1e-6)
    result = streaming_perplexity(model, None, ids, policy, None, progress=False, engine="compiled")
    assert result.engine == "compiled"
    with pytest.raises(NotImplementedError, match="engine='compiled' cannot run H2O"):
        streaming_perplexity(model, None, ids, H2O(6, 3), None, progress=False, engine="compiled")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("policy", [_policies()[i] for i in (0, 1, 4, 7)], ids=repr)
def test_cuda_compiled_graph_equals_hooks(policy):
    """torch.compile'd layers captured in the CUDA graph: the hooks engine's NLL and kept counts."""
    model = _tiny("llama").to("cuda")
    ids = _ids(48, 6).cuda()
    hooks = streaming_perplexity(model, None, ids, policy, None, progress=False, engine="hooks")
    compiled = streaming_perplexity(model, None, ids, policy, None, progress=False, engine="compiled")
    assert compiled.engine == "compiled"
    torch.testing.assert_close(compiled.nll, hooks.nll, rtol=1e-5, atol=0)
    assert torch.equal(compiled.kv_trace_per_layer, hooks.kv_trace_per_layer)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_cuda_graph_batch_bf16_runs():
    model = _tiny("qwen2").to("cuda", torch.bfloat16)
    texts = [_ids(40, s)[0] for s in range(4)]
    results = streaming_perplexity_batch(model, None, texts, SepLLMStreaming(2, 3, 4, 12, separators=SEPS), None,
                                         progress=False)
    assert all(torch.isfinite(r.nll).all() and r.engine == "static" for r in results)


def _contract_instances():
    from test_policy_contract import INSTANCES

    return [p for _, p in INSTANCES]


@pytest.mark.parametrize("policy", _contract_instances(), ids=repr)
def test_every_exported_policy_runs_static_or_says_why(policy):
    """Every policy of kvlab.policies: a static rule equal to the hooks engine, or a visible reason."""
    model = _tiny("llama")
    ids = _ids(30, 8)
    hooks = streaming_perplexity(model, None, ids, policy, None, progress=False, engine="hooks")
    if policy.static_reason is None:
        result = streaming_perplexity(model, None, ids, policy, None, progress=False)
        assert result.engine == "static"
        torch.testing.assert_close(result.nll, hooks.nll, rtol=1e-5, atol=0)
        assert torch.equal(result.kv_trace_per_layer, hooks.kv_trace_per_layer)
    else:
        assert len(policy.static_reason) > 15
        with pytest.warns(UserWarning, match="hooks engine"):
            assert streaming_perplexity(model, None, ids, policy, None, progress=False).engine == "hooks"
