"""TOVA, "Transformers are Multi-State RNNs" (Oren et al., 2024, https://arxiv.org/abs/2401.06104).

A score-based baseline that needs no accumulated history: when a layer holds more than ``budget`` entries,
it drops the entries that the *newest* query attended to least (attention averaged over heads), one per
step in token-by-token decoding. Unlike H2O it keeps no running sum, so an entry that was important long
ago but is ignored now goes first.
"""

from __future__ import annotations

import torch

from kvlab.core import LayerView, Policy, check_int

__all__ = ["TOVA"]


class TOVA(Policy):
    """Keep the ``budget`` entries with the highest attention from the newest query (Sec. 3 of the paper).

    Pseudocode (per layer, n entries held, ``a`` = last query's attention averaged over heads)::

        if n <= budget: keep all
        else: keep the `budget` entries of highest a, in order

    Args:
        budget: most entries each layer holds after a step.
        positions: ``"cache"`` (default, like the other baselines) or ``"original"``.
    """

    needs_scores = True
    static_reason = "it ranks entries by attention scores, which the static engine does not record"

    @classmethod
    def for_budget(cls, cache: int, *, tokenizer=None) -> "TOVA":
        """``TOVA(cache)``: the method splits its own budget (see the class docstring)."""
        return cls(cache)

    def __init__(self, budget: int, *, positions: str = "cache"):
        super().__init__(positions)
        self._budget = check_int("budget", budget, 1)

    @property
    def budget(self) -> int:
        return self._budget

    def keep(self, view: LayerView) -> torch.Tensor | None:
        if view.size <= self._budget:
            return None
        if view.last_scores is None:
            raise RuntimeError("TOVA needs attention scores: run it through kvlab's KVCache, which records them "
                               "when a policy sets needs_scores")
        return view.last_scores.topk(self._budget, dim=-1).indices.sort(dim=-1).values

    def __repr__(self) -> str:
        return f"TOVA(budget={self._budget}, positions={self.positions!r})"
