"""The LaCache policy: a ladder-shaped cache across layers, compacted again and again (Shi et al., ICML 2025).

The maths (ladder geometry, layer offsets, one compaction step) is :mod:`kvlab.lacache.reference`; this
class only applies it to every layer of a :class:`~kvlab.core.KVCache` after every step.
"""

from __future__ import annotations

import torch

from kvlab.core import LayerView, Policy, check_choice, check_int
from kvlab.lacache.reference import LAYOUTS, LadderGeometry, compaction_step, default_span_overlap, ladder_offsets

__all__ = ["LaCache", "ACCOUNTINGS"]

#: How ``budget`` is counted: a strict maximum per layer, or the authors' code (grown by floor(R/2)).
ACCOUNTINGS = ("strict", "official")


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
        recent: newest entries never compacted. None: the number of layers ``L`` with ``accounting="strict"``
            (a round choice near the public code, which in these terms stops a pass ``L - R + 1`` entries
            before the newest), ``L - R + 1`` with ``accounting="official"``.
        layout: ``"bands"`` (contiguous, the paper's figure) or ``"interleaved"`` (the public code).
        positions: ``"cache"`` (default, as the public code: positions within the cache), ``"original"`` or
            ``"insertion"``.
        accounting: ``"strict"`` (default): ``budget`` is the most entries a layer ever holds.
            ``"official"``: as the authors' ``LaCache(cache_size, span, overlap)``: the cache grows by
            ``floor(R / 2)`` at its first overflow so that its *mean* size is near ``budget``, and a pass
            stops ``L - R + 1`` entries before the newest. ``LaCache(C, S, O, accounting="official",
            layout="interleaved")`` keeps exactly the entries of the public code's ``LaCache(C, S, O)``
            (tested), i.e. ``LaCache(C + R // 2, S, O, layout="interleaved", recent=L - R + 1)``;
            :meth:`official` builds it.

    Needs no attention scores, so the model keeps its fast attention kernel (SDPA / FlashAttention).
    See :mod:`kvlab.lacache.reference` for the readings of the paper this relies on.
    """

    def __init__(self, budget: int, span: int | None = None, overlap: int | None = None, sink: int = 4, *,
                 recent: int | None = None, layout: str = "bands", positions: str = "cache",
                 accounting: str = "strict"):
        super().__init__(positions)
        self.accounting = check_choice("accounting", accounting, ACCOUNTINGS)
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
        self._plans: dict[int, tuple[LadderGeometry, torch.Tensor, int, int]] = {}
        self._last_plan: int | None = None

    @classmethod
    def for_budget(cls, cache: int, *, tokenizer=None) -> "LaCache":
        """``LaCache(cache)``: span and overlap follow from the budget and the model's depth (the class docstring)."""
        return cls(cache)

    @classmethod
    def official(cls, cache_size: int, span: int = 16, overlap: int = 0, sink: int = 4, *,
                 positions: str = "cache") -> "LaCache":
        """The authors' ``LaCache(cache_size, span, overlap)`` (public code, ``start_size = sink``): interleaved
        ladder, cache grown by ``floor(R / 2)`` at the first overflow, passes stopping ``L - R + 1`` before
        the newest entry."""
        return cls(cache_size, span, overlap, sink, layout="interleaved", positions=positions, accounting="official")

    @property
    def budget(self) -> int | None:
        """Most entries a layer holds. With ``accounting="official"`` it depends on the model (``budget +
        floor(R / 2)``): known once the policy met one, None before."""
        if self.accounting == "strict":
            return self._budget
        return None if self._last_plan is None else self._plans[self._last_plan][3]

    def settings(self, num_layers: int) -> dict:
        """What the policy really runs on a model of ``num_layers`` layers (for result files): span, overlap,
        most entries held, recent, layout, accounting."""
        geometry, _, recent, budget = self.plan(num_layers)
        return dict(span=geometry.span, overlap=geometry.overlap, sink=self.sink, recent=recent, max_held=budget,
                    cache_size=self._budget, layout=self.layout, accounting=self.accounting,
                    positions=self.positions)

    def plan(self, num_layers: int) -> tuple[LadderGeometry, torch.Tensor, int, int]:
        """``(geometry, offsets (layers,), recent, most entries held)`` for a model with ``num_layers``
        layers (validated)."""
        if num_layers not in self._plans:
            span = default_span_overlap(num_layers)[0] if self.span is None else self.span
            overlap = span // 2 if self.overlap is None else self.overlap
            if span > num_layers:
                raise ValueError(f"span={span} exceeds the model's {num_layers} layers; use span <= {num_layers}")
            geometry = LadderGeometry(num_layers, span, overlap)
            official = self.accounting == "official"
            budget = self._budget + (geometry.freed // 2 if official else 0)
            default_recent = num_layers - geometry.freed + 1 if official else num_layers
            recent = default_recent if self.recent is None else self.recent
            need = self.sink + recent + geometry.group
            if budget < need:
                raise ValueError(
                    f"budget={self._budget} is too small for a ladder of {geometry.group} tokens between sink="
                    f"{self.sink} and recent={recent} on {num_layers} layers: use budget >= "
                    f"{need - (budget - self._budget)} (or lower recent=, or raise the span)")
            self._plans[num_layers] = (geometry, ladder_offsets(geometry, self.layout), recent, budget)
        self._last_plan = num_layers
        return self._plans[num_layers]

    def check_model(self, num_layers: int) -> None:
        self.plan(num_layers)

    def keep(self, view: LayerView) -> torch.Tensor | None:
        geometry, offsets, recent, budget = self.plan(view.num_layers)
        cursor = view.state.get("lacache_cursor", self.sink)
        index, cursor = compaction_step(view.size, cursor, budget=budget, sink=self.sink, recent=recent,
                                        geometry=geometry, offset=int(offsets[view.layer_idx]))
        view.state["lacache_cursor"] = cursor
        if index is None:
            return None
        return torch.tensor(index, dtype=torch.long, device=view.positions.device)

    static_reason = None

    def static_state(self, rows: int, device) -> dict[str, torch.Tensor]:
        return {"cursor": torch.full((rows,), self.sink, dtype=torch.long, device=device)}

    def static_keep(self, view) -> torch.Tensor:
        """:func:`~kvlab.lacache.reference.compaction_step` for one-token steps (a layer holds at most
        ``budget + 1`` entries, so one ladder application brings it back under the budget), as slot masks;
        the cursor is a per-row tensor and each row's ladder offset is looked up by its layer."""
        geometry, offsets, recent, budget = self.plan(view.num_layers)
        n, slots = view.length[:, None], view.slots
        over = n > budget  # (rows, 1)
        if geometry.freed == 0:  # one rung over all layers: StreamingLLM
            return (slots < self.sink) | (slots >= n - (budget - self.sink)) | ~over
        cursor = view.state["cursor"][:, None]
        G, A = geometry.group, geometry.keep
        on_device = self.__dict__.setdefault("_device_offsets", {})  # copied once (not inside a graph capture)
        key = (view.num_layers, view.layer.device)
        if key not in on_device:
            on_device[key] = offsets.to(view.layer.device)
        off = on_device[key][view.layer][:, None]  # (rows, 1): off[l] of each row's layer
        start = torch.where(cursor + G > n - recent, self.sink, cursor)  # a new pass starts at the sink
        rung = (slots >= start + off) & (slots < start + off + A)
        keep = (slots < start) | (slots >= start + G) | rung
        view.state["cursor"].copy_(torch.where(over, start + A, cursor)[:, 0])
        return keep | ~over

    def __repr__(self) -> str:
        # once the policy met a model, show the span, overlap and recent it really uses (not None)
        span, overlap, recent = self.span, self.overlap, self.recent
        if self._last_plan is not None:
            geometry, _, recent, _ = self._plans[self._last_plan]
            span, overlap = geometry.span, geometry.overlap
        return (f"LaCache(budget={self._budget}, span={span}, overlap={overlap}, sink={self.sink}, "
                f"recent={recent}, layout={self.layout!r}, positions={self.positions!r}, "
                f"accounting={self.accounting!r})")
