"""Checks for the assignments in ``lessons/``: compare a student's answer with kvlab's reference and say
what differs, in words a student can act on."""

from __future__ import annotations

import torch

__all__ = ["check"]


def check(name: str, got, expected, *, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    """Print ``✓ name`` when ``got`` matches ``expected`` (numbers, sequences or tensors), else raise an
    ``AssertionError`` that shows both and the largest difference."""
    if got is None:
        raise AssertionError(f"✗ {name}: your function returned None — did you forget `return`?")
    g = torch.as_tensor(got).detach().cpu()
    e = torch.as_tensor(expected).detach().cpu()
    if g.shape != e.shape:
        raise AssertionError(f"✗ {name}: shape {tuple(g.shape)}, expected {tuple(e.shape)}\n"
                             f"  yours:    {g.tolist()}\n  expected: {e.tolist()}")
    if g.is_floating_point() or e.is_floating_point():
        g, e = g.double(), e.double()
        ok = torch.allclose(g, e, rtol=rtol, atol=atol)
        diff = float((g - e).abs().max()) if g.numel() else 0.0
    else:
        ok = torch.equal(g, e)
        diff = int((g != e).sum())
    if not ok:
        what = f"max difference {diff:.3g}" if isinstance(diff, float) else f"{diff} entries differ"
        shown = "" if g.numel() > 64 else f"\n  yours:    {g.tolist()}\n  expected: {e.tolist()}"
        raise AssertionError(f"✗ {name}: {what}{shown}")
    print(f"✓ {name}")
