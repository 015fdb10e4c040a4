"""LaCache: ladder invariants, iterative compaction, degenerate cases, the policy inside a model, validation."""

from __future__ import annotations

import itertools

import pytest
import torch

from kvlab.eval import decode_stepwise

from kvlab.core import KVCache, rerotate
from kvlab.lacache import LaCache, compaction_snapshots, ladder_geometry, ladder_pattern
from kvlab.lacache.coverage import (coverage, pattern_perplexity, random_patterns, reach, simulate,
                                    worst_case_coverage)
from kvlab.lacache.reference import LadderGeometry, compaction_step, ladder_offsets
from kvlab.policies import Full, StreamingLLM

LAYOUTS = ("bands", "interleaved")
# (layers, span, overlap): the paper's L/4, L/2 settings, spans not divisible by the step, overlap 0
GEOMETRIES = [(30, 8, 4), (30, 15, 7), (30, 7, 3), (30, 8, 0), (12, 3, 1), (8, 4, 2), (4, 2, 1), (6, 3, 1)]


def layers_keeping(mask: torch.Tensor, token: int) -> list[int]:
    return torch.nonzero(mask[:, token]).flatten().tolist()


# ---------------------------------------------------------------------------------------------------
# the ladder (Sec. 3.2)

@pytest.mark.parametrize("L, S, O", GEOMETRIES)
def test_geometry_formulas(L, S, O):
    g = LadderGeometry(L, S, O)
    assert g.step == S - O
    assert (g.group - 1) * g.step >= L - S > (g.group - 2) * g.step  # fewest tokens whose bands reach layer L-1
    assert g.keep == min(-(-S // g.step), g.group) and g.freed == g.group - g.keep > 0


def test_paper_default_on_smollm2():
    g = ladder_geometry(30)  # S = L/4, O = S/2
    assert (g.span, g.overlap, g.step, g.group, g.keep, g.freed) == (8, 4, 4, 7, 2, 5)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("L, S, O", GEOMETRIES)
def test_every_layer_keeps_A_of_each_group_and_every_token_is_kept(L, S, O, layout):
    g = LadderGeometry(L, S, O)
    groups = 3
    mask = ladder_pattern(L, groups * g.group, S, O, layout=layout)
    per_group = mask.view(L, groups, g.group).sum(-1)
    assert torch.all(per_group == g.keep)  # no bubbles (footnote 1): equal counts in every layer
    assert torch.all(coverage(mask) >= 1)  # no token lost by all layers
    assert int(mask.sum()) == L * g.keep * groups
    rows = mask.view(L, groups, g.group)
    assert torch.equal(rows[:, 0], rows[:, -1])  # the same ladder repeats
    for layer in range(L):  # each layer keeps neighbouring tokens
        kept = torch.nonzero(rows[layer, 0]).flatten()
        assert torch.equal(kept, torch.arange(kept[0], kept[0] + g.keep))


@pytest.mark.parametrize("L, S, O", GEOMETRIES)
def test_bands_span_and_overlap(L, S, O):
    g = LadderGeometry(L, S, O)
    mask = ladder_pattern(L, g.group, S, O, layout="bands")
    off = ladder_offsets(g, "bands")
    assert torch.all(off[1:] >= off[:-1])  # early tokens in early layers
    D, A = g.step, g.keep
    for j in range(g.group):
        layers = layers_keeping(mask, j)
        assert layers == list(range(layers[0], layers[-1] + 1))  # S *consecutive* layers
        unclipped = A <= j < g.freed and (j + A) * D <= L  # offsets are clamped to 0..R at the ends
        if unclipped:  # a token away from the ladder's ends: band [j*D, j*D + A*D)
            assert layers == list(range(j * D, (j + A) * D))
            if S % D == 0:
                assert len(layers) == S
        if unclipped and j + 1 < g.freed and (j + 1 + A) * D <= L:
            shared = set(layers) & set(layers_keeping(mask, j + 1))
            assert len(shared) == (A - 1) * D
            if S % D == 0:
                assert len(shared) == O
    # footnote 1: the ends of the ladder are kept by at least as many layers as the ideal band gives them
    assert len(layers_keeping(mask, 0)) >= min(S, L)
    assert len(layers_keeping(mask, g.group - 1)) >= L - (g.group - 1) * D


def test_bands_example_from_the_docstring():
    mask = ladder_pattern(30, 7, 8, 4, layout="bands")
    assert coverage(mask).tolist() == [8, 12, 8, 8, 8, 10, 6]  # interior tokens: S = 8 layers
    assert layers_keeping(mask, 3) == list(range(12, 20))


@pytest.mark.parametrize("L, S, O", GEOMETRIES)
def test_interleaved_repeats_a_short_ladder(L, S, O):
    g = LadderGeometry(L, S, O)
    off = ladder_offsets(g, "interleaved")
    period = g.freed + 1
    assert off[:period].tolist() == list(range(period))
    assert torch.equal(off[period:], off[:L - period])


def test_layouts_differ_but_keep_as_much():
    bands = ladder_pattern(30, 21, layout="bands")
    inter = ladder_pattern(30, 21, layout="interleaved")
    assert int(bands.sum()) == int(inter.sum())
    assert not torch.equal(bands, inter)


def test_ladder_pattern_keeps_sink_and_partial_group():
    g = ladder_geometry(8, 4, 2)  # G = 3, A = 2
    mask = ladder_pattern(8, 2 + 2 * g.group + 2, 4, 2, sink=2)
    assert mask[:, :2].all() and mask[:, -2:].all()
    assert torch.all(mask[:, 2:2 + 2 * g.group].sum(-1) == 2 * g.keep)


# ---------------------------------------------------------------------------------------------------
# iterative compaction (Sec. 3.3)

def test_compaction_step_by_hand():
    g = LadderGeometry(4, 2, 1)  # D = 1, G = 3, A = 2, R = 1
    assert ladder_offsets(g, "bands").tolist() == [0, 0, 1, 1]
    assert ladder_offsets(g, "interleaved").tolist() == [0, 1, 0, 1]
    args = dict(budget=6, sink=1, recent=2, geometry=g)
    assert compaction_step(6, 1, offset=1, **args) == (None, 1)
    keep, cursor = compaction_step(7, 1, offset=1, **args)
    assert (keep, cursor) == ([0, 2, 3, 4, 5, 6], 3)
    keep, cursor = compaction_step(7, 1, offset=0, **args)
    assert (keep, cursor) == ([0, 1, 2, 4, 5, 6], 3)
    # cursor 3 + G = 6 > 7 - recent: the pass is over, start over at the sink (the compacted entries)
    assert compaction_step(7, 3, offset=1, **args) == ([0, 2, 3, 4, 5, 6], 3)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_compaction_stays_within_budget_for_10k_steps(layout):
    L, budget, sink = 6, 40, 2
    policy = LaCache(budget, span=2, overlap=1, sink=sink, layout=layout)
    sim = simulate(policy, L, 10_000, snapshots=[5_000])
    g = ladder_geometry(L, 2, 1)
    assert int(sim.held.max()) == budget
    assert torch.all(sim.held == sim.held[:, :1])  # every layer holds the same number of entries
    assert int(sim.held[budget:].min()) >= budget - g.freed  # memory constant once full
    recent = L
    for pos in sim.kept:
        assert pos[:sink].tolist() == list(range(sink))
        assert pos[-recent:].tolist() == list(range(10_000 - recent, 10_000))
        assert torch.all(pos[1:] > pos[:-1])
    # older tokens are sparser: more layers hold the newest tokens than tokens further back
    cov = coverage(sim.mask()).double()
    assert cov[-100:].mean() > cov[-400:-100].mean() > cov[sink:-400].mean()
    assert sim.snapshots[5_000].shape == (L, 5_000)


def official_kept(L, cache_size, span, overlap, steps, sink=4):
    """The authors' LaCache bookkeeping, token by token, in its own terms: the size grows by floor(R/2) at
    the first overflow; one token over the size compacts one ladder at the cursor, unless fewer than A
    entries lie between the cursor and the L newest, in which case the pass starts over at the sink."""
    D = span - overlap
    G = 1 + -(-(L - span) // D)
    A = min(-(-span // D), G)
    R = G - A
    size, cursor, grown = cache_size, sink, False
    layers = [[] for _ in range(L)]
    for t in range(steps):
        for held in layers:
            held.append(t)
        if len(layers[0]) > size and not grown:
            size, grown = size + R // 2, True
        if len(layers[0]) <= size:
            continue
        if size - cursor - L < A:
            cursor = sink
        for layer, held in enumerate(layers):
            off = layer % (R + 1)
            held[cursor:cursor + G] = held[cursor + off:cursor + off + A]
        cursor += A
    return layers


@pytest.mark.parametrize("L, C, S, O", [(30, 80, 16, 0), (30, 80, 15, 0), (30, 256, 8, 4), (30, 64, 8, 0),
                                        (12, 40, 3, 1), (6, 20, 2, 1)])
def test_official_accounting_keeps_what_the_public_code_keeps(L, C, S, O):
    steps = 1500
    want = official_kept(L, C, S, O, steps)
    g = ladder_geometry(L, S, O)
    for policy in (LaCache.official(C, S, O),
                   LaCache(C + g.freed // 2, S, O, layout="interleaved", recent=L - g.freed + 1)):
        sim = simulate(policy, L, steps)
        for layer in range(L):
            assert sim.kept[layer].tolist() == want[layer], (policy, layer)
    assert LaCache.official(C, S, O).settings(L) == dict(
        span=S, overlap=O, sink=4, recent=L - g.freed + 1, max_held=C + g.freed // 2, cache_size=C,
        layout="interleaved", accounting="official", positions="cache")
    strict = simulate(LaCache(C, S, O, layout="interleaved"), L, steps).held.double().mean()
    official = simulate(LaCache.official(C, S, O), L, steps).held.double().mean()
    assert official >= strict  # the official count holds more at the same "cache size"


def test_official_budget_is_known_once_the_model_is():
    policy = LaCache.official(80, 16, 0)
    assert policy.budget is None
    policy.check_model(30)
    assert policy.budget == 80 + ladder_geometry(30, 16, 0).freed // 2
    assert LaCache(80, 16, 0).budget == 80


def test_chunked_prefill_matches_budget():
    sim = simulate(LaCache(64, span=3, overlap=1, sink=4), 12, 3_000, chunk=64)
    assert int(sim.held[-1].max()) <= 64 and len(set(sim.held[-1].tolist())) == 1


@pytest.mark.parametrize("layout", LAYOUTS)
def test_span_equal_to_layers_is_streaming_llm(layout):
    L, budget, sink = 5, 24, 3
    la = simulate(LaCache(budget, span=L, overlap=2, sink=sink, layout=layout), L, 400, snapshots=range(1, 401))
    sl = simulate(StreamingLLM(sink=sink, window=budget - sink), L, 400, snapshots=range(1, 401))
    for step in range(1, 401):
        assert torch.equal(la.snapshots[step], sl.snapshots[step]), step


def test_budget_at_least_length_keeps_everything():
    sim = simulate(LaCache(300), 30, 300)
    assert sim.mask().all()


def test_snapshots_before_and_after_compaction():
    snaps = compaction_snapshots(30, 64, [64, 65, 400])
    assert snaps[64].all()
    assert snaps[65].sum(-1).max() == 64 - 4  # one ladder of 7 applied: 5 entries freed, then 1 arrived
    assert int(snaps[400].sum(-1).max()) <= 64


# ---------------------------------------------------------------------------------------------------
# coverage theory

def test_coverage_reach_streaming_vs_lacache():
    L, budget, t = 30, 128, 2_000
    steps = list(range(200, t + 1, 50))
    sl = simulate(StreamingLLM(sink=4, window=budget - 4), L, t, snapshots=steps).snapshots
    la = simulate(LaCache(budget), L, t, snapshots=steps).snapshots
    for step in steps:
        assert reach(sl[step], 1, sink=4) == reach(sl[step], L, sink=4) == budget - 4
        assert int(coverage(sl[step]).sum()) == L * budget  # the same memory, spent differently:
        assert int(coverage(la[step]).sum()) <= L * budget
        held = int((coverage(la[step])[4:] > 0).sum())
        assert held > budget  # more positions held by at least one layer ...
        assert L <= reach(la[step], L, sink=4) < budget - 4  # ... but fewer by every layer (at least `recent`)
        worst = worst_case_coverage(la[step], sink=4)
        assert torch.all(worst[1:] <= worst[:-1])
    # holes appear once old entries are compacted a second time, so the hole-free reach oscillates; on average
    # it is longer than StreamingLLM's window
    mean_reach = sum(reach(la[s], 1, sink=4) for s in steps) / len(steps)
    assert mean_reach > budget


def test_random_patterns_are_valid():
    g = torch.Generator().manual_seed(0)
    pats = random_patterns(5, 100, 20, 9, sink=3, generator=g)
    assert {f for f, _ in pats} == {"window+block", "scattered", "window+strided"}
    for _, layers in pats:
        assert len(layers) == 5
        for idx in layers:
            assert idx.numel() == 20 and idx[:3].tolist() == [0, 1, 2]
            assert torch.all(idx[1:] > idx[:-1]) and int(idx.max()) < 100


def test_pattern_perplexity_keep_all_equals_full_forward(tiny_llama, ids):
    context = 30
    everything = [torch.arange(context)] * 4
    recent_only = [torch.arange(context - 4, context)] * 4
    ppl = pattern_perplexity(tiny_llama, ids, context, [everything, recent_only])
    with torch.no_grad():
        logits = tiny_llama(input_ids=ids, use_cache=False).logits[0, context:-1]
    ref = torch.nn.functional.cross_entropy(logits, ids[0, context + 1:]).double().exp()
    assert float(ppl[0]) == pytest.approx(float(ref), rel=1e-4)
    assert float(ppl[1]) != pytest.approx(float(ref), rel=1e-4)


# ---------------------------------------------------------------------------------------------------
# the policy inside a model



def test_large_budget_equals_full_exactly(tiny_model, ids):
    full, _ = decode_stepwise(tiny_model, ids, Full())
    la, cache = decode_stepwise(tiny_model, ids, LaCache(ids.shape[1], span=2, overlap=1, sink=2))
    assert torch.equal(full, la)


def test_span_equal_to_layers_equals_streaming_in_model(tiny_llama, ids):
    sl, _ = decode_stepwise(tiny_llama, ids, StreamingLLM(sink=2, window=14))
    la, _ = decode_stepwise(tiny_llama, ids, LaCache(16, span=4, overlap=1, sink=2))
    assert torch.equal(sl, la)


@pytest.mark.parametrize("positions", ["cache", "original"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_layers_hold_different_positions_and_attention_uses_them(tiny_llama, ids, positions, layout):
    """After streaming, the next step equals a plain DynamicCache holding each layer's own kept entries, at
    positions 0..n-1 (positions="cache") or at their original positions."""
    from transformers import DynamicCache

    policy = LaCache(16, span=2, overlap=1, sink=2, recent=3, layout=layout, positions=positions)
    _, cache = decode_stepwise(tiny_llama, ids[:, :-1], policy)
    kept = [layer.positions[0].tolist() for layer in cache.layers]
    assert len({tuple(k) for k in kept}) > 1  # the ladder: layers keep different tokens
    assert all(len(k) == len(kept[0]) <= 16 for k in kept)
    n = len(kept[0])
    dyn = DynamicCache(config=tiny_llama.config)
    for i, layer in enumerate(cache.layers):
        target = torch.arange(n)[None] if positions == "cache" else layer.positions
        dyn.update(rerotate(layer.keys, target - layer.rot, layer.inv_freq), layer.values.clone(), i)
    query_pos = n if positions == "cache" else ids.shape[1] - 1
    with torch.no_grad():
        ref = tiny_llama(input_ids=ids[:, -1:], past_key_values=dyn, position_ids=torch.tensor([[query_pos]])).logits
        got = tiny_llama(input_ids=ids[:, -1:], past_key_values=cache, use_cache=True).logits
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


def test_generate_and_batch(tiny_llama):
    torch.manual_seed(4)
    ids = torch.randint(0, 96, (2, 30))
    both, _ = decode_stepwise(tiny_llama, ids, LaCache(14, span=2, overlap=1, sink=2, recent=2))
    for row in range(2):
        one, _ = decode_stepwise(tiny_llama, ids[row:row + 1], LaCache(14, span=2, overlap=1, sink=2, recent=2))
        torch.testing.assert_close(both[row:row + 1], one, rtol=1e-5, atol=1e-5)
    cache = KVCache(tiny_llama, LaCache(14, span=2, overlap=1, sink=2, recent=2))
    with torch.no_grad():
        tiny_llama.generate(ids[:1, :8], max_new_tokens=20, do_sample=False, past_key_values=cache)
    assert max(max(h) for h in cache.trace.per_layer) <= 14


def test_policy_reused_across_caches_starts_fresh(tiny_llama, ids):
    policy = LaCache(12, span=2, overlap=1, sink=2, recent=2)
    first, _ = decode_stepwise(tiny_llama, ids[:, :30], policy)
    second, _ = decode_stepwise(tiny_llama, ids[:, :30], policy)
    assert torch.equal(first, second)


# ---------------------------------------------------------------------------------------------------
# validation

@pytest.mark.parametrize("kwargs, error, message", [
    (dict(budget=64, span=4, overlap=4), ValueError, r"overlap \(4\) must be smaller than span \(4\)"),
    (dict(budget=64, span=0), ValueError, "span must be >= 1"),
    (dict(budget=64, span=4, overlap=-1), ValueError, "overlap must be >= 0"),
    (dict(budget=0), ValueError, "budget must be >= 1"),
    (dict(budget=64, sink=-1), ValueError, "sink must be >= 0"),
    (dict(budget=64, layout="diagonal"), ValueError, "layout must be one of"),
    (dict(budget=64, positions="absolute"), ValueError, "positions must be one of"),
    (dict(budget=64, accounting="mean"), ValueError, "accounting must be one of"),
    (dict(budget=8, sink=4, recent=4), ValueError, r"sink \+ recent \(4 \+ 4\) must be smaller than budget"),
    (dict(budget=64.0), TypeError, "budget must be an int"),
    (dict(budget=64, span=2.5), TypeError, "span must be an int"),
])
def test_bad_parameters_rejected(kwargs, error, message):
    with pytest.raises(error, match=message):
        LaCache(**kwargs)


def test_model_dependent_checks(tiny_llama):
    with pytest.raises(ValueError, match="span=5 exceeds the model's 4 layers"):
        KVCache(tiny_llama, LaCache(64, span=5, overlap=1))
    with pytest.raises(ValueError, match=r"budget=10 is too small .* use budget >= 11"):
        KVCache(tiny_llama, LaCache(10, span=2, overlap=1, sink=4))  # 4 + recent 4 + G 3
    with pytest.raises(ValueError, match="compaction frees nothing"):
        LadderGeometry(30, 20, 19)
    with pytest.raises(ValueError, match="span must be in 1..4"):
        ladder_geometry(4, 6, 1)
    with pytest.raises(ValueError, match="layout must be one of"):
        ladder_pattern(4, 10, layout="zigzag")


def test_every_geometry_of_a_small_model_is_valid_or_explained():
    for span, overlap in itertools.product(range(1, 9), range(0, 8)):
        if overlap >= span:
            continue
        try:
            g = LadderGeometry(8, span, overlap)
        except ValueError as err:
            assert "frees nothing" in str(err)
            continue
        mask = ladder_pattern(8, 2 * g.group, span, overlap, layout="bands")
        assert torch.all(coverage(mask) >= 1)


def test_chunked_perplexity_chunk_one_is_token_by_token(tiny_llama, ids):
    from kvlab.eval import streaming_perplexity
    from kvlab.eval import chunked_perplexity, ppl_at_lengths

    from conftest import IdTokenizer

    policy = LaCache(16, span=2, overlap=1, sink=2, recent=2)
    ref = streaming_perplexity(tiny_llama, IdTokenizer(), ids, policy, progress=False)
    one = chunked_perplexity(tiny_llama, IdTokenizer(), ids, policy, chunk_size=1)
    torch.testing.assert_close(one.nll, ref.nll, rtol=1e-5, atol=1e-6)
    assert torch.equal(one.kv_trace_per_layer, ref.kv_trace_per_layer)
    eight = chunked_perplexity(tiny_llama, IdTokenizer(), ids, policy, chunk_size=8)
    assert eight.nll.shape == ref.nll.shape and not torch.allclose(eight.nll, ref.nll)
    full = chunked_perplexity(tiny_llama, IdTokenizer(), ids, Full(), chunk_size=8)
    ref_full = streaming_perplexity(tiny_llama, IdTokenizer(), ids, Full(), progress=False)
    torch.testing.assert_close(full.nll, ref_full.nll, rtol=1e-4, atol=1e-4)  # nothing dropped: chunks are exact
    at = ppl_at_lengths(ref, [10, 48, 1000])
    assert set(at) == {10, 48} and at[48] == pytest.approx(ref.ppl)


def test_is_dominated():
    from kvlab.lacache.coverage import is_dominated

    assert is_dominated(10, 5.0, [8, 12], [4.0, 1.0])
    assert not is_dominated(10, 5.0, [12, 10], [1.0, 5.0])
