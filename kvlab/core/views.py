"""What a policy sees when it decides what to keep: one layer of a :class:`~kvlab.core.KVCache`
(:class:`LayerView`) or every layer of a :class:`~kvlab.core.StaticKVCache` at once (:class:`StaticView`).

Their own module, so that :mod:`kvlab.core.policy` (which documents them), :mod:`kvlab.core.cache` and
:mod:`kvlab.core.static` all import them without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["LayerView", "StaticView"]


@dataclass
class LayerView:
    """What a policy sees of one layer when it decides what to keep (after a forward step).

    All tensors are ``(batch, n)`` over the ``n`` entries the layer holds now, oldest first.
    """

    layer_idx: int
    num_layers: int
    seen: int  # tokens of the stream processed so far (the current step included)
    positions: torch.Tensor  # original position of each entry in the stream
    token_ids: torch.Tensor  # token id of each entry (-1 when the model was fed embeddings)
    scores: torch.Tensor | None  # attention received since the entry arrived, summed over heads and queries
    last_scores: torch.Tensor | None  # attention from the newest query, averaged over heads
    state: dict[str, Any]  # scratch space a stateful policy keeps for this layer

    @property
    def size(self) -> int:
        return self.positions.shape[-1]



@dataclass
class StaticView:
    """What a policy's :meth:`~kvlab.core.Policy.static_keep` sees, after the step's entry was appended: every
    layer of every stream at once, one *row* per (layer, stream) pair (``rows = layers * B``, layer-major).
    Tensors are ``(rows, C)`` over all ``C`` slots; only slots ``< length`` are live."""

    layer: torch.Tensor  # (rows,) long: the layer each row belongs to
    num_layers: int
    seen: torch.Tensor  # 0-d long: tokens of the stream processed so far, this step included
    length: torch.Tensor  # (rows,) long: live entries per row
    positions: torch.Tensor
    token_ids: torch.Tensor
    state: dict[str, torch.Tensor]  # the policy's scratch tensors, (rows, ...) (static_state), updated in place

    @property
    def slots(self) -> torch.Tensor:
        """``(1, C)`` slot indices."""
        return torch.arange(self.positions.shape[1], device=self.positions.device)[None]

    @property
    def live(self) -> torch.Tensor:
        """``(rows, C)`` bool: the slot holds an entry."""
        return self.slots < self.length[:, None]

