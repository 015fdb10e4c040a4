"""DHSA's selection on the GPU (issue 53): :func:`kvlab.dhsa.triton.chunk_plan_fast` and
:func:`~kvlab.dhsa.triton.launch_tables_fast` return exactly what :func:`kvlab.dhsa.reference.chunk_plan` and
:func:`~kvlab.dhsa.triton.launch_tables` return: the same ranked lists (ties to the lower chunk), counts, offsets,
query tiles, their order and the kernel config.

The fast chunk sums add in another order than the reference's ``index_add_``, so the inputs are small integers:
every sum is exact, the scores are bit-identical and the equal-length chunks of fixed chunkings tie often (the
tie rule is exercised). On a CPU the Triton kernels run in the interpreter (``tests/conftest.py`` sets
``TRITON_INTERPRET=1``; tiny shapes); on a GPU (``-k cuda``) also at the production block sizes.
"""
from __future__ import annotations

import pytest
import torch
from kvlab.dhsa import reference as R

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.triton]
CUDA = torch.cuda.is_available()
DEV = torch.device("cuda" if CUDA else "cpu")


def _qkv(b, h, hk, n, d, seed):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randint(-3, 4, (b, x, n, d), generator=g).float().to(DEV) for x in (h, hk))


def _assert_same_plan(ref, fast):
    assert (ref.budget, ref.initial, ref.n) == (fast.budget, fast.initial, fast.n)
    for name in ("starts", "ends", "tokens", "n_tokens"):
        for a, b in zip(getattr(ref, name), getattr(fast, name), strict=True):
            assert a.shape == b.shape and a.dtype == b.dtype, name
            assert torch.equal(a, b), name


def _assert_same_tables(ref, fast):
    from kvlab.dhsa.triton import launch_tables, launch_tables_fast

    group = 2
    for variant in ("packed", "lists", "ranges"):
        t1 = launch_tables(ref, variant, dtype=torch.bfloat16, head_dim=16, group=group)
        t2 = launch_tables_fast(fast, variant, dtype=torch.bfloat16, head_dim=16, group=group)
        assert t1.config == t2.config and (t1.budget, t1.initial) == (t2.budget, t2.initial)
        for a, b in zip(t1[:3], t2[:3]):
            assert a.device == b.device and torch.equal(a, b), variant
        assert len(t1.launches) == len(t2.launches)
        for (a, ca), (b, cb) in zip(t1.launches, t2.launches):
            assert torch.equal(a, b) and ca == cb, variant


def _check(b, h, hk, n, chunks, budget, initial, share, local, aggregation="eq4", seed=0, tables=True):
    from kvlab.dhsa.api import resolve_chunks
    from kvlab.dhsa.triton import chunk_plan_fast

    q, k = _qkv(b, h, hk, n, 16, seed)
    per = resolve_chunks(chunks, b, n, DEV)
    kw = dict(initial=initial, share_heads=share, local=local, aggregation=aggregation)
    ref = R.chunk_plan(q, k, per, budget, **kw)
    fast = chunk_plan_fast(q, k, per, budget, **kw)
    _assert_same_plan(ref, fast)
    fast_host = chunk_plan_fast(q, k, [p.cpu() for p in per], budget, **kw)  # host offsets: no copy back
    _assert_same_plan(ref, fast_host)
    if tables:
        _assert_same_tables(ref, fast)
    return ref, fast


CASES = [  # (batch, heads, kv_heads, seq, chunks, budget, initial, share_heads, local)
    (1, 2, 1, 64, 16, 40, 16, False, 0),  # fixed chunks, aligned: many ties
    (1, 4, 2, 64, 16, 48, 16, True, 16),  # shared selection, aligned local keys (TMA run check from the offsets)
    (2, 2, 2, 41, [torch.tensor([0, 3, 9, 10, 20, 27, 33, 41]), torch.tensor([0, 16, 17, 30, 41])], 20, 3, False, 0),
    (1, 2, 1, 80, torch.tensor([0, 5, 40, 41, 70, 80]), 60, 3, True, 4),  # long chunk, local keys
    (1, 2, 2, 40, 8, None, 2, False, 0),  # budget None: every causal key
    (1, 2, 1, 50, 7, 25, 5, False, 6),  # ragged end
]


@pytest.mark.parametrize("case", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_fast_selection_equals_the_reference(case):
    _check(*case)


@pytest.mark.parametrize("aggregation", ["mean", "padded_mean", "sum"])
def test_fast_selection_other_aggregations(aggregation):
    _check(1, 2, 1, 48, torch.tensor([0, 5, 16, 17, 33, 48]), 30, 2, False, 0, aggregation, tables=False)


def _random_case(seed):
    """A seeded random case: spaced or fixed chunks, MHA or GQA, initial and local keys, a budget at the edge."""
    g = torch.Generator().manual_seed(seed)

    def draw(lo, hi):
        return int(torch.randint(lo, hi + 1, (1,), generator=g))

    n = draw(8, 72)
    if draw(0, 1):
        cuts = torch.randperm(n - 1, generator=g)[:draw(0, min(n - 1, 10))] + 1
        bd = torch.cat([torch.tensor([0]), cuts.sort().values, torch.tensor([n])])
    else:  # fixed chunks: equal lengths, equal scores more often
        bd = R.fixed_boundaries(n, [4, 8, 16][draw(0, 2)])
    hk = draw(1, 2)
    h = hk * draw(1, 2)
    initial, local = draw(0, 8), draw(0, 8)
    need = R.max_forced(bd, initial, local=local)
    budget = None if draw(0, 4) == 0 else need + draw(0, 40)
    return h, hk, n, bd, budget, initial, bool(draw(0, 1)), local


@pytest.mark.parametrize("seed", range(8))
def test_fast_selection_random_cases(seed):
    h, hk, n, bd, budget, initial, share, local = _random_case(seed)
    _check(1, h, hk, n, bd, budget, initial, share, local, seed=seed, tables=seed % 2 == 0)


def test_fast_tables_from_a_reference_plan():
    """A plan of the reference (no host copy) gives the same tables through launch_tables_fast."""
    from kvlab.dhsa.triton import launch_tables, launch_tables_fast

    q, k = _qkv(1, 2, 1, 64, 16, 1)
    ref = R.chunk_plan(q, k, R.fixed_boundaries(64, 16, DEV), 40, initial=16)
    for variant in ("packed", "lists"):
        t1 = launch_tables(ref, variant, dtype=torch.bfloat16, head_dim=16, group=2)
        t2 = launch_tables_fast(ref, variant, dtype=torch.bfloat16, head_dim=16, group=2)
        assert t1.config == t2.config and torch.equal(t1.tiles, t2.tiles) and torch.equal(t1.ntok, t2.ntok)


def test_fast_selection_refuses_a_small_budget():
    from kvlab.dhsa.triton import chunk_plan_fast

    q, k = _qkv(1, 2, 2, 32, 16, 0)
    with pytest.raises(ValueError, match="budget=10 is smaller"):
        chunk_plan_fast(q, k, R.fixed_boundaries(32, 16), 10, initial=0)


def test_fast_selection_through_the_api_attends_like_the_reference():
    """dhsa_attention with backend='triton' (the fast selection on a GPU) against the torch backend."""
    from kvlab.dhsa.api import dhsa_selection

    q, k = _qkv(1, 4, 2, 64, 16, 3)
    sel = dhsa_selection(q, k, chunks=16, budget=40, initial=16, share_heads=True, backend="triton")
    ref = R.chunk_plan(q, k, R.fixed_boundaries(64, 16, DEV), 40, initial=16, share_heads=True)
    _assert_same_plan(ref, sel.plan)


@pytest.mark.skipif(not CUDA, reason="needs a GPU (production block sizes, 8k tokens)")
def test_fast_selection_cuda_production_shapes():
    """At 8k tokens, 8 heads, the bench's chunkings, budget 2048: the same plan and tables (integer inputs)."""
    from kvlab.experiments.bench.dhsa import spaced_boundaries

    n = 8192
    for bd in (R.fixed_boundaries(n, 64), spaced_boundaries(n)):
        for share in (False, True):
            ref, fast = _check(1, 8, 4, n, bd.to(DEV), 2048, 64, share, 0, tables=False)
            _assert_same_tables(ref, fast)
