"""The static engine's Triton decode kernel (kvlab.core.static_triton) against its float64 oracle, and the
engine's indexed layouts against the compact one.

The kernel runs in Triton's CPU interpreter (``TRITON_INTERPRET=1``, set before triton is imported: run this file
alone or with the other interpreter tests) and on CUDA. Tolerances follow STYLE.md 3: the kernel's error against
float64 is at most the error of the same computation done eagerly in the input dtype, plus sqrt(N) ulps.
"""

from __future__ import annotations

import os

import pytest
import torch

from conftest import _tiny
from kvlab.core.static_triton import static_decode_reference
from kvlab.eval import FastDecoder
from kvlab.policies import LaCache, SepLLMStreaming, StreamingLLM

SEPS = list(range(0, 96, 7))
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
DEVICES = (["cpu"] if INTERPRET else []) + (["cuda"] if torch.cuda.is_available() else [])
needs_kernel = pytest.mark.skipif(not DEVICES, reason="needs CUDA or TRITON_INTERPRET=1")


def _case(device, dtype, batch=3, heads=6, kv_heads=2, capacity=21, dim=16, seed=0, rotate=True):
    """Random keys/values in physical slots, a random slot order per row, random live counts and rotations."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, dim, generator=gen)
    k = torch.randn(batch, kv_heads, capacity, dim, generator=gen)
    v = torch.randn(batch, kv_heads, capacity, dim, generator=gen)
    phys = torch.stack([torch.randperm(capacity, generator=gen) for _ in range(batch)])
    length = torch.randint(0, capacity, (batch,), generator=gen)  # entries before the step's: n = length + 1
    length[0] = capacity - 1
    extra = {}
    if rotate:
        c = capacity
        shifts = torch.arange(-2 * c, 2 * c + 1, dtype=torch.float64)
        inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
        angles = shifts[:, None] * inv_freq[None]
        emb = torch.cat((angles, angles), dim=-1)
        rope = torch.randint(c, 3 * c, (batch,), generator=gen)
        rot = torch.randint(0, 3 * c, (batch, capacity), generator=gen)
        extra = dict(rot=rot, rope=rope, cos=emb.cos(), sin=emb.sin(), base=2 * c)
    cast = lambda t: t.to(device=device, dtype=dtype)  # noqa: E731
    tensors = dict(q=cast(q), keys=cast(k), values=cast(v), phys=phys.to(device), length=length.to(device))
    inv = torch.argsort(phys, dim=1)  # the engine's inverse: slot phys[b, i] holds entry i
    extra["inv"] = inv.to(device)
    if rotate:
        rot_phys = torch.zeros_like(extra["rot"]).scatter_(1, phys, extra["rot"])  # each slot's rotation
        extra = dict(extra, rot=extra["rot"].to(device), rope=extra["rope"].to(device), cos=cast(extra["cos"]),
                     sin=cast(extra["sin"]), rot_phys=rot_phys.to(device))
    return tensors, extra


def _reference(t, extra, dtype, scale):
    """The oracle on the given tensors promoted to ``dtype`` (float64: the truth; the input dtype: eager error)."""
    up = lambda x: x.to(dtype) if x.is_floating_point() else x  # noqa: E731
    ex = {k: up(v) if isinstance(v, torch.Tensor) else v for k, v in extra.items() if k not in ("inv", "rot_phys")}
    return static_decode_reference(up(t["q"]), up(t["keys"]), up(t["values"]), t["phys"], t["length"] + 1, scale,
                                   **ex)


@needs_kernel
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rotate", [True, False], ids=["rotate", "no-rotate"])
@pytest.mark.parametrize("splits", [1, 3], ids=["one-range", "3-ranges"])
@pytest.mark.parametrize("use_dot", [False, True], ids=["broadcast", "dot"])
@pytest.mark.parametrize("order", [False, True], ids=["logical", "physical"])
def test_kernel_matches_float64_oracle(device, dtype, rotate, splits, use_dot, order):
    """One program per (row, kv head), or each row's entries cut into 3 ranges merged by the second kernel
    (what small batches get; rows with fewer entries than a range leave later ranges empty); scores by broadcast
    products or by tl.dot over padded query rows; entries walked in logical order through ``phys`` or slots in
    memory order through the inverse."""
    _oracle_case(device, dtype, rotate, splits, use_dot, order)


@needs_kernel
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rotate", [True, False], ids=["rotate", "no-rotate"])
def test_tf32x3_products_stay_within_the_fp32_bound(device, rotate):
    """fp32 ``tl.dot`` in three TF32 passes (a tuner candidate on the GPU; the interpreter computes it in fp32):
    within the same error bound against float64 as the fp32 products."""
    _oracle_case(device, torch.float32, rotate, 1, True, False, DOT_PRECISION="tf32x3")


def _oracle_case(device, dtype, rotate, splits, use_dot, order, **options):
    """The kernel on one random case against the float64 oracle, within the eager error plus sqrt(N) ulps."""
    from kvlab.core.static_triton import default_config, static_decode_triton

    t, extra = _case(device, dtype, rotate=rotate)
    scale = 16 ** -0.5
    config = dict(default_config(), BLOCK_N=16 if use_dot else 8, splits=splits, USE_DOT=use_dot, PHYS_ORDER=order,
                  **options)
    out = static_decode_triton(t["q"], t["keys"], t["values"], t["phys"], t["length"], scale, config=config,
                               **extra)
    truth = _reference(t, extra, torch.float64, scale)
    eager = _reference(t, extra, dtype, scale)
    eps = torch.finfo(dtype).eps
    bound = (eager.double() - truth).abs().max() + (21 ** 0.5) * eps * truth.abs().max()
    err = (out.double() - truth).abs().max()
    assert err <= bound, (err, bound)


@needs_kernel
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("splits", [1, 3], ids=["one-range", "3-ranges"])
def test_loads_only_diagnostic_reads_the_live_entries_and_sums_them(device, splits):
    """LOADS_ONLY (the benchmark's bound on the default tiles): the same key/value reads with no attention; what it
    returns is the mean of key + value over each row's live entries, for every query head of the group."""
    from kvlab.core.static_triton import default_config, static_decode_triton

    t, _ = _case(device, torch.float32, rotate=False)
    config = dict(default_config(), LOADS_ONLY=True, splits=splits)
    out = static_decode_triton(t["q"], t["keys"], t["values"], t["phys"], t["length"], 0.25, config=config)
    group = t["q"].shape[1] // t["keys"].shape[1]
    for b in range(t["q"].shape[0]):
        live = t["phys"][b, : int(t["length"][b]) + 1]
        want = (t["keys"][b][:, live] + t["values"][b][:, live]).mean(1).repeat_interleave(group, 0)
        torch.testing.assert_close(out[b], want, rtol=1e-5, atol=1e-5)


@needs_kernel
@pytest.mark.parametrize("device", DEVICES)
def test_kernel_reads_only_live_entries(device):
    """Garbage (NaN) in every slot that is not among a row's first ``length + 1`` entries changes nothing."""
    from kvlab.core.static_triton import static_decode_triton

    t, extra = _case(device, torch.float32, seed=4)
    scale = 0.25
    t["length"][1] = 2  # a short row: most of its ranges are empty
    clean = static_decode_triton(t["q"], t["keys"], t["values"], t["phys"], t["length"], scale, **extra)
    keys, values = t["keys"].clone(), t["values"].clone()
    for b in range(keys.shape[0]):
        dead = t["phys"][b, int(t["length"][b]) + 1:]
        keys[b][:, dead] = float("nan")
        values[b][:, dead] = float("nan")
    dirty = static_decode_triton(t["q"], keys, values, t["phys"], t["length"], scale, **extra)
    assert torch.equal(clean, dirty)
    from kvlab.core.static_triton import default_config

    for cfg in (dict(BLOCK_N=8, splits=3), dict(BLOCK_N=16, splits=2, USE_DOT=True), dict(BLOCK_N=8, PHYS_ORDER=True),
                dict(BLOCK_N=16, splits=3, USE_DOT=True, PHYS_ORDER=True)):
        split = static_decode_triton(t["q"], keys, values, t["phys"], t["length"], scale,
                                     config=dict(default_config(), **cfg), **extra)
        assert torch.isfinite(split).all()
        torch.testing.assert_close(split, clean, rtol=1e-5, atol=1e-6)


def _steps(model, policy, ids, kernel, shortcuts):
    decoder = FastDecoder(model, policy, ids.shape[0], max_steps=ids.shape[1] - 1, record=ids.shape[1] - 1,
                          graph=False, kernel=kernel)
    decoder.cache.shortcuts = shortcuts
    with torch.no_grad():
        logits = torch.stack([decoder.step(ids[:, t:t + 1]).clone() for t in range(ids.shape[1] - 1)])
    return logits, decoder


POLICIES = [StreamingLLM(2, 6), StreamingLLM(2, 6, positions="insertion"),
            SepLLMStreaming(2, 3, 4, 12, separators=SEPS), LaCache(12, 2, 1, 2)]


@pytest.mark.parametrize("policy", POLICIES, ids=repr)
@pytest.mark.parametrize("shortcuts", [True, False], ids=["cpu-shortcuts", "gpu-arithmetic"])
def test_indexed_layout_is_bit_identical_to_compact(policy, shortcuts):
    """kernel='indexed' (entries never move; the row gathered in logical order and rotated as 'compact' rotates
    it) gives the same logits, bit for bit, and the same entries in every layer after every step."""
    model = _tiny("llama")
    ids = torch.randint(0, 96, (3, 36), generator=torch.Generator().manual_seed(5))
    before, compact = _steps(model, policy, ids, "compact", shortcuts)
    after, indexed = _steps(model, policy, ids, "indexed", shortcuts)
    assert torch.equal(before, after)
    assert torch.equal(compact.trace(), indexed.trace())
    for name in ("positions", "token_ids", "rot", "length"):
        assert torch.equal(getattr(compact.cache, name), getattr(indexed.cache, name)), name
    # the indexed cache really left its entries in place: some row's order is not the identity
    assert not torch.equal(indexed.cache.phys, torch.arange(indexed.cache.capacity).expand_as(indexed.cache.phys))


@needs_kernel
@pytest.mark.parametrize("policy,order", [(p, False) for p in POLICIES] + [(POLICIES[0], True), (POLICIES[2], True)],
                         ids=lambda x: repr(x) if not isinstance(x, bool) else ("physical" if x else "logical"))
def test_triton_engine_same_greedy_tokens_and_entries(policy, order, monkeypatch):
    """kernel='triton' (the kernel rotates each key as it reads it): the same greedy tokens as the engine before
    (a model fed its own argmax), the same entries kept, logits to fp32 rounding; the kernel walking entries in
    logical order (through phys) or slots in memory order (through the inverse the engine keeps)."""
    from kvlab.core import static_triton

    base = static_triton.default_config
    monkeypatch.setenv("KVLAB_STATIC_TUNE", "0")
    monkeypatch.setattr(static_triton, "default_config", lambda interpret=None: dict(base(interpret), PHYS_ORDER=order))
    device = DEVICES[0]
    model = _tiny("llama").to(device)
    runs = {}
    for kernel in ("compact", "triton"):
        decoder = FastDecoder(model, policy, 2, max_steps=30, record=30, graph=False, kernel=kernel)
        decoder.cache.shortcuts = False
        tokens = torch.tensor([[3], [50]], device=device)
        out, logits = [], []
        with torch.no_grad():
            for _ in range(30):
                step = decoder.step(tokens)
                logits.append(step.clone())
                tokens = step.argmax(-1, keepdim=True)
                out.append(tokens)
        runs[kernel] = (torch.cat(out, 1), torch.stack(logits), decoder.trace(), decoder.cache.positions.clone(),
                        decoder.cache.length.clone())
    assert torch.equal(runs["compact"][0], runs["triton"][0])
    torch.testing.assert_close(runs["triton"][1], runs["compact"][1], rtol=1e-5, atol=1e-5)
    for i in (2, 3, 4):
        assert torch.equal(runs["compact"][i], runs["triton"][i])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the timing needs a GPU")
def test_cuda_tuned_config_is_cached_and_correct(monkeypatch):
    """The engine's one-off timing of the kernel's choices (opt-in) picks one, caches it, and its output is right."""
    from kvlab.core import static_triton

    monkeypatch.setenv("KVLAB_STATIC_TUNE", "1")
    t, extra = _case("cuda", torch.bfloat16, batch=5, seed=8)
    scale = 16 ** -0.5
    out = static_triton.static_decode_triton(t["q"], t["keys"], t["values"], t["phys"], t["length"], scale, **extra)
    assert len(static_triton._TUNED) >= 1
    chosen = list(static_triton._TUNED.values())[-1]
    assert chosen in static_triton.candidate_configs(5 * 2, 21)
    truth = _reference(t, extra, torch.float64, scale)
    eager = _reference(t, extra, torch.bfloat16, scale)
    bound = (eager.double() - truth).abs().max() + (21 ** 0.5) * torch.finfo(torch.bfloat16).eps * truth.abs().max()
    assert (out.double() - truth).abs().max() <= bound


def test_kernel_choice_is_checked():
    model = _tiny("llama")
    with pytest.raises(ValueError, match="kernel must be one of"):
        FastDecoder(model, StreamingLLM(2, 6), kernel="fused")
    if not INTERPRET:
        with pytest.raises(ValueError, match="kernel='triton' needs CUDA tensors"):
            FastDecoder(model, StreamingLLM(2, 6), kernel="triton", graph=False)
    assert FastDecoder(model, StreamingLLM(2, 6), graph=False).cache.kernel == (
        "triton" if next(model.parameters()).is_cuda else "indexed")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("policy", POLICIES, ids=repr)
def test_cuda_triton_graph_equals_compact(policy):
    """On the GPU, graph-captured: kernel='triton' (the default) gives the NLL of the engine before, and the
    same kept counts."""
    from kvlab.eval.fast import decode_static

    model = _tiny("llama").to("cuda")
    ids = torch.randint(0, 96, (4, 48), generator=torch.Generator().manual_seed(6)).cuda()
    before = decode_static(model, ids, policy, kernel="compact")
    after = decode_static(model, ids, policy)
    torch.testing.assert_close(after["nll"], before["nll"], rtol=1e-5, atol=1e-6)
    assert torch.equal(after["trace"], before["trace"])
