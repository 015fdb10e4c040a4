"""H2O, the heavy-hitter oracle (Zhang et al., NeurIPS 2023, https://arxiv.org/abs/2306.14048).

An attention-score method: the baseline LaCache compares against in throughput (LaCache Fig. 7). Each
layer keeps its ``recent`` newest entries and, among the older ones, the "heavy hitters": the entries that
received the most attention, summed over heads and over every query since they arrived (H2O Sec. 3-4).
Reading those scores needs the attention probabilities, so the model runs eager attention instead of a
fused kernel (SDPA / FlashAttention): that is the cost LaCache avoids.
"""

from __future__ import annotations

import torch

from kvlab.core import LayerView, Policy, check_int

__all__ = ["H2O"]


class H2O(Policy):
    """Heavy hitters + recent window, ``budget`` entries per layer.

    Pseudocode (per layer, n entries held, accumulated attention ``score``)::

        if n <= budget: keep all
        else: keep the `recent` newest + the (budget - recent) older entries of highest score, in order

    Args:
        budget: most entries each layer holds after a step.
        recent: newest entries always kept (``0 <= recent <= budget``; H2O's paper uses half the budget).
        positions: ``"cache"`` (default, like StreamingLLM) or ``"original"``.
    """

    needs_scores = True
    static_reason = "it ranks entries by attention scores, which the static engine does not record"

    @classmethod
    def for_budget(cls, cache: int, *, tokenizer=None) -> "H2O":
        """``H2O(cache)``: the method splits its own budget (see the class docstring)."""
        return cls(cache)

    def __init__(self, budget: int, recent: int | None = None, *, positions: str = "cache"):
        super().__init__(positions)
        self._budget = check_int("budget", budget, 1)
        recent = budget // 2 if recent is None else recent
        self.recent = check_int("recent", recent, 0)
        if self.recent > budget:
            raise ValueError(f"recent ({recent}) must be <= budget ({budget}): the recent window is part of it")

    @property
    def budget(self) -> int:
        return self._budget

    def keep(self, view: LayerView) -> torch.Tensor | None:
        n = view.size
        if n <= self._budget:
            return None
        if view.scores is None:
            raise RuntimeError("H2O needs attention scores: run it through kvlab's KVCache, which records them "
                               "when a policy sets needs_scores")
        old = n - self.recent
        heavy = self._budget - self.recent
        scores = view.scores[:, :old]
        top = scores.topk(heavy, dim=-1).indices.sort(dim=-1).values  # (batch, heavy)
        recent = torch.arange(old, n, device=top.device).expand(top.shape[0], -1)
        return torch.cat([top, recent], dim=-1)

    def __repr__(self) -> str:
        return f"H2O(budget={self._budget}, recent={self.recent}, positions={self.positions!r})"
