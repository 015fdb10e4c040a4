"""The layers a study's plans are sized and named in, and the model that runs them.

A full run sizes and names its plans on the model it runs (``Fig4 L29 orthogonal``, ``T4 layers 0.30 / tokens
0.33``: layer 29 of SmolLM2's 30, 9 of its 30 layers). A ``--smoke`` run runs a tiny random model of the same
architecture (4 layers, :func:`kvlab.experiments.orthorank.commands.load_model`) whose sink profile means nothing;
to write records under the full run's method names it keeps the full model's frame: its depth (the architecture's
own config) and its ``l_sink`` (the ``--layers`` file's, notebook 11's profile of the full model), with layer ``l``
of the full model running as ``l mod 4`` of the tiny one (the folding of
:func:`read_layers`). Where either is unknown (no ``--layers`` file, or one
without ``l_sink``), a smoke run sizes and names its plans on the tiny model itself.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

if TYPE_CHECKING:  # the plans' module loads torch: imported where a plan is folded
    from kvlab.orthorank.layers import Plan

__all__ = ["LayerFrame", "layer_frame", "full_depth"]


@dataclass(frozen=True)
class LayerFrame:
    """``num_layers`` / ``sink_layer``: the depth and ``l_sink`` the plans are sized and named in;
    ``model_layers``: the depth of the model that runs them (the same in a full run)."""

    num_layers: int
    sink_layer: int
    model_layers: int

    def __post_init__(self):
        if not 1 <= self.model_layers <= self.num_layers:
            raise ValueError(f"model_layers must lie in 1..num_layers={self.num_layers}, got {self.model_layers}")
        if not -1 <= self.sink_layer < self.num_layers:
            raise ValueError(f"sink_layer must lie in -1..{self.num_layers - 1}, got {self.sink_layer}")

    @property
    def folded(self) -> bool:
        """Whether the plans' layers are a deeper model's, folded onto the one that runs them."""
        return self.num_layers != self.model_layers

    def after_sink(self) -> list[int]:
        """The layers after ``l_sink`` in the frame (OrthoRank's candidates, Sec. 3.2)."""
        return list(range(self.sink_layer + 1, self.num_layers))

    def fold(self, layers: Iterable[int]) -> tuple[int, ...]:
        """The model's layers that run the frame's ``layers`` (``l mod model_layers``), sorted, each once."""
        return tuple(sorted({int(layer) % self.model_layers for layer in layers}))

    def plan(self, plan: Plan) -> Plan:
        """``plan`` (the frame's layers) on the model that runs it; a layer folded onto a removed one is removed."""
        removed = self.fold(plan.removed)
        routed = tuple(layer for layer in self.fold(plan.routed) if layer not in removed)
        from kvlab.orthorank.layers import Plan

        return Plan(removed=removed, routed=routed, router=dict(plan.router))

    def as_dict(self) -> dict:
        return asdict(self)


def full_depth(model_name: str) -> int | None:
    """The decoder depth of kvlab model ``model_name`` from its own config (no weights read); None if unknown."""
    try:
        from transformers import AutoConfig

        from kvlab.models import converted_path

        config = AutoConfig.from_pretrained(converted_path(model_name))
    except (KeyError, OSError, ValueError):  # not converted, or not a kvlab id
        return None
    config = getattr(config, "text_config", config)
    depth = getattr(config, "num_hidden_layers", None)
    return int(depth) if depth else None


def layer_frame(args, model, sink_layer: int) -> LayerFrame:
    """The frame of a study run with ``args`` on ``model`` whose profiled ``l_sink`` is ``sink_layer``: the model's
    own, or in a ``--smoke`` run the full model's where its depth and ``l_sink`` are known (see the module's text)."""
    depth = model.config.get_text_config().num_hidden_layers
    own = LayerFrame(depth, sink_layer, depth)
    if not args.smoke or not args.layers:
        return own

    full, sink = full_depth(args.model), read_layers(args.layers, depth).get("l_sink")
    if full is None or full < depth or not isinstance(sink, int) or not -1 <= sink < full - 1:
        return own
    return LayerFrame(full, sink, depth)


def read_layers(path: str | Path, num_layers: int, smoke: bool = False) -> dict:
    """A results JSON naming layers (notebook 11's ``sleb_order`` / ``orthorank_order`` and ``table`` rows'
    ``removed`` / ``routed``). ``smoke``: layer ``l`` of the full model becomes ``l mod num_layers`` of the tiny
    one (orders keep each layer's first place), so the plans stay of their kind on a model with fewer layers."""
    found = json.loads(Path(path).read_text())
    if not smoke:
        return found

    def fold(layers):
        return list(dict.fromkeys(int(layer) % num_layers for layer in layers))

    for key in ("sleb_order", "orthorank_order"):
        if key in found:
            found[key] = fold(found[key])
    found["table"] = [dict(row, **{k: sorted(fold(row[k])) for k in ("removed", "routed") if k in row})
                      for row in found.get("table", [])]
    return found
