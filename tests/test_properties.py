"""Property tests drawn by hypothesis: every KV policy, the five mechanisms against their references, the record format.

* **Policies** (every class of :mod:`kvlab.policies`, with drawn arguments, streams and step sizes): the indices a
  policy returns are valid (ascending, in range); a layer never holds more than the policy's ``budget``; the kept set
  is the one the policy's rule names (sink + window, initial + separators + neighbours, heavy hitters + recent ...);
  the static engine's rule (``static_keep``, slots of every layer at once) keeps exactly what ``keep`` keeps; inside
  a model the cache holds exactly those original positions, and with a budget the stream never exceeds, a streamed
  forward (any position mode, any chunking) gives the full forward's logits.
* **Mechanisms**: SepLLM's ``sep_attention`` against the mask read off Sec. 3.1; DHSA's ``dhsa_attention`` against
  masked softmax over its reference mask, within budget, and dense when the budget covers the sequence; LaCache's
  static rule against its reference ``compaction_step`` (through ``keep``); REFORM's H2O compression and gather
  against their definitions; OrthoRank's top-k against Algorithm 1, and a token ratio of 1 against the dense model.
* **Records**: ``write`` then ``read`` gives back the records, also across a resumed writer; an interrupted writer
  leaves no file under the final name.

Each property runs a few bounded examples (``max_examples`` below, no deadline, derandomized so CI runs the same cases
every time); the whole file takes seconds.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import kvlab.policies as policies
from kvlab.core import KVCache, LayerView, StaticView

pytestmark = pytest.mark.usefixtures("one_thread")

SMALL = settings(max_examples=25, deadline=None, derandomize=True, database=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
MODEL = settings(max_examples=8, deadline=None, derandomize=True, database=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
VOCAB = 96  # the tiny models' vocabulary (conftest)


# ================================================================================================ policies
@st.composite
def policy_cases(draw, kinds=None, scores=True):
    """(policy, layers): one policy of kvlab.policies with drawn arguments that it accepts."""
    names = kinds or ["Full", "StreamingLLM", "H2O", "TOVA", "LaCache", "SepLLM", "FixLLM", "SepLLMStreaming"]
    if not scores:
        names = [n for n in names if n not in ("H2O", "TOVA")]
    kind = draw(st.sampled_from(names))
    layers = draw(st.integers(1, 5))
    positions = draw(st.sampled_from(["cache", "original", "insertion"]))
    seps = draw(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=12, unique=True))
    P = policies
    if kind == "Full":
        return P.Full(positions=positions), layers
    if kind == "StreamingLLM":
        return P.StreamingLLM(draw(st.integers(0, 4)), draw(st.integers(1, 10)), positions=positions), layers
    if kind == "H2O":
        budget = draw(st.integers(1, 12))
        return P.H2O(budget, draw(st.integers(0, budget)), positions=positions), layers
    if kind == "TOVA":
        return P.TOVA(draw(st.integers(1, 12)), positions=positions), layers
    if kind == "SepLLM":
        return P.SepLLM(draw(st.integers(0, 4)), draw(st.integers(1, 10)), separators=seps, positions=positions), layers
    if kind == "FixLLM":
        return P.FixLLM(draw(st.integers(0, 4)), draw(st.integers(1, 10)), draw(st.integers(1, 6)),
                        positions=positions), layers
    if kind == "SepLLMStreaming":
        init, sep, local = draw(st.integers(0, 3)), draw(st.integers(1, 4)), draw(st.integers(1, 6))
        cache = init + sep + local + draw(st.integers(1, 6))
        return P.SepLLMStreaming(init, sep, local, cache, separators=seps, positions=positions), layers
    layers = draw(st.integers(2, 6))
    span = draw(st.integers(1, layers))
    overlap = draw(st.integers(0, span - 1))
    sink, recent = draw(st.integers(0, 3)), draw(st.integers(0, 3))
    budget = sink + recent + draw(st.integers(2, 12))
    layout = draw(st.sampled_from(["bands", "interleaved"]))
    policy = P.LaCache(budget, span, overlap, sink, recent=recent, layout=layout, positions=positions)
    try:
        policy.check_model(layers)
    except ValueError:
        assume(False)
    return policy, layers


def _chunks(draw, total: int, largest: int) -> list[int]:
    sizes, left = [], total
    while left:
        sizes.append(draw(st.integers(1, min(largest, left))))
        left -= sizes[-1]
    return sizes


@st.composite
def streams(draw, largest: int = 4, longest: int = 40):
    """(token ids (1, T), chunk sizes summing to T)."""
    total = draw(st.integers(1, longest))
    ids = torch.tensor([draw(st.lists(st.integers(0, VOCAB - 1), min_size=total, max_size=total))])
    return ids, _chunks(draw, total, largest)


def _run_keep(policy, layers: int, ids: torch.Tensor, chunks: list[int], seed: int = 0):
    """The hooks engine's bookkeeping without a model: each step appends a chunk, then ``policy.keep`` decides per
    layer (scores drawn at random where the policy reads them). Yields (seen, [(positions, scores, last) before the
    keep], [kept positions after]) per step; every returned index is checked on the way."""
    gen = torch.Generator().manual_seed(seed)
    pos = [torch.empty(1, 0, dtype=torch.long) for _ in range(layers)]
    acc = [torch.empty(1, 0) for _ in range(layers)]
    states = [{} for _ in range(layers)]
    seen = 0
    for t in chunks:
        new = torch.arange(seen, seen + t)[None]
        seen += t
        before, after = [], []
        for layer in range(layers):
            p = torch.cat([pos[layer], new], dim=1)
            scores = torch.cat([acc[layer], torch.zeros(1, t)], dim=1) + torch.rand(p.shape, generator=gen)
            last = torch.rand(p.shape, generator=gen)
            view = LayerView(layer, layers, seen, p, ids[:, p[0]], scores, last, states[layer])
            index = policy.keep(view)
            before.append((p, scores, last))
            if index is not None:
                assert index.dtype == torch.long and index.dim() in (1, 2)
                flat = index.reshape(-1)
                assert flat.numel() == 0 or (int(flat.min()) >= 0 and int(flat.max()) < p.shape[1])
                assert bool((flat[1:] > flat[:-1]).all()), f"{policy!r} returned indices out of order"
                p = p[:, index] if index.dim() == 1 else p.gather(1, index)
                scores = scores[:, index] if index.dim() == 1 else scores.gather(1, index)
            pos[layer], acc[layer] = p, scores
            after.append(p[0].tolist())
        yield seen, before, after


def _expected(policy, seen: int, ids: list[int], held: torch.Tensor, scores, last) -> list[int] | None:
    """The kept positions the policy's documented rule names, for the policies whose rule is a set (None: checked
    elsewhere). ``held`` are the positions the layer holds when it decides, ``ids`` the stream's tokens."""
    P = policies
    held = held[0].tolist()
    if isinstance(policy, P.Full):
        return held
    if isinstance(policy, P.StreamingLLM):
        return held if len(held) <= policy.budget else held[:policy.sink] + held[len(held) - policy.window:]
    if isinstance(policy, P.FixLLM):
        i = policy.interval
        return [p for p in held if p < policy.init or seen - p < policy.neighbors or p % i == i - 1]
    if isinstance(policy, P.SepLLM):
        seps = set(policy.separators.tolist())
        return [p for p in held if p < policy.init or seen - p < policy.neighbors or ids[p] in seps]
    if isinstance(policy, (P.H2O, P.TOVA)):
        n = len(held)
        if n <= policy.budget:
            return held
        if isinstance(policy, P.TOVA):
            best = last[0].argsort(descending=True)[:policy.budget]
            return sorted(held[i] for i in best.tolist())
        old = n - policy.recent
        best = scores[0, :old].argsort(descending=True)[:policy.budget - policy.recent]
        return sorted(held[i] for i in best.tolist()) + held[old:]
    return None


@SMALL
@given(case=policy_cases(), stream=streams())
def test_every_policy_keeps_its_rule_within_its_budget(case, stream):
    policy, layers = case
    ids, chunks = stream
    tokens = ids[0].tolist()
    for seen, before, after in _run_keep(policy, layers, ids, chunks):
        for layer, ((held, scores, last), kept) in enumerate(zip(before, after)):
            assert len(set(kept)) == len(kept) and set(kept) <= set(range(seen))
            if policy.budget is not None:
                assert len(kept) <= policy.budget, f"{policy!r} layer {layer} holds {len(kept)} after {seen}"
            want = _expected(policy, seen, tokens, held, scores, last)
            if want is not None:
                assert kept == want, f"{policy!r} layer {layer} after {seen} tokens"
            if isinstance(policy, policies.LaCache):  # the sinks and the recent entries are never compacted
                assert kept[:policy.sink] == list(range(min(policy.sink, seen)))
                recent = policy.plan(layers)[2]
                assert kept[len(kept) - min(recent, seen):] == list(range(seen - min(recent, seen), seen))
            if isinstance(policy, policies.SepLLMStreaming):
                assert kept[:policy.init] == list(range(min(policy.init, seen)))
                assert seen - 1 in kept  # the newest entry is in the local window


def _run_static(policy, layers: int, ids: torch.Tensor):
    """The static engine's bookkeeping without a model: one-token steps, ``static_keep`` on every layer's row at
    once, kept slots moved to the front in order (as StaticKVCache does). Yields the kept positions per layer."""
    total = ids.shape[1]
    cap = total + 1
    pos = torch.zeros(layers, cap, dtype=torch.long)
    tok = torch.zeros(layers, cap, dtype=torch.long)
    length = torch.zeros(layers, dtype=torch.long)
    state = policy.static_state(layers, "cpu")
    for seen in range(1, total + 1):
        pos[torch.arange(layers), length] = seen - 1
        tok[torch.arange(layers), length] = ids[0, seen - 1]
        length += 1
        view = StaticView(torch.arange(layers), layers, torch.tensor(seen), length.clone(), pos.clone(), tok.clone(),
                          state)
        keep = policy.static_keep(view)
        kept = []
        for row in range(layers):
            live = torch.arange(cap) < length[row]
            mask = live if keep is None else keep[row] & live
            held = pos[row][mask]
            kept.append(held.tolist())
            pos[row, :held.numel()] = held
            tok[row, :held.numel()] = tok[row][mask]
            length[row] = held.numel()
        yield kept


@SMALL
@given(case=policy_cases(scores=False), stream=streams(largest=1))
def test_the_static_rule_keeps_what_keep_keeps(case, stream):
    policy, layers = case
    assume(policy.static_reason is None)
    ids, chunks = stream
    static = _run_static(policy, layers, ids)
    for (seen, _, hooks), fast in zip(_run_keep(policy, layers, ids, chunks), static):
        assert fast == hooks, f"{policy!r} after {seen} tokens: static {fast} vs keep {hooks}"


@MODEL
@given(case=policy_cases(scores=False), stream=streams(largest=6, longest=24))
def test_the_cache_inside_a_model_holds_the_positions_the_policy_keeps(tiny_llama, case, stream):
    policy, layers = case
    ids, chunks = stream
    layers = 4
    try:
        cache = KVCache(tiny_llama, policy)
    except ValueError:
        assume(False)
    expected = list(_run_keep(policy, layers, ids, chunks))
    start = 0
    with torch.no_grad():
        for t, (seen, _, kept) in zip(chunks, expected):
            tiny_llama(input_ids=ids[:, start:start + t], past_key_values=cache, use_cache=True)
            start += t
            assert [layer.positions[0].tolist() for layer in cache.layers] == kept
            assert cache.seen == seen and cache.trace.per_layer[-1] == [len(k) for k in kept]


@MODEL
@given(stream=streams(largest=6, longest=20), positions=st.sampled_from(["cache", "original", "insertion"]),
       kind=st.sampled_from(["StreamingLLM", "SepLLM", "LaCache", "FixLLM"]))
def test_a_stream_within_the_budget_gives_the_full_forward(tiny_llama, stream, positions, kind):
    """Nothing is evicted, so every position mode must rotate every key where the full forward does."""
    ids, chunks = stream
    total = ids.shape[1]
    policy = {"StreamingLLM": lambda: policies.StreamingLLM(2, total, positions=positions),
              "SepLLM": lambda: policies.SepLLM(1, total + 1, separators=[5], positions=positions),
              "LaCache": lambda: policies.LaCache(total + 8, 2, 1, 2, positions=positions),
              "FixLLM": lambda: policies.FixLLM(1, total + 1, 3, positions=positions)}[kind]()
    cache, start, logits = KVCache(tiny_llama, policy), 0, []
    with torch.no_grad():
        full = tiny_llama(input_ids=ids).logits
        for t in chunks:
            logits.append(tiny_llama(input_ids=ids[:, start:start + t], past_key_values=cache, use_cache=True).logits)
            start += t
    torch.testing.assert_close(torch.cat(logits, dim=1), full, rtol=1e-4, atol=1e-4)


# ================================================================================================ mechanisms
@st.composite
def qkv_shapes(draw, longest: int = 24):
    batch, kv_heads = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    heads = kv_heads * draw(st.integers(1, 2))
    return batch, heads, kv_heads, draw(st.integers(1, longest)), draw(st.sampled_from([4, 8]))


def _qkv(shape, seed):
    b, h, hk, n, d = shape
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, h, n, d, generator=g, dtype=torch.float64),
            torch.randn(b, hk, n, d, generator=g, dtype=torch.float64),
            torch.randn(b, hk, n, d, generator=g, dtype=torch.float64))


def _masked_softmax(q, k, v, mask):
    """Attention written out: (batch, heads, seq, seq) bool mask, key heads repeated for GQA, float64."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    return torch.softmax(s.masked_fill(~mask, float("-inf")), dim=-1) @ v


@SMALL
@given(shape=qkv_shapes(), init=st.integers(0, 5), neighbors=st.integers(1, 10), seed=st.integers(0, 2**16),
       sep_rate=st.floats(0.0, 0.5))
def test_sep_attention_is_the_mask_of_sec_3_1(shape, init, neighbors, seed, sep_rate):
    from kvlab.sepllm import sep_attention

    q, k, v = _qkv(shape, seed)
    b, _, _, n, _ = shape
    is_sep = torch.rand(b, n, generator=torch.Generator().manual_seed(seed + 1)) < sep_rate
    qi, ki = torch.arange(n)[:, None], torch.arange(n)[None, :]
    mask = (ki <= qi) & ((ki < init) | (qi - ki < neighbors) | is_sep[:, None, None, :])  # (b, 1, n, n)
    want = _masked_softmax(q, k, v, mask.expand(b, q.shape[1], n, n))
    got = sep_attention(q, k, v, is_sep, init, neighbors, backend="torch")
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


@SMALL
@given(shape=qkv_shapes(), chunk=st.integers(1, 6), initial=st.integers(0, 3), seed=st.integers(0, 2**16),
       slack=st.integers(0, 8), dense=st.booleans())
def test_dhsa_attention_is_masked_softmax_within_its_budget(shape, chunk, initial, seed, slack, dense):
    from kvlab.dhsa import dhsa_attention
    from kvlab.dhsa.reference import dhsa_mask, fixed_boundaries, max_forced

    q, k, v = _qkv(shape, seed)
    b, h, _, n, _ = shape
    bd = fixed_boundaries(n, min(chunk, n))
    budget = n if dense else max_forced(bd, initial) + slack
    mask = dhsa_mask(q, k, bd, budget, initial=initial)
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    assert not bool((mask & ~causal).any())  # never a future key
    assert int(mask.sum(-1).max()) <= budget  # never more than the budget
    if budget >= n:
        assert bool((mask == causal).all())  # a budget covering the sequence is dense attention
    got = dhsa_attention(q, k, v, chunks=bd, budget=budget, initial=initial, backend="torch")
    torch.testing.assert_close(got, _masked_softmax(q, k, v, mask), rtol=1e-10, atol=1e-10)


@SMALL
@given(n=st.integers(1, 40), data=st.data())
def test_reform_compression_and_gather_are_their_definitions(n, data):
    from kvlab.reform.reference import gather_indices, h2o_keep

    scores = torch.tensor(data.draw(st.lists(st.floats(-5, 5, allow_nan=False), min_size=n, max_size=n,
                                             unique=True)), dtype=torch.float64)
    budget = data.draw(st.integers(1, n + 2))
    first, last = data.draw(st.integers(0, budget)), data.draw(st.integers(0, budget))
    assume(first + last <= budget)
    kept = h2o_keep(scores, budget, first, last).tolist()
    order = scores.tolist()
    if n <= budget:
        assert kept == list(range(n))
    else:  # initial and recent entries, then the heaviest of the middle
        middle = sorted(range(first, n - last), key=lambda i: -order[i])[:budget - first - last]
        assert kept == sorted(set(range(first)) | set(middle) | set(range(n - last, n)))
    gathered = gather_indices(scores, budget, first, last).tolist()
    if n <= budget:
        assert gathered == list(range(n))
    else:
        forced = set(range(first)) | set(range(n - last, n))
        rest = sorted(set(range(n)) - forced, key=lambda i: -order[i])
        assert gathered == sorted(forced | set(rest[:budget - len(forced)]))


@SMALL
@given(batch=st.integers(1, 3), seq=st.integers(1, 20), data=st.data())
def test_orthorank_top_k_is_algorithm_1(batch, seq, data):
    from kvlab.orthorank.reference import select_topk

    k = data.draw(st.integers(0, seq))
    sink = data.draw(st.sampled_from(["skip", "select"]))
    scores = torch.tensor(data.draw(st.lists(st.lists(st.integers(0, 4), min_size=seq, max_size=seq),
                                             min_size=batch, max_size=batch)), dtype=torch.float32)
    got = select_topk(scores, k, sink)
    for row in range(batch):
        s = scores[row].tolist()
        s[0] = math.inf if sink == "skip" else -math.inf
        want = sorted(sorted(range(seq), key=lambda i: (s[i], i))[:k])  # smallest first, ties to the earlier token
        assert got[row].tolist() == want


@MODEL
@given(ids=st.lists(st.integers(0, VOCAB - 1), min_size=2, max_size=20), layers=st.sets(st.integers(1, 3), min_size=1))
def test_orthorank_computing_every_token_is_the_dense_model(tiny_llama, ids, layers):
    from kvlab.orthorank import orthorank

    x = torch.tensor([ids])
    with torch.no_grad():
        dense = tiny_llama(input_ids=x).logits
        with orthorank(tiny_llama, layers=sorted(layers), token_ratio=1.0):
            routed = tiny_llama(input_ids=x).logits
    torch.testing.assert_close(routed, dense, rtol=1e-4, atol=1e-4)


# ================================================================================================ records
_text = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=12)
_json = st.recursive(st.none() | st.booleans() | st.integers(-2**53, 2**53) | st.floats(allow_nan=False,
                                                                                       allow_infinity=False) | _text,
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3),
                     max_leaves=8)


@st.composite
def records_lists(draw):
    from kvlab.experiments import records

    out = []
    for _ in range(draw(st.integers(0, 6))):
        value = draw(st.none() | st.integers(-10**6, 10**6) | st.floats(allow_nan=False, allow_infinity=False))
        extra = draw(st.dictionaries(_text.filter(lambda s: s not in records.REQUIRED), _json, max_size=2))
        out.append(records.record(draw(_text), draw(_text), draw(_text), value,
                                  config=draw(st.dictionaries(_text, _json, max_size=3)), device=draw(_text), **extra))
    return out


@SMALL
@given(recs=records_lists(), split=st.integers(0, 6))
def test_records_write_then_read_is_the_identity(tmp_path_factory, recs, split):
    from kvlab.experiments import records

    folder = tmp_path_factory.mktemp("records")
    path = folder / "x.examples.jsonl.gz"
    assert records.write(path, recs) == path
    assert records.read(path) == recs
    # a resumed writer starts from what is there and adds the rest
    records.write(path, recs[:split])
    with records.RecordWriter(path, keep=True) as w:
        for rec in recs[split:]:
            w.add(rec)
    assert records.read(path) == recs
    # an interrupted writer leaves the earlier file whole and no partial file
    with pytest.raises(KeyboardInterrupt):
        with records.RecordWriter(path) as w:
            for rec in recs[:1]:
                w.add(rec)
            raise KeyboardInterrupt
    assert records.read(path) == recs and not w.partial.exists()
