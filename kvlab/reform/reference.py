"""REFORM in plain PyTorch: compress, gather, recompute — the specification.

Paper: Song et al., "Compress, Gather, and Recompute: REFORMing Long-Context Processing in Transformers"
(2025, https://arxiv.org/abs/2506.01215): Sec. 2.1 (recurrent chunked forwarding, early exit), Sec. 2.2
(on-demand cache recomputation), Algorithm 1 (App. A), App. C.1 (cross-layer context embeddings), App. C.2
(Mean Normalized Rank), App. C.6 (similarity search).

Algorithm 1, as this module spells it (function names in brackets)::

    procedure FORWARDCHUNK(chunk, cache, emb)                         [forward_chunk]
        hs <- embed(chunk), at positions cache.size, cache.size + 1, ...    (consecutive after eviction)
        for layer in model_layers[:early_exit_layer]:                       (early exit: the rest never run)
            emb.save(layer, input of the layer's Q/K/V projections)          [ContextEmbeddings.save]
            hs, cache <- layer.forward(hs, cache)                            (the decoder layer itself)
            scores[layer] <- attention of the chunk's last 128 queries      [h2o_scores]
        cache <- Compress(cache, scores)                                     [h2o_keep, CompressedCache.compress]
    procedure REFORM(context, query)                                    [reform]
        for c in chunks(context) + [query]: FORWARDCHUNK(c, cache, emb)
        relevant <- GatherRelevant(context, emb)                             [significance, gather_indices]
        cache <- model.forward(context[relevant] + query)                    (recompute: fresh positions)

How the decoder layers are driven: **directly**. :func:`forward_chunk` is the loop of Algorithm 1: it
calls ``model.model.layers[l]`` for ``l < early_exit_layer`` with its own small cache
(:class:`CompressedCache`, which speaks transformers' ``update`` protocol), its own position ids and
attention mask. Layers at or above the exit are never called, so their entry of the cache stays ``None``:
nothing is allocated for them (``CompressedCache.nbytes`` measures it). The layers' own ``forward`` is used
unchanged (no fork of the model); the only extra arithmetic is what the paper adds: the chosen heads'
projections for the embeddings and the last queries' attention for the H2O scores, both recomputed from
the layer's normalised input (a few rows of the projection matrices).

Shapes: ``(batch, heads, seq, dim)`` for per-head states; batch 1 throughout (what is kept depends on
the tokens, so rows of a batch would keep different entries).

Readings of the paper (each relied on below, and checked by ``tests/test_reform.py`` where testable):

* reading: **compression** (Sec. 2.1, App. C "restrict attention score computations to the last 128 tokens of each
  chunk"): after each chunk, every layer below the exit scores its entries by the attention the chunk's
  last ``score_window=128`` queries give them, **summed over query heads and those queries**, recomputed
  for each chunk (not accumulated across chunks). Each layer keeps its ``n_initial`` first entries, its
  ``n_recent`` newest entries and the ``budget - n_initial - n_recent`` highest-scoring entries in between
  (H2O per layer, heads pooled, as :class:`kvlab.baselines.H2O` does); order is kept. Paper: budget and
  chunk 32k, initial and recent 256 ("We always keep the initial and recent 256 tokens").
* reading: **positions** (Sec. 2.1 "reassign the position IDs so that the tokens in the compressed cache have
  consecutive position IDs"): entry ``i`` of the cache sits at position ``i``; after eviction the kept keys
  are re-rotated (RoPE) from their old index to their new one, and the next chunk starts at position
  ``cache.size``. The query is the last chunk (Algorithm 1: ``chunks <- ChunkInputs(context) + [query]``).
* reading: **embeddings** (App. C.1): a head is ``(kind, layer, head)`` with kind ``q``, ``k`` or ``v``; its state is
  the output of that projection for that head, **before** RoPE (and before Gemma3's q/k norm): "embeddings
  resulting from QKV projection". Each is L2-normalised, the chosen heads are concatenated, one row per
  input token (query tokens too). The dot product of two rows, divided by the number of heads, is the
  mean of the per-head cosines ("mathematically equivalent to ... averaging them").
* reading: **gather** (Sec. 2.2, App. C.6): cosine similarity of every context token to every query token, max over
  query tokens, then max-pooled over ``pool=129`` neighbours (Sec. 2.2 "128 adjacent tokens"; App. D.4
  "129-token windows": 64 on each side). The ``n_initial`` first and ``n_final`` last context tokens are
  always kept; the rest of ``recompute_budget`` goes to the highest scores; original order is kept.
  ``recompute_budget`` counts the **context** tokens recomputed (initial and final included); the query
  follows them (the brief's "then the query and generation"). Max-pooling makes plateaus of equal
  scores: ties are broken by the unpooled score (the matching token and its most similar neighbours
  first), then by position; this matters when the budget is smaller than a pooling window.
* reading: **query tokens for the similarity** (App. C.6): special tokens and the generation prefix ("the answer
  is") are left out; :func:`reform` takes ``query_mask`` for that, and ``kvlab.reform.api`` passes the
  question without its answer prefix.
* reading: **recompute** (Sec. 2.2): the gathered tokens, in their original order, are forwarded through the whole
  model as a fresh prompt (positions ``0..m-1``), followed by the query; generation continues from there.
* reading: **MNR** (App. C.2): the score of each context token is smoothed by a mean over itself and its 20
  neighbours (10 on each side; "mean-pooling with 20 neighboring tokens"), ranked descending (rank 0 is
  best, ties get their mean rank); ``MNR = mean over gold tokens of rank / num_context_tokens``, reported
  in percent (the paper's Table 2 values 5-10 read as percentages). Attention scores (Table 2's first row)
  are the dot products of pre-RoPE queries of a head with the keys of its KV group, max over the query
  tokens, the same pipeline as the cosines.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterable

import torch
import torch.nn.functional as F

from kvlab.core import rerotate

__all__ = [
    "HEAD_KINDS",
    "Head",
    "CompressedCache",
    "ContextEmbeddings",
    "StateRecorder",
    "ReformTrace",
    "chunk_spans",
    "h2o_scores",
    "h2o_keep",
    "head_states",
    "forward_chunk",
    "similarity",
    "significance",
    "gather_indices",
    "reform",
    "mean_pool",
    "normalised_ranks",
    "mean_normalised_rank",
]

HEAD_KINDS = ("q", "k", "v")


@dataclass(frozen=True, order=True)
class Head:
    """One embedding head: the ``kind`` projection (``"q"``, ``"k"`` or ``"v"``) of ``head`` at ``layer``."""

    kind: str
    layer: int
    head: int

    def __str__(self) -> str:
        return f"{self.kind}:{self.layer}:{self.head}"


# --------------------------------------------------------------------------- model plumbing


def decoder_of(model):
    return model.get_decoder() if hasattr(model, "get_decoder") else model.model


def _layer_type(model, layer_idx: int) -> str | None:
    types = getattr(decoder_of(model).config, "layer_types", None)
    return types[layer_idx] if types else None


def rope_at(model, layer_idx: int, hs: torch.Tensor, positions: torch.Tensor):
    """``(cos, sin)`` for ``positions`` ``(batch, seq)`` as this layer's rotary embedding makes them."""
    rotary = decoder_of(model).rotary_emb
    kind = _layer_type(model, layer_idx)
    if kind is not None and hasattr(rotary, f"{kind}_inv_freq"):  # Gemma3: local and global RoPE
        return rotary(hs, positions, kind)
    return rotary(hs, positions)


def _inv_freq(model, layer_idx: int) -> torch.Tensor:
    rotary = decoder_of(model).rotary_emb
    kind = _layer_type(model, layer_idx)
    freq = getattr(rotary, f"{kind}_inv_freq", None) if kind is not None else None
    return rotary.inv_freq if freq is None else freq


def sliding_window_of(model, layer_idx: int) -> int | None:
    if _layer_type(model, layer_idx) == "sliding_attention":
        return int(decoder_of(model).config.sliding_window)
    return None


def _attention_bias(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int | None, dtype) -> torch.Tensor:
    """Additive mask ``(1, 1, q, n)``: 0 where key ``j`` is visible to query ``i`` (causal, within
    ``window``), the dtype's lowest value elsewhere. Works with both SDPA and eager attention."""
    diff = q_pos[:, None] - k_pos[None, :]
    visible = diff >= 0
    if window is not None:
        visible &= diff < window
    bias = torch.zeros(visible.shape, dtype=dtype, device=q_pos.device)
    return bias.masked_fill(~visible, torch.finfo(dtype).min)[None, None]


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def head_states(layer, normed: torch.Tensor, kind: str, heads: Iterable[int] | None = None) -> torch.Tensor:
    """The ``kind`` projection of the decoder ``layer`` for the chosen ``heads``: ``(batch, h, seq, dim)``.

    ``normed`` ``(batch, seq, hidden)`` is the layer's normalised input (``layer.input_layernorm(hs)``), what
    its attention projects. Only the rows of the weight that belong to the chosen heads are multiplied.
    """
    attn = layer.self_attn
    proj = {"q": attn.q_proj, "k": attn.k_proj, "v": attn.v_proj}[kind]
    dim = attn.head_dim
    total = proj.out_features // dim
    chosen = list(range(total)) if heads is None else list(heads)
    if heads is None:  # every head: the whole weight (no index to build and copy to the device)
        weight, bias = proj.weight, proj.bias
    else:
        rows = torch.cat([torch.arange(h * dim, (h + 1) * dim) for h in chosen]).to(proj.weight.device)
        weight, bias = proj.weight[rows], None if proj.bias is None else proj.bias[rows]
    out = F.linear(normed, weight, bias)  # (batch, seq, h * dim)
    return out.view(*normed.shape[:2], len(chosen), dim).transpose(1, 2)


# --------------------------------------------------------------------------- the compressed cache


class CompressedCache:
    """The KV cache of recurrent chunked forwarding: one entry per kept token, for layers below the exit.

    ``keys[l]``/``values[l]``: ``(batch, kv_heads, n, dim)``, keys rotated at cache positions ``0..n-1``;
    ``origin[l]``: ``(n,)`` index in the input of the token each entry holds. A layer that never ran (at or
    above the exit) stays ``None``. ``update`` is the transformers cache protocol the attention layers call.
    ``compress_fn(keys, values, index, inv_freq) -> (keys, values)``: a fused replacement of the gather and
    re-rotation in :meth:`compress` (``kvlab.reform.triton.compress_kv_triton``); None: the eager code below.
    """

    def __init__(self, num_layers: int, compress_fn: Callable | None = None):
        self.compress_fn = compress_fn
        self.keys: list[torch.Tensor | None] = [None] * num_layers
        self.values: list[torch.Tensor | None] = [None] * num_layers
        self.origin: list[torch.Tensor | None] = [None] * num_layers
        self.peak_bytes = 0  # most bytes held at once (after a chunk was added, before compression)

    # transformers' attention calls this with the new (rotated) keys and values of one layer
    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        if self.keys[layer_idx] is None:
            self.keys[layer_idx], self.values[layer_idx] = key_states, value_states
        else:
            self.keys[layer_idx] = torch.cat([self.keys[layer_idx], key_states], dim=-2)
            self.values[layer_idx] = torch.cat([self.values[layer_idx], value_states], dim=-2)
        return self.keys[layer_idx], self.values[layer_idx]

    @property
    def size(self) -> int:
        """Entries held per running layer (all running layers hold the same number)."""
        return next((k.shape[-2] for k in self.keys if k is not None), 0)

    def allocated(self) -> list[bool]:
        return [k is not None for k in self.keys]

    def nbytes(self, layer_idx: int | None = None) -> int:
        """Bytes of keys and values held (one layer, or all)."""
        layers = range(len(self.keys)) if layer_idx is None else [layer_idx]
        return sum(t.numel() * t.element_size() for i in layers for t in (self.keys[i], self.values[i])
                   if t is not None)

    def compress(self, model, keep: dict[int, torch.Tensor]) -> None:
        """Keep entries ``keep[l]`` (ascending indices) of each layer ``l``; kept entry ``keep[l][j]`` moves to
        position ``j`` (its key is re-rotated by ``j - keep[l][j]``): positions stay consecutive."""
        for layer_idx, index in keep.items():
            index = index.to(self.keys[layer_idx].device)
            if self.compress_fn is not None:
                self.keys[layer_idx], self.values[layer_idx] = self.compress_fn(
                    self.keys[layer_idx], self.values[layer_idx], index, _inv_freq(model, layer_idx))
                self.origin[layer_idx] = self.origin[layer_idx][index.to(self.origin[layer_idx].device)]
                continue
            delta = (torch.arange(index.numel(), device=index.device) - index)[None]  # (1, m)
            keys = self.keys[layer_idx][:, :, index]
            if bool((delta != 0).any()):
                work = torch.promote_types(keys.dtype, torch.float32)  # float64 stays float64 (the oracle)
                keys = rerotate(keys.to(work), delta, _inv_freq(model, layer_idx)).to(keys.dtype)
            self.keys[layer_idx] = keys
            self.values[layer_idx] = self.values[layer_idx][:, :, index]
            self.origin[layer_idx] = self.origin[layer_idx][index.to(self.origin[layer_idx].device)]


# --------------------------------------------------------------------------- embeddings


class ContextEmbeddings:
    """Cross-layer context embeddings (App. C.1): per input token, the chosen heads' Q/K/V states, each
    L2-normalised, concatenated: ``matrix()`` is ``(tokens, len(heads) * head_dim)``.

    ``save(layer_idx, layer, normed, output)`` is Algorithm 1's ``emb.SaveSelected(qkv)``: called by
    :func:`forward_chunk` for every layer that runs, it keeps the chosen heads of that layer.
    """

    def __init__(self, heads: Iterable[Head], dtype: torch.dtype = torch.float16, capacity: int | None = None):
        self.heads = sorted(set(heads))
        if not self.heads:
            raise ValueError("heads must name at least one (kind, layer, head)")
        self.dtype = dtype
        self.capacity = capacity  # tokens to expect: one buffer, filled chunk by chunk (no copy at the end)
        self._rows: list[torch.Tensor] = []  # one block per chunk, columns in self.heads order
        self._buffer: torch.Tensor | None = None
        self._filled = 0
        self._pending: dict[Head, torch.Tensor] = {}

    def save(self, layer_idx: int, layer, normed: torch.Tensor, output: torch.Tensor | None = None) -> None:
        for kind in HEAD_KINDS:
            chosen = [h for h in self.heads if h.layer == layer_idx and h.kind == kind]
            if not chosen:
                continue
            states = head_states(layer, normed, kind, [h.head for h in chosen])  # (1, h, seq, dim)
            for i, h in enumerate(chosen):
                self._pending[h] = F.normalize(states[0, i].float(), dim=-1).to(self.dtype)

    def end_chunk(self) -> None:
        missing = [str(h) for h in self.heads if h not in self._pending]
        if missing:
            raise RuntimeError(f"heads {missing} were not computed: their layers did not run (early exit)")
        block = torch.cat([self._pending[h] for h in self.heads], dim=-1)  # (chunk, heads * dim)
        self._pending = {}
        if self.capacity is None:
            self._rows.append(block)
            return
        if self._buffer is None:
            self._buffer = block.new_empty((self.capacity, block.shape[-1]))
        self._buffer[self._filled:self._filled + block.shape[0]] = block
        self._filled += block.shape[0]

    def matrix(self) -> torch.Tensor:
        """``(tokens, heads * dim)``: row ``t`` is token ``t``'s embedding (unit norm per head)."""
        if self._buffer is not None:
            return self._buffer[:self._filled]
        return torch.cat(self._rows, dim=0)

    def bytes_per_token(self) -> int:
        m = self.matrix()
        return m.shape[-1] * m.element_size()


class StateRecorder:
    """Saves every layer's normalised input and output hidden states (for head choice, App. C.2).

    ``inputs[l]``/``outputs[l]``: ``(tokens, hidden)`` float32 on the CPU, all chunks concatenated.
    """

    def __init__(self, device="cpu", dtype=torch.float32):
        self.inputs: dict[int, list[torch.Tensor]] = {}
        self.outputs: dict[int, list[torch.Tensor]] = {}
        self.device, self.dtype = device, dtype

    def save(self, layer_idx: int, layer, normed: torch.Tensor, output: torch.Tensor | None = None) -> None:
        self.inputs.setdefault(layer_idx, []).append(normed[0].to(self.device, self.dtype))
        if output is not None:
            self.outputs.setdefault(layer_idx, []).append(output[0].to(self.device, self.dtype))

    def end_chunk(self) -> None:
        pass

    def input(self, layer_idx: int) -> torch.Tensor:
        return torch.cat(self.inputs[layer_idx], dim=0)

    def output(self, layer_idx: int) -> torch.Tensor:
        return torch.cat(self.outputs[layer_idx], dim=0)


# --------------------------------------------------------------------------- recurrent chunked forwarding


def chunk_spans(length: int, chunk_size: int) -> list[tuple[int, int]]:
    """``[(start, end), ...]`` cutting ``length`` tokens into chunks of ``chunk_size`` (the last may be shorter)."""
    return [(s, min(s + chunk_size, length)) for s in range(0, length, chunk_size)]


def h2o_scores(query: torch.Tensor, keys: torch.Tensor, scaling: float, q_pos: torch.Tensor,
               k_pos: torch.Tensor, window: int | None = None) -> torch.Tensor:
    """Heavy-hitter scores: attention the given queries give each key, summed over heads and queries.

    query ``(batch, heads, w, dim)`` and keys ``(batch, kv_heads, n, dim)``, both RoPE-rotated (GQA: each
    query head reads the keys of its group); ``q_pos`` ``(w,)``, ``k_pos`` ``(n,)`` positions for the causal
    mask. Returns ``(batch, n)`` float32 (float64 for float64 inputs: the oracle of the Triton kernel):
    ``sum_{heads, queries} softmax(q k^T * scaling)``.
    """
    groups = query.shape[1] // keys.shape[1]
    k = keys.repeat_interleave(groups, dim=1)
    dtype = torch.promote_types(query.dtype, torch.float32)
    logits = torch.matmul(query.to(dtype), k.to(dtype).transpose(-1, -2)) * scaling  # (batch, heads, w, n)
    diff = q_pos[:, None] - k_pos[None, :]
    visible = diff >= 0 if window is None else (diff >= 0) & (diff < window)
    probs = torch.softmax(logits.masked_fill(~visible, float("-inf")), dim=-1)
    return probs.sum(dim=(1, 2))


def h2o_keep(scores: torch.Tensor, budget: int, n_initial: int, n_recent: int) -> torch.Tensor:
    """Indices ``(m,)`` (ascending) of the entries one layer keeps, ``m = min(n, budget)``.

    scores ``(n,)``. Pseudocode::

        if n <= budget: keep all
        keep [0, n_initial) + [n - n_recent, n) + the (budget - n_initial - n_recent) best of the rest
    """
    n = scores.numel()
    if n <= budget:
        return torch.arange(n, device=scores.device)
    heavy = budget - n_initial - n_recent
    middle = scores[n_initial:n - n_recent]
    best = middle.topk(heavy).indices + n_initial if heavy > 0 else middle.new_empty(0, dtype=torch.long)
    return torch.cat([torch.arange(n_initial, device=scores.device), best.sort().values,
                      torch.arange(n - n_recent, n, device=scores.device)])


def query_states(layer, normed: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotated queries ``(batch, heads, w, dim)`` of the layer, as its attention computes them."""
    q = head_states(layer, normed, "q")
    if hasattr(layer.self_attn, "q_norm"):  # Gemma3 normalises each head before RoPE
        q = layer.self_attn.q_norm(q)
    return q * cos[:, None] + _rotate_half(q) * sin[:, None]


@torch.no_grad()
def forward_chunk(model, chunk_ids: torch.Tensor, cache: CompressedCache, emb, *, early_exit_layer: int,
                  budget: int | None, n_initial: int, n_recent: int, score_window: int = 128,
                  chunk_start: int = 0, compress: bool = True, profile: dict | None = None,
                  score_fn: Callable = h2o_scores) -> torch.Tensor:
    """Algorithm 1's FORWARDCHUNK: one chunk through layers ``[0, early_exit_layer)``, then compression.

    chunk_ids ``(1, c)``; ``chunk_start`` is the chunk's index in the input (for ``cache.origin``);
    ``emb`` has ``save(layer_idx, layer, normed, output)`` and ``end_chunk()``; ``budget=None`` never
    evicts. ``profile``: a dict that accumulates seconds per step (``layers``, ``embeddings``, ``scoring``,
    ``compression``; the device is synchronised at each step, so only pass one to measure). ``score_fn``: the
    scoring with :func:`h2o_scores`'s arguments and result (``kvlab.reform.triton.h2o_scores_triton`` fuses it).
    Returns the hidden states ``(1, c, hidden)`` leaving layer ``early_exit_layer - 1``.
    """
    layers = decoder_of(model).layers
    c = chunk_ids.shape[1]
    start = cache.size  # consecutive positions: the chunk goes right after the kept entries
    positions = torch.arange(start, start + c, device=chunk_ids.device)
    hs = decoder_of(model).embed_tokens(chunk_ids)
    w = min(score_window, c)
    scores: dict[int, torch.Tensor] = {}
    tick = _Ticker(profile, hs.device)
    for layer_idx in range(early_exit_layer):
        layer = layers[layer_idx]
        cos, sin = rope_at(model, layer_idx, hs, positions[None])
        mask = _attention_bias(positions, torch.arange(start + c, device=hs.device), sliding_window_of(model, layer_idx),
                               hs.dtype)
        normed = layer.input_layernorm(hs)  # what the layer's Q/K/V projections read
        hs = layer(hs, attention_mask=mask, position_ids=positions[None], past_key_values=cache, use_cache=True,
                   position_embeddings=(cos, sin))
        tick("layers")
        emb.save(layer_idx, layer, normed, hs)
        tick("embeddings")
        if compress and budget is not None and cache.keys[layer_idx].shape[-2] > budget:
            q = query_states(layer, normed[:, -w:], cos[:, -w:], sin[:, -w:])
            scores[layer_idx] = score_fn(q, cache.keys[layer_idx], layer.self_attn.scaling, positions[-w:],
                                         torch.arange(start + c, device=hs.device), sliding_window_of(model, layer_idx))[0]
            tick("scoring")
    emb.end_chunk()
    cache.peak_bytes = max(cache.peak_bytes, cache.nbytes())
    new = torch.arange(chunk_start, chunk_start + c)
    for layer_idx in range(early_exit_layer):
        old = cache.origin[layer_idx]
        cache.origin[layer_idx] = new if old is None else torch.cat([old, new])
    if scores:
        cache.compress(model, {l: h2o_keep(s, budget, n_initial, n_recent) for l, s in scores.items()})
    tick("compression")
    return hs


class _Ticker:
    """Accumulates the seconds since the previous tick under a name (does nothing without a dict)."""

    def __init__(self, profile: dict | None, device):
        self.profile = profile
        self.clock = _Clock(device) if profile is not None else None

    def __call__(self, name: str) -> None:
        if self.profile is not None:
            self.profile[name] = self.profile.get(name, 0.0) + self.clock.lap()


# --------------------------------------------------------------------------- gather


def similarity(context_emb: torch.Tensor, query_emb: torch.Tensor, n_heads: int, block: int = 65536) -> torch.Tensor:
    """``(n,)`` float32: for each context token the best mean cosine to a query token, before pooling.

    context_emb ``(n, H*d)``, query_emb ``(q, H*d)``: rows of :meth:`ContextEmbeddings.matrix`; the product runs
    ``block`` context rows at a time, so a million tokens never need an ``(n, q)`` matrix or a float32 copy
    of the embeddings.
    """
    q = query_emb.float().T
    return torch.cat([torch.matmul(context_emb[i:i + block].float(), q).max(dim=1).values
                      for i in range(0, context_emb.shape[0], block)]) / n_heads


def significance(context_emb: torch.Tensor, query_emb: torch.Tensor, n_heads: int, pool: int = 129) -> torch.Tensor:
    """Score of every context token (Sec. 2.2): ``(n,)`` float32. Pseudocode::

        sim = context_emb @ query_emb.T / n_heads     # (n, q) mean cosine over the heads (App. C.1)
        s = max over query tokens of sim               # one score per context token   [similarity]
        s = max over the pool neighbours (pool // 2 each side)
    """
    s = similarity(context_emb, query_emb, n_heads)
    if pool > 1:
        s = F.max_pool1d(s[None, None], kernel_size=pool, stride=1, padding=pool // 2)[0, 0]
    return s


def gather_indices(scores: torch.Tensor, recompute_budget: int, n_initial: int, n_final: int,
                   tiebreak: torch.Tensor | None = None) -> torch.Tensor:
    """Context tokens to recompute: ``(m,)`` ascending, ``m = min(n, recompute_budget)``.

    The ``n_initial`` first and ``n_final`` last tokens always; then the highest ``scores`` until
    ``recompute_budget`` tokens are chosen; original order kept. Max-pooling gives a whole window the score
    of its best token, so ties are broken by ``tiebreak`` (the unpooled score: the best token of a window
    and its most similar neighbours first), then by position (earlier first).
    """
    n = scores.numel()
    if n <= recompute_budget:
        return torch.arange(n, device=scores.device)
    ranked = scores.clone()
    ranked[:n_initial] = float("inf")
    ranked[n - n_final:] = float("inf")
    order = torch.arange(n, device=scores.device)
    if tiebreak is not None:  # stable sorts: the last key sorted is the first key of the order
        order = torch.sort(tiebreak, descending=True, stable=True).indices
    order = order[torch.sort(ranked[order], descending=True, stable=True).indices]
    return order[:recompute_budget].sort().values


@dataclass
class ReformTrace:
    """What :func:`reform` did: the gathered context indices and everything behind them."""

    gathered: torch.Tensor  # (m,) context indices recomputed, ascending
    scores: torch.Tensor  # (n_context,) significance after pooling
    input_ids: torch.Tensor  # (1, m + q): gathered context then query: what the model recomputes
    cache: CompressedCache
    embeddings: torch.Tensor  # (n_context + q, H*d)
    cache_bytes_peak: int  # most bytes of K/V held during chunked forwarding
    chunks: int
    hidden: list[torch.Tensor] = field(default_factory=list)  # exit hidden states per chunk (keep_hidden)
    timings: dict[str, float] = field(default_factory=dict)  # seconds: chunked forwarding, gather


@torch.no_grad()
def reform(model, context_ids: torch.Tensor, query_ids: torch.Tensor, *, heads: Iterable[Head],
           chunk_size: int, budget: int | None, early_exit_layer: int, recompute_budget: int, n_initial: int = 256,
           n_recent: int = 256, n_final: int = 256, pool: int = 129, score_window: int = 128,
           query_mask: torch.Tensor | None = None, emb_dtype: torch.dtype = torch.float16,
           keep_hidden: bool = False, progress: Callable[[Iterable], Iterable] | None = None,
           profile: bool = False, score_fn: Callable = h2o_scores,
           compress_fn: Callable | None = None) -> ReformTrace:
    """REFORM (Algorithm 1): compress, gather; returns the ids to recompute (``trace.input_ids``).

    context_ids ``(1, n)``, query_ids ``(1, q)``. ``query_mask`` ``(q,)`` bool picks the query tokens used
    for the similarity (default: all). ``profile``: time the steps of chunked forwarding separately
    (``trace.timings``; synchronises the device at every step). The caller forwards ``trace.input_ids``
    through the whole model (``model.generate``): that is the recompute step. ``score_fn``/``compress_fn``:
    fused kernels for the scoring and the compression gather (see :func:`forward_chunk`, :class:`CompressedCache`;
    ``kvlab.reform.api`` picks them by ``backend``).
    """
    heads = list(heads)
    cache = CompressedCache(len(decoder_of(model).layers), compress_fn)
    n = context_ids.shape[1]
    emb = ContextEmbeddings(heads, dtype=emb_dtype, capacity=n + query_ids.shape[1])
    chunks = [(context_ids[:, s:e], s) for s, e in chunk_spans(n, chunk_size)] + [(query_ids, n)]
    hidden = []
    steps: dict[str, float] | None = {} if profile else None
    clock = _Clock(context_ids.device)
    iterator = chunks if progress is None else progress(chunks)
    for i, (ids, start) in enumerate(iterator):
        last = i == len(chunks) - 1
        hs = forward_chunk(model, ids, cache, emb, early_exit_layer=early_exit_layer, budget=budget,
                           n_initial=n_initial, n_recent=n_recent, score_window=score_window, chunk_start=start,
                           compress=not last, profile=steps, score_fn=score_fn)
        if keep_hidden:
            hidden.append(hs)
    timings = {"chunked_forwarding": clock.lap(), **{f"forwarding.{k}": v for k, v in (steps or {}).items()}}
    matrix = emb.matrix()
    query_emb = matrix[n:]
    if query_mask is not None:
        query_emb = query_emb[query_mask.to(query_emb.device)]
    raw = similarity(matrix[:n], query_emb, len(emb.heads))
    scores = F.max_pool1d(raw[None, None], kernel_size=pool, stride=1, padding=pool // 2)[0, 0] if pool > 1 else raw
    gathered = gather_indices(scores, recompute_budget, n_initial, n_final, tiebreak=raw)
    input_ids = torch.cat([context_ids[:, gathered.to(context_ids.device)], query_ids], dim=1)
    timings["similarity_and_gather"] = clock.lap()
    timings = {k: round(v, 4) for k, v in timings.items()}
    return ReformTrace(gathered.cpu(), scores.cpu(), input_ids, cache, matrix, cache.peak_bytes, len(chunks), hidden,
                       timings)


class _Clock:
    """Seconds between laps (the device synchronised first, so GPU work is counted where it happens)."""

    def __init__(self, device):
        self.cuda = torch.device(device).type == "cuda"
        self.last = self._now()

    def _now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    def lap(self) -> float:
        now = self._now()
        out, self.last = now - self.last, now
        return out


# --------------------------------------------------------------------------- Mean Normalized Rank (App. C.2)


def mean_pool(scores: torch.Tensor, neighbours: int = 20) -> torch.Tensor:
    """Mean over each token and its ``neighbours`` nearest (``neighbours // 2`` each side), edges averaging
    what exists: ``(n,)`` -> ``(n,)``."""
    if neighbours <= 0:
        return scores
    k = 2 * (neighbours // 2) + 1
    return F.avg_pool1d(scores.float()[None, None], k, stride=1, padding=k // 2, count_include_pad=False)[0, 0]


def normalised_ranks(scores: torch.Tensor) -> torch.Tensor:
    """``rank(t) / n`` for every token: rank 0 is the highest score, ties get their mean rank. ``(n,)``."""
    n = scores.numel()
    ascending = scores.float().sort().values
    above = n - torch.searchsorted(ascending, scores.float(), right=True)  # strictly higher scores
    equal = torch.searchsorted(ascending, scores.float(), right=True) - torch.searchsorted(ascending, scores.float())
    return (above + (equal - 1) / 2) / n


def mean_normalised_rank(scores: torch.Tensor, gold: torch.Tensor, neighbours: int = 20) -> float:
    """MNR in percent (App. C.2): smoothed scores ``(n,)``, gold ``(n,)`` bool; lower is better."""
    if not bool(gold.any()):
        raise ValueError("gold marks no token: MNR needs at least one golden token")
    ranks = normalised_ranks(mean_pool(scores, neighbours))
    return float(ranks[gold].mean()) * 100
