"""The LaCache policy: a ladder-shaped cache across layers, compacted again and again (Shi et al., ICML 2025).

The maths (ladder geometry, layer offsets, one compaction step) is :mod:`kvlab.lacache.reference`; this
class only applies it to every layer of a :class:`~kvlab.core.KVCache` after every step.
"""

from __future__ import annotations

import torch

from kvlab.core import LayerView, Policy, check_choice, check_int
from kvlab.lacache.reference import LAYOUTS, LadderGeometry, compaction_step, default_span_overlap, ladder_offsets

__all__ = ["LaCache"]


class LaCache(Policy):
    """Ladder-shaped KV cache with iterative compaction (LaCache, Sec. 3.2-3.3).

    Every layer holds at most ``budget`` entries: the ``sink`` oldest, a compacted middle in which layer
    ``l`` keeps ``A`` of every ``G`` entries starting at its own offset (early tokens in early layers), and
    the newest entries dense. When a layer overflows, the ladder is applied to the next ``G`` entries after
    a cursor; when the cursor reaches the ``recent`` newest entries, it starts over and compacts the already
    compacted cache (older tokens sparser, memory constant for unbounded streams).

    Args:
        budget: most entries each layer holds after a step (the paper's "cache size").
        span: ``S``, layers that keep the same token. None: the paper's language-modelling choice ``L/4``.
        overlap: ``O``, layers shared by the bands of neighbouring tokens, ``0 <= O < S``. None: ``S // 2``.
        sink: oldest entries always kept (attention sinks, as in the public code: 4).
        recent: newest entries never compacted. None: the number of layers (our reading of the public code).
        layout: ``"bands"`` (contiguous, the paper's figure) or ``"interleaved"`` (the public code).
        positions: ``"cache"`` (default, as the public code: positions within the cache) or ``"original"``.

    Needs no attention scores, so the model keeps its fast attention kernel (SDPA / FlashAttention).
    See :mod:`kvlab.lacache.reference` for the readings of the paper this relies on.
    """

    def __init__(self, budget: int, span: int | None = None, overlap: int | None = None, sink: int = 4, *,
                 recent: int | None = None, layout: str = "bands", positions: str = "cache"):
        super().__init__(positions)
        self._budget = check_int("budget", budget, 1)
        self.span = None if span is None else check_int("span", span, 1)
        self.overlap = None if overlap is None else check_int("overlap", overlap, 0)
        if self.span is not None and self.overlap is not None and self.overlap >= self.span:
            raise ValueError(f"overlap ({self.overlap}) must be smaller than span ({self.span}): the bands of "
                             "neighbouring tokens share at most span - 1 layers")
        self.sink = check_int("sink", sink, 0)
        self.recent = None if recent is None else check_int("recent", recent, 0)
        self.layout = check_choice("layout", layout, LAYOUTS)
        if self.sink + (self.recent or 0) >= budget:
            raise ValueError(f"sink + recent ({self.sink} + {self.recent or 0}) must be smaller than budget "
                             f"({budget}) to leave room for the ladder")
        self._plans: dict[int, tuple[LadderGeometry, torch.Tensor, int]] = {}

    @property
    def budget(self) -> int:
        return self._budget

    def plan(self, num_layers: int) -> tuple[LadderGeometry, torch.Tensor, int]:
        """``(geometry, offsets (layers,), recent)`` for a model with ``num_layers`` layers (validated)."""
        if num_layers not in self._plans:
            span = default_span_overlap(num_layers)[0] if self.span is None else self.span
            overlap = span // 2 if self.overlap is None else self.overlap
            if span > num_layers:
                raise ValueError(f"span={span} exceeds the model's {num_layers} layers; use span <= {num_layers}")
            geometry = LadderGeometry(num_layers, span, overlap)
            recent = num_layers if self.recent is None else self.recent
            need = self.sink + recent + geometry.group
            if self._budget < need:
                raise ValueError(
                    f"budget={self._budget} is too small for a ladder of {geometry.group} tokens between sink="
                    f"{self.sink} and recent={recent} on {num_layers} layers: use budget >= {need} (or lower "
                    "recent=, or raise the span)")
            self._plans[num_layers] = (geometry, ladder_offsets(geometry, self.layout), recent)
        return self._plans[num_layers]

    def check_model(self, num_layers: int) -> None:
        self.plan(num_layers)

    def keep(self, view: LayerView) -> torch.Tensor | None:
        geometry, offsets, recent = self.plan(view.num_layers)
        cursor = view.state.get("lacache_cursor", self.sink)
        index, cursor = compaction_step(view.size, cursor, budget=self._budget, sink=self.sink, recent=recent,
                                        geometry=geometry, offset=int(offsets[view.layer_idx]))
        view.state["lacache_cursor"] = cursor
        if index is None:
            return None
        return torch.tensor(index, dtype=torch.long, device=view.positions.device)

    def __repr__(self) -> str:
        return (f"LaCache(budget={self._budget}, span={self.span}, overlap={self.overlap}, sink={self.sink}, "
                f"recent={self.recent}, layout={self.layout!r}, positions={self.positions!r})")
