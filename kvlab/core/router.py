"""The door for layer routers: decide, per decoder layer and forward pass, which tokens the layer computes.

KV policies decide what a layer *keeps*; attention patterns decide what a layer's queries *see*. A router
decides what a layer *computes*: OrthoRank runs a layer for the tokens most orthogonal to the attention
sink and lets the others pass by the residual connection; REFORM stops the forward pass above an exit
layer while it encodes a long input. A router replaces the decoder layer's ``forward`` for the layers it is
installed on::

    class SkipLayer(LayerRouter):                      # the simplest router: the layer does nothing
        def __call__(self, call):
            return call.hidden_states

    with use_router(model, SkipLayer(), layers=[10, 11]):
        logits = model(input_ids).logits                # layers 10 and 11 are skipped (and cache nothing)

``call.run(hidden_states)`` runs the layer's own forward (on any subset or variant of the hidden states,
with the keyword arguments the model passed, e.g. ``position_embeddings``, which ``call.run`` accepts as
overrides). A router that computes a subset of tokens itself uses the layer's submodules
(``call.layer.self_attn``, ``call.layer.mlp``, ...) and, for attention, :func:`kvlab.core.attend`.

Routers compose with KV policies: a layer a router skips writes nothing into the :class:`~kvlab.core.KVCache`
(its ``KVLayer`` stays empty, so it costs no memory), and a layer that runs ``call.run`` caches as usual.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Iterable

import torch

from kvlab.core.state import ModelState, in_layers

__all__ = ["LayerRouter", "RouteCall", "use_router"]


@dataclass
class RouteCall:
    """One decoder layer's turn in a forward pass, handed to a router.

    hidden_states: ``(batch, seq, hidden)``, the layer's input. position_ids: ``(batch, seq)`` positions
    the model rotates at. token_ids: ``(batch, seq)`` or None (the model was fed embeddings).
    kwargs: what the model passed the layer (``position_embeddings=(cos, sin)``, ``attention_mask``,
    ``past_key_values``, ...).
    """

    layer_idx: int
    num_layers: int
    layer: torch.nn.Module
    hidden_states: torch.Tensor
    position_ids: torch.Tensor | None
    token_ids: torch.Tensor | None
    kwargs: dict[str, Any] = field(default_factory=dict)
    _forward: Any = None

    def run(self, hidden_states: torch.Tensor | None = None, **overrides) -> torch.Tensor:
        """The layer's own forward on ``hidden_states`` (default: the call's), keyword arguments overridden."""
        hs = self.hidden_states if hidden_states is None else hidden_states
        return self._forward(hs, **{**self.kwargs, **overrides})


class LayerRouter:
    """Base class: ``__call__(call: RouteCall) -> hidden states (batch, seq, hidden)``. The default runs the
    layer unchanged."""

    def __call__(self, call: RouteCall) -> torch.Tensor:
        return call.run()


def install_router_door(model: torch.nn.Module, state: ModelState) -> None:
    """Called once by :func:`kvlab.core.attach`: every decoder layer asks ``state.routers`` before running."""
    inner = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    for idx, layer in enumerate(inner.layers[: state.num_layers]):
        own = layer.forward
        layer.forward = functools.partial(_routed_forward, layer, idx, own, state)


def _routed_forward(layer, idx: int, own, state: ModelState, hidden_states, *args, **kwargs):
    router = state.routers.get(idx)
    if router is None:
        return own(hidden_states, *args, **kwargs)
    if args:  # transformers passes everything but the hidden states by keyword; keep it that way here
        raise RuntimeError("kvlab routers expect decoder layers to be called with keyword arguments")
    step = state.step
    call = RouteCall(idx, state.num_layers, layer, hidden_states,
                     kwargs.get("position_ids", step.position_ids if step is not None else None),
                     step.input_ids if step is not None else None, kwargs, own)
    out = router(call)
    if not isinstance(out, torch.Tensor) or out.shape != hidden_states.shape:
        raise RuntimeError(f"router {type(router).__name__} must return hidden states of shape "
                           f"{tuple(hidden_states.shape)}, got {getattr(out, 'shape', type(out).__name__)}")
    return out


def use_router(model: torch.nn.Module, router: LayerRouter | None, layers: Iterable[int] | None = None):
    """Within the block, ``router`` runs the decoder ``layers`` (default: all). ``None`` changes nothing."""
    return in_layers(model, "routers", router, layers, "router must be a LayerRouter")
