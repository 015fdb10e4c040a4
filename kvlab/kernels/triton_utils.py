"""Triton helpers shared by every method's kernels: the dot product with the right precision, one step of
the online softmax (FlashAttention's running max and sum), whether
Triton runs in its CPU interpreter, and the eligibility checks every Triton backend makes before launching.

Importing this module imports Triton; ``api.py`` modules call :func:`check_triton_inputs` (which does not
need Triton) before they import a kernel.
"""

from __future__ import annotations

import os

import torch

__all__ = ["TRITON_DTYPES", "check_triton_inputs", "dot", "gathered_tile", "interpreting", "online_softmax_step",
           "interpreter_scalar_bounds"]

TRITON_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``, read at import)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def interpreter_scalar_bounds() -> bool:
    """Make Triton's CPU interpreter turn 1-element scalars into loop bounds the way Triton 3.7 does.

    The interpreter keeps a kernel's scalars (loaded values, their minima) in 1-element arrays and converts a
    ``range(lo, hi, step)`` bound with ``int(array)``; NumPy 2.5 refuses that for arrays with a dimension, so
    under Triton 3.6 every loop bounded by a loaded value fails (``only 0-dimensional arrays can be converted
    to Python scalars``). Triton 3.7 squeezes the array first; this applies the same conversion to older
    versions. Idempotent; returns True when it wrapped the interpreter's tensor patch.
    """
    try:
        import triton.runtime.interpreter as interp
    except ImportError:  # pragma: no cover - no interpreter in this Triton
        return False
    inner = getattr(interp, "_patch_lang_tensor", None)
    if inner is None or getattr(inner, "_kvlab_squeezes", False):
        return False

    def patch_tensor(tensor, scope):
        inner(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    patch_tensor._kvlab_squeezes = True
    interp._patch_lang_tensor = patch_tensor
    return True


def check_triton_inputs(x: torch.Tensor, head_dim: int, *, fallback: str = "backend='torch'") -> None:
    """Raise ValueError naming the fix when a Triton kernel cannot take ``x`` (dtype, head dim, device)."""
    if x.dtype not in TRITON_DTYPES:
        raise ValueError(f"backend='triton' takes {TRITON_DTYPES}, got {x.dtype}; use {fallback}")
    if head_dim < 16 or head_dim > 256 or head_dim & (head_dim - 1):
        raise ValueError(f"backend='triton' needs a head dim that is a power of two in [16, 256], got {head_dim}; "
                         f"use {fallback}")
    if not x.is_cuda and not interpreting():
        raise ValueError("backend='triton' needs CUDA tensors; on CPU set TRITON_INTERPRET=1 before importing "
                         f"triton (slow: small shapes only) or use {fallback}")


try:  # the jit helper exists only where Triton is installed
    import triton
    import triton.language as tl

    if interpreting():
        interpreter_scalar_bounds()

    @triton.jit
    def dot(a, b, acc, FP32_DOT: tl.constexpr):
        # FP32_DOT: float32 inputs get true fp32 products (not tf32), and the CPU interpreter (whose
        # bf16 dot is wrong in triton 3.7) gets fp32 operands. bf16 x bf16 products are exact in fp32,
        # so upcasting changes nothing but the order of the fp32 sums.
        if FP32_DOT:
            out = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
        else:
            out = tl.dot(a, b, acc)
        return out

    @triton.jit
    def online_softmax_step(s, v, m_i, l_i, acc, FP32_DOT: tl.constexpr):
        # s: (BLOCK_M, BLOCK_N) base-2 scores, -inf where hidden. A row may be fully hidden in one tile
        # (and in all tiles so far): then m stays -inf and we subtract 0 instead, so exp2 gives 0, not NaN.
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_sub)
        p = tl.exp2(s - m_sub[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = dot(p.to(v.dtype), v, acc * alpha[:, None], FP32_DOT)
        return m_new, l_i, acc

    @triton.jit
    def gathered_tile(q, POS, Kbh, Vbh, start, n, stride_kn, stride_vn, offs_d, BLOCK_M: tl.constexpr,
                      BLOCK_N: tl.constexpr, FP32_DOT: tl.constexpr):
        # Slots [start, start + BLOCK_N) of a list of n key positions POS (SepLLM's compacted kept keys,
        # DHSA's ranked tokens of a chunk): which slots are live, their positions, keys and values, and the
        # raw scores q k^T of the query tile against them. Padding slots read row 0: in bounds.
        slot = start + tl.arange(0, BLOCK_N)
        live = slot < n
        kpos = tl.load(POS + slot, mask=live, other=0)
        k = tl.load(Kbh + kpos[:, None] * stride_kn + offs_d[None, :])
        v = tl.load(Vbh + kpos[:, None] * stride_vn + offs_d[None, :])
        s = dot(q, tl.trans(k), tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), FP32_DOT)
        return k, v, s, live, slot, kpos
except ImportError:  # pragma: no cover - kvlab without the triton extra
    dot = online_softmax_step = gathered_tile = None
