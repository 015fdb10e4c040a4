"""Public entry point of LaCache (https://arxiv.org/abs/2507.14204): checks inputs, returns patterns.

LaCache only chooses *which* entries each layer keeps; attention itself stays the model's own (SDPA or
FlashAttention), so there is no kernel backend to pick. The specification is
:mod:`kvlab.lacache.reference`; the policy that runs it inside a model is
:class:`kvlab.lacache.policy.LaCache`, re-exported here.
"""

from __future__ import annotations

import torch

from kvlab.core import check_choice, check_int
from kvlab.lacache.reference import LAYOUTS, LadderGeometry, default_span_overlap, ladder_mask
from kvlab.lacache.coverage import simulate
from kvlab.lacache.policy import LaCache

__all__ = ["LaCache", "LAYOUTS", "ladder_geometry", "ladder_pattern", "compaction_snapshots"]


def ladder_geometry(num_layers: int, span: int | None = None, overlap: int | None = None) -> LadderGeometry:
    """The ladder's sizes (step ``D``, group ``G``, kept ``A``, freed ``R``) for a model with ``num_layers``
    layers. Defaults: the paper's language-modelling setting, ``S = L/4`` and ``O = S/2`` (Sec. 4.4)."""
    check_int("num_layers", num_layers, 1)
    span = default_span_overlap(num_layers)[0] if span is None else span
    overlap = span // 2 if overlap is None else overlap
    return LadderGeometry(num_layers, span, overlap)


def ladder_pattern(num_layers: int, length: int, span: int | None = None, overlap: int | None = None, *,
                   layout: str = "bands", sink: int = 0) -> torch.Tensor:
    """``(layers, length)`` bool: the ladder applied once to ``length`` dense tokens (Fig. 2).

    The first ``sink`` tokens stay in every layer; the others are cut into ladders of ``G`` tokens, of which
    layer ``l`` keeps ``A`` from its offset; a trailing partial ladder stays whole.
    """
    check_choice("layout", layout, LAYOUTS)
    check_int("length", length, 0)
    return ladder_mask(ladder_geometry(num_layers, span, overlap), length, layout, sink)


def compaction_snapshots(num_layers: int, budget: int, steps: list[int], span: int | None = None,
                         overlap: int | None = None, *, sink: int = 4, recent: int | None = None,
                         layout: str = "bands") -> dict[int, torch.Tensor]:
    """What a LaCache of ``budget`` entries per layer holds after each of ``steps`` tokens (Fig. 4):
    step -> ``(layers, step)`` bool mask. Simulated on positions alone, no model needed."""
    if not steps or any(int(s) < 1 for s in steps):
        raise ValueError(f"steps must be a non-empty list of positive token counts, got {steps!r}")
    policy = LaCache(budget, span, overlap, sink, recent=recent, layout=layout)
    return simulate(policy, num_layers, max(steps), snapshots=steps).snapshots
