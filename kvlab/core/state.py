"""kvlab's bookkeeping for one attached model, shared by the attention function, the cache and routers.

Kept in its own module so that :mod:`kvlab.core.cache` and :mod:`kvlab.core.attention` both read it without
importing each other. It sits below :mod:`kvlab.core.pattern` and :mod:`kvlab.core.router`, which install their
objects here through :func:`in_layers`: it stores them as the callables they are and imports neither.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator

import torch

__all__ = ["ModelState", "StepInfo", "in_layers", "model_state"]


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
    # layer -> prefill pattern (a kvlab.core.pattern.AttentionPattern)
    patterns: dict[int, Callable[..., Any]] = field(default_factory=dict)
    # layer -> router (a kvlab.core.router.LayerRouter)
    routers: dict[int, Callable[..., Any]] = field(default_factory=dict)
    capture: dict[int, torch.Tensor] | None = None  # layer -> captured attention probabilities
    step: StepInfo | None = None


def model_state(model: torch.nn.Module) -> ModelState:
    state = getattr(model, "_kvlab_state", None)
    if state is None:
        raise RuntimeError("this model is not attached to kvlab: call kvlab.core.attach(model) "
                           "(kvlab.load_model does it for you)")
    return state


def chosen_layers(num_layers: int, layers: Iterable[int] | None) -> list[int]:
    """``layers`` checked against the model (default: all of them)."""
    chosen = list(range(num_layers)) if layers is None else list(layers)
    for i in chosen:
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < num_layers:
            raise ValueError(f"layer {i!r} does not exist: the model has layers 0..{num_layers - 1}")
    return chosen


@contextlib.contextmanager
def _installed(table: dict, chosen: list[int], item) -> Iterator[None]:
    saved = dict(table)
    try:
        table.update({i: item for i in chosen})
        yield
    finally:
        table.clear()
        table.update(saved)


def in_layers(model: torch.nn.Module, table: str, item, layers: Iterable[int] | None, what: str):
    """A context manager that puts ``item`` in ``layers`` of the model's ``table`` ("patterns", "routers") for
    the block and restores the table afterwards; ``item=None`` changes nothing."""
    state = model_state(model)
    if item is not None and not callable(item):
        raise TypeError(f"{what} (callable), got {type(item).__name__}")
    chosen = chosen_layers(state.num_layers, layers)
    if item is None:
        return contextlib.nullcontext()
    return _installed(getattr(state, table), chosen, item)
