"""How kvlab plugs into a transformers model: one attention function, two hooks, no forked model code.

``attach(model)`` (``kvlab.load_model`` calls it) does four things, all through public transformers APIs:

1. registers the attention function ``"kvlab"`` with ``AttentionInterface`` (and the matching mask
   function with ``AttentionMaskInterface``) and switches the model to it with
   ``model.set_attn_implementation("kvlab")``;
2. adds a forward pre-hook on the model that tells a :class:`~kvlab.core.KVCache` which tokens arrive
   (token ids, original positions) and, for policies that use positions within the cache, rewrites
   ``position_ids``;
3. adds a forward post-hook that lets the cache's policy compact every layer once the step is over;
4. wraps ``generate`` so that a call with a used KVCache refuses a prompt that does not start with the stream the
   cache holds (generate would read it as a continuation): checked once per call, not per step.

The attention function does what the model's own implementation (sdpa or eager) would do, unless

* a :class:`~kvlab.core.KVCache` is in use: the mask is then built from the *original positions* of
  the entries the cache holds (causal order survives eviction; Gemma3's sliding window too), and when
  the policy asks for attention scores (H2O, TOVA) they are computed eagerly and handed to the cache;
* a *prefill attention pattern* is active for the layer (``with use_pattern(model, pattern): ...``):
  the pattern computes attention itself, from the queries, keys, values and an :class:`AttentionCall`
  that carries positions and token ids (SepLLM's mask, DHSA's chunk mask, a Triton kernel);
* attention maps are being captured (``capture_attention``) for pictures;
* a :class:`~kvlab.core.StaticKVCache` is in use (the fast decode engine): the cache attends over its
  live slots itself.

It also opens the door for layer routers (:mod:`kvlab.core.router`): every decoder layer first asks
whether a router runs it (OrthoRank computes a subset of tokens, REFORM exits early).

Supported architectures: Llama (SmolLM2), Qwen2 and Gemma3 (text). Batch size 1 works everywhere; batch
> 1 works when all rows have the same length (no padding) and the policy keeps equally many entries per
row (Full, StreamingLLM, LaCache, H2O); padded batches raise.
"""

from __future__ import annotations

import contextlib
import types
from typing import Iterable, Iterator

import torch

from kvlab.core.cache import KVCache
from kvlab.core.pattern import AttentionCall, attend, causal_mask
from kvlab.core.router import install_router_door
from kvlab.core.static import StaticKVCache
from kvlab.core.state import ModelState, StepInfo, model_state

__all__ = ["SUPPORTED_ARCHITECTURES", "attach", "capture_attention", "eager_base"]

SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "gemma3_text")
_NAME = "kvlab"


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask, sdpa_mask

    # Two names, one function: the mask transformers prepares must suit the implementation kvlab falls back
    # to when it has nothing to do (boolean for SDPA, additive for eager).
    AttentionInterface.register(_NAME, _kvlab_attention)
    AttentionMaskInterface.register(_NAME, sdpa_mask)
    AttentionInterface.register(_NAME + "_eager", _kvlab_attention)
    AttentionMaskInterface.register(_NAME + "_eager", eager_mask)


def _base_function(state: ModelState, module):
    """The model's own attention: SDPA through transformers' interface, eager from the model's source."""
    if state.base_implementation == "eager":
        import sys

        return sys.modules[type(module).__module__].eager_attention_forward
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    return ALL_ATTENTION_FUNCTIONS[state.base_implementation]


def attach(model: torch.nn.Module) -> torch.nn.Module:
    """Route ``model``'s attention through kvlab (idempotent). Returns the model."""
    if getattr(model, "_kvlab_state", None) is not None:
        return model
    config = model.config
    model_type = getattr(config, "model_type", None)
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    if model_type not in SUPPORTED_ARCHITECTURES and getattr(text_config, "model_type", None) not in SUPPORTED_ARCHITECTURES:
        raise NotImplementedError(
            f"kvlab supports the architectures {', '.join(SUPPORTED_ARCHITECTURES)}; "
            f"this model is '{model_type}'. Load one of kvlab's models (kvlab.assets.list_assets()) "
            "or open an issue for the architecture you need."
        )
    _register()
    base = config._attn_implementation or "sdpa"
    if base not in ("sdpa", "eager"):  # flash/flex kernels cannot take kvlab's masks: SDPA stands in
        base = "sdpa"
    num_layers = text_config.num_hidden_layers
    inner = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    rotary = getattr(inner, "rotary_emb", None)
    layer_types = getattr(text_config, "layer_types", None) or ["full_attention"] * num_layers
    inv_freq, windows = [], []
    for i in range(num_layers):
        kind = layer_types[i]
        freq = getattr(rotary, f"{kind}_inv_freq", None) if rotary is not None else None
        if freq is None and rotary is not None:
            freq = getattr(rotary, "inv_freq", None)
        inv_freq.append(None if freq is None else freq.detach().clone())
        sliding = kind == "sliding_attention" and getattr(text_config, "sliding_window", None)
        windows.append(int(text_config.sliding_window) if sliding else None)
    state = ModelState(base, num_layers, inv_freq, windows)
    model._kvlab_state = state
    for module in model.modules():
        if hasattr(module, "layer_idx") and hasattr(module, "num_key_value_groups"):
            module._kvlab_state = state
    model.set_attn_implementation(_NAME if base == "sdpa" else _NAME + "_eager")
    _install_hooks(model)
    install_router_door(model, state)
    return model


def _install_hooks(model: torch.nn.Module) -> None:
    """The two forward hooks, and generate()'s check of a used KVCache (a bound method: deepcopy rebinds it)."""
    model.register_forward_pre_hook(_pre_hook, with_kwargs=True)
    model.register_forward_hook(_post_hook, always_call=True)
    if hasattr(model, "generate"):
        model.generate = types.MethodType(_generate, model)


def _generate(model, *args, **kwargs):
    """The model's own ``generate``, after checking once that a used KVCache holds the start of this prompt."""
    cache = kwargs.get("past_key_values")
    if isinstance(cache, KVCache):
        cache.check_prompt(kwargs.get("input_ids", kwargs.get("inputs", args[0] if args else None)))
    return type(model).generate(model, *args, **kwargs)


def _pre_hook(model, args, kwargs):
    state = model._kvlab_state
    input_ids = kwargs.get("input_ids", args[0] if args else None)
    embeds = kwargs.get("inputs_embeds")
    ref = input_ids if input_ids is not None else embeds
    if ref is None:
        state.step = None
        return None
    batch, length = ref.shape[0], ref.shape[1]
    cache = kwargs.get("past_key_values")
    if state.patterns:  # patterns (DHSA, SepLLM, ...) read positions and ids, never the padding mask
        mask = kwargs.get("attention_mask")
        if mask is not None and mask.dim() == 2 and not bool(mask.all()):
            raise NotImplementedError(
                "attention_mask has padding (zeros) while an attention pattern is installed (use_pattern): "
                "patterns ignore attention_mask, so a padded row would be silently wrong; run one sequence "
                "at a time or without padding (sequences of equal length)."
            )
    if isinstance(cache, KVCache):
        mask = kwargs.get("attention_mask")
        if mask is not None and mask.dim() == 2 and not bool(mask.all()):
            raise NotImplementedError(
                "kvlab policies do not support padded batches: pass sequences of equal length "
                "(or batch size 1) without padding."
            )
        cache.check_model(state)  # a cache made for another model (layers, RoPE) fails here, not silently
        fresh = cache.seen == 0
        positions = cache.begin_step(input_ids, batch, length, ref.device)
        kwargs = dict(kwargs)
        kwargs["position_ids"] = positions
        state.step = StepInfo(input_ids, positions, cache, fresh)
        return args, kwargs
    positions = kwargs.get("position_ids")
    past = cache.get_seq_length() if cache is not None else 0
    fresh = positions is None and past == 0  # known without looking at (and waiting for) device tensors
    if positions is None:
        positions = (torch.arange(length, device=ref.device) + past).expand(batch, -1)
    state.step = StepInfo(input_ids, positions, None, fresh)
    return None


def _post_hook(model, args, output):
    state = model._kvlab_state
    step, state.step = state.step, None
    if step is not None and step.cache is not None:
        if output is None:  # the forward pass raised (torch still calls always_call hooks): undo, never count
            step.cache.rollback()
        else:
            step.cache.end_step()
    return None


# ---------------------------------------------------------------------------------------------------
# the attention function


def _kvlab_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                     sliding_window=None, softcap=None, **kwargs):
    state: ModelState | None = getattr(module, "_kvlab_state", None)
    layer = module.layer_idx
    step = state.step if state is not None else None
    cache = step.cache if step is not None else None
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    if isinstance(cache, StaticKVCache):  # the fast decode engine (kvlab.eval.fast): the cache attends itself
        return cache.attend(query, key, value, layer, scale).transpose(1, 2).contiguous(), None
    pattern = state.patterns.get(layer) if state is not None else None
    if not _kvlab_takes_over(state, step, cache, pattern):
        base = _plain_function(state, module)
        return base(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                    sliding_window=sliding_window, softcap=softcap, **kwargs)
    _check_supported(module, dropout, softcap)
    q_pos, k_pos, q_ids, k_ids = _positions_and_ids(step, cache, layer, query)
    if pattern is not None:
        call = AttentionCall(layer, state.num_layers, q_pos, k_pos, q_ids, k_ids, scale, sliding_window,
                             query.shape[1] // key.shape[1], fresh=step.fresh)
        out = pattern(query, key, value, call)
    else:
        out = _attend_and_observe(state, cache, layer, query, key, value, q_pos, k_pos, scale, sliding_window)
    return out.transpose(1, 2).contiguous(), None


def _kvlab_takes_over(state, step, cache, pattern) -> bool:
    """Does kvlab compute this layer's attention (a cache, a pattern or a capture in force)?"""
    if state is None or step is None:
        return False
    return cache is not None or pattern is not None or state.capture is not None


def _check_supported(module, dropout, softcap) -> None:
    if softcap is not None:
        raise NotImplementedError("kvlab's attention does not implement logit soft-capping (Gemma2)")
    if dropout and module.training:
        raise NotImplementedError("kvlab's attention does not implement attention dropout; set it to 0")


def _attend_and_observe(state, cache, layer, query, key, value, q_pos, k_pos, scale, sliding_window):
    """Causal attention over the held keys; the probabilities go to a policy that scores entries (H2O, TOVA)
    and to :func:`capture_attention`."""
    capture = state.capture is not None
    scores_wanted = cache is not None and cache.policy.needs_scores
    q_len = query.shape[2]
    mask = None if (q_len == 1 and sliding_window is None) else causal_mask(q_pos, k_pos, sliding_window)
    out, probs = attend(query, key, value, mask, scale, want_probs=capture or scores_wanted)
    if probs is not None and scores_wanted:
        cache.layers[layer].observe(probs)
    if capture and probs is not None and layer in state.capture:
        state.capture[layer] = probs.detach().cpu()
    return out


def _plain_function(state: ModelState | None, module):
    """The attention function of a pass kvlab leaves alone (no cache, pattern or capture)."""
    if state is None:
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        return ALL_ATTENTION_FUNCTIONS["sdpa"]
    return _base_function(state, module)


def _positions_and_ids(step, cache, layer: int, query: torch.Tensor):
    """Query and key positions and token ids of this pass: from the cache's held entries, or from the step."""
    q_len = query.shape[2]
    if cache is not None:
        held = cache.layers[layer]
        k_pos, k_ids = held.positions, held.token_ids
        return k_pos[:, -q_len:], k_pos, k_ids[:, -q_len:], k_ids
    q_pos = step.position_ids.to(query.device)
    ids = step.input_ids
    q_ids = ids if ids is not None else torch.full_like(q_pos, -1)
    return q_pos, q_pos, q_ids, q_ids


# ---------------------------------------------------------------------------------------------------
# user-facing helpers


@torch.no_grad()
def capture_attention(model: torch.nn.Module, input_ids: torch.Tensor,
                      layers: Iterable[int] | None = None) -> torch.Tensor:
    """Attention probabilities of one forward pass: ``(layers, heads, q, n)`` for batch row 0.

    Computed eagerly (full softmax matrices), so keep inputs small (a few hundred tokens).
    """
    state = model_state(model)
    chosen = list(range(state.num_layers)) if layers is None else list(layers)
    if state.patterns:
        raise RuntimeError("capture_attention shows plain attention; leave use_pattern blocks first")
    state.capture = {i: None for i in chosen}
    try:
        model(input_ids=input_ids.to(model.device), use_cache=False)
        maps = [state.capture[i][0] for i in chosen]
    finally:
        state.capture = None
    return torch.stack(maps)


@contextlib.contextmanager
def eager_base(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """Within the block, the attention kvlab falls back to is eager (full softmax weights returned), not SDPA.

    For code that reads attention weights from transformers' outputs or hooks (kvpress's presses,
    ``output_attentions=True``): transformers then prepares eager's additive mask (kvlab registers the name
    ``kvlab_eager`` for it). Restores the previous implementation on exit, also after an error. A model not
    attached to kvlab is switched with ``set_attn_implementation("eager")``.
    """
    state = getattr(model, "_kvlab_state", None)
    before_name = model.config._attn_implementation
    before_base = state.base_implementation if state is not None else None
    if state is not None:
        state.base_implementation = "eager"
    model.set_attn_implementation(_NAME + "_eager" if state is not None else "eager")
    try:
        yield model
    finally:
        if state is not None:
            state.base_implementation = before_base
        model.set_attn_implementation(before_name)
