"""Test helpers for kernels: dtype-aware comparison with a float64 oracle (STYLE.md, point 3).

A kernel in bf16/fp16/fp32 is accepted when its error against the fp64 oracle is no larger than the error
of the eager reference run in the same low precision, plus a ``sqrt(n) * eps`` allowance for the different
order of sums; the relative L2 error must stay within twice the eager one. No hand-tuned tolerances.
"""

from __future__ import annotations

import math

import torch

__all__ = ["assert_close_to_oracle"]


def assert_close_to_oracle(actual: torch.Tensor, eager: torch.Tensor, oracle: torch.Tensor, *, reduction: int,
                           dtype: torch.dtype | None = None, name: str = "out") -> None:
    """Raise AssertionError unless ``actual`` is as close to ``oracle`` as ``eager`` is.

    Args:
        actual: the fast path's result (low precision).
        eager: the eager reference run on the same low-precision inputs.
        oracle: the reference on the same values promoted to float64.
        reduction: length of the longest sum behind one output element (keys per query): the allowance
            is ``sqrt(reduction) * eps * max|oracle|``.
        dtype: the inputs' dtype (default ``actual.dtype``), whose ``eps`` sets the allowance.
    """
    dtype = dtype or actual.dtype
    eps = torch.finfo(dtype).eps
    assert actual.shape == oracle.shape, f"{name}: shape {tuple(actual.shape)} != oracle {tuple(oracle.shape)}"
    assert torch.isfinite(actual).all(), f"{name}: non-finite values"
    err = (actual.double() - oracle).abs().max().item()
    err_eager = (eager.double() - oracle).abs().max().item()
    allow = math.sqrt(max(reduction, 1)) * eps * oracle.abs().max().item()
    assert err <= err_eager + allow, f"{name}: err {err:.3g} > eager {err_eager:.3g} + {allow:.3g}"
    # The max-error bound is loose in bf16; the relative L2 error pins the whole tensor (one missing key in a
    # row moves it by far more than rounding does).
    norm = oracle.norm().item()
    if norm > 0:
        rel = (actual.double() - oracle).norm().item() / norm
        rel_eager = (eager.double() - oracle).norm().item() / norm
        assert rel <= 2 * rel_eager + eps, f"{name}: rel err {rel:.3g} > 2 x eager {rel_eager:.3g} + eps"
