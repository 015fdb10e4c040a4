"""LaCache in plain PyTorch: the ladder pattern and iterative compaction, the specification.

Paper: LaCache, "Ladder-Shaped KV Caching for Efficient Long-Context Modeling of Large Language Models"
(Shi et al., ICML 2025, https://arxiv.org/abs/2507.14204), Sec. 3.2 (ladder, Fig. 2, footnote 1) and
Sec. 3.3 (iterative compaction, Fig. 4).

Everything here works on *indices*: which entries of a layer's cache survive. No model is needed, so the
same functions drive the policy (:class:`kvlab.lacache.policy.LaCache`), the pictures and the coverage
theory (:mod:`kvlab.lacache.coverage`).

The ladder (Sec. 3.2)
---------------------
``L`` layers, span ``S`` (layers that keep the same token), overlap ``O`` (layers shared by the bands of
two neighbouring tokens). Our readings, each checked by a test:

* **Step.** Moving one token later moves its band of layers ``D = S - O`` layers deeper: token ``j`` of a
  ladder is kept by layers ``[j*D, j*D + S)``. ``O`` is counted in *layers*, as in the authors' public code
  (which subtracts it from the span); the paper's sentence "the number of tokens ... preserved in each
  layer" is the consequence: every layer keeps ``A = ceil(S / D)`` neighbouring tokens of each ladder.
* **Group.** One ladder covers ``G = 1 + ceil((L - S) / D)`` consecutive tokens, the fewest whose bands
  reach from layer 0 to layer ``L - 1``; applying it frees ``R = G - A`` entries per layer and group.
* **No bubbles (footnote 1).** The ideal band is cut by the first and last layer, so layers near the top
  and the bottom would keep fewer than ``A`` tokens of a group. We give every layer exactly ``A``
  neighbouring tokens, starting at offset ``off[l]``; the first and last tokens of a ladder are then kept
  by slightly more layers ("slightly more positions are preserved for tokens located at the beginning and
  end of ladders"). Every layer holds the same number of entries, so the budget is met exactly.
* **Two layouts.** ``"bands"`` (the paper's Fig. 1-2): contiguous bands, early tokens in early layers,
  ``off[l] = clamp(floor(l / D) - A + 1, 0, R)``; interior tokens are kept by ``A*D`` consecutive layers,
  which is ``S`` when ``D`` divides ``S`` (otherwise the span rounds up to the next multiple of ``D``), and
  two neighbours share ``(A-1)*D`` layers (``O`` when ``D`` divides ``S``). ``"interleaved"`` (the authors'
  public code): ``off[l] = l mod (R + 1)``, i.e. the ladder is only ``R + 1`` layers tall and repeats
  down the network, so a token is kept by non-consecutive layers spread over the whole depth.

Pseudocode of one application to ``G`` consecutive entries ``e[0..G)`` of every layer::

    for layer l: keep e[off[l] : off[l] + A]          # A of G entries; the others are dropped

Iterative compaction (Sec. 3.3)
-------------------------------
The cache of every layer is ``[sink | already compacted in this pass | not yet | recent]``. Whenever a
layer holds more than ``budget`` entries, the ladder is applied to the ``G`` entries right after a cursor,
which then moves ``A`` entries on; when fewer than ``G`` entries remain between the cursor and the
``recent`` newest entries, the pass is over and the cursor starts over at the sink: the next pass applies
the ladder to the already compacted cache ("apply LaCache again to further condense it"), so older tokens
become sparser and recent ones stay dense::

    while n > budget:
        if cursor + G > n - recent: cursor = sink            # start over: a new pass
        entries[cursor : cursor + G] = entries[cursor + off[l] : cursor + off[l] + A]
        cursor += A;  n -= R

Every layer runs the same arithmetic (only ``off[l]`` differs), so all layers hold the same number of
entries. Readings: the paper does not say how many newest tokens stay dense. The public code starts a
new pass when fewer than ``A`` entries lie between the cursor and the ``L`` newest *before* a ladder is
applied, which in the terms above is ``recent = L - R + 1``; the policy's default ``recent = L`` (strict
accounting) is a round choice one to a few entries away from it. The public code also raises its cache size
by ``floor(R / 2)`` at the first overflow so that the *average* size matches the budget; by default we keep
the *maximum* at the budget and report the mean held (``StreamingResult.mean_kv``);
``LaCache(..., accounting="official")`` reproduces the public code's accounting exactly.
When ``R = 0`` (span equal to the number of layers: one rung, every layer keeps every token) the ladder
frees nothing, and compaction falls back to dropping the oldest entry after the sink: StreamingLLM.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from kvlab.core.checks import check_int

__all__ = [
    "LAYOUTS",
    "LadderGeometry",
    "ladder_offsets",
    "ladder_mask",
    "compaction_step",
    "default_span_overlap",
]

LAYOUTS = ("bands", "interleaved")


def default_span_overlap(num_layers: int) -> tuple[int, int]:
    """The paper's language-modelling setting (Sec. 4.4): ``S = L/4`` (rounded, at least 1), ``O = S/2``
    (rounded down)."""
    span = max(1, round(num_layers / 4))
    return span, span // 2


@dataclass(frozen=True)
class LadderGeometry:
    """Sizes of one ladder for ``num_layers`` layers, span ``S`` and overlap ``O`` (see module docstring).

    step ``D = S - O``; group ``G = 1 + ceil((L - S) / D)`` tokens; each layer keeps ``A = min(ceil(S / D),
    G)`` of them; ``R = G - A`` entries per layer are freed per group.
    """

    num_layers: int
    span: int
    overlap: int

    def __post_init__(self):
        check_int("num_layers", self.num_layers, 1)
        check_int("span", self.span)
        check_int("overlap", self.overlap)
        if not 1 <= self.span <= self.num_layers:
            raise ValueError(f"span must be in 1..{self.num_layers} (the number of layers), got {self.span}")
        if not 0 <= self.overlap < self.span:
            raise ValueError(f"overlap must be in 0..span-1 = 0..{self.span - 1} (layers shared by the bands "
                             f"of neighbouring tokens), got {self.overlap}")
        if self.freed == 0 and self.span < self.num_layers:
            raise ValueError(
                f"span={self.span}, overlap={self.overlap} on {self.num_layers} layers makes every layer keep all "
                f"{self.group} tokens of a ladder, so compaction frees nothing; lower the overlap or the span")

    @property
    def step(self) -> int:
        return self.span - self.overlap

    @property
    def group(self) -> int:
        return 1 + math.ceil((self.num_layers - self.span) / self.step)

    @property
    def keep(self) -> int:
        return min(math.ceil(self.span / self.step), self.group)

    @property
    def freed(self) -> int:
        return self.group - self.keep

    @property
    def ratio(self) -> float:
        """Entries kept per entry before, per layer, by one application of the ladder: ``A / G``."""
        return self.keep / self.group


def ladder_offsets(geometry: LadderGeometry, layout: str = "bands") -> torch.Tensor:
    """``(layers,)`` long: where in each group of ``G`` entries layer ``l`` starts its ``A`` kept ones.

    bands:       ``off[l] = clamp(floor(l / D) - A + 1, 0, R)``   (paper's figure; footnote 1 at both ends)
    interleaved: ``off[l] = l mod (R + 1)``                       (the authors' public code)
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    layers = torch.arange(geometry.num_layers)
    if layout == "interleaved":
        return layers % (geometry.freed + 1)
    return (layers // geometry.step - geometry.keep + 1).clamp(0, geometry.freed)


def ladder_mask(geometry: LadderGeometry, length: int, layout: str = "bands", sink: int = 0) -> torch.Tensor:
    """One application of the ladder to ``length`` dense tokens (Fig. 2): ``(layers, length)`` bool.

    The ``sink`` first tokens stay in every layer; the rest is cut into groups of ``G`` and layer ``l`` keeps
    ``A`` tokens of each group from ``off[l]``; a trailing partial group stays whole (nothing to compact yet).
    """
    if length < 0 or sink < 0:
        raise ValueError(f"length and sink must be >= 0, got {length}, {sink}")
    off = ladder_offsets(geometry, layout)
    pos = torch.arange(length)
    rel = pos - sink
    full_groups = max(0, (length - sink) // geometry.group)
    in_ladder = (rel >= 0) & (rel < full_groups * geometry.group)
    within = (rel % geometry.group)[None, :] - off[:, None]  # (layers, length)
    kept = (within >= 0) & (within < geometry.keep)
    return ~in_ladder[None, :] | kept


def compaction_step(n: int, cursor: int, *, budget: int, sink: int, recent: int, geometry: LadderGeometry,
                    offset: int) -> tuple[list[int] | None, int]:
    """Iterative compaction of one layer holding ``n`` entries (Sec. 3.3).

    Args:
        n: entries the layer holds now (oldest first).
        cursor: index of the first entry not yet compacted in the current pass (``sink`` at the start).
        budget: most entries a layer may hold after the step.
        sink: oldest entries never compacted. recent: newest entries never compacted.
        geometry: the ladder; offset: this layer's ``off[l]`` from :func:`ladder_offsets`.

    Returns:
        ``(keep, cursor)``: indices to keep, ascending (None when nothing is dropped), and the new cursor.
        The cursor only depends on ``n`` and the arguments shared by all layers, so every layer agrees.
    """
    if n <= budget:
        return None, cursor
    if geometry.freed == 0:  # one rung over all layers: nothing to compact, drop the oldest (StreamingLLM)
        return list(range(sink)) + list(range(n - (budget - sink), n)), cursor
    G, A = geometry.group, geometry.keep
    index = list(range(n))
    while len(index) > budget:
        if cursor + G > len(index) - recent:
            cursor = sink  # start over: the next pass compacts the already-compacted cache
            if cursor + G > len(index) - recent:
                raise ValueError(f"budget={budget} leaves no group of {G} entries to compact between sink={sink} "
                                 f"and recent={recent}; raise the budget to at least {sink + recent + G}")
        index[cursor:cursor + G] = index[cursor + offset:cursor + offset + A]
        cursor += A
    return index, cursor
