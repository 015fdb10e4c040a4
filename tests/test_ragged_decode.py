"""Ragged decode attention: Triton and padded-SDPA backends against a float64 oracle.

Without CUDA the Triton kernels run in Triton's interpreter: ``tests/conftest.py`` sets
``TRITON_INTERPRET=1`` before anything imports Triton. Tolerance as in ``test_sep_attention.py``: the eager low-precision error plus
``sqrt(len) * eps`` times the oracle's scale, and at most twice the eager relative L2 error.
"""
from __future__ import annotations


import pytest
import torch

from kvlab.kernels.decode import ragged_decode_attention
from kvlab.kernels.decode.reference import ragged_decode_reference
from kvlab.testing import assert_close_to_oracle

CUDA = torch.cuda.is_available()
DEV = torch.device("cuda" if CUDA else "cpu")
needs_triton = pytest.mark.triton  # skipped by conftest.py where Triton cannot run


def _inputs(lens, h, hk, d, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    lens = torch.as_tensor(lens)
    cu = torch.zeros(len(lens) + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(lens, 0)
    total = int(cu[-1])
    q = torch.randn(len(lens), h, d, generator=g).to(dtype).to(DEV)
    k = torch.randn(total, hk, d, generator=g).to(dtype).to(DEV)
    v = torch.randn(total, hk, d, generator=g).to(dtype).to(DEV)
    return q, k, v, cu.to(DEV)


def _check(backend, q, k, v, cu):
    longest = int((cu[1:] - cu[:-1]).max())
    oracle = ragged_decode_reference(q.double(), k.double(), v.double(), cu)
    eager = ragged_decode_reference(q, k, v, cu)
    out = ragged_decode_attention(q, k, v, cu, backend=backend)
    assert out.dtype == q.dtype
    assert_close_to_oracle(out, eager, oracle, reduction=longest)


CASES = [  # (lengths, heads, kv_heads, dim, dtype)
    ([5, 70, 33], 8, 2, 32, torch.bfloat16),      # ragged, GQA 4, one split and several
    ([64, 1, 100, 17], 4, 4, 16, torch.float16),  # MHA, a one-entry cache
    ([40, 90], 6, 3, 64, torch.float32),          # group of 2, fp32
    ([0, 20, 45], 4, 1, 16, torch.float32),       # an empty cache gives zeros
]


@needs_triton
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{'-'.join(map(str, c[0]))}h{c[1]}/{c[2]}-{str(c[4])[6:]}")
def test_triton_matches_oracle(case):
    lens, h, hk, d, dtype = case
    q, k, v, cu = _inputs(lens, h, hk, d, dtype)
    _check("triton", q, k, v, cu)
    if 0 in lens:
        out = ragged_decode_attention(q, k, v, cu, backend="triton")
        assert (out[lens.index(0)] == 0).all()


def test_padded_sdpa_matches_oracle():
    q, k, v, cu = _inputs([5, 70, 33], 8, 2, 32, torch.float32)
    _check("sdpa", q, k, v, cu)


@needs_triton
def test_triton_chunking_does_not_change_the_result():
    """The packed axis is cut into equal ranges that straddle sequence boundaries: one range per
    kv head, ranges shorter than every sequence, and ranges longer than several give the same."""
    from kvlab.kernels.decode.triton import ragged_decode_triton

    q, k, v, cu = _inputs([7, 130, 0, 64, 3], 4, 2, 16, torch.float32, seed=2)
    ref = ragged_decode_reference(q, k, v, cu)
    for chunks in (1, 2, 5, 17, 90):
        cfg = dict(BLOCK_N=16, chunks=chunks, num_warps=4, num_stages=1)
        for max_seqlen in (None, 130):
            out = ragged_decode_triton(q, k, v, cu, max_seqlen=max_seqlen, config=cfg)
            torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)


@needs_triton
def test_triton_unused_rows_after_the_last_sequence():
    """cu_seqlens[-1] < total: the rows past the last sequence are never read."""
    q, k, v, cu = _inputs([20, 9], 4, 4, 16, torch.float32, seed=4)
    k_pad = torch.cat([k, torch.full_like(k[:11], float("nan"))])
    v_pad = torch.cat([v, torch.full_like(v[:11], float("nan"))])
    out = ragged_decode_attention(q, k_pad, v_pad, cu, backend="triton")
    torch.testing.assert_close(out, ragged_decode_reference(q, k, v, cu), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("bad, match", [
    (dict(backend="cuda"), "backend="),
    (dict(cu="short"), "cu_seqlens"),
    (dict(kv_heads=3), "multiple"),
])
def test_api_rejects_bad_inputs(bad, match):
    q, k, v, cu = _inputs([3, 4], 4, 2, 16, torch.float32)
    if bad.pop("cu", None):
        cu = cu[:-1]
    if bad.pop("kv_heads", None):
        k = v = torch.randn(7, 3, 16, device=DEV)
    with pytest.raises(ValueError, match=match):
        ragged_decode_attention(q, k, v, cu, **({"backend": "torch"} | bad))


@pytest.mark.skipif(not CUDA, reason="large shapes run on the GPU only")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_triton_large_gpu(dtype):
    g = torch.Generator().manual_seed(0)
    lens = torch.randint(6144, 8193, (16,), generator=g).tolist()
    q, k, v, cu = _inputs(lens, 32, 8, 128, dtype)
    _check("triton", q, k, v, cu)
