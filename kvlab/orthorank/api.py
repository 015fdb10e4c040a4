"""Public entry point of OrthoRank (Shin, Oh and Oh, ICML 2025, https://arxiv.org/abs/2507.03865).

::

    import kvlab
    from kvlab.orthorank import orthorank, sink_profile, search_layers, text_windows, perplexity

    model, tok = kvlab.load_model()
    profile = sink_profile(model, ids)                         # l_sink and the curves of Fig. 2-3
    with orthorank(model, layers=[12, 17, 20], token_ratio=0.33) as router:
        logits = model(ids).logits                             # those layers compute 33% of the tokens

OrthoRank changes *which tokens a layer computes*. The routed layer has two backends (``backend=`` of
:func:`orthorank`): ``"torch"``, :func:`kvlab.orthorank.reference.routed_layer` (the definition), and
``"triton"``, :func:`kvlab.orthorank.triton.routed_layer_triton` (scores, top-k, gathers, attention of the
selected queries and the scatter in Triton kernels); ``"auto"`` takes Triton on CUDA where it can run. The GPU
benchmark is :mod:`kvlab.experiments.bench.orthorank`. Layer choice and the baselines (SLEB, Shortened
LLaMA) live in :mod:`kvlab.orthorank.layers` and are re-exported here.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Iterable

import torch

from kvlab.core import capture_attention, check_float, check_int, check_token_ids, model_state, use_router
from kvlab.orthorank.layers import (Plan, LayerSearch, layers_for_sparsity, nominal_sparsity, perplexity,
                                    refusing_padding, search_layers, taylor_importance, text_windows, use_plan)
from kvlab.orthorank.reference import SinkCurves, sink_curves
from kvlab.orthorank.router import CRITERIA, DECODE_MODES, KV_MODES, OrthoRankRouter, RecordInputs, SkipLayer

__all__ = ["orthorank", "skip_layers", "OrthoRankRouter", "SkipLayer", "CRITERIA", "DECODE_MODES", "KV_MODES",
           "SinkProfile", "sink_profile", "Plan", "LayerSearch", "use_plan", "search_layers", "taylor_importance",
           "text_windows", "perplexity", "layers_for_sparsity", "nominal_sparsity", "flop_sparsity",
           "after_sink"]


def _check_layers(model, layers, what: str) -> list[int]:
    num_layers = model_state(model).num_layers
    if layers is None:
        return []
    if isinstance(layers, (int, str)) or not isinstance(layers, Iterable):
        raise TypeError(f"layers must be a list of decoder layer indices, got {type(layers).__name__}")
    out = []
    for i in layers:
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < num_layers:
            raise ValueError(f"layers must hold layer indices in 0..{num_layers - 1} ({what}), got {i!r}")
        out.append(int(i))
    if len(set(out)) != len(out):
        raise ValueError(f"layers must not repeat a layer, got {out}")
    return sorted(out)


def orthorank(model: torch.nn.Module, layers: Iterable[int] | None = None, token_ratio: float = 0.33, **options):
    """Context manager: the decoder ``layers`` compute only the ``token_ratio`` share of tokens most orthogonal
    to the sink token; yields the :class:`OrthoRankRouter` (``options``: ``criterion``, ``stage``, ``score``,
    ``kv``, ``sink``, ``decode``, ``seed``; see :mod:`kvlab.orthorank.router`).

    Raises ValueError for a ``token_ratio`` outside [0, 1] and for a token ratio without layers (which layers
    select tokens is part of the method: pick them with :func:`search_layers`). Within the block the model
    refuses a padded batch (an ``attention_mask`` with zeros): each row's first token is its sink and every
    token counts towards the ratio, so pads would be scored as tokens.
    """
    if isinstance(token_ratio, bool) or not isinstance(token_ratio, (int, float)):
        raise TypeError(f"token_ratio must be a number in [0, 1], got {type(token_ratio).__name__} {token_ratio!r}")
    if not 0.0 <= float(token_ratio) <= 1.0 or math.isnan(float(token_ratio)):
        raise ValueError(f"token_ratio must be in [0, 1] (the share of tokens a selected layer computes; "
                         f"the paper uses 0.33), got {token_ratio}")
    chosen = _check_layers(model, layers, "the layers that select tokens")
    if not chosen:
        raise ValueError(f"token_ratio={token_ratio} needs layers: a token ratio only applies to the layers that "
                         "select tokens; pass layers=[...] (at least one, after the sink layer; "
                         "search_layers(...) picks them as the paper does)")
    router = OrthoRankRouter(token_ratio, **options)
    return _installed(model, router, chosen, refuse_padding=True)


@contextlib.contextmanager
def _installed(model, router, layers, refuse_padding: bool = False):
    with contextlib.ExitStack() as stack:
        if refuse_padding:
            stack.enter_context(refusing_padding(model))
        stack.enter_context(use_router(model, router, layers))
        yield router


def skip_layers(model: torch.nn.Module, layers: Iterable[int]):
    """Context manager: the decoder ``layers`` are removed (SLEB, Shortened LLaMA): they return their input
    and cache nothing. An empty list is the dense model."""
    chosen = _check_layers(model, layers, "the layers to remove")
    if not chosen:
        return contextlib.nullcontext()
    return _installed(model, SkipLayer(), chosen)


@dataclass
class SinkProfile(SinkCurves):
    """:class:`~kvlab.orthorank.reference.SinkCurves` plus the attention mass on the first token.

    attention_mass ``(L,)``: mean attention probability that queries ``i >= 1`` give key 0, over heads.
    attention_layer: the first layer whose mass on token 0 exceeds half its maximum over layers (where the
    attention sink "occurs"; compare with ``sink_layer + 1``, the first layer that sees the massive sink).
    """

    attention_mass: torch.Tensor | None = None
    attention_layer: int | None = None


@torch.no_grad()
def sink_profile(model: torch.nn.Module, input_ids: torch.Tensor, *, attention: bool = True) -> SinkProfile:
    """Sec. 2's observations on ``input_ids (batch, seq)`` (or ``(seq,)``): the sink layer ``l_sink`` (where the
    first token's norm jumps), the cosine of every token to the sink per layer (Fig. 2), the sink's and the
    other tokens' self-similarity across layers (Fig. 3) and, with ``attention``, the attention mass on the
    first token per layer (eager attention of batch row 0: keep ``seq`` to a few hundred tokens)."""
    ids = check_token_ids("input_ids", input_ids, model.get_input_embeddings().num_embeddings)
    ids = ids[None] if ids.dim() == 1 else ids
    if ids.shape[1] < 2:
        raise ValueError(f"input_ids must hold at least 2 tokens (a sink and another), got {ids.shape[1]}")
    state = model_state(model)
    recorder = RecordInputs(state.num_layers)
    device = next(model.parameters()).device
    with use_router(model, recorder):
        model(input_ids=ids.to(device), use_cache=False)
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    curves = sink_curves(recorder.inputs, list(decoder.layers[:state.num_layers]), recorder.output)
    profile = SinkProfile(**vars(curves))
    if attention:
        probs = capture_attention(model, ids[:1])  # (layers, heads, q, n)
        mass = probs[:, :, 1:, 0].float().mean(dim=(1, 2))
        profile.attention_mass = mass
        profile.attention_layer = int(torch.nonzero(mass >= 0.5 * mass.max())[0])
    return profile


def after_sink(model: torch.nn.Module, sink_layer: int) -> list[int]:
    """The layers after ``sink_layer``: OrthoRank's candidates (Sec. 3.2)."""
    num_layers = model_state(model).num_layers
    sink_layer = check_int("sink_layer", sink_layer, -1, num_layers - 1)
    return list(range(sink_layer + 1, num_layers))


def flop_sparsity(config, *, removed: int = 0, routed: int = 0, token_ratio: float = 0.33,
                  seq_len: int = 2048) -> float:
    """Share of the decoder layers' multiply-adds skipped, counting what the paper's accounting leaves out:
    a routed layer still computes keys and values of every token (and its selected queries attend over all
    keys, causal: ``(seq_len + 1) / 2`` keys on average). ``config``: the model's (text) config."""
    cfg = config.get_text_config() if hasattr(config, "get_text_config") else config
    d, inter, layers = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
    hq = cfg.num_attention_heads
    hkv = getattr(cfg, "num_key_value_heads", None) or hq
    hd = getattr(cfg, "head_dim", None) or d // hq
    token_ratio = check_float("token_ratio", token_ratio, 0.0, 1.0)
    seq_len = check_int("seq_len", seq_len, 1)
    kv = 2 * d * hkv * hd
    per_query = 2 * d * hq * hd + 2 * hq * hd * (seq_len + 1) / 2 + 3 * d * inter
    dense = kv + per_query
    routed_cost = kv + math.floor(token_ratio * seq_len + 1e-9) / seq_len * per_query
    removed = check_int("removed", removed, 0, layers)
    routed = check_int("routed", routed, 0, layers - removed)
    return (removed * dense + routed * (dense - routed_cost)) / (layers * dense)
