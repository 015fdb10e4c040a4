"""SepLLM attention: reference properties, Triton and Flex backends against a float64 oracle.

On a machine without CUDA the Triton kernels run in Triton's interpreter: ``tests/conftest.py`` sets
``TRITON_INTERPRET=1`` before anything imports Triton, so a plain ``pytest`` needs no flag. Shapes are tiny there. With CUDA the same
tests run compiled, plus the ``large`` ones (long sequences, 32/8 GQA heads, dim 128).

Tolerance (dtype-aware): inputs are drawn in the low-precision dtype and promoted to float64 for
the oracle; a backend passes when its max error is at most the eager low-precision reference's
error plus ``sqrt(seq) * eps(dtype)`` times the oracle's scale, and its relative L2 error is at most
twice the eager one (plus eps).
"""
from __future__ import annotations


import pytest
import torch

from kvlab.sepllm import kept_fraction, sep_attention, sepllm_mask
from kvlab.sepllm.reference import sep_attention_reference
from kvlab.testing import assert_close_to_oracle

CUDA = torch.cuda.is_available()
DEV = torch.device("cuda" if CUDA else "cpu")
needs_triton = pytest.mark.triton  # skipped by conftest.py where Triton cannot run


def _inputs(b, h, hk, n, d, dtype, p_sep=0.15, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, n, d, generator=g).to(dtype).to(DEV)
    k = torch.randn(b, hk, n, d, generator=g).to(dtype).to(DEV)
    v = torch.randn(b, hk, n, d, generator=g).to(dtype).to(DEV)
    is_sep = (torch.rand(b, n, generator=g) < p_sep).to(DEV)
    do = torch.randn(b, h, n, d, generator=g).to(dtype).to(DEV)
    return q, k, v, is_sep, do


def _run(fn, q, k, v, do, grad=True):
    q, k, v = (x.detach().clone().requires_grad_(grad) for x in (q, k, v))
    out = fn(q, k, v)
    if not grad:
        return [out.detach()]
    return [out.detach(), *torch.autograd.grad(out, (q, k, v), do)]


def _variant_fn(variant, is_sep, a, n):
    """The Triton kernels of one variant with their default tiles (``sep_attention`` takes the default one)."""
    from kvlab.sepllm.triton import default_config, sep_attention_triton

    def fn(q_, k_, v_):
        cfg = default_config(q_.shape[-1], q_.dtype, variant=variant)
        return sep_attention_triton(q_, k_, v_, is_sep, a, n, config=cfg)
    return fn


def _check_against_oracle(backend, q, k, v, is_sep, do, a, n, grad=True, variant=None, config=None):
    """Compare a backend's output (and grads) with the fp64 oracle, allowing the eager error (``config``: the
    Triton kernels with these tiles and options)."""
    seq = q.shape[2]
    oracle = _run(lambda q_, k_, v_: sep_attention_reference(q_, k_, v_, is_sep, a, n),
                  q.double(), k.double(), v.double(), do.double(), grad)
    eager = _run(lambda q_, k_, v_: sep_attention_reference(q_, k_, v_, is_sep, a, n), q, k, v, do, grad)
    if config is not None:
        from kvlab.sepllm.triton import sep_attention_triton

        fn = lambda q_, k_, v_: sep_attention_triton(q_, k_, v_, is_sep, a, n, config=config)  # noqa: E731
    elif variant is None:
        fn = lambda q_, k_, v_: sep_attention(q_, k_, v_, is_sep, a, n, backend=backend)  # noqa: E731
    else:
        fn = _variant_fn(variant, is_sep, a, n)
    fast = _run(fn, q, k, v, do, grad)
    for name, x, e, o in zip(["out", "dq", "dk", "dv"], fast, eager, oracle):
        assert x.dtype == q.dtype, name
        assert_close_to_oracle(x, e, o, reduction=seq, name=name)


# ------------------------------------------------------------------------------ reference
def test_mask_matches_definition():
    is_sep = torch.tensor([[0, 0, 1, 0, 0, 0, 1, 0, 0, 0]], dtype=torch.bool)
    m = sepllm_mask(is_sep, init=1, neighbors=2)[0]
    for qi in range(10):
        for ki in range(10):
            want = ki <= qi and (ki < 1 or qi - ki < 2 or bool(is_sep[0, ki]))
            assert bool(m[qi, ki]) == want


def test_kept_fraction_counts_mask():
    g = torch.Generator().manual_seed(1)
    is_sep = torch.rand(3, 97, generator=g) < 0.1
    m = sepllm_mask(is_sep, 4, 16)
    assert kept_fraction(is_sep, 4, 16) == pytest.approx(m.sum().item() / (3 * 97 * 98 / 2))


def test_block_mask_touches_nearly_every_tile():
    """The motivation of the Triton kernel: scattered separators fill the block mask."""
    from kvlab.sepllm.reference import touched_block_fraction

    g = torch.Generator().manual_seed(2)
    is_sep = torch.rand(1, 512, generator=g) < 0.08
    assert touched_block_fraction(is_sep, 4, 32, block=32) > 0.9
    assert kept_fraction(is_sep, 4, 32) < 0.3
    assert touched_block_fraction(torch.zeros_like(is_sep), 4, 32, block=32) < 0.4


def test_reference_limits_are_causal_and_window():
    q, k, v, is_sep, _ = _inputs(1, 2, 2, 40, 16, torch.float64)
    causal = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    # every token a separator, or a window as long as the sequence: plain causal attention
    all_sep = torch.ones_like(is_sep)
    torch.testing.assert_close(sep_attention_reference(q, k, v, all_sep, 0, 1), causal)
    torch.testing.assert_close(sep_attention_reference(q, k, v, is_sep, 0, 40), causal)


# ------------------------------------------------------------------------------ triton
CASES = [  # (batch, heads, kv_heads, seq, dim, init, neighbors, dtype, p_sep)
    (2, 4, 2, 77, 32, 3, 9, torch.bfloat16, 0.15),   # odd length, GQA, per-sequence separators
    (1, 2, 2, 50, 16, 4, 20, torch.float16, 0.2),
    (2, 2, 1, 45, 32, 2, 7, torch.float32, 0.1),
    (1, 3, 1, 64, 16, 0, 1, torch.bfloat16, 0.3),    # no initial tokens, window = the query only
    (1, 2, 2, 40, 16, 4, 8, torch.bfloat16, 0.0),    # no separators: sink + window
    (1, 2, 2, 40, 16, 4, 8, torch.bfloat16, 1.0),    # all separators: causal
    (1, 2, 1, 100, 16, 2, 40, torch.float32, 0.1),   # window > 2 tiles: fully visible inner window tiles
]


VARIANTS = ["tma", "gather"]


@needs_triton
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"b{c[0]}h{c[1]}/{c[2]}n{c[3]}d{c[4]}a{c[5]}w{c[6]}"
                         f"-{str(c[7])[6:]}-sep{c[8]}")
def test_triton_matches_oracle(case, variant):
    b, h, hk, n, d, a, w, dtype, p = case
    q, k, v, is_sep, do = _inputs(b, h, hk, n, d, dtype, p)
    _check_against_oracle("triton", q, k, v, is_sep, do, a, w, variant=variant)


@needs_triton
def test_api_triton_uses_the_default_variant():
    """``backend="triton"`` runs the default variant (``"tma"`` where Triton has tensor descriptors)."""
    from kvlab.sepllm.triton import auto_variant, default_config, tma_supported

    assert default_config(128, torch.bfloat16, interpret=False)["variant"] == ("tma" if tma_supported() else "gather")
    x = torch.zeros(1, 2, 3, 64, device=DEV, dtype=torch.bfloat16)
    hopper = not CUDA or torch.cuda.get_device_capability()[0] >= 9
    assert auto_variant(x) == ("tma" if tma_supported() and hopper else "gather")
    if CUDA:  # fp32 and dim 256 stay on the GPU-tested gather kernels
        assert auto_variant(x.float()) == auto_variant(torch.zeros(1, 2, 3, 256, device=DEV)) == "gather"
    q, k, v, is_sep, do = _inputs(1, 2, 1, 40, 16, torch.float32, 0.2, seed=11)
    _check_against_oracle("triton", q, k, v, is_sep, do, 2, 7)


@needs_triton
def test_compact_kv_rows_are_the_kept_rows():
    from kvlab.sepllm.triton import compact_kept_keys, compact_kv

    q, k, v, is_sep, _ = _inputs(2, 2, 2, 70, 16, torch.float32, 0.2, seed=9)
    kept, idx, cnt = compact_kept_keys(is_sep, 3)
    kc, vc = compact_kv(k, v, idx, cnt)
    for b in range(2):
        pos = torch.nonzero(kept[b].bool()).flatten()
        torch.testing.assert_close(kc[b, :, : len(pos)], k[b, :, pos], rtol=0, atol=0)
        torch.testing.assert_close(vc[b, :, : len(pos)], v[b, :, pos], rtol=0, atol=0)


@needs_triton
@pytest.mark.parametrize("variant", VARIANTS)
def test_triton_takes_strided_inputs(variant):
    """q, k, v as HF lays them out, (batch, seq, heads, dim) transposed to (batch, heads, seq, dim), and a
    key tensor whose rows start off the 16-byte grid (tensor descriptors need aligned rows: copied first)."""
    b, h, hk, n, d = 1, 4, 2, 45, 16
    g = torch.Generator().manual_seed(4)
    q_rows = torch.randn(b, n, h, d, generator=g).to(DEV).requires_grad_()
    kv_rows = torch.randn(b, n, hk, 2 * d + 1, generator=g).to(DEV).requires_grad_()
    q = q_rows.transpose(1, 2)
    k = kv_rows[..., 1:d + 1].transpose(1, 2)  # element offset 1: rows 4 bytes off the 16-byte grid
    v = kv_rows[..., d + 1:].transpose(1, 2)
    assert k.data_ptr() % 16 and not k.is_contiguous()
    is_sep = (torch.rand(b, n, generator=g) < 0.2).to(DEV)
    do = torch.randn(b, h, n, d, generator=g).to(DEV)
    out = _variant_fn(variant, is_sep, 2, 6)(q, k, v)
    fast = [out.detach(), *torch.autograd.grad(out, (q, k, v), do)]
    plain = [x.detach().contiguous() for x in (q, k, v)]
    oracle = _run(lambda q_, k_, v_: sep_attention_reference(q_, k_, v_, is_sep, 2, 6), *(x.double() for x in plain),
                  do.double())
    eager = _run(lambda q_, k_, v_: sep_attention_reference(q_, k_, v_, is_sep, 2, 6), *plain, do)
    for name, x, e, o in zip(["out", "dq", "dk", "dv"], fast, eager, oracle):
        assert_close_to_oracle(x, e, o, reduction=n, name=name)


@needs_triton
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("neighbors, splits_per", [(5, 1), (37, 1), (5, 1000)])
def test_triton_tile_shapes_do_not_change_the_result(neighbors, splits_per, variant):
    """The window region is aligned to BLOCK_N; unequal tiles per kernel must give the same maths
    (neighbors = 37 gives the forward pass fully visible window tiles in both configs; 70 keys with
    far tiles of 32 leave full and partial far tiles; splits_per 1000 runs the far dK/dV walk unsplit; the "tma"
    forward's window_split sends whole window tiles through an unmasked loop)."""
    from kvlab.sepllm.triton import sep_attention_triton

    q, k, v, is_sep, do = _inputs(2, 2, 1, 70, 16, torch.float32, 0.15, seed=3)
    base = _run(lambda *x: sep_attention_triton(*x, is_sep, 2, neighbors), q, k, v, do)
    cfg = {"variant": variant, "fwd": dict(BLOCK_M=32, BLOCK_N=16, BLOCK_F=32, num_warps=4, num_stages=1,
                                           window_split=True),
           "dq": dict(BLOCK_M=16, BLOCK_N=32, BLOCK_F=16, num_warps=4, num_stages=1),
           "dkdv": dict(BLOCK_M=32, BLOCK_N=16, BLOCK_F=32, num_warps=4, num_stages=1), "far_splits_per": splits_per,
           "far": dict(BLOCK_M=16, BLOCK_N=64, BLOCK_F=16, num_warps=4, num_stages=1)}  # tma: its own tiles
    other = _run(lambda *x: sep_attention_triton(*x, is_sep, 2, neighbors, config=cfg), q, k, v, do)
    for x, y in zip(base, other):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-5)


WINDOW_OPTIONS = [  # (ops variant, forward BLOCK_M, neighbors): the tma forward's window-loop options, each case
    ("tma+w64", 16, 20),            # window tiles wider than the query tile: region aligned to 64, no split or diag
    ("tma+diag", 32, 40),           # keys before q0 without the causal test, two diagonal tiles with it alone
    ("tma+diag", 32, 9),            # BLOCK_M > neighbors: the diagonal needs the whole rule, the host keeps it
    ("tma+w16+diag+split", 32, 50),  # masked front, one unmasked interior tile, the diagonal
    ("tma+s3+diag", 32, 40),        # the window loops' own pipeline depth (the interpreter runs the code path)
]


@needs_triton
@pytest.mark.parametrize("spec, block_m, neighbors", WINDOW_OPTIONS, ids=lambda x: str(x))
def test_tma_window_options_match_oracle(spec, block_m, neighbors):
    """Each option ``bench sepllm ops`` can time beside the default forward (``variant_config``) computes the same
    attention: output and, through the saved log-sum-exp, the gradients. No initial token, so early rows see
    nothing in the first tiles (the online softmax's guard)."""
    from kvlab.experiments.bench.sepllm import variant_config

    q, k, v, is_sep, do = _inputs(1, 2, 1, 83, 16, torch.bfloat16, 0.15, seed=13)
    cfg = variant_config(spec, 16, torch.bfloat16)
    cfg["fwd"]["BLOCK_M"] = block_m
    _check_against_oracle("triton", q, k, v, is_sep, do, 0, neighbors, config=cfg)


def test_ops_variant_options_set_the_forward_config():
    """``tma+w64+diag+s3`` changes the forward's window tiles, mask split and window stages, nothing else;
    ``+rerun`` changes nothing; options of the tma forward on another variant, or unknown ones, are refused."""
    from kvlab.experiments.bench.sepllm import variant_config
    from kvlab.sepllm.triton import default_config, tma_supported

    if not tma_supported():
        pytest.skip("this Triton has no tensor descriptors")
    base = default_config(128, torch.bfloat16, variant="tma")
    cfg = variant_config("tma+w64+diag+s3", 128, torch.bfloat16)
    assert cfg["fwd"] == base["fwd"] | {"BLOCK_N": 64, "window_diag": True, "window_stages": 3}
    assert {key: val for key, val in cfg.items() if key != "fwd"} == {key: val for key, val in base.items()
                                                                     if key != "fwd"}
    assert variant_config("tma+rerun", 128, torch.bfloat16) == base
    for bad, match in (("gather+diag", "tma forward"), ("tma+w64x", "unknown option")):
        with pytest.raises(ValueError, match=match):
            variant_config(bad, 128, torch.bfloat16)


@needs_triton
def test_compaction_kernel_matches_torch():
    from kvlab.sepllm.triton import compact_kept_keys, compact_kept_keys_torch

    g = torch.Generator().manual_seed(7)
    is_sep = (torch.rand(3, 600, generator=g) < 0.2).to(DEV)
    is_sep[1] = False
    for init in (0, 4, 700):
        kept, idx, cnt = compact_kept_keys(is_sep, init)
        kept_t, idx_t, cnt_t = compact_kept_keys_torch(is_sep, init)
        torch.testing.assert_close(kept, kept_t)
        torch.testing.assert_close(cnt, cnt_t)
        for b in range(3):  # only the first cnt[b, -1] slots of idx are specified
            total = int(cnt_t[b, -1])
            torch.testing.assert_close(idx[b, :total], idx_t[b, :total])


@needs_triton
def test_triton_batch_invariance():
    q, k, v, is_sep, do = _inputs(3, 2, 2, 37, 16, torch.float32, 0.2, seed=5)
    both = sep_attention(q, k, v, is_sep, 2, 6, backend="triton")
    for i in range(3):
        one = sep_attention(q[i:i + 1], k[i:i + 1], v[i:i + 1], is_sep[i:i + 1], 2, 6, backend="triton")
        torch.testing.assert_close(one, both[i:i + 1], rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------ flex
def test_flex_matches_oracle():
    """FlexAttention runs forward-only on CPU (eager); forward and backward on CUDA (compiled)."""
    pytest.importorskip("torch.nn.attention.flex_attention")
    q, k, v, is_sep, do = _inputs(2, 4, 2, 64, 16, torch.float32 if not CUDA else torch.bfloat16, 0.15)
    _check_against_oracle("flex", q, k, v, is_sep, do, 3, 9, grad=CUDA)


# ------------------------------------------------------------------------------ api
@pytest.mark.parametrize("bad, match", [
    (dict(backend="cuda"), "backend must be one of"),
    (dict(neighbors=0), "neighbors"),
    (dict(init=-1), "init"),
    (dict(is_sep="float"), "is_sep"),
    (dict(kv_heads=3), "multiple"),
])
def test_api_rejects_bad_inputs(bad, match):
    q, k, v, is_sep, _ = _inputs(1, 4, 2, 8, 16, torch.float32)
    if bad.pop("kv_heads", None):
        k = v = torch.randn(1, 3, 8, 16, device=DEV)
    if bad.pop("is_sep", None):
        is_sep = is_sep.float()
    kw = dict(init=1, neighbors=2, backend="torch") | bad
    with pytest.raises(ValueError, match=match):
        sep_attention(q, k, v, is_sep, **kw)


def test_api_triton_rejects_odd_head_dim():
    q, k, v, is_sep, _ = _inputs(1, 2, 2, 8, 24, torch.float32)
    with pytest.raises(ValueError, match="power of two"):
        sep_attention(q, k, v, is_sep, 1, 2, backend="triton")


# ------------------------------------------------------------------------------ GPU, large
LARGE = [  # (batch, heads, kv_heads, seq, dim, dtype, p_sep)
    (1, 8, 2, 4097, 128, torch.bfloat16, 0.08),
    (2, 4, 4, 3001, 64, torch.float16, 0.15),
    (1, 8, 2, 2048, 128, torch.bfloat16, 0.0),
    (1, 4, 1, 2048, 128, torch.bfloat16, 1.0),
    (1, 4, 2, 1531, 128, torch.float32, 0.1),
]


@pytest.mark.skipif(not CUDA, reason="large shapes run on the GPU only")
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("case", LARGE, ids=lambda c: f"n{c[3]}d{c[4]}-{str(c[5])[6:]}-sep{c[6]}")
def test_triton_large_gpu(case, variant):
    b, h, hk, n, d, dtype, p = case
    q, k, v, is_sep, do = _inputs(b, h, hk, n, d, dtype, p, seed=n)
    _check_against_oracle("triton", q, k, v, is_sep, do, 4, 256, variant=variant)


# forward options `bench sepllm ops` times beside the default (variant_config), with the tiles they are timed with
OPS_WINDOW_VARIANTS = ["tma+w64", "tma+diag", "tma+w64+diag", "tma+w64+split", "tma+w64+diag+split", "tma+w64+s1",
                       "tma+w64+s3", "tma+w128"]


@pytest.mark.skipif(not CUDA, reason="large shapes run on the GPU only")
@pytest.mark.parametrize("spec", OPS_WINDOW_VARIANTS)
def test_tma_window_options_large_gpu(spec):
    """The ops candidates with the tiles they are timed with (window 256, 4k tokens, dim 128) match the oracle."""
    from kvlab.experiments.bench.sepllm import variant_config

    q, k, v, is_sep, do = _inputs(1, 8, 2, 4097, 128, torch.bfloat16, 0.08, seed=4097)
    _check_against_oracle("triton", q, k, v, is_sep, do, 4, 256, config=variant_config(spec, 128, torch.bfloat16))


def test_api_casts_under_autocast():
    """Under autocast HF's RoPE leaves q, k in fp32 while v is bf16: the API casts them like SDPA."""
    q, k, v, is_sep, _ = _inputs(1, 2, 2, 12, 16, torch.float32)
    with torch.autocast(DEV.type, dtype=torch.bfloat16):
        out = sep_attention(q, k, v.bfloat16(), is_sep, 1, 3, backend="torch")
    assert out.dtype == torch.bfloat16


@needs_triton
def test_default_tiles_follow_head_dim_and_dtype():
    """Rows twice as large (dim 256, or fp32) get tiles half as tall, so shared memory per tile is unchanged."""
    from kvlab.sepllm.triton import default_config

    for variant in ("gather", "tma"):
        tuned = default_config(128, torch.bfloat16, interpret=False, variant=variant)
        for d, dt in ((256, torch.bfloat16), (128, torch.float32)):
            cfg = default_config(d, dt, interpret=False, variant=variant)
            assert cfg["fwd"]["BLOCK_M"] == tuned["fwd"]["BLOCK_M"] // 2
            # the tma kernels multi-buffer their window tiles too: those shrink as well
            want_n = tuned["dq"]["BLOCK_N"] // 2 if variant == "tma" else tuned["dq"]["BLOCK_N"]
            assert cfg["dq"]["BLOCK_N"] == want_n
        assert default_config(64, torch.bfloat16, interpret=False, variant=variant) == tuned


def test_tile_work_counts_the_mask_and_the_tiles():
    """The benchmark's work model: useful FLOP = 4 * dim per visible (query, key) entry of the mask; computed FLOP
    = every entry of the tiles the forward kernel walks (far tiles of BLOCK_F, window tiles of BLOCK_N)."""
    from kvlab.experiments.bench.sepllm import tile_work

    g = torch.Generator().manual_seed(12)
    is_sep = torch.rand(2, 300, generator=g) < 0.1
    cfg = {"variant": "tma", "fwd": dict(BLOCK_M=64, BLOCK_N=32, BLOCK_F=16)}
    work = tile_work(is_sep, 4, 50, cfg, heads=3, kv_heads=1, dim=8)
    assert work["useful_flop"] == pytest.approx(4 * 8 * 3 * sepllm_mask(is_sep, 4, 50).sum().item())
    computed = 0
    for b in range(2):
        kept = is_sep[b].clone()
        kept[:4] = True
        for q0 in range(0, 300, 64):
            lo = max(q0 - 49, 0) // 32 * 32
            hi = min(q0 + 64, 300)
            far = int(kept[:lo].sum())
            computed += 64 * (-(-far // 16) * 16 + -(-(hi - lo) // 32) * 32)
    assert work["computed_flop"] == pytest.approx(4 * 8 * 3 * computed)
    assert work["computed_flop"] >= work["useful_flop"]


_SMEM_SCRIPT = r"""
import json, sys
import torch, triton
try:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    import kvlab.sepllm.triton as st
    triton.compile  # noqa: B018
except Exception:
    sys.exit(3)
P = {torch.bfloat16: "*bf16", torch.float32: "*fp32"}
out = []
for dtype, d in ((torch.float32, 128), (torch.bfloat16, 256)):
    cfg = st.default_config(d, dtype, interpret=False, variant="tma")
    p, f32, i8, i32 = P[dtype], "*fp32", "*i8", "*i32"
    kernels = [("fwd", st._sep_fwd_tma_kernel, dict(WARP_SPEC=False, PARTS=3, WINDOW_SPLIT=False, WINDOW_DIAG=False,
                                                    WINDOW_STAGES=None)),
               ("dq", st._sep_bwd_dq_tma_kernel, dict(WARP_SPEC=False)),
               ("far", st._sep_bwd_dkdv_far_tma_kernel, dict(N_SPLITS=1)),
               ("dkdv", st._sep_bwd_dkdv_window_tma_kernel, {})]
    for key, kernel, extra in kernels:
        c = cfg[key]
        cx = dict(H=8, GROUP=4, HEAD_DIM=d, FP32_DOT=dtype == torch.float32, BLOCK_M=c["BLOCK_M"], BLOCK_N=c["BLOCK_N"],
                  BLOCK_F=c["BLOCK_F"], **extra)
        cx = {k: v for k, v in cx.items() if k in kernel.arg_names}
        sig = {}
        for name in kernel.arg_names:
            if name in cx:
                sig[name] = "constexpr"
            elif name in ("LSE", "DELTA", "DKC", "DVC"):
                sig[name] = f32
            elif name == "KEPT":
                sig[name] = i8
            elif name in ("IDX", "CNT"):
                sig[name] = i32
            elif name in ("Q", "K", "V", "KC", "VC", "O", "DO", "DQ", "DK", "DV"):
                sig[name] = p
            else:
                sig[name] = "fp32" if name.endswith("scale") else "i32"
        ck = triton.compile(ASTSource(fn=kernel, signature=sig, constexprs=cx), target=GPUTarget("cuda", 90, 32),
                            options={"num_warps": c["num_warps"], "num_stages": c["num_stages"]})
        out.append({"dtype": str(dtype), "dim": d, "kernel": key, "shared": ck.metadata.shared})
print(json.dumps(out))
"""


@needs_triton
def test_tma_default_tiles_fit_in_hopper_shared_memory():
    """Regression (GPU round 2, 2026-11-25): fp32 rows with dQ's 64-key window tiles asked 262,160 bytes of shared
    memory, more than an H100/H200 block may have (232,448), and the launch failed. Every default tile set of the
    "tma" variant for 4-byte elements and for dim 256 is compiled here for sm_90 (no GPU needed) and must fit."""
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-c", _SMEM_SCRIPT], env=env, capture_output=True, text=True, timeout=900)
    if res.returncode == 3:
        pytest.skip("this Triton cannot compile for CUDA here (no NVIDIA backend)")
    assert res.returncode == 0, res.stderr[-3000:]
    for row in json.loads(res.stdout.strip().splitlines()[-1]):
        assert row["shared"] <= 232448, row
