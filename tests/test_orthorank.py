"""OrthoRank: Eq. 1-4, Algorithm 1's selection, the routed layer against the dense layer, KV for the
unselected tokens, decoding, the layer searches (OrthoRank, SLEB, Shortened LLaMA) and input checks."""

from __future__ import annotations

import contextlib

import dataclasses
import math

import pytest
import torch
from transformers import DynamicCache, Gemma3ForCausalLM

from kvlab.core import KVCache, LayerRouter, use_router
from kvlab.orthorank import (Plan, after_sink, flop_sparsity, layers_for_sparsity, nominal_sparsity, orthorank,
                             perplexity, search_layers, skip_layers, taylor_importance)
from kvlab.orthorank import layers as layers_module
from kvlab.orthorank.reference import (alignment, cos_gradient, routed_layer, select_topk, selection_mask,
                                       sink_curves, tokens_for_ratio)
from kvlab.orthorank.router import OrthoRankRouter, RecordInputs, SkipLayer
from kvlab.policies import Full

pytestmark = pytest.mark.usefixtures("one_thread")



@contextlib.contextmanager
def in_float64(model):
    """The shared tiny model in float64 for the block, back in float32 afterwards (even if the block fails)."""
    try:
        yield model.double()
    finally:
        model.float()

def logits(model, ids, **kw):
    with torch.no_grad():
        return model(input_ids=ids, use_cache=False, **kw).logits


class Routed(LayerRouter):
    """Test router: the reference routed layer with a fixed selection mask per layer (batch, seq)."""

    def __init__(self, masks: dict[int, torch.Tensor], kv: str = "all"):
        self.masks, self.kv = masks, kv

    def __call__(self, call):
        mask = self.masks[call.layer_idx]
        n = call.hidden_states.shape[1]
        mask = mask[:, -n:]  # a decoding pass sees the newest columns
        k = int(mask.sum(1).max())
        order = torch.sort((~mask).to(torch.int8), dim=1, stable=True).indices[:, :k]
        order = torch.sort(order, dim=1).values
        valid = mask.gather(1, order)
        return routed_layer(call.layer, call.hidden_states, order,
                            position_embeddings=call.kwargs["position_embeddings"], positions=call.position_ids,
                            past_key_values=call.kwargs.get("past_key_values"), kv=self.kv,
                            valid=None if bool(valid.all()) else valid)


# ---------------------------------------------------------------------------------------------------
# Eq. 1-4 and Algorithm 1


def test_eq2_closed_form_is_the_gradient_and_eq3_its_norm():
    torch.manual_seed(0)
    h0 = torch.randn(5, 32, dtype=torch.float64)
    hi = torch.randn(5, 32, dtype=torch.float64, requires_grad=True)
    cos = torch.nn.functional.cosine_similarity(h0, hi, dim=-1)
    (grad,) = torch.autograd.grad(cos.sum(), hi)
    torch.testing.assert_close(cos_gradient(h0, hi.detach()), grad)
    # Eq. 3 before dropping the norm: ||grad||^2 = (1 - cos^2) / ||h_i||^2
    torch.testing.assert_close(grad.norm(dim=-1) ** 2, (1 - cos.detach() ** 2) / hi.detach().norm(dim=-1) ** 2)


def test_alignment_scores_and_their_orientation():
    torch.manual_seed(0)
    states = torch.randn(2, 9, 16, dtype=torch.float64)
    h0 = states[:, 0]
    dot = alignment(states, "dot")
    torch.testing.assert_close(dot, (states @ h0[..., None]).squeeze(-1).abs())  # Eq. 4
    cos = torch.nn.functional.cosine_similarity(h0[:, None], states, dim=-1)
    torch.testing.assert_close(alignment(states, "cos"), cos.abs())
    grad = torch.stack([cos_gradient(h0[:, None].expand_as(states)[b], states[b]).norm(dim=-1) for b in range(2)])
    torch.testing.assert_close(alignment(states, "grad"), -grad)  # Eq. 1 exactly; smaller = more orthogonal
    # equal norms (Eq. 3's assumption): all three rank the tokens alike
    unit = torch.nn.functional.normalize(states, dim=-1) * 3.0
    ranks = [alignment(unit, s).argsort(dim=-1) for s in ("dot", "cos", "grad")]
    assert torch.equal(ranks[0], ranks[1]) and torch.equal(ranks[0], ranks[2])
    # a kept sink state stands in for the first token
    torch.testing.assert_close(alignment(states[:, 3:], "dot", sink_state=h0), dot[:, 3:])


def test_topk_keeps_order_and_picks_the_smallest():
    torch.manual_seed(0)
    scores = torch.rand(3, 50)
    for k in (0, 1, 7, 49, 50):
        for sink in ("skip", "select"):
            sel = select_topk(scores, k, sink)
            assert sel.shape == (3, k)
            assert torch.all(sel[:, 1:] > sel[:, :-1])  # sorted, no repeats: original order kept
            for b in range(3):
                s = scores[b].clone()
                s[0] = float("inf") if sink == "skip" else float("-inf")
                assert set(sel[b].tolist()) == set(s.argsort()[:k].tolist())


def test_sink_rule():
    torch.manual_seed(0)
    scores = torch.rand(4, 20)
    scores[:, 0] = 0.0  # the most "orthogonal" of all: skip must still leave it out
    for k in range(1, 20):
        assert torch.all((select_topk(scores, k, "select") == 0).any(dim=1))  # sink always selected
        assert not torch.any(select_topk(scores, k, "skip") == 0)  # Algorithm 1: never, unless all are
    assert torch.equal(select_topk(scores, 20, "skip"), torch.arange(20).expand(4, 20))
    assert select_topk(scores, 0, "select").shape == (4, 0)


def test_ties_go_to_the_earlier_token():
    scores = torch.zeros(1, 10)
    assert select_topk(scores, 3, "skip").tolist() == [[1, 2, 3]]


def test_tokens_for_ratio_is_algorithm_1s_floor():
    assert tokens_for_ratio(0.33, 2048) == int(0.33 * 2048) == 675
    assert tokens_for_ratio(0.3, 10) == 3  # 0.3 * 10 = 2.9999999999999996 in floating point
    assert tokens_for_ratio(0.0, 7) == 0 and tokens_for_ratio(1.0, 7) == 7


def test_selection_mask_roundtrip():
    sel = torch.tensor([[0, 3, 4], [1, 2, 5]])
    mask = selection_mask(sel, 6)
    assert mask.tolist() == [[True, False, False, True, True, False], [False, True, True, False, False, True]]


# ---------------------------------------------------------------------------------------------------
# the routed layer inside the model


def test_selecting_all_tokens_is_the_dense_model_exactly(tiny_model, ids):
    dense = logits(tiny_model, ids)
    layers = list(range(tiny_model.config.num_hidden_layers))
    with orthorank(tiny_model, layers=layers, token_ratio=1.0):
        assert torch.equal(logits(tiny_model, ids), dense)
    # the reference path itself, every token selected, float64: the same numbers
    with in_float64(tiny_model) as model:
        dense64 = logits(model, ids)
        every = {i: torch.ones_like(ids, dtype=torch.bool) for i in layers}
        with use_router(model, Routed(every)):
            torch.testing.assert_close(logits(model, ids), dense64, rtol=0, atol=1e-10)


def test_routed_layer_equals_the_dense_layer_where_selected(tiny_model):
    """The unselected tokens' outputs never feed the selected ones (KV come from the layer's input), so the
    routed layer is the dense layer's output on the selected rows and the input elsewhere."""
    torch.manual_seed(3)
    ids = torch.randint(0, 96, (2, 40))
    model = tiny_model  # run in float64 below
    checked = []

    class Compare(LayerRouter):
        def __call__(self, call):
            full = call.run()
            gen = torch.Generator().manual_seed(call.layer_idx)
            mask = torch.rand(call.hidden_states.shape[:2], generator=gen) < 0.4
            mask[:, 5] = True
            routed = Routed({call.layer_idx: mask})(call)
            expected = torch.where(mask[..., None], full, call.hidden_states)
            torch.testing.assert_close(routed, expected, rtol=0, atol=1e-10)
            checked.append(call.layer_idx)
            return full

    with in_float64(tiny_model), torch.no_grad(), use_router(model, Compare()):
        model(input_ids=ids, use_cache=False)
    assert checked == list(range(model.config.num_hidden_layers))


def test_selecting_none_with_kv_skips_the_update_but_keeps_the_cache(tiny_model, ids):
    layer = 2
    with torch.no_grad():
        dense_cache = DynamicCache(config=tiny_model.config)
        tiny_model(input_ids=ids, past_key_values=dense_cache, use_cache=True)
        with skip_layers(tiny_model, [layer]):
            skipped = logits(tiny_model, ids)
        cache = DynamicCache(config=tiny_model.config)
        with orthorank(tiny_model, layers=[layer], token_ratio=0.0) as router:
            out = tiny_model(input_ids=ids, past_key_values=cache, use_cache=True).logits
    assert torch.equal(out, skipped)  # no residual update: the same as removing the layer
    assert router.computed_ratio() == 0.0
    # ... but the layer's keys and values of every token are cached, as the dense layer caches them
    assert torch.equal(cache.layers[layer].keys, dense_cache.layers[layer].keys)
    assert torch.equal(cache.layers[layer].values, dense_cache.layers[layer].values)
    for earlier in range(layer):
        assert torch.equal(cache.layers[earlier].keys, dense_cache.layers[earlier].keys)


def test_removed_layer_caches_nothing(tiny_llama, ids):
    cache = KVCache(tiny_llama, Full())
    with torch.no_grad(), skip_layers(tiny_llama, [2]):
        tiny_llama(input_ids=ids, past_key_values=cache, use_cache=True)
    assert cache.held()[2] == 0 and cache.held()[1] == ids.shape[1]


def test_router_selection_follows_algorithm_1(tiny_llama, ids):
    layer = 1
    recorder = RecordInputs(tiny_llama.config.num_hidden_layers)
    with torch.no_grad(), use_router(tiny_llama, recorder):
        tiny_llama(input_ids=ids, use_cache=False)
    h = recorder.inputs[layer]
    states = tiny_llama.model.layers[layer].input_layernorm(h)
    for sink in ("skip", "select"):
        expected = selection_mask(select_topk(alignment(states), int(0.33 * ids.shape[1]), sink), ids.shape[1])
        with orthorank(tiny_llama, layers=[layer], token_ratio=0.33, sink=sink) as router:
            logits(tiny_llama, ids)
        assert torch.equal(router.last_selected[layer], expected)
    # raw stage scores the residual stream; least-orthogonal takes the largest scores
    with orthorank(tiny_llama, layers=[layer], token_ratio=0.33, stage="raw") as router:
        logits(tiny_llama, ids)
    assert torch.equal(router.last_selected[layer],
                       selection_mask(select_topk(alignment(h), int(0.33 * ids.shape[1])), ids.shape[1]))
    with orthorank(tiny_llama, layers=[layer], token_ratio=0.33, criterion="least_orthogonal") as router:
        logits(tiny_llama, ids)
    assert torch.equal(router.last_selected[layer],
                       selection_mask(select_topk(-alignment(states), int(0.33 * ids.shape[1])), ids.shape[1]))


def test_random_criterion_is_seeded(tiny_llama, ids):
    masks = []
    for seed in (0, 0, 1):
        with orthorank(tiny_llama, layers=[1], token_ratio=0.5, criterion="random", seed=seed) as router:
            logits(tiny_llama, ids)
        masks.append(router.last_selected[1])
    assert torch.equal(masks[0], masks[1]) and not torch.equal(masks[0], masks[2])
    assert int(masks[0].sum()) == ids.shape[1] // 2


def test_no_kv_for_unselected_equals_the_layer_on_the_selected_subsequence(tiny_model):
    """Table 3 row 4: the selected tokens attend among themselves only, at their original positions."""
    torch.manual_seed(4)
    ids = torch.randint(0, 96, (1, 30))
    model = tiny_model  # run in float64 below

    class Compare(LayerRouter):
        def __call__(self, call):
            mask = torch.zeros(call.hidden_states.shape[:2], dtype=torch.bool)
            mask[:, [0, 3, 4, 9, 15, 16, 22, 29]] = True
            routed = Routed({call.layer_idx: mask}, kv="selected")(call)
            sel = torch.nonzero(mask[0]).flatten()
            pos = call.position_ids[:, sel]
            sub = call.hidden_states[:, sel]
            pe = tuple(t[:, sel] for t in call.kwargs["position_embeddings"])
            own = Routed({call.layer_idx: torch.ones_like(pos, dtype=torch.bool)})(
                dataclasses.replace(call, hidden_states=sub, position_ids=pos,
                                    kwargs={**call.kwargs, "position_embeddings": pe}))
            expected = call.hidden_states.clone()
            expected[:, sel] = own
            torch.testing.assert_close(routed, expected, rtol=0, atol=1e-10)
            return routed

    with in_float64(tiny_model), torch.no_grad(), use_router(model, Compare()):
        model(input_ids=ids, use_cache=False)


def test_no_kv_for_unselected_refuses_a_cache(tiny_llama, ids):
    with orthorank(tiny_llama, layers=[1], token_ratio=0.5, kv="selected"):
        logits(tiny_llama, ids)  # prefill without a cache works
        with pytest.raises(ValueError, match="use_cache=False"), torch.no_grad():
            tiny_llama(input_ids=ids, use_cache=True)


def test_batch_rows_are_independent(tiny_model):
    torch.manual_seed(5)
    ids = torch.randint(0, 96, (3, 24))
    with orthorank(tiny_model, layers=[1, 3], token_ratio=0.4) as router:
        together = logits(tiny_model, ids)
        alone = torch.cat([logits(tiny_model, ids[b:b + 1]) for b in range(3)])
    torch.testing.assert_close(together, alone, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------------
# generation


@pytest.mark.parametrize("cache_kind", ["dynamic", "kvlab"])
def test_decoding_with_threshold_equals_one_pass_with_the_same_selection(tiny_model, cache_kind):
    torch.manual_seed(6)
    ids = torch.randint(0, 96, (2, 30))
    prompt, steps = 24, 6
    layers = [1, 2]
    cache = DynamicCache(config=tiny_model.config) if cache_kind == "dynamic" else KVCache(tiny_model, Full())
    chosen = {i: [] for i in layers}
    outs = []
    with torch.no_grad(), orthorank(tiny_model, layers=layers, token_ratio=0.33) as router:
        outs.append(tiny_model(input_ids=ids[:, :prompt], past_key_values=cache, use_cache=True).logits)
        for i in layers:
            chosen[i].append(router.last_selected[i])
        for t in range(prompt, prompt + steps):
            outs.append(tiny_model(input_ids=ids[:, t:t + 1], past_key_values=cache, use_cache=True).logits)
            for i in layers:
                chosen[i].append(router.last_selected[i])
    stepwise = torch.cat(outs, dim=1)
    masks = {i: torch.cat(chosen[i], dim=1) for i in layers}
    # the threshold kept from the prompt decides: a generated token runs iff its score <= the prompt's largest
    for i in layers:
        assert masks[i][:, :prompt].sum(1).tolist() == [int(0.33 * prompt)] * 2
    with use_router(tiny_model, Routed(masks), layers=layers):
        one_pass = logits(tiny_model, ids[:, :prompt + steps])
    torch.testing.assert_close(stepwise, one_pass, rtol=1e-4, atol=1e-4)


def test_decode_modes(tiny_llama):
    torch.manual_seed(7)
    ids = torch.randint(0, 96, (1, 20))
    dense_steps = []
    for mode in ("dense", "topk"):
        cache = DynamicCache(config=tiny_llama.config)
        with torch.no_grad(), orthorank(tiny_llama, layers=[1], token_ratio=0.5, decode=mode) as router:
            tiny_llama(input_ids=ids[:, :16], past_key_values=cache, use_cache=True)
            for t in range(16, 20):
                tiny_llama(input_ids=ids[:, t:t + 1], past_key_values=cache, use_cache=True)
                dense_steps.append((mode, bool(router.last_selected[1].all())))
        assert router.computed_ratio() == pytest.approx((8 + (4 if mode == "dense" else 0)) / 20)
        assert router.computed_ratio("prompt") == 0.5
        assert router.computed_ratio("decode") == (1.0 if mode == "dense" else 0.0)
    assert all(flag for mode, flag in dense_steps if mode == "dense")
    assert not any(flag for mode, flag in dense_steps if mode == "topk")  # int(0.5 * 1) = 0 tokens


def test_generate_runs_under_orthorank(tiny_llama):
    ids = torch.randint(0, 96, (1, 12))
    with orthorank(tiny_llama, layers=[1, 2], token_ratio=0.33) as router:
        out = tiny_llama.generate(ids, max_new_tokens=5, do_sample=False)
    assert out.shape == (1, 17) and 0.0 < router.computed_ratio() < 1.0


def test_a_pass_without_the_sink_first_is_refused(tiny_llama):
    cache = DynamicCache(config=tiny_llama.config)
    ids = torch.randint(0, 96, (1, 12))
    with torch.no_grad():
        tiny_llama(input_ids=ids[:, :6], past_key_values=cache, use_cache=True)
        with orthorank(tiny_llama, layers=[1], token_ratio=0.5), pytest.raises(RuntimeError, match="position 0"):
            tiny_llama(input_ids=ids[:, 6:], past_key_values=cache, use_cache=True)


# ---------------------------------------------------------------------------------------------------
# layer choice, SLEB, Shortened LLaMA, sparsity


def windows(n=3, seq=24, seed=8):
    torch.manual_seed(seed)
    return torch.randint(0, 96, (n, seq))


def test_perplexity_of_the_empty_plan_is_the_dense_model(tiny_llama):
    w = windows()
    lg = logits(tiny_llama, w)
    nll = torch.nn.functional.cross_entropy(lg[:, :-1].flatten(0, 1), w[:, 1:].flatten())
    assert perplexity(tiny_llama, w, batch_size=2) == pytest.approx(math.exp(float(nll)), rel=1e-5)
    assert perplexity(tiny_llama, w, Plan()) == perplexity(tiny_llama, w, Plan(removed=()))


def test_sleb_with_zero_layers_is_the_dense_model(tiny_llama, ids):
    w = windows()
    result = search_layers(tiny_llama, w, 0, action="remove")
    assert result.order == [] and result.plan(0) == Plan()
    assert perplexity(tiny_llama, w, result.plan(0)) == pytest.approx(result.dense_ppl, rel=1e-9)
    with skip_layers(tiny_llama, []):
        assert torch.equal(logits(tiny_llama, ids), logits(tiny_llama, ids))


@pytest.mark.parametrize("action", ["remove", "route"])
def test_iterative_search_is_greedy_and_resuming_changes_nothing(tiny_llama, action, monkeypatch):
    w = windows()
    router = {"token_ratio": 0.33} if action == "route" else None
    fast = search_layers(tiny_llama, w, 3, action=action, router=router, batch_size=2)
    monkeypatch.setattr(layers_module, "_REUSE_LIMIT_BYTES", -1)  # no recorded inputs: full passes
    slow = search_layers(tiny_llama, w, 3, action=action, router=router, batch_size=2)
    assert fast.order == slow.order
    for a, b in zip(fast.trials, slow.trials):
        assert a.keys() == b.keys()
        for c in a:
            assert a[c] == pytest.approx(b[c], rel=1e-5)
    picked: list[int] = []
    for step, tried in enumerate(fast.trials):  # each step adds the candidate that hurts least
        assert set(tried) == set(range(4)) - set(picked)
        best = min(tried, key=tried.get)
        assert fast.order[step] == best
        picked.append(best)
        plan = fast.plan(step + 1)
        assert perplexity(tiny_llama, w, plan, batch_size=2) == pytest.approx(fast.ppl[step], rel=1e-5)
    assert fast.plan(3).removed if action == "remove" else fast.plan(3).routed


def test_one_shot_ranks_single_layers(tiny_llama):
    w = windows()
    result = search_layers(tiny_llama, w, 2, action="remove", search="one-shot", candidates=[0, 1, 2, 3])
    tried = result.trials[0]
    assert result.order == sorted(tried, key=tried.get)[:2]
    for layer, ppl in tried.items():
        assert perplexity(tiny_llama, w, Plan(removed=(layer,))) == pytest.approx(ppl, rel=1e-5)


def test_taylor_importance(tiny_llama):
    w = windows()
    flags = [p.requires_grad for p in tiny_llama.parameters()]
    scores = taylor_importance(tiny_llama, w, batch_size=2)
    assert scores.shape == (4,) and torch.all(scores > 0)
    assert [p.requires_grad for p in tiny_llama.parameters()] == flags
    assert all(p.grad is None for p in tiny_llama.parameters())
    # by hand for one block: |dL/dW * W| summed over its weights
    layer = tiny_llama.model.layers[2]
    tiny_llama.zero_grad()
    lg = tiny_llama(input_ids=w, use_cache=False).logits
    torch.nn.functional.cross_entropy(lg[:, :-1].flatten(0, 1), w[:, 1:].flatten()).backward()
    by_hand = sum(float((p.grad * p.detach()).abs().sum()) for p in layer.parameters())
    tiny_llama.zero_grad(set_to_none=True)
    for p, flag in zip(tiny_llama.parameters(), flags):
        p.requires_grad_(flag)
    assert float(scores[2]) == pytest.approx(by_hand, rel=1e-4)
    result = search_layers(tiny_llama, w, 1, action="remove", search="taylor", keep_first=1, keep_last=1)
    assert result.candidates == [1, 2] and result.order == [min((1, 2), key=lambda c: float(scores[c]))]


def test_sparsity_accounting_is_the_papers():
    # Sec. 4.1: 15% / 30% of the layers at 33% tokens are 10% / 20%; Table 4: 0.4 at 0.5 is 0.2
    assert nominal_sparsity(40, routed=6, token_ratio=0.33) == pytest.approx(0.1005)
    assert nominal_sparsity(40, routed=12, token_ratio=0.333) == pytest.approx(0.2, abs=1e-3)
    assert nominal_sparsity(40, routed=16, token_ratio=0.5) == pytest.approx(0.2)
    assert nominal_sparsity(40, removed=8) == pytest.approx(0.2)
    assert [layers_for_sparsity(40, s, 0.33) for s in (0.1, 0.2)] == [6, 12]
    assert [layers_for_sparsity(40, s) for s in (0.1, 0.2)] == [4, 8]
    assert [layers_for_sparsity(30, s, 0.33) for s in (0.1, 0.2)] == [5, 9]
    assert [layers_for_sparsity(30, s) for s in (0.1, 0.2)] == [3, 6]
    assert layers_for_sparsity(30, 0.0, 0.33) == 0


def test_flop_sparsity_counts_the_kv_of_unselected_tokens(tiny_llama):
    cfg = tiny_llama.config
    assert flop_sparsity(cfg, removed=1) == pytest.approx(1 / 4)
    assert flop_sparsity(cfg, routed=4, token_ratio=1.0) == 0.0
    routed = flop_sparsity(cfg, routed=3, token_ratio=0.33, seq_len=2048)
    assert 0 < routed < nominal_sparsity(4, routed=3, token_ratio=0.33)


def test_after_sink(tiny_llama):
    assert after_sink(tiny_llama, 1) == [2, 3] and after_sink(tiny_llama, -1) == [0, 1, 2, 3]


def test_sink_curves_find_the_jump():
    torch.manual_seed(9)
    L = 5
    layers = [torch.nn.Module() for _ in range(L)]
    for layer in layers:
        layer.input_layernorm = torch.nn.Identity()
    stream = [torch.randn(2, 10, 8) for _ in range(L + 1)]
    for h in stream[3:]:
        h[:, 0] *= 100.0  # layer 2's output carries the massive sink
    curves = sink_curves(stream[:L], layers, stream[L])
    assert curves.sink_layer == 2
    assert curves.norm_ratio.shape == (L + 1,) and curves.cos_to_sink.shape == (L,)
    assert curves.sink_self_cos.shape == (L, L) and torch.allclose(curves.sink_self_cos.diagonal(), torch.ones(L))


# ---------------------------------------------------------------------------------------------------
# checks


@pytest.mark.parametrize("ratio", [-0.1, 1.5, float("nan")])
def test_invalid_token_ratio_raises(tiny_llama, ratio):
    with pytest.raises(ValueError, match=r"token_ratio must be in \[0, 1\]"):
        orthorank(tiny_llama, layers=[1], token_ratio=ratio)
    with pytest.raises(ValueError, match="token_ratio"):
        OrthoRankRouter(ratio)


@pytest.mark.parametrize("layers", [None, []])
def test_token_ratio_without_layers_raises(tiny_llama, layers):
    with pytest.raises(ValueError, match="needs layers"):
        orthorank(tiny_llama, layers=layers, token_ratio=0.33)


def test_bad_layers_and_options_raise(tiny_llama):
    with pytest.raises(ValueError, match=r"0\.\.3"):
        orthorank(tiny_llama, layers=[7], token_ratio=0.5)
    with pytest.raises(ValueError, match="repeat"):
        orthorank(tiny_llama, layers=[1, 1], token_ratio=0.5)
    with pytest.raises(TypeError, match="token_ratio"):
        orthorank(tiny_llama, layers=[1], token_ratio="half")
    with pytest.raises(ValueError, match="criterion"):
        orthorank(tiny_llama, layers=[1], token_ratio=0.5, criterion="nearest")
    with pytest.raises(ValueError, match="sparsity"):
        layers_for_sparsity(30, 1.2)
    with pytest.raises(ValueError, match="token_ratio"):
        layers_for_sparsity(30, 0.1, 1.0)
    with pytest.raises(ValueError, match="either removed or routed"):
        Plan(removed=(1,), routed=(1,))
    with pytest.raises(ValueError, match="action='remove'"):
        search_layers(tiny_llama, windows(), 1, action="route", search="taylor")


def test_unsupported_layer_names_the_supported_ones():
    from kvlab.orthorank.reference import layer_kind

    with pytest.raises(NotImplementedError, match="LlamaDecoderLayer, Qwen2DecoderLayer, Gemma3DecoderLayer"):
        layer_kind(torch.nn.Linear(2, 2))


def test_skip_layer_router_returns_its_input():
    class Call:
        hidden_states = torch.randn(1, 3, 4)

    assert SkipLayer()(Call()) is Call.hidden_states


def test_bench_command_table_and_layer_spread(capsys):
    from kvlab.experiments.bench import orthorank as bench

    assert set(bench.COMMANDS) == {"throughput", "layer"}
    assert bench.main(["--help"]) == 0 and "throughput" in capsys.readouterr().out
    assert bench.main(["nonsense"]) == 2
    for L in (16, 32):
        for s in (0.1, 0.2):
            for r in (0.0, 0.33):
                n = layers_for_sparsity(L, s, r)
                chosen = bench.spread_layers(L, n)
                assert len(chosen) == n == len(set(chosen)) and all(0 < c < L - 1 for c in chosen)


# ---------------------------------------------------------------------------------------------------
# the Triton routed layer (kvlab/orthorank/triton.py) against the reference; CPU runs the interpreter


DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # CPU: the Triton interpreter


@contextlib.contextmanager
def on_device(model):
    """The shared tiny model on DEV for the block, back on the CPU afterwards."""
    try:
        yield model.to(DEV)
    finally:
        model.cpu()


def _rope_for(model, h, pos, layer_idx):
    types = getattr(model.config, "layer_types", None)
    if isinstance(model, Gemma3ForCausalLM):  # Gemma3: one table per attention type
        return model.model.rotary_emb(h, pos, types[layer_idx])
    return model.model.rotary_emb(h, pos)


@pytest.mark.triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_scores_are_eq4(dtype):
    from kvlab.orthorank.triton import orthogonal_scores
    from kvlab.testing import assert_close_to_oracle

    torch.manual_seed(10)
    states = torch.randn(3, 37, 80).to(DEV, dtype)
    assert_close_to_oracle(orthogonal_scores(states), alignment(states), alignment(states.double()), reduction=80,
                           dtype=dtype, name="scores")


def _norm_module(kind: str, dim: int, dtype: torch.dtype):
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    norm = LlamaRMSNorm(dim, eps=1e-5) if kind == "llama" else Gemma3RMSNorm(dim, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(dim) * 0.5 + (1.0 if kind == "llama" else 0.0))
    return norm.to(DEV, dtype)


@pytest.mark.triton
@pytest.mark.parametrize("kind", ["llama", "gemma3"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hidden", [48, 80])  # on CPU: whole rows in one chunk, or two passes over chunks
def test_triton_rmsnorm_with_scores_is_the_module_then_eq4(kind, dtype, hidden):
    """One pass gives the layer's RMSNorm (its own rounding: Llama casts before the weight, Gemma3 after)
    and Eq. 4 on the result."""
    from kvlab.orthorank.triton import rmsnorm, rmsnorm_form
    from kvlab.testing import assert_close_to_oracle

    torch.manual_seed(17)  # hidden sizes that are not powers of two: masked lanes
    norm = _norm_module(kind, hidden, dtype)
    assert rmsnorm_form(norm) is not None
    x = (torch.randn(3, 37, hidden) * 3).to(DEV, dtype)
    x[1, 0] *= 40  # a sink far larger than the rest (the massive activation)
    y, scores = rmsnorm(norm, x, scores=True)
    with torch.no_grad():
        eager = norm(x)
        oracle = _norm_module(kind, hidden, torch.float64)
        oracle.load_state_dict({k: v.double() for k, v in norm.state_dict().items()})
        exact = oracle(x.double())
    assert y.dtype == eager.dtype and y.shape == eager.shape
    assert_close_to_oracle(y, eager, exact, reduction=hidden, dtype=dtype, name="rmsnorm")
    assert_close_to_oracle(scores, alignment(eager), alignment(exact), reduction=hidden, dtype=dtype, name="scores")
    assert torch.equal(rmsnorm(norm, x), y)  # without scores: the same normalised states

    class Other(torch.nn.Module):  # a norm the kernel does not know: the module itself runs
        def forward(self, t):
            return t * 2

    other, other_scores = rmsnorm(Other(), x, scores=True)
    assert torch.equal(other, x * 2) and rmsnorm_form(Other()) is None
    assert_close_to_oracle(other_scores, alignment(x * 2), alignment((x * 2).double()), reduction=hidden, dtype=dtype)


@pytest.mark.triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_gather_add_rmsnorm_and_silu_mul_are_the_modules(dtype):
    from transformers.models.llama.modeling_llama import LlamaMLP

    from kvlab.kernels.triton_utils import interpreting
    from kvlab.orthorank.triton import gather_add_rmsnorm, mlp, silu_mul
    from kvlab.testing import assert_close_to_oracle

    torch.manual_seed(18)
    norm = _norm_module("llama", 48, dtype)
    h = torch.randn(2, 20, 48).to(DEV, dtype)
    sel = torch.tensor([[1, 4, 9, 10], [0, 2, 18, 19]], device=DEV)
    add = torch.randn(2, 4, 48).to(DEV, dtype)
    a, y = gather_add_rmsnorm(h, sel, add, norm)
    wide = _norm_module("llama", 80, dtype)  # on CPU: two passes over chunks
    h80, add80 = torch.randn(2, 20, 80).to(DEV, dtype), torch.randn(2, 4, 80).to(DEV, dtype)
    a80, y80 = gather_add_rmsnorm(h80, sel, add80, wide)
    rows80 = torch.stack([h80[b, sel[b]] for b in range(2)])
    with torch.no_grad():
        assert_close_to_oracle(y80, wide(rows80 + add80), wide.double()(rows80.double() + add80.double()),
                               reduction=80, dtype=dtype, name="two-pass norm")
        wide.to(dtype)
    rows = torch.stack([h[b, sel[b]] for b in range(2)])
    a_eager = rows + add
    # the residual sum: one rounding of the fp32 sum (the interpreter truncates bf16 instead: one ulp)
    assert (a.float() - a_eager.float()).abs().max() <= a_eager.float().abs().max() * torch.finfo(dtype).eps
    with torch.no_grad():
        exact = norm.double()(rows.double() + add.double())
        norm.to(dtype)
        assert_close_to_oracle(y, norm(a_eager), exact, reduction=48, dtype=dtype, name="post-attention norm")
    with pytest.raises(ValueError, match="no kernel for Linear"):
        gather_add_rmsnorm(h, sel, add, torch.nn.Linear(48, 48))

    g, u = (torch.randn(5, 33) * 4).to(DEV, dtype), torch.randn(5, 33).to(DEV, dtype)
    fused, eager = silu_mul(g, u), torch.nn.functional.silu(g) * u
    if dtype == torch.bfloat16 and interpreting():  # the interpreter truncates to bf16 (two roundings: 2 ulps)
        assert ((fused.float() - eager.float()).abs() <= eager.float().abs() * 2.0 ** -6).all()
    else:
        assert_close_to_oracle(fused, eager, torch.nn.functional.silu(g.double()) * u.double(), reduction=1,
                               dtype=dtype, name="silu")
    from transformers import LlamaConfig

    module = LlamaMLP(LlamaConfig(hidden_size=48, intermediate_size=64, hidden_act="silu", num_attention_heads=4)).to(DEV, dtype)
    x = torch.randn(3, 48).to(DEV, dtype)
    with torch.no_grad():
        exact = LlamaMLP(LlamaConfig(hidden_size=48, intermediate_size=64, hidden_act="silu", num_attention_heads=4)).double().to(DEV)
        exact.load_state_dict({k: v.double() for k, v in module.state_dict().items()})
        assert_close_to_oracle(mlp(module, x), module(x), exact(x.double()), reduction=64, dtype=dtype, name="mlp")


@pytest.mark.triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_rope_heads_is_the_reference_rotation(dtype):
    """One pass: heads split, each rotated by its own row's position (or the gathered one)."""
    from kvlab.orthorank.reference import _heads, _rope
    from kvlab.orthorank.triton import rope_heads
    from kvlab.testing import assert_close_to_oracle

    torch.manual_seed(20)
    batch, seq, heads, dim = 2, 19, 3, 16
    angles = torch.arange(seq)[:, None] * 0.3 ** torch.arange(dim // 2)[None, :]
    cos = torch.cat([angles.cos(), angles.cos()], -1)[None].to(DEV, dtype)
    sin = torch.cat([angles.sin(), angles.sin()], -1)[None].to(DEV, dtype)
    x = (torch.randn(batch, seq, heads * dim) * 3).to(DEV, dtype)
    sel = torch.tensor([[0, 3, 4, 18], [1, 2, 9, 17]], device=DEV)
    x_sel = torch.stack([x[b, sel[b]] for b in range(batch)])

    def ref(t, c, s_, index=None):
        c, s_ = c.expand(batch, -1, -1), s_.expand(batch, -1, -1)
        if index is not None:
            c = torch.stack([c[b, index[b]] for b in range(batch)])
            s_ = torch.stack([s_[b, index[b]] for b in range(batch)])
        return _rope(_heads(t, dim), c, s_)

    for t, index in ((x, None), (x_sel, sel)):
        out = rope_heads(t, cos, sin, dim, index=index)
        assert out.shape == (batch, heads, t.shape[1], dim)
        assert_close_to_oracle(out, ref(t, cos, sin, index), ref(t.double(), cos.double(), sin.double(), index),
                               reduction=2, dtype=dtype, name="rope")


@pytest.mark.triton
def test_triton_attention_unmasked_prefix_is_used_and_exact():
    """Queries late in the sequence see whole key tiles before them: those run without the mask (and
    without bounds checks); a cache whose positions do not ascend shortens that prefix, never lengthens it."""
    from kvlab.orthorank.reference import attention
    from kvlab.orthorank.triton import selected_attention
    from kvlab.testing import assert_close_to_oracle

    torch.manual_seed(19)
    batch, heads, kv_heads, n, dim, nq = 1, 2, 1, 70, 16, 5
    q = torch.randn(batch, heads, nq, dim).to(DEV)
    k = torch.randn(batch, kv_heads, n, dim).to(DEV)
    v = torch.randn(batch, kv_heads, n, dim).to(DEV)
    q_pos = torch.tensor([[50, 52, 60, 61, 69]], device=DEV)
    for k_pos in (torch.arange(n, device=DEV)[None], torch.arange(n, device=DEV).flip(-1)[None],
                  torch.cat([torch.arange(40, 70), torch.arange(40)]).to(DEV)[None]):
        mask = q_pos[:, :, None] >= k_pos[:, None, :]

        def ref(*xs):
            return attention(*xs, mask[:, None], 0.3).transpose(1, 2).reshape(batch, nq, heads * dim)

        out = selected_attention(q, k, v, q_pos, k_pos, 0.3)
        assert_close_to_oracle(out, ref(q, k, v), ref(q.double(), k.double(), v.double()), reduction=n)


@pytest.mark.triton
def test_triton_topk_is_algorithm_1():
    from kvlab.orthorank.triton import topk_in_order

    torch.manual_seed(11)
    for seq in (1, 37, 130):
        scores = torch.rand(3, seq)
        scores[1] = torch.round(scores[1] * 4) / 4  # many ties: the earlier token goes first
        scores[2, seq // 2:] = scores[2, : seq - seq // 2].clone()
        for k in sorted({0, 1, seq // 3, seq}):
            for sink in ("skip", "select"):
                got = topk_in_order(scores.to(DEV), k, sink).cpu()
                assert torch.equal(got, select_topk(scores, k, sink)), (seq, k, sink)
    signed = torch.randn(2, 40)
    signed[0, 5], signed[0, 6], signed[1, 7] = -0.0, 0.0, float("inf")  # -0.0 ties with +0.0, as in the sort
    signed = torch.cat([signed, -signed])
    for k in (1, 6, 7, 8, 20, 39, 40):
        assert torch.equal(topk_in_order(signed.to(DEV), k).cpu(), select_topk(signed, k)), k
    with pytest.raises(ValueError, match="k must be in 0..40"):
        topk_in_order(signed, 41)


@pytest.mark.triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window", [None, 6])
def test_triton_attention_of_selected_queries_is_causal_on_original_positions(dtype, window):
    from kvlab.orthorank.reference import attention
    from kvlab.orthorank.triton import selected_attention
    from kvlab.testing import assert_close_to_oracle

    torch.manual_seed(12)
    batch, heads, kv_heads, n, dim = 2, 4, 2, 45, 16
    q = torch.randn(batch, heads, 13, dim).to(DEV, dtype)
    k = torch.randn(batch, kv_heads, n, dim).to(DEV, dtype)
    v = torch.randn(batch, kv_heads, n, dim).to(DEV, dtype)
    selected = torch.stack([torch.sort(torch.randperm(n)[:13]).values for _ in range(batch)]).to(DEV)
    k_pos = torch.arange(n, device=DEV).expand(batch, n)
    q_pos = k_pos.gather(1, selected)
    mask = q_pos[:, :, None] >= k_pos[:, None, :]
    if window is not None:
        mask &= q_pos[:, :, None] - k_pos[:, None, :] < window

    def ref(*xs):
        return attention(*xs, mask[:, None], 0.25).transpose(1, 2).reshape(batch, 13, heads * dim)

    out = selected_attention(q, k, v, q_pos, k_pos, 0.25, window)
    assert_close_to_oracle(out, ref(q, k, v), ref(q.double(), k.double(), v.double()), reduction=n, dtype=dtype)
    # keys held in another order (a cache after evictions): the position rule, not the index, decides
    perm = torch.randperm(n).to(DEV)
    shuffled = selected_attention(q, k[:, :, perm], v[:, :, perm], q_pos, k_pos[:, perm], 0.25, window)
    assert_close_to_oracle(shuffled, ref(q, k, v), ref(q.double(), k.double(), v.double()), reduction=n, dtype=dtype)


@pytest.mark.triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_gather_and_scatter_rows_are_exact(dtype):
    from kvlab.kernels.triton_utils import interpreting
    from kvlab.orthorank.triton import gather_rows, scatter_rows

    torch.manual_seed(13)
    h = torch.randn(2, 20, 24).to(DEV, dtype)
    sel = torch.tensor([[1, 4, 9], [0, 2, 19]], device=DEV)
    add = torch.randn(2, 3, 24).to(DEV, dtype)
    rows = torch.stack([h[b, sel[b]] for b in range(2)])

    def same(actual, expected):  # one rounding of the fp32 sum, as PyTorch; the CPU interpreter (triton 3.7)
        if dtype == torch.bfloat16 and interpreting():  # truncates fp32 -> bf16 instead: within one bf16 ulp
            ulp = expected.float().abs() * 2.0 ** -7
            return bool(((actual.float() - expected.float()).abs() <= ulp).all())
        return torch.equal(actual, expected)

    assert torch.equal(gather_rows(h, sel), rows)
    assert same(gather_rows(h, sel, add=add), rows + add)
    expected = h.clone()
    for b in range(2):
        expected[b, sel[b]] = rows[b] + add[b]
    assert same(scatter_rows(h, sel, rows, add), expected)
    valid = torch.tensor([[True, False, True], [True, True, True]], device=DEV)
    expected[0, 4] = h[0, 4]
    out = scatter_rows(h, sel, rows, add, valid)
    assert same(out, expected) and out.data_ptr() != h.data_ptr()
    assert torch.equal(out[0, 4], h[0, 4])  # a padding entry keeps its input
    inplace = h.clone()
    assert scatter_rows(inplace, sel, rows, add, valid, inplace=True) is inplace and same(inplace, expected)


@pytest.mark.triton
def test_triton_routed_layer_matches_the_reference(tiny_model):
    from kvlab.orthorank.triton import routed_layer_triton
    from kvlab.testing import assert_close_to_oracle

    torch.manual_seed(14)
    batch, seq = 2, 30
    h = torch.randn(batch, seq, tiny_model.config.hidden_size).to(DEV)
    pos = torch.arange(seq, device=DEV)[None]
    selected = torch.stack([torch.sort(torch.randperm(seq)[:11]).values for _ in range(batch)]).to(DEV)
    valid = torch.ones(batch, 11, dtype=torch.bool, device=DEV)
    valid[1, 3] = False
    for i in (1, 2):  # Gemma3: a sliding-window layer and a global one
        layer = tiny_model.model.layers[i]
        with torch.no_grad(), on_device(tiny_model):
            pe = _rope_for(tiny_model, h, pos, i)
            eager = routed_layer(layer, h, selected, position_embeddings=pe, positions=pos, valid=valid)
            out = routed_layer_triton(layer, h, selected, position_embeddings=pe, positions=pos, valid=valid)
            with in_float64(tiny_model):
                oracle = routed_layer(layer, h.double(), selected, positions=pos, valid=valid,
                                      position_embeddings=tuple(t.double() for t in pe))
        assert_close_to_oracle(out, eager, oracle, reduction=seq, name=f"layer {i}")
        assert torch.equal(out[1, selected[1, 3]], h[1, selected[1, 3]])  # a padding entry is not written


@pytest.mark.triton
def test_triton_all_tokens_selected_is_the_dense_layer(tiny_model, ids):
    from kvlab.orthorank.triton import routed_layer_triton
    from kvlab.testing import assert_close_to_oracle

    ids = ids.to(DEV)
    every = torch.arange(ids.shape[1], device=DEV)[None]
    seen = []

    class Compare(LayerRouter):
        def __call__(self, call):
            dense = call.run()
            pe, pos = call.kwargs["position_embeddings"], call.position_ids
            routed = routed_layer_triton(call.layer, call.hidden_states, every, position_embeddings=pe, positions=pos)
            with in_float64(tiny_model):
                oracle = call.run(call.hidden_states.double(), position_embeddings=tuple(t.double() for t in pe))
            assert_close_to_oracle(routed, dense, oracle, reduction=ids.shape[1], name=f"layer {call.layer_idx}")
            seen.append(call.layer_idx)
            return dense

    with torch.no_grad(), on_device(tiny_model), use_router(tiny_model, Compare()):
        tiny_model(input_ids=ids, use_cache=False)
    assert seen == list(range(tiny_model.config.num_hidden_layers))
    # through the router: every token selected runs the layer's own forward, the dense model exactly
    with on_device(tiny_model):
        dense = logits(tiny_model, ids)
        with orthorank(tiny_model, layers=[1, 2], token_ratio=1.0, backend="triton"):
            assert torch.equal(logits(tiny_model, ids), dense)


@pytest.mark.triton
def test_triton_router_matches_the_torch_router(tiny_model):
    from kvlab.testing import assert_close_to_oracle

    torch.manual_seed(15)
    ids = torch.randint(0, 96, (2, 40)).to(DEV)
    out, chosen = {}, {}
    with on_device(tiny_model):
        for backend in ("torch", "triton"):
            with orthorank(tiny_model, layers=[1, 2], token_ratio=0.33, backend=backend) as router:
                out[backend] = logits(tiny_model, ids)
            chosen[backend] = router.last_selected
        assert all(torch.equal(chosen["torch"][i], chosen["triton"][i]) for i in (1, 2))
        with in_float64(tiny_model), orthorank(tiny_model, layers=[1, 2], token_ratio=0.33, backend="torch"):
            oracle = logits(tiny_model, ids)
        assert_close_to_oracle(out["triton"], out["torch"], oracle, reduction=ids.shape[1])
        with orthorank(tiny_model, layers=[1, 2], token_ratio=0.33, backend="triton", inplace=True):
            assert_close_to_oracle(logits(tiny_model, ids), out["torch"], oracle, reduction=ids.shape[1])


@pytest.mark.triton
def test_triton_router_decodes_like_the_torch_router(tiny_llama):
    torch.manual_seed(16)
    ids = torch.randint(0, 96, (2, 28)).to(DEV)
    steps = {}
    for backend in ("torch", "triton"):
        cache = DynamicCache(config=tiny_llama.config)
        with torch.no_grad(), on_device(tiny_llama), orthorank(tiny_llama, layers=[1, 2], token_ratio=0.33,
                                                                backend=backend):
            outs = [tiny_llama(input_ids=ids[:, :24], past_key_values=cache, use_cache=True).logits]
            for t in range(24, 28):
                outs.append(tiny_llama(input_ids=ids[:, t:t + 1], past_key_values=cache, use_cache=True).logits)
        steps[backend] = torch.cat(outs, dim=1)
    torch.testing.assert_close(steps["triton"], steps["torch"], rtol=1e-4, atol=1e-4)


@pytest.mark.triton
def test_triton_backend_refuses_what_it_cannot_run(tiny_llama, ids):
    with orthorank(tiny_llama, layers=[1], token_ratio=0.5, kv="selected", backend="triton"):
        with pytest.raises(ValueError, match="kv='all' only"):
            logits(tiny_llama, ids)
    with orthorank(tiny_llama, layers=[1], token_ratio=0.5, backend="triton"):
        with pytest.raises(ValueError, match="torch.no_grad"):
            tiny_llama(input_ids=ids, use_cache=False)
    with pytest.raises(ValueError, match="backend must be one of"):
        OrthoRankRouter(0.5, backend="cuda")
    # auto on CPU tensors is the PyTorch definition, bit for bit
    with orthorank(tiny_llama, layers=[1], token_ratio=0.5, backend="torch"):
        plain = logits(tiny_llama, ids)
    with orthorank(tiny_llama, layers=[1], token_ratio=0.5):
        assert torch.equal(logits(tiny_llama, ids), plain)
