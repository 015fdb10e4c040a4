"""OrthoRank's routers, through kvlab.core's layer-router door: which tokens a decoder layer computes.

:class:`OrthoRankRouter` runs a chosen layer for the ``int(token_ratio * seq)`` tokens most orthogonal to the
sink token (Algorithm 1) and lets the others pass by the residual; every token still gives its key and
value (Table 3). Its options are the paper's ablations (Table 3):

* ``criterion``: ``"orthogonal"`` (the method: smallest ``|h_bar_0 . h_bar_i|``), ``"least_orthogonal"``
  (Orthogonal-down, row 2: the largest), ``"random"`` (row 1);
* ``stage``: ``"normalized"`` (the layer's input RMSNorm, row 5) or ``"raw"`` (the residual stream, row 3);
* ``kv``: ``"all"`` (row 5), ``"selected"`` (row 4, no K/V for the unselected tokens; the sink, never selected,
  keeps its K/V, so row 4 differs from row 5 in that one thing) or ``"selected_no_sink"`` (row 4 read literally:
  the sink's K/V go too, a second change reported as its own row); both ablations prefill only;
* ``score``: ``"dot"`` (Eq. 4), ``"cos"`` (Eq. 3) or ``"grad"`` (Eq. 1 exactly);
* ``sink``: ``"skip"`` (Algorithm 1: the sink's score is +inf, it is never selected) or ``"select"``.

Backends (``backend=``): ``"torch"`` runs :func:`kvlab.orthorank.reference.routed_layer`, the definition;
``"triton"`` runs :func:`kvlab.orthorank.triton.routed_layer_triton` (Eq. 4 scores, top-k, row gathers, the
attention of the selected queries and the scatter back in Triton kernels; inference, ``kv="all"``, no logit
soft-capping; CUDA, or CPU under ``TRITON_INTERPRET=1``) and raises ValueError naming the fix where it cannot;
``"auto"`` (default) takes ``"triton"`` for CUDA tensors where it can run and ``"torch"`` otherwise (CPU,
gradients, the ``kv`` ablations, soft-capping, no Triton). Passes after the first (decoding) select in PyTorch.

Generation (our reading; the paper measures prefill throughput, perplexity and log-likelihood scoring only)
---------------------------------------------------------------------------------------------------------
A forward pass that starts the sequence (position 0 present) is selected exactly as Algorithm 1 says. A
later pass (decoding, or a prompt fed in chunks) no longer contains the sink token, and ``int(ratio * 1)``
is 0 for a single token, so Algorithm 1 would never compute a generated token. ``decode`` says what then:

* ``"threshold"`` (default): the router keeps, per layer and sequence, the sink's normalised state and the
  largest score it selected in the first pass; a later token is computed when its score (against the kept
  sink state) is at most that threshold. Same criterion, but not the same share: generated tokens score
  differently from prompt tokens (notebook 11, SmolLM2-135M-Instruct, 9 routed layers at 33 %: 14 % of the
  generated tokens computed against 33 % of the prompt's); ``router.computed_ratio()`` reports the share.
* ``"dense"``: later tokens run every layer (the dense model's decoding; savings in prefill only).
* ``"topk"``: Algorithm 1 applied within each later pass (``int(ratio * chunk)`` tokens; 0 for one token,
  i.e. generated tokens only give their K and V in the selected layers).

With ``criterion="random"`` a later token is computed with probability ``token_ratio``.
"""

from __future__ import annotations

import importlib

import torch

from kvlab.core import LayerRouter, RouteCall, check_choice, check_float, check_int
from kvlab.orthorank.reference import (KV_MODES, SCORES, SINK_RULES, STAGES, alignment, normalized_states,
                                       routed_layer, select_topk, tokens_for_ratio)

__all__ = ["BACKENDS", "CRITERIA", "DECODE_MODES", "KV_MODES", "OrthoRankRouter", "SkipLayer", "RecordInputs"]

BACKENDS = ("auto", "torch", "triton")
CRITERIA = ("orthogonal", "least_orthogonal", "random")
DECODE_MODES = ("threshold", "dense", "topk")


class OrthoRankRouter(LayerRouter):
    """Runs a decoder layer for the tokens most orthogonal to the sink (see the module docstring).

    Args:
        token_ratio: share of the tokens a routed layer computes, in [0, 1] (paper: 0.33).
        criterion, stage, score, kv, sink, decode: see the module docstring.
        seed: seed of ``criterion="random"``.
        backend: ``"auto" | "torch" | "triton"`` (module docstring).
        inplace: the Triton path writes the computed rows into the layer's input tensor instead of a copy of
            it (saves one copy of the hidden states per routed layer; only where nothing else keeps the layer
            inputs, e.g. not with ``output_hidden_states=True``).

    ``router.computed_ratio()`` is the share of (token, layer) pairs computed so far in the routed layers
    (``part="prompt"``: in passes that start the sequence; ``"decode"``: in later passes);
    ``router.last_selected[layer]`` the ``(batch, seq)`` bool mask of the last pass (for pictures).
    """

    def __init__(self, token_ratio: float = 0.33, *, criterion: str = "orthogonal", stage: str = "normalized",
                 score: str = "dot", kv: str = "all", sink: str = "skip", decode: str = "threshold", seed: int = 0,
                 backend: str = "auto", inplace: bool = False):
        self.token_ratio = check_float("token_ratio", token_ratio, 0.0, 1.0)
        self.criterion = check_choice("criterion", criterion, CRITERIA)
        self.stage = check_choice("stage", stage, STAGES)
        self.score = check_choice("score", score, SCORES)
        self.kv = check_choice("kv", kv, KV_MODES)
        self.sink = check_choice("sink", sink, SINK_RULES)
        self.decode = check_choice("decode", decode, DECODE_MODES)
        self.seed = check_int("seed", seed, 0)
        self.backend = check_choice("backend", backend, BACKENDS)
        if not isinstance(inplace, bool):
            raise TypeError(f"inplace must be True or False, got {type(inplace).__name__} {inplace!r}")
        self.inplace = inplace
        self.generator = torch.Generator().manual_seed(self.seed)
        self.memory: dict[int, dict[str, torch.Tensor]] = {}  # layer -> sink state, threshold (first pass)
        self.last_selected: dict[int, torch.Tensor] = {}
        self.counts = {"prompt": [0, 0], "decode": [0, 0]}  # computed, offered (token x layer)

    def __repr__(self) -> str:
        return (f"OrthoRankRouter(token_ratio={self.token_ratio}, criterion={self.criterion!r}, stage={self.stage!r}, "
                f"score={self.score!r}, kv={self.kv!r}, sink={self.sink!r}, decode={self.decode!r}, "
                f"backend={self.backend!r})")

    def computed_ratio(self, part: str | None = None) -> float:
        """Share of the tokens the routed layers computed so far (1.0 before any pass); ``part``: None (all),
        ``"prompt"`` (passes that start the sequence) or ``"decode"`` (later passes)."""
        parts = ("prompt", "decode") if part is None else (check_choice("part", part, ("prompt", "decode")),)
        done = sum(float(self.counts[p][0]) for p in parts)
        offered = sum(self.counts[p][1] for p in parts)
        return done / offered if offered else 1.0

    def reset(self) -> None:
        self.memory.clear()
        self.last_selected.clear()
        self.counts = {"prompt": [0, 0], "decode": [0, 0]}
        self.generator.manual_seed(self.seed)

    # -- scores: smaller = computed first --------------------------------------------------------------
    def _scores(self, states: torch.Tensor, sink_state: torch.Tensor | None) -> torch.Tensor:
        if self.criterion == "random":
            return torch.rand(states.shape[:2], generator=self.generator).to(states.device)
        s = alignment(states, self.score, sink_state)
        return s if self.criterion == "orthogonal" else -s

    def __call__(self, call: RouteCall) -> torch.Tensor:
        h = call.hidden_states
        batch, seq, _ = h.shape
        if call.position_ids is None:
            raise RuntimeError("OrthoRankRouter needs the position ids of the pass (call the model with input_ids)")
        positions = call.position_ids.expand(batch, seq)
        first = _starts_sequence(call, positions)
        memory = self.memory.get(call.layer_idx)
        if not first and memory is None:
            raise RuntimeError(f"layer {call.layer_idx}: a pass that does not start at position 0 came before any "
                               "pass that did; the router needs the sink token (position 0) first")
        path = self._path(call.layer, h)  # the torch or the Triton path, chosen once for this call
        states, scores = path.states_and_scores(call.layer, h, first)
        if first:
            selected, valid = self._select_prompt(path, call.layer_idx, states, scores), None
        elif self.decode == "dense":
            selected, valid = torch.arange(seq, device=h.device).expand(batch, seq), None
        else:
            selected, valid = _mask_to_indices(self._chosen_in_decode(states, memory))
        self._record(call.layer_idx, selected, valid, first, h)
        if selected.shape[1] == seq and (valid is None or bool(valid.all())):
            return call.run()  # every token computed: the layer's own forward, exactly the dense model
        kwargs = call.kwargs
        args = dict(position_embeddings=kwargs["position_embeddings"], positions=_original_positions(call, positions),
                    past_key_values=kwargs.get("past_key_values"), valid=valid,
                    normed=states if self.stage == "normalized" else None)
        return path.routed_layer(call.layer, h, selected, args)

    def _select_prompt(self, path, layer_idx: int, states: torch.Tensor, scores) -> torch.Tensor:
        """A pass that starts the sequence: the top-``k`` tokens by score (Eq. 4), and the threshold and sink state
        that later passes reuse."""
        batch, seq = states.shape[:2]
        k = tokens_for_ratio(self.token_ratio, seq)
        scores = path.prompt_scores(states, scores)
        selected = path.topk(scores, k, self.sink)
        picked = scores.gather(1, selected)
        if self.sink == "select" and k > 0:
            picked = picked[:, 1:]  # the sink's forced score is not a threshold
        threshold = picked.max(dim=1).values if picked.shape[1] else scores.new_full((batch,), float("-inf"))
        self.memory[layer_idx] = {"sink": states[:, 0].detach().clone(), "threshold": threshold.detach()}
        return selected

    def _chosen_in_decode(self, states: torch.Tensor, memory: dict) -> torch.Tensor:
        """A later pass (``decode`` = ``"threshold"`` or ``"topk"``): the ``(batch, seq)`` mask of computed tokens."""
        batch, seq = states.shape[:2]
        if self.criterion == "random" and self.decode == "threshold":
            return torch.rand((batch, seq), generator=self.generator).to(states.device) < self.token_ratio
        scores = self._scores(states, memory["sink"])
        if self.decode == "threshold":
            return scores <= memory["threshold"][:, None]
        k = tokens_for_ratio(self.token_ratio, seq)
        order = torch.sort(scores, dim=-1, stable=True).indices[:, :k]
        return torch.zeros_like(scores, dtype=torch.bool).scatter_(1, order, True)

    def _record(self, layer_idx: int, selected: torch.Tensor, valid, first: bool, h: torch.Tensor) -> None:
        """The last pass's mask (for pictures) and the computed / offered counts (no host sync)."""
        batch, seq = h.shape[:2]
        mask = torch.zeros(batch, seq, dtype=torch.bool, device=h.device)
        mask.scatter_(1, selected, True if valid is None else valid)
        self.last_selected[layer_idx] = mask
        part = self.counts["prompt" if first else "decode"]
        part[0] = part[0] + mask.sum()  # a device tensor: no host sync in the forward pass
        part[1] += batch * seq

    def _path(self, layer: torch.nn.Module, h: torch.Tensor):
        """The one place the backend is chosen: :class:`_TorchPath` or :class:`_TritonPath` (see ``backend``)."""
        if self.backend == "torch" or (self.backend == "auto" and not h.is_cuda):
            return _TorchPath(self)
        try:
            kernels = importlib.import_module("kvlab.orthorank.triton")
        except ImportError as err:
            if self.backend == "auto":
                return _TorchPath(self)
            raise ValueError("backend='triton' needs the triton package; use backend='torch'") from err
        try:
            kernels.check_routed_layer_triton(layer, h, self.kv)
        except ValueError:
            if self.backend == "auto":
                return _TorchPath(self)
            raise
        return _TritonPath(self, kernels)


class _TorchPath:
    """The readable path: RMSNorm, scores and top-k in eager PyTorch, then :func:`routed_layer`."""

    def __init__(self, router: OrthoRankRouter):
        self.router = router

    def states_and_scores(self, layer, h, first: bool):
        states = normalized_states(layer, h) if self.router.stage == "normalized" else h
        return states, None

    def prompt_scores(self, states, scores):
        return self.router._scores(states, None)

    def topk(self, scores, k: int, sink: str):
        return select_topk(scores, k, sink)

    def routed_layer(self, layer, h, selected, args: dict):
        return routed_layer(layer, h, selected, kv=self.router.kv, **args)


class _TritonPath(_TorchPath):
    """The fast path (:mod:`kvlab.orthorank.triton`): fused RMSNorm + Eq. 4 scores, in-order top-k, routed layer."""

    def __init__(self, router: OrthoRankRouter, kernels):
        super().__init__(router)
        self.kernels = kernels
        self.dot = router.criterion == "orthogonal" and router.score == "dot"

    def states_and_scores(self, layer, h, first: bool):
        if first and self.dot and self.router.stage == "normalized":
            return self.kernels.normalized_scores(layer, h)  # the RMSNorm and Eq. 4 in one pass
        return super().states_and_scores(layer, h, first)

    def prompt_scores(self, states, scores):
        if scores is not None:
            return scores
        return self.kernels.orthogonal_scores(states) if self.dot else self.router._scores(states, None).float()

    def topk(self, scores, k: int, sink: str):
        return self.kernels.topk_in_order(scores, k, sink)

    def routed_layer(self, layer, h, selected, args: dict):
        return self.kernels.routed_layer_triton(layer, h, selected, inplace=self.router.inplace, **args)


def _starts_sequence(call: RouteCall, positions: torch.Tensor) -> bool:
    """Does this pass contain position 0? kvlab's step knows without reading the device tensor (no sync)."""
    state = getattr(call.layer.self_attn, "_kvlab_state", None)
    step = getattr(state, "step", None)
    if step is not None and step.fresh:
        return True
    return bool((positions[:, 0] == 0).all())


def _mask_to_indices(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Sorted indices ``(batch, k_max)`` of the True entries of ``mask (batch, seq)``, padded (valid mask)."""
    k_max = int(mask.sum(dim=1).max())
    # True entries first, in order (stable sort of the negated mask), then the False ones as padding
    order = torch.sort((~mask).to(torch.int8), dim=1, stable=True).indices[:, :k_max]
    order = torch.sort(order, dim=1).values
    valid = mask.gather(1, order)
    return order, (None if bool(valid.all()) else valid)


def _original_positions(call: RouteCall, positions: torch.Tensor) -> torch.Tensor:
    """Stream positions for the causal rule: a kvlab KVCache that shifts positions ("cache" mode) hands the
    model rotated positions; the original ones are on its step."""
    cache = call.kwargs.get("past_key_values")
    step = getattr(cache, "_step", None)
    new = getattr(step, "new_positions", None)
    if isinstance(new, torch.Tensor) and new.shape[-1] == positions.shape[-1]:
        return new.to(positions.device).expand_as(positions)
    return positions


class SkipLayer(LayerRouter):
    """Layer removal (SLEB, Shortened LLaMA): the layer returns its input and caches nothing."""

    def __call__(self, call: RouteCall) -> torch.Tensor:
        return call.hidden_states

    def __repr__(self) -> str:
        return "SkipLayer()"


class RecordInputs(LayerRouter):
    """Runs every layer unchanged and records its input ``(batch, seq, hidden)`` (and the last output)."""

    def __init__(self, num_layers: int):
        self.inputs: list[torch.Tensor | None] = [None] * num_layers
        self.output: torch.Tensor | None = None

    def __call__(self, call: RouteCall) -> torch.Tensor:
        self.inputs[call.layer_idx] = call.hidden_states.detach()
        out = call.run()
        if call.layer_idx == call.num_layers - 1:
            self.output = out.detach()
        return out
