"""DHSA's fast chunking (:mod:`kvlab.dhsa.chunking`, issue 24) against the reference.

The NMS must give *the same offsets* as :func:`kvlab.dhsa.boundary_predictor.nms_boundaries` /
:func:`~kvlab.dhsa.boundary_predictor.select_boundaries` (greedy, in rank order) for the same scores: checked on random
scores, ties, sure positions, dependency chains longer than the kernel's halo (several passes), the edge cases
(sequence shorter than the window, nothing above the threshold, everything above it, caps of 1 and 2) and a
property test over many seeded random cases (drawn the same way on every run; the hypothesis-drawn properties of
the mechanisms are in tests/test_properties.py). The restructured predictor is checked against the reference module evaluated in float64 (its float64
evaluation of the PyTorch path is exact to rounding; the Triton window attention in float32/bf16 is held to the
dtype-aware bound of :func:`kvlab.testing.assert_close_to_oracle`). On CPU in Triton's interpreter (tiny shapes);
``-k cuda`` runs the same checks at 32k positions on a GPU.
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from kvlab.dhsa import api as A
from kvlab.dhsa import reference as R
from kvlab.dhsa import boundary_predictor as B
from kvlab.testing import assert_close_to_oracle

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.triton]
CUDA = torch.cuda.is_available()
DEV = torch.device("cuda" if CUDA else "cpu")


def _on(x, device):
    return x.to(device) if isinstance(x, torch.Tensor) else x


def _both(sc, **kw):
    """The reference NMS on CPU and the fast one on the device under test (the Triton kernel refuses CPU tensors
    outside the interpreter), both returned on CPU."""
    from kvlab.dhsa.chunking import nms_boundaries_fast

    max_len = kw.pop("max_len", None)
    ref = B.nms_boundaries(sc.cpu(), **{k: _on(v, "cpu") for k, v in kw.items()})
    if max_len:
        ref = [R.split_long_chunks(b, max_len) for b in ref]
    got = nms_boundaries_fast(sc.to(DEV), max_len=max_len, **{k: _on(v, DEV) for k, v in kw.items()})
    return ref, [b.cpu() for b in got]


def _assert_same(ref, got, what=""):
    assert len(ref) == len(got)
    for i, (a, b) in enumerate(zip(ref, got)):
        assert torch.equal(a.cpu(), b.cpu()), f"{what} row {i}: reference {a.tolist()} != fast {b.tolist()}"


def _greedy_one(sc, **kw):
    """select_boundaries (the Python greedy loop, the plainest statement of App. B) for one row."""
    return B.select_boundaries(sc, **kw)


def test_nms_matches_greedy_on_random_scores_with_ties_and_sure_positions():
    g = torch.Generator().manual_seed(0)
    for trial in range(8):
        n = int(torch.randint(5, 260, (), generator=g))
        sc = torch.rand(3, n, generator=g)
        if trial % 2:
            sc = (sc * 4).round() / 4  # many ties: the lower index must win
        w = int(torch.randint(0, 12, (), generator=g))
        mc = int(torch.randint(1, 40, (), generator=g))
        th = None if trial % 4 == 0 else 0.3
        valid = torch.rand(n, generator=g) > 0.1
        sure = (torch.rand(3, n, generator=g) > 0.95) if trial % 3 else None
        kw = dict(max_chunks=mc, threshold=th, nms_window=w, valid=valid, sure=sure)
        ref, got = _both(sc, **kw)
        _assert_same(ref, got, f"trial {trial}")
        for b in range(3):  # and against the sequential greedy itself, row by row
            one = _greedy_one(sc[b], max_chunks=mc, threshold=th, nms_window=w, valid=valid,
                              sure=None if sure is None else sure[b])
            assert torch.equal(one, got[b]), f"trial {trial} row {b}"


def test_nms_cuts_long_chunks_like_split_long_chunks():
    g = torch.Generator().manual_seed(1)
    for max_len in (1, 3, 16, 500):
        sc = torch.rand(2, 300, generator=g) ** 4  # sparse boundaries: long chunks to cut
        ref, got = _both(sc, max_chunks=20, threshold=0.5, nms_window=8, max_len=max_len)
        _assert_same(ref, got, f"max_len {max_len}")


def test_nms_cuts_carry_the_last_boundary_across_kernel_slices():
    # the offsets kernel scans 1024 offsets at a time in the interpreter: a chunk that spans a slice edge must be
    # cut from its own start, not from the slice's
    g = torch.Generator().manual_seed(5)
    sc = torch.rand(1, 1300, generator=g) ** 12
    for max_len in (7, 50, 300):
        ref, got = _both(sc, max_chunks=30, threshold=0.5, nms_window=8, max_len=max_len)
        _assert_same(ref, got, f"max_len {max_len}")


def test_nms_dependency_chain_longer_than_the_halo_needs_and_gets_several_passes():
    # strictly monotone scores, every position a candidate, window 1: greedy keeps every other position from the
    # best end, a chain of decisions across the whole row (the interpreter's halo is 64 positions)
    n = 200
    sc = torch.linspace(0.1, 0.9, n)[None].repeat(2, 1)
    sc[1] = sc[1].flip(0)
    ref, got = _both(sc, max_chunks=n, threshold=None, nms_window=1)
    _assert_same(ref, got, "chain")
    assert got[0].numel() - 2 == n // 2  # every other position (the last one is the sequence end)


@pytest.mark.parametrize("case", ["short", "none_above", "all_above", "cap1", "cap2", "window0", "window_wide"])
def test_nms_edge_cases(case):
    g = torch.Generator().manual_seed(2)
    n = 40
    sc = torch.rand(2, n, generator=g)
    kw = dict(max_chunks=12, threshold=0.5, nms_window=4)
    if case == "short":  # fewer positions than the window
        sc = sc[:, :3]
        kw["nms_window"] = 8
    elif case == "none_above":
        sc = sc * 0.4
    elif case == "all_above":
        sc = 0.6 + 0.3 * sc
    elif case == "cap1":
        kw["max_chunks"] = 1
    elif case == "cap2":
        kw["max_chunks"] = 2
    elif case == "window0":
        kw["nms_window"] = 0
    elif case == "window_wide":
        kw["nms_window"] = 100
    ref, got = _both(sc, **kw)
    _assert_same(ref, got, case)
    if case == "none_above":
        assert all(b.tolist() == [0, n] for b in got)
    if case == "cap1":
        assert all(b.numel() == 2 for b in got)


def test_nms_float64_scores_and_negative_zero_ties():
    g = torch.Generator().manual_seed(3)
    sc = torch.rand(2, 120, generator=g, dtype=torch.float64)
    sc[:, ::7] = sc[:, 3:4]  # exact float64 ties
    ref, got = _both(sc, max_chunks=30, threshold=0.2, nms_window=3)
    _assert_same(ref, got, "float64")
    z = torch.zeros(1, 30)
    z[0, ::2] = -0.0  # -0.0 and +0.0 are the same score: ties go to the lower index
    ref, got = _both(z, max_chunks=8, threshold=None, nms_window=2)
    _assert_same(ref, got, "signed zeros")


def test_nms_property_many_random_cases():
    """Property: for any scores, window, cap, threshold, valid and sure sets, the fast NMS returns greedy's
    offsets. 36 cases drawn from a seeded generator (distinct values, heavy ties, smooth bumps like a
    predictor's output)."""
    g = torch.Generator().manual_seed(4)
    for case in range(36):
        n = int(torch.randint(2, 180, (), generator=g))
        kind = case % 3
        if kind == 0:
            sc = torch.rand(1, n, generator=g)
        elif kind == 1:
            sc = torch.randint(0, 3, (1, n), generator=g).float() / 2
        else:
            t = torch.arange(n).float()
            sc = 0.5 + 0.5 * torch.sin(t / float(torch.randint(2, 9, (), generator=g))) * torch.rand(1, n, generator=g)
        kw = dict(max_chunks=int(torch.randint(1, n + 2, (), generator=g)),
                  threshold=None if case % 5 == 0 else float(torch.rand((), generator=g)) * 0.9,
                  nms_window=int(torch.randint(0, 10, (), generator=g)),
                  valid=torch.rand(n, generator=g) > 0.2 if case % 2 else None,
                  sure=torch.rand(1, n, generator=g) > 0.9 if case % 7 == 0 else None)
        ref, got = _both(sc, **kw)
        _assert_same(ref, got, f"case {case} {kw}")


def test_nms_fast_bad_arguments_raise():
    from kvlab.dhsa.chunking import MAX_NMS_WINDOW, nms_boundaries_fast, nms_status

    sc = torch.rand(1, 20, device=DEV)
    with pytest.raises(ValueError, match="scores must be"):
        nms_boundaries_fast(sc[0], max_chunks=4, threshold=0.5)
    with pytest.raises(ValueError, match="max_chunks must be"):
        nms_boundaries_fast(sc, max_chunks=0, threshold=0.5)
    with pytest.raises(ValueError, match="nms_window must be"):
        nms_boundaries_fast(sc, max_chunks=4, threshold=0.5, nms_window=-1)
    with pytest.raises(ValueError, match="max_len must be"):
        nms_boundaries_fast(sc, max_chunks=4, threshold=0.5, max_len=0)
    with pytest.raises(ValueError, match="backend='torch'"):
        nms_status(sc, sc > 0.5, sc > 2, MAX_NMS_WINDOW + 1)


# ------------------------------------------------------------------------------------------------
# The predictor
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("encoder", ["separate", "joint"])
@pytest.mark.parametrize("input_norm", [True, False])
def test_predictor_logits_torch_pool_equals_reference_in_float64(encoder, input_norm):
    from kvlab.dhsa.chunking import predictor_logits

    torch.manual_seed(0)
    p = B.BoundaryPredictor(32, window=3, heads=4, hidden=16, encoder=encoder, input_norm=input_norm).double()
    x = torch.randn(2, 23, 32, dtype=torch.float64)
    ref = p(x)
    got = predictor_logits(p, x, pool="torch")
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-12)


@pytest.mark.parametrize("encoder", ["separate", "joint"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_predictor_logits_triton_against_float64_oracle(encoder, dtype):
    from kvlab.dhsa.chunking import predictor_logits

    torch.manual_seed(0)
    c, n = 64, 40
    p64 = B.BoundaryPredictor(c, window=4, heads=4, hidden=32, encoder=encoder).double()
    x = torch.randn(2, n, c, dtype=torch.float64)
    xl = x.to(dtype)
    oracle = p64(xl.double())
    plow = B.BoundaryPredictor(c, window=4, heads=4, hidden=32, encoder=encoder)
    plow.load_state_dict(p64.state_dict())
    plow = plow.to(DEV, dtype)
    with torch.no_grad():
        eager = plow(xl.to(DEV)).cpu()
        got = predictor_logits(plow, xl.to(DEV), pool="triton").cpu()
    # the longest sum behind a logit: the MLP's first layer over 4C + 1 features
    assert_close_to_oracle(got, eager, oracle, reduction=4 * c + 1, dtype=dtype, name="logits")


def test_window_pool_triton_equals_torch_pool():
    from kvlab.dhsa.chunking import _window_pool_torch, window_pool

    torch.manual_seed(1)
    qkv = torch.randn(2, 20, 3, 2, 24, dtype=torch.float32)  # head dim 24: not a power of two (masked slices)
    for size, groups, count in ((4, 1, 17), (8, 2, 13), (3, 1, 18), (1, 1, 20)):
        ref = _window_pool_torch(qkv.double(), size, groups, count)
        got = window_pool(qkv.to(DEV), size, groups, count).cpu().double()
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fusion_features_equal_the_torch_expressions(dtype):
    from kvlab.dhsa.chunking import fusion_features

    torch.manual_seed(2)
    enc = torch.randn(2, 30, 40, dtype=torch.float64)
    enc[0, 3] = 0.0  # a zero vector: the eps clamp, no NaN
    n, w = 26, 4
    l, r = enc[:, :n], enc[:, w:w + n]
    ref_feat = torch.cat([(l - r).abs(), l * r], -1)
    ref_cos = F.cosine_similarity(l, r, dim=-1, eps=1e-6)
    feat, cos = fusion_features(enc.to(dtype).to(DEV), n, w)
    eps = torch.finfo(dtype).eps
    torch.testing.assert_close(feat.cpu().double(), ref_feat.to(dtype).double(), rtol=2 * eps, atol=2 * eps)
    torch.testing.assert_close(cos.cpu().double(), F.cosine_similarity(
        l.to(dtype).double(), r.to(dtype).double(), dim=-1, eps=1e-6), rtol=1e-5, atol=1e-6)
    assert cos[0, 3].item() == 0.0 and torch.isfinite(ref_cos).all()


def test_predict_boundaries_backends_agree():
    torch.manual_seed(0)
    pred = B.BoundaryPredictor(32, window=4, heads=4, hidden=16).to(DEV)
    k = torch.randn(2, 2, 160, 16, device=DEV)
    kw = dict(max_chunks=12, threshold=0.5, nms_window=4, max_len=24)
    ref = A.predict_boundaries(pred, k, backend="torch", **kw)
    fast = A.predict_boundaries(pred, k, backend="triton", **kw)
    auto = A.predict_boundaries(pred, k, **kw)
    # same probabilities up to float32 rounding of a different order of sums: offsets equal unless a probability
    # sits within rounding of the threshold or of a tie (not at these seeds)
    _assert_same(ref, fast, "triton")
    _assert_same(ref, auto, "auto")
    with pytest.raises(ValueError, match="backend must be"):
        A.predict_boundaries(pred, k, backend="cuda", **kw)


# ------------------------------------------------------------------------------------------------
# On a GPU, at the benchmark's size
# ------------------------------------------------------------------------------------------------
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("kind", ["predictor_like", "ties", "chains"])
def test_nms_matches_reference_at_32k_cuda(kind):
    g = torch.Generator(device="cuda").manual_seed(0)
    n = 32768
    if kind == "predictor_like":  # smooth bumps around the threshold, as a predictor's probabilities
        t = torch.arange(n, device="cuda").float()
        sc = torch.sigmoid(3 * torch.sin(t / 5.0) + torch.randn(2, n, device="cuda", generator=g))
    elif kind == "ties":
        sc = torch.randint(0, 5, (2, n), device="cuda", generator=g).float() / 4
    else:  # long monotone stretches: chains across program blocks
        sc = (torch.arange(n, device="cuda").float() % 3000)[None].repeat(2, 1) / 3000
    valid = B.label_valid(n, 4, "cuda")
    for w, mc in ((8, n // 32), (64, n // 64), (0, n)):
        ref, got = _both(sc, max_chunks=mc, threshold=0.5, nms_window=w, valid=valid, max_len=128)
        _assert_same(ref, got, f"{kind} w={w}")


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("channels,heads", [(1024, 8), (256, 8), (192, 8)])
def test_predictor_logits_bf16_cuda_against_float64_oracle(channels, heads):
    from kvlab.dhsa.chunking import predictor_logits

    torch.manual_seed(0)
    n = 4096
    p64 = B.BoundaryPredictor(channels, window=4, heads=heads, hidden=256).double().cuda()
    x = torch.randn(1, n, channels, device="cuda").bfloat16()
    with torch.no_grad():
        oracle = p64(x.double())
        p16 = B.BoundaryPredictor(channels, window=4, heads=heads, hidden=256).cuda()
        p16.load_state_dict(p64.state_dict())
        p16 = p16.bfloat16()
        eager = p16(x)
        got = predictor_logits(p16, x)
    assert_close_to_oracle(got, eager, oracle, reduction=4 * channels + 1, dtype=torch.bfloat16, name="logits")
    assert math.isfinite(float(got.float().abs().max()))


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_graphed_logits_replay_equals_eager_cuda():
    from kvlab.dhsa.chunking import GraphedLogits, predictor_logits

    torch.manual_seed(0)
    p = B.BoundaryPredictor(256, window=4, heads=8, hidden=256).cuda().bfloat16().eval()
    graphed = GraphedLogits(p)
    for seed in (0, 1):  # a second input through the same graph: the copy-in is what it reads
        x = torch.randn(1, 2048, 256, device="cuda", generator=torch.Generator("cuda").manual_seed(seed)).bfloat16()
        assert torch.equal(graphed(x), predictor_logits(p, x))
    with pytest.raises(ValueError, match="CUDA tensors"):
        graphed(torch.randn(1, 8, 256))


def test_make_labels_batched_equals_one_sample_per_pass(tiny_llama):
    from kvlab.dhsa.training import make_labels

    g = torch.Generator().manual_seed(0)
    samples = [torch.randint(0, 96, (40,), generator=g) for _ in range(3)]
    one = make_labels(tiny_llama, samples, [0, 2], keep_keys=True)
    two = make_labels(tiny_llama, samples, [0, 2], keep_keys=True, batch=2)
    for a, b in zip(one.ratios, two.ratios):
        for layer in (0, 2):
            torch.testing.assert_close(a[layer], b[layer], rtol=1e-5, atol=1e-6)
    for a, b in zip(one.keys, two.keys):
        torch.testing.assert_close(a[2], b[2], rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="batch must be"):
        make_labels(tiny_llama, samples, [0], batch=0)


def test_shipped_paper_size_predictor_loads_checks_and_beats_the_older_one_on_held_out_windows():
    """kvlab/dhsa/data/smollm2-135m-h256.pt (trained on an H200, 500 windows of five corpora): its checksum, the
    paper's size, its command, and the held-out metrics its sidecar records for it and for the older file."""
    from kvlab.dhsa import training as T

    p, info = T.shipped_predictor("smollm2-135m-h256")
    assert p.config() == info["predictor"] and p.hidden == 256 and p.heads == 8 and p.window == 4
    assert info["command"].startswith("python -m kvlab.dhsa.training") and "--hidden 256" in info["command"]
    assert sum(info["data"]["train"].values()) == 500 and info["data"]["seq_len"] == 1024
    new, old = info["validation"], info["compared"]["validation"]
    assert new["positives"] == old["positives"]  # the same held-out windows
    assert new["f1"] > old["f1"] and new["loss"] < old["loss"] and new["topk_overlap"] > old["topk_overlap"]
    logits = p(torch.randn(1, 24, 192))
    assert logits.shape == (1, 24) and torch.isfinite(logits).all()
