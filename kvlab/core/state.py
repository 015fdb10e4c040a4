"""kvlab's bookkeeping for one attached model, shared by the attention function, the cache and routers.

Kept in its own module so that :mod:`kvlab.core.cache` and :mod:`kvlab.core.attention` both read it without
importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from kvlab.core.pattern import AttentionPattern
    from kvlab.core.router import LayerRouter

__all__ = ["ModelState", "StepInfo", "model_state"]


@dataclass
class StepInfo:
    """What the model-level pre-hook learnt about the forward pass under way."""

    input_ids: torch.Tensor | None
    position_ids: torch.Tensor  # (batch, q) positions the queries are rotated at
    cache: Any | None  # the KVCache in use, if any
    fresh: bool = False  # the step starts the sequence: positions 0..q-1, nothing cached before


@dataclass
class ModelState:
    """Stored on the model and on its attention modules by :func:`kvlab.core.attach`."""

    base_implementation: str  # "sdpa" or "eager": what runs when kvlab has nothing to change
    num_layers: int
    inv_freq: list[torch.Tensor | None]  # RoPE frequencies per layer (None: no rotary embedding known)
    sliding_window: list[int | None]  # window of each layer (Gemma3's local layers), None for global ones
    patterns: dict[int, "AttentionPattern"] = field(default_factory=dict)  # layer -> prefill pattern
    routers: dict[int, "LayerRouter"] = field(default_factory=dict)  # layer -> router
    capture: dict[int, torch.Tensor] | None = None  # layer -> captured attention probabilities
    step: StepInfo | None = None


def model_state(model: torch.nn.Module) -> ModelState:
    state = getattr(model, "_kvlab_state", None)
    if state is None:
        raise RuntimeError("this model is not attached to kvlab: call kvlab.core.attach(model) "
                           "(kvlab.load_model does it for you)")
    return state
