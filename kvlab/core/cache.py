"""The policy-driven KV cache: what the model physically keeps, layer by layer.

A transformers ``Cache`` holds, for every layer, the keys and values of the tokens seen so far. kvlab's
:class:`KVCache` holds only the entries a :class:`~kvlab.core.Policy` decided to keep, and beside each
entry the facts a policy needs to decide: the token id, its original position in the stream, the position
its key was rotated at when stored (RoPE), and, when the policy asks for them, the attention it received.

The life of one forward step (``model(input_ids, past_key_values=cache)``)::

    begin_step(input_ids)   # forward pre-hook installed by kvlab.core.attach
    for each layer l:       # inside the model
        keys, values = cache.update(k_new, v_new, l)   # append; hand out keys moved to in-cache positions
        attention over (keys, values)                   # kvlab's attention function, maybe recording scores
    end_step()              # forward post-hook: policy.keep(view of layer l) -> indices; physically compact

Positions (SepLLM Table 8, StreamingLLM Sec. 3.2): with ``policy.positions == "original"`` every token keeps
the position it had in the stream. With ``"cache"`` the model sees positions *within the cache*: the new
query sits right after the kept entries and the kept keys are re-rotated so that entry ``i`` of a layer
holding ``n`` entries sits at ``P - n + i``, where ``P`` is the query position. RoPE only depends on the
distance between query and key, so this is exactly "positions 0..n-1, query at n" for every layer, also
when layers keep different numbers of entries (LaCache). With ``"insertion"`` a new token is rotated at the
current cache length (the entries layer 0 holds when the step begins) and cached keys keep the rotation
they got when inserted, never moved: what the SepLLM and StreamingLLM code does on transformers 4.33 when
it passes no ``position_ids`` (``past_key_values_length`` is the cache length of the first layer). After an
eviction the new query may sit *before* keys it attends to; that is the "no shift" of SepLLM's Table 8.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from kvlab.core.policy import Policy
from kvlab.core.rope import rerotate, rotate_half
from kvlab.core.state import model_state
from kvlab.core.views import LayerView

__all__ = ["KVCache", "KVLayer", "LayerView"]


class KVLayer(CacheLayerMixin):
    """One layer of a :class:`KVCache`: keys/values ``(batch, kv_heads, n, dim)`` plus per-entry metadata."""

    is_sliding = False
    is_compileable = False
    is_croppable = False

    def __init__(self, cache: "KVCache", layer_idx: int, inv_freq: torch.Tensor | None, sliding_window: int | None):
        super().__init__()
        self.cache = cache
        self.layer_idx = layer_idx
        self.inv_freq = inv_freq
        self.sliding_window = sliding_window
        self.positions: torch.Tensor | None = None
        self.token_ids: torch.Tensor | None = None
        self.rot: torch.Tensor | None = None
        self.scores: torch.Tensor | None = None
        self.last_scores: torch.Tensor | None = None
        self.state: dict[str, Any] = {}

    # -- transformers' CacheLayerMixin interface -------------------------------------------------------
    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        b, h, _, d = key_states.shape
        self.keys = key_states.new_empty((b, h, 0, d))
        self.values = value_states.new_empty((b, value_states.shape[1], 0, value_states.shape[-1]))
        long = dict(dtype=torch.long, device=key_states.device)
        self.positions = torch.empty((b, 0), **long)
        self.token_ids = torch.empty((b, 0), **long)
        self.rot = torch.empty((b, 0), **long)
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        step = self.cache._step
        if step is None:
            raise RuntimeError(
                "KVCache.update was called outside a step: run the model through kvlab.core.attach(model) "
                "(kvlab.load_model does it) so the cache learns the token ids and positions of each step."
            )
        t = key_states.shape[2]
        if t != step.new_positions.shape[-1]:
            raise RuntimeError(f"layer {self.layer_idx}: got {t} new keys but the step announced "
                               f"{step.new_positions.shape[-1]} tokens")
        new_rot = step.rope_positions.to(self.device)
        self.keys = torch.cat([self.keys, key_states], dim=-2)
        self.values = torch.cat([self.values, value_states], dim=-2)
        self.positions = torch.cat([self.positions, step.new_positions.to(self.device)], dim=-1)
        self.token_ids = torch.cat([self.token_ids, step.new_token_ids.to(self.device)], dim=-1)
        self.rot = torch.cat([self.rot, new_rot], dim=-1)
        if self.scores is not None:
            self.scores = torch.cat([self.scores, self.scores.new_zeros((self.scores.shape[0], t))], dim=-1)
        if self.cache.policy.positions == "cache":
            # Keys stay stored as first rotated; attention gets them moved right behind the new queries.
            # One rotation from the stored copy each step, so rounding errors never accumulate (bf16).
            n = self.keys.shape[2] - t
            want = new_rot[:, :1] - n + torch.arange(n + t, device=self.device)
            # On a GPU, rotating by zero (exact: cos 0 = 1, sin 0 = 0) beats asking the host whether to.
            if self.device.type != "cpu" or not torch.equal(want, self.rot):
                return rerotate(self.keys, want - self.rot, self._inv_freq()), self.values
        return self.keys, self.values

    def get_mask_sizes(self, query_length) -> tuple[int, int]:
        if isinstance(query_length, torch.Tensor):  # transformers < 5.3 passes the cache positions
            query_length = query_length.shape[0]
        return self.get_seq_length() + query_length, 0

    def get_seq_length(self) -> int:
        # transformers' generate() uses this to know how many tokens were processed, so it counts the stream,
        # not the entries held (those are ``size``).
        return self.cache.seen

    def get_max_length(self) -> int:
        return -1

    get_max_cache_shape = get_max_length  # the same question under its transformers < 5.3 name (kvpress's env)

    def reset(self) -> None:
        self.keys = self.values = None
        self.positions = self.token_ids = self.rot = None
        self.scores = self.last_scores = None
        self.state = {}
        self.is_initialized = False

    # -- kvlab ----------------------------------------------------------------------------------------
    @property
    def size(self) -> int:
        return 0 if self.keys is None else self.keys.shape[2]

    def nbytes(self) -> int:
        if self.keys is None:
            return 0
        return self.keys.numel() * self.keys.element_size() + self.values.numel() * self.values.element_size()

    def _inv_freq(self) -> torch.Tensor:
        if self.inv_freq is None:
            raise NotImplementedError(
                f"layer {self.layer_idx} has no rotary frequencies known to kvlab, so its keys cannot be moved; "
                "use a policy with positions='original'."
            )
        return self.inv_freq

    def observe(self, probs: torch.Tensor) -> None:
        """Record attention probabilities ``(batch, heads, q, n)`` the layer's queries gave to its entries."""
        received = probs.float().sum(dim=(1, 2))
        self.scores = received if self.scores is None else self.scores + received
        self.last_scores = probs[:, :, -1].float().mean(dim=1)

    def select(self, index: torch.Tensor) -> None:
        """Physically keep only the entries ``index`` (``(batch, m)`` or ``(m,)``, ascending)."""
        b = self.keys.shape[0]
        if index.dim() == 1:
            index = index.expand(b, -1)
        index = index.to(self.device)
        gather_kv = index[:, None, :, None]
        self.keys = self.keys.gather(2, gather_kv.expand(-1, self.keys.shape[1], -1, self.keys.shape[3]))
        self.values = self.values.gather(2, gather_kv.expand(-1, self.values.shape[1], -1, self.values.shape[3]))
        self.positions = self.positions.gather(1, index)
        self.token_ids = self.token_ids.gather(1, index)
        self.rot = self.rot.gather(1, index)
        if self.scores is not None:
            self.scores = self.scores.gather(1, index)
        if self.last_scores is not None:
            self.last_scores = self.last_scores.gather(1, index)

    def view(self) -> LayerView:
        return LayerView(
            layer_idx=self.layer_idx,
            num_layers=len(self.cache.layers),
            seen=self.cache.seen,
            positions=self.positions,
            token_ids=self.token_ids,
            scores=self.scores,
            last_scores=self.last_scores,
            state=self.state,
        )


@dataclass
class _Step:
    new_positions: torch.Tensor  # (batch, t) original positions of the tokens of this step
    new_token_ids: torch.Tensor  # (batch, t)
    rope_positions: torch.Tensor  # (batch, t) positions the model rotates the new queries/keys at
    held_before: list[int]  # entries each layer held when the step began (for rollback)


@dataclass
class _Trace:
    per_layer: list[list[int]] = field(default_factory=list)  # entries held after each step, per layer
    nbytes: list[int] = field(default_factory=list)  # bytes of K and V held after each step


class KVCache(Cache):
    """A transformers ``Cache`` whose layers keep only what ``policy`` decides, after every forward step.

    >>> model, tok = kvlab.load_model()
    >>> cache = KVCache(model, kvlab.policies.StreamingLLM(sink=4, window=252))
    >>> out = model(input_ids, past_key_values=cache)   # or model.generate(..., past_key_values=cache)

    ``cache.trace`` records after each step how many entries each layer holds (``kv_trace``) and the bytes
    of keys and values held (the memory really drops: dropped entries are freed, not masked).
    Batch: every row must have the same length (no padding); a policy must keep the same number of
    entries in every row of a layer (true for Full, StreamingLLM and other count-based policies).
    A cache belongs to the kind of model it was made for: a step of a model with another layer count, RoPE
    frequencies or sliding windows raises ValueError (:meth:`check_model`).
    """

    def __init__(self, model: torch.nn.Module, policy: Policy):
        state = model_state(model)
        self._built_for = state  # the model this cache was made for (check_model compares another one with it)
        self.policy = policy
        self.seen = 0
        self.batch: int | None = None  # rows of the streams this cache holds (fixed by the first step)
        self._step: _Step | None = None
        self._stream_ids: list[torch.Tensor] = []  # the token ids of every step so far (-1 where embeddings came)
        self._stream_has_embeds = False  # a step came as embeddings: the stream's ids are unknown
        self.trace = _Trace()
        layers = [
            KVLayer(self, i, state.inv_freq[i], state.sliding_window[i]) for i in range(state.num_layers)
        ]
        super().__init__(layers=layers)
        if not isinstance(policy, Policy):
            raise TypeError(f"policy must be a kvlab Policy (e.g. kvlab.policies.Full()), got {type(policy).__name__}")
        policy.check_model(state.num_layers)
        vocab = getattr(model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config,
                        "vocab_size", None)
        if vocab:
            policy.check_vocab(int(vocab))

    # -- step protocol (called by kvlab.core.attention's hooks) -------------------------------------------
    def check_model(self, state) -> None:
        """Raise unless the model running this step (its kvlab ``ModelState``) is the kind this cache was made
        for: the same number of layers, RoPE frequencies and sliding windows. Keys re-rotated with another
        model's frequencies, or layers left empty, would give wrong logits silently."""
        mine = self._built_for
        if state is mine:
            return
        fix = "make a KVCache for each model: KVCache(model, policy)"
        if state.num_layers != mine.num_layers:
            raise ValueError(f"this KVCache was made for a model with {mine.num_layers} layers, but the model running "
                             f"it has {state.num_layers}: {fix}")
        if state.sliding_window != mine.sliding_window:
            raise ValueError(f"this KVCache was made for a model with sliding windows {mine.sliding_window} per "
                             f"layer, but the model running it has {state.sliding_window}: {fix}")
        for i, (a, b) in enumerate(zip(mine.inv_freq, state.inv_freq)):
            same = (a is None and b is None) or (a is not None and b is not None and a.shape == b.shape
                                                  and torch.equal(a.cpu(), b.cpu()))
            if not same:
                raise ValueError(f"this KVCache was made for a model with other RoPE frequencies (layer {i}: "
                                 "rope_theta or rope scaling differ), so its keys would be moved with the wrong "
                                 f"angles: {fix}")
        self._built_for = state  # an equal model: later steps take the fast path

    def check_prompt(self, input_ids: torch.Tensor | None) -> None:
        """Raise unless ``input_ids`` (the whole prompt ``generate`` was given) starts with the stream this cache
        already holds. transformers' ``generate`` reads a used cache as the first ``seen`` tokens of its prompt and
        runs only the rest, so another prompt would silently continue the old stream instead of starting anew."""
        if not self.seen or input_ids is None or input_ids.dim() != 2 or input_ids.shape[1] <= self.seen:
            return  # a fresh cache, embeddings, or a prompt too short to continue (begin_step refuses that one)
        if self._stream_has_embeds or self.batch != input_ids.shape[0]:
            return  # a stream fed as embeddings, or another batch size (begin_step refuses it): nothing to compare
        self._stream_ids = [torch.cat(self._stream_ids, dim=-1)]  # once per generate() call, not per step
        stream = self._stream_ids[0]
        if not torch.equal(stream, input_ids[:, :self.seen].to(stream.device)):
            raise ValueError(
                f"this KVCache already holds a stream of {self.seen} tokens, and the prompt given to generate() does "
                f"not start with them: generate() would read its first {self.seen} tokens as already in the cache "
                "and continue the old stream. Make a new KVCache for each prompt (KVCache(model, policy)) or call "
                "cache.reset() first; to continue the same stream, pass all of it (prompt, generated tokens, then "
                "the new text)")

    def held(self) -> list[int]:
        return [layer.size for layer in self.layers]

    def begin_step(self, input_ids: torch.Tensor | None, batch: int, length: int, device) -> torch.Tensor:
        """Announce a step of ``length`` new tokens; returns the position ids the model must use.

        A step that never ended (the forward pass raised, or was interrupted) is rolled back first, so an
        error never leaves half a step in the cache.
        """
        if self._step is not None:
            self.rollback()
        if length < 1:
            used = (f"this KVCache already holds a stream of {self.seen} tokens, and transformers' generate() reads "
                    f"a used cache as the first {self.seen} tokens of the prompt it is given, so a new prompt of that "
                    "length or less leaves none to run" if self.seen else "a step needs at least one new token")
            raise ValueError(f"{used}: make a new KVCache for each prompt (KVCache(model, policy)) or call "
                             "cache.reset() first; to continue the same stream, pass all of it (prompt, generated "
                             "tokens, then the new text)")
        if self.batch is not None and batch != self.batch:
            raise ValueError(f"this KVCache holds {self.batch} stream(s) but the step has batch size {batch}: a cache "
                             "belongs to one batch of streams; create a new KVCache (or call cache.reset())")
        if batch > 1 and getattr(self.policy, "batch_rows", "equal") == "one":
            raise NotImplementedError(
                f"{type(self.policy).__name__} keeps a different number of entries per sequence (it reads the "
                "tokens), and kvlab's cache needs equal counts per row: run batch size 1")
        self.batch = batch
        positions = (torch.arange(length, device=device) + self.seen).expand(batch, -1)
        if input_ids is None:
            ids = torch.full((batch, length), -1, dtype=torch.long, device=device)
        else:
            ids = input_ids.to(device)
        if self.policy.positions in ("cache", "insertion"):
            # "cache": every layer's kept keys are re-rotated behind the query (update); "insertion": not.
            held = self.held()
            start = max(held, default=0) if self.policy.positions == "cache" else (held[0] if held else 0)
            rope = (torch.arange(length, device=device) + start).expand(batch, -1)
        else:
            rope = positions
        self._stream_has_embeds |= input_ids is None
        self._step = _Step(positions, ids, rope, self.held())
        return rope

    def rollback(self) -> None:
        """Undo the step under way: every layer drops what it appended since ``begin_step``."""
        step, self._step = self._step, None
        if step is None:
            return
        for layer, before in zip(self.layers, step.held_before):
            if layer.is_initialized and layer.size > before:
                layer.select(torch.arange(before, device=layer.device))

    def end_step(self) -> None:
        """The forward step is over: count it, let the policy compact every layer, record the trace."""
        step, self._step = self._step, None
        if step is None:
            return
        self.seen += step.new_positions.shape[-1]
        self._stream_ids.append(step.new_token_ids)
        for layer in self.layers:
            if not layer.is_initialized:
                continue
            index = self.policy.keep(layer.view())
            if layer.sliding_window is not None:
                index = _within_window(layer, index, self.seen)
            if index is not None:
                if index.device.type == "cpu" or self.seen <= step.new_positions.shape[-1]:
                    _check_index(index, layer.size, self.policy)  # on a GPU only at the first step (host syncs)
                layer.select(index)
        self.trace.per_layer.append(self.held())
        self.trace.nbytes.append(sum(layer.nbytes() for layer in self.layers))

    # -- transformers Cache interface -----------------------------------------------------------------
    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.seen

    def reset(self):
        super().reset()
        self.seen = 0
        self.batch = None
        self._step = None
        self._stream_ids = []
        self._stream_has_embeds = False
        self.trace = _Trace()


def _within_window(layer: KVLayer, index: torch.Tensor | None, seen: int) -> torch.Tensor | None:
    """A sliding-window layer (Gemma3 local layers) never needs keys that the next query cannot see."""
    positions = layer.positions if index is None else layer.positions.gather(
        1, index if index.dim() == 2 else index.expand(layer.positions.shape[0], -1))
    visible = positions[0] > seen - layer.sliding_window  # next query sits at position `seen`
    if bool(visible.all()):
        return index
    base = torch.arange(layer.size, device=layer.positions.device) if index is None else index
    return base[..., visible]


def _check_index(index: torch.Tensor, size: int, policy) -> None:
    if index.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"{type(policy).__name__}.keep must return integer indices, got {index.dtype}")
    if index.numel() and (int(index.min()) < 0 or int(index.max()) >= size):
        raise IndexError(f"{type(policy).__name__}.keep returned an index outside 0..{size - 1}")
    if index.shape[-1] > 1 and not bool((index[..., 1:] > index[..., :-1]).all()):
        raise ValueError(f"{type(policy).__name__}.keep must return strictly increasing indices (oldest first)")
