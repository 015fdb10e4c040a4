"""OrthoRank in plain PyTorch: the specification.

Paper: "OrthoRank: Token Selection via Sink Token Orthogonality for Efficient LLM Inference" (Shin, Oh and Oh,
ICML 2025, https://arxiv.org/abs/2507.03865; kvlab's reading notes: ``docs/papers/orthorank.md``; the text we read was the
anonymous submission). Sec. 2 (observations), Sec. 3.1 (Eq. 1-4), Algorithm 1, Sec. 4.3.3 (KV of the
unselected tokens).

The idea in four lines
----------------------
After the attention-sink layer ``l_sink`` the normalised hidden states of the other tokens drift towards the
sink token's, which barely moves (Obs. 1-2). A token whose state is *orthogonal* to the sink's can still
change its cosine to the sink the most (Eq. 1-3), so it is the one worth computing. In a selected layer::

    h_bar = input_layernorm(h)                          # (batch, seq, hidden), the layer's own RMSNorm
    score = |h_bar[:, :1] @ h_bar.transpose(1, 2)|      # (batch, seq): Eq. 4, small = orthogonal to the sink
    idx   = sort(topk(score, k=int(ratio * seq), smallest))   # Algorithm 1; order kept for attention
    h[idx] = layer(h[idx] as queries, every token as keys/values)  # the others pass by the residual

Readings of the paper (each is used below and checked by a test)
---------------------------------------------------------------
* **Normalised states** are the layer's *input* RMSNorm output, weight included ("the hidden states after
  the pre-attention normalization layer ... the direct inputs for an attention module", Sec. 2).
  ``stage="raw"`` (Table 3 row 3) scores the residual stream ``h`` itself.
* **Eq. 1-3.** The exact gradient (Eq. 2) has ``||d cos / d h_i||^2 = (1 - cos^2) / ||h_i||^2``; Eq. 3 drops
  ``||h_i||`` ("norms approximately equal"), Eq. 4 then uses ``|h_0 . h_i| = ||h_0|| ||h_i|| |cos|`` as the
  proxy. :func:`alignment` offers all three (``"dot"`` = Eq. 4, the paper's; ``"cos"`` = Eq. 3;
  ``"grad"`` = Eq. 1 exactly); every score is oriented so that *smaller = more orthogonal = computed first*.
* **The sink token is the first token of each sequence** ("for simplicity and consistency, we focus our
  calculations on the first token"); its score is compared within each sequence (per batch row).
* **k = int(ratio * seq)** (floor), counted over all ``seq`` tokens of the forward pass (Algorithm 1).
* **The sink itself (Algorithm 1 sets its score to +inf and takes the k smallest)**: it is *never* among the
  selected tokens unless every token is (``sink="skip"``, the default). ``sink="select"`` gives it score
  -inf instead, so it is always selected (and takes one of the k slots).
* **Selected tokens keep their order** ("Sorting for attention module"): the causal rule is applied on the
  *original* positions (a selected query at position ``t`` sees every key at position ``<= t``).
* **KV of unselected tokens** (Table 3, Sec. 4.3.3): in the paper's method every token's key and value are
  computed from its normalised state and used by the selected queries (and cached); the unselected tokens'
  own hidden states are not updated (attention output and MLP skipped). ``kv="selected"`` is the ablation
  (row 4): keys and values of the selected tokens *and of the sink*. Algorithm 1 never selects the sink, so
  "no K/V for the unselected tokens" read literally also removes the sink's K/V, a second change that
  Sec. 4.3.3 does not discuss; ``kv="selected_no_sink"`` is that confounded variant, reported as its own row.
* **Sparsity accounting** (Sec. 4.1, Table 4): a layer that computes a fraction ``r`` of the tokens saves
  ``1 - r`` of a layer, so ``layer_ratio * (1 - token_ratio)`` of the layers' work is skipped: 15% of the
  layers at 33% tokens is 10%, 30% at 33% is 20%, 40% at 50% is 20% (K/V projections of the unselected
  tokens are not counted; :func:`kvlab.orthorank.api.flop_sparsity` counts them).
* **The sink layer** (Sec. 2): the first token's normalised state jumps away from the others' at an early
  layer, together with its massive activation (Sun et al. 2024). We define ``l_sink`` as the layer whose
  update raises the first token's norm relative to the others' the most (:func:`sink_curves`): the
  layers after it (``l > l_sink``) see the sink in their input, and that is where Fig. 2's cosine drops.

Shapes follow kvlab: hidden states ``(batch, seq, hidden)``, attention tensors ``(batch, heads, seq, dim)``.
Supported decoder layers: Llama (SmolLM2), Qwen2, Gemma3 text (its extra sandwich norms, q/k norms and
sliding window are honoured).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = [
    "SCORES", "SINK_RULES", "STAGES", "SUPPORTED_LAYERS", "KV_MODES",
    "normalized_states", "alignment", "cos_gradient", "select_topk", "selection_mask",
    "routed_layer", "attention", "project_qkv", "logit_softcap", "attention_update", "mlp_update",
    "sink_curves", "SinkCurves", "layer_kind", "tokens_for_ratio",
]

SCORES = ("dot", "cos", "grad")
KV_MODES = ("all", "selected", "selected_no_sink")
SINK_RULES = ("skip", "select")
STAGES = ("normalized", "raw")
SUPPORTED_LAYERS = ("LlamaDecoderLayer", "Qwen2DecoderLayer", "Gemma3DecoderLayer")


def layer_kind(layer: torch.nn.Module) -> str:
    """``"pre"`` (Llama, Qwen2: pre-norm) or ``"sandwich"`` (Gemma3: norms before and after each block)."""
    name = type(layer).__name__
    if name in ("LlamaDecoderLayer", "Qwen2DecoderLayer"):
        return "pre"
    if name == "Gemma3DecoderLayer":
        return "sandwich"
    raise NotImplementedError(f"OrthoRank's routed layer supports {', '.join(SUPPORTED_LAYERS)}; got {name}")


# ---------------------------------------------------------------------------------------------------
# Sec. 3.1: the importance of a token (Eq. 1-4)


def normalized_states(layer: torch.nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    """``h_bar``: the layer's own input RMSNorm applied to ``hidden_states (batch, seq, hidden)``."""
    return layer.input_layernorm(hidden_states)


def alignment(states: torch.Tensor, score: str = "dot", sink_state: torch.Tensor | None = None) -> torch.Tensor:
    """How aligned each token is with the sink token: ``(batch, seq)``, **smaller = more orthogonal**.

    states ``(batch, seq, hidden)``; sink_state ``(batch, hidden)`` (default: ``states[:, 0]``, the first token;
    a decoding step passes the sink's state kept from the prompt).

    * ``"dot"``  ``|h_0 . h_i|``                                   Eq. 4, the paper's proxy
    * ``"cos"``  ``|cos(h_0, h_i)|``                               Eq. 3 (equal norms assumed)
    * ``"grad"`` ``-||d cos(h_0, h_i) / d h_i|| = -sqrt(1 - cos^2) / ||h_i||``   Eq. 1-2 exactly
    """
    if score not in SCORES:
        raise ValueError(f"score must be one of {SCORES}, got {score!r}")
    dtype = torch.promote_types(states.dtype, torch.float32)  # half precision is scored in float32
    h = states.to(dtype)
    h0 = h[:, 0] if sink_state is None else sink_state.to(dtype)
    dot = torch.einsum("bd,bnd->bn", h0, h)
    if score == "dot":
        return dot.abs()
    norm_i = h.norm(dim=-1).clamp_min(1e-12)
    cos = dot / (h0.norm(dim=-1, keepdim=True).clamp_min(1e-12) * norm_i)
    if score == "cos":
        return cos.abs()
    return -(1.0 - cos.square()).clamp_min(0.0).sqrt() / norm_i


def cos_gradient(h0: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
    """Eq. 2: ``d cos(h_0, h_i) / d h_i = (h_0/||h_0|| - cos(h_0, h_i) h_i/||h_i||) / ||h_i||``, ``(..., hidden)``."""
    n0, ni = h0.norm(dim=-1, keepdim=True), hi.norm(dim=-1, keepdim=True)
    cos = (h0 * hi).sum(-1, keepdim=True) / (n0 * ni)
    return (h0 / n0 - cos * hi / ni) / ni


def select_topk(scores: torch.Tensor, k: int, sink: str = "skip") -> torch.Tensor:
    """Algorithm 1: the ``k`` tokens with the smallest ``scores (batch, seq)``, as sorted indices ``(batch, k)``.

    ``sink="skip"`` (Algorithm 1's ``importance_score[:, 0] = inf``): the first token is never selected
    unless ``k == seq``; ``sink="select"``: it always is (when ``k >= 1``). Ties go to the earlier token.
    """
    if sink not in SINK_RULES:
        raise ValueError(f"sink must be one of {SINK_RULES}, got {sink!r}")
    batch, seq = scores.shape
    if not 0 <= k <= seq:
        raise ValueError(f"k must be in 0..{seq} (the number of tokens), got {k}")
    s = scores.clone()
    s[:, 0] = float("inf") if sink == "skip" else float("-inf")
    # a stable sort makes ties deterministic (earlier token first), which topk does not promise
    order = torch.sort(s, dim=-1, stable=True).indices[:, :k]
    return torch.sort(order, dim=-1).values


def selection_mask(selected: torch.Tensor, seq: int) -> torch.Tensor:
    """``(batch, seq)`` bool from sorted indices ``(batch, k)``."""
    mask = torch.zeros(selected.shape[0], seq, dtype=torch.bool, device=selected.device)
    return mask.scatter_(1, selected, True)


# ---------------------------------------------------------------------------------------------------
# The routed layer: selected tokens are queries and run the MLP; every token gives K and V


def attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor, scaling: float,
              softcap: float | None = None) -> torch.Tensor:
    """``softmax(q k^T * scaling [softcapped] + mask) v`` with GQA.

    query ``(batch, heads, q, dim)``, key/value ``(batch, kv_heads, n, dim)``, mask bool ``(batch, 1, q, n)``
    (True = visible; every query sees at least one key). Returns ``(batch, heads, q, dim)``.
    """
    groups = query.shape[1] // key.shape[1]
    if softcap is None:
        if query.is_cuda and groups > 1:  # GQA with a mask: expanded heads keep SDPA on its fused kernels
            key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
            groups = 1
        return torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scaling,
                                                                enable_gqa=groups > 1)
    key = key.repeat_interleave(groups, dim=1)
    value = value.repeat_interleave(groups, dim=1)
    scores = torch.matmul(query, key.transpose(-1, -2)) * scaling
    scores = torch.tanh(scores / softcap) * softcap
    scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores.float(), dim=-1).to(value.dtype)
    return torch.matmul(probs, value)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x ``(batch, heads, n, dim)``, cos/sin ``(batch, n, dim)``."""
    return x * cos[:, None] + _rotate_half(x) * sin[:, None]


def _heads(x: torch.Tensor, head_dim: int) -> torch.Tensor:
    """``(batch, n, heads * dim) -> (batch, heads, n, dim)``."""
    return x.view(*x.shape[:2], x.shape[-1] // head_dim, head_dim).transpose(1, 2)


def take_rows(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Rows ``index (batch, k)`` of ``x (batch or 1, n, d)`` -> ``(batch, k, d)``."""
    x = x.expand(index.shape[0], *x.shape[1:])
    return x.gather(1, index[..., None].expand(-1, -1, x.shape[-1]))


def project_qkv(layer: torch.nn.Module, x_q: torch.Tensor, cos_q: torch.Tensor, sin_q: torch.Tensor,
                x_kv: torch.Tensor, cos_kv: torch.Tensor, sin_kv: torch.Tensor):
    """Rotated queries of ``x_q (batch, k, hidden)`` and keys/values of ``x_kv (batch, n, hidden)``, each
    ``(batch, heads, ., dim)``, with the layer's own projections (and Gemma3's q/k norms).

    cos/sin: ``(batch, ., dim)`` for the rows of ``x_q`` and of ``x_kv``. Shared by both backends.
    """
    attn = layer.self_attn
    key = _heads(attn.k_proj(x_kv), attn.head_dim)
    value = _heads(attn.v_proj(x_kv), attn.head_dim)
    query = _heads(attn.q_proj(x_q), attn.head_dim)
    if layer_kind(layer) == "sandwich":
        key, query = attn.k_norm(key), attn.q_norm(query)
    return _rope(query, cos_q, sin_q), _rope(key, cos_kv, sin_kv), value


def logit_softcap(layer: torch.nn.Module) -> float | None:
    """Gemma's attention logit soft-capping (None: none)."""
    return getattr(getattr(layer.self_attn, "config", None), "attn_logit_softcapping", None)


def attention_update(layer: torch.nn.Module, out: torch.Tensor) -> torch.Tensor:
    """What the attention block adds to the residual, from its ``o_proj`` output ``(batch, k, hidden)``."""
    return out if layer_kind(layer) == "pre" else layer.post_attention_layernorm(out)


def mlp_update(layer: torch.nn.Module, h: torch.Tensor) -> torch.Tensor:
    """What the MLP block adds to the residual ``h (batch, k, hidden)`` (after the attention update)."""
    if layer_kind(layer) == "pre":
        return layer.mlp(layer.post_attention_layernorm(h))
    return layer.post_feedforward_layernorm(layer.mlp(layer.pre_feedforward_layernorm(h)))


def _cached_positions(cache, layer_idx: int, positions: torch.Tensor, n: int) -> torch.Tensor:
    """Original positions ``(batch, n)`` of the keys a cache layer returned after its update.

    kvlab's ``KVCache`` records them per entry (any policy, evictions included); a transformers cache holds
    a contiguous run of positions that ends at this step's last token (full or sliding-window layers).
    """
    layers = getattr(cache, "layers", None)
    held = getattr(layers[layer_idx], "positions", None) if layers is not None else None
    if isinstance(held, torch.Tensor) and held.shape[-1] == n:
        return held.to(positions.device).expand(positions.shape[0], n)
    last = positions[:, -1:]
    return last - torch.arange(n - 1, -1, -1, device=last.device)[None, :]


def routed_layer(layer: torch.nn.Module, hidden_states: torch.Tensor, selected: torch.Tensor, *,
                 position_embeddings: tuple[torch.Tensor, torch.Tensor], positions: torch.Tensor,
                 past_key_values=None, kv: str = "all", valid: torch.Tensor | None = None,
                 normed: torch.Tensor | None = None) -> torch.Tensor:
    """One decoder layer computed for the ``selected`` tokens only (the routed layer of Fig. 1).

    Args:
        layer: a Llama / Qwen2 / Gemma3 decoder layer.
        hidden_states: ``(batch, seq, hidden)``, the layer's input.
        selected: ``(batch, k)`` sorted token indices to compute (see :func:`select_topk`).
        position_embeddings: ``(cos, sin)``, each ``(batch or 1, seq, head_dim)``, as the model passes them.
        positions: ``(batch or 1, seq)`` original positions of the tokens (causal rule, sliding window);
            the rotation itself comes from ``position_embeddings``.
        past_key_values: a transformers ``Cache`` or None. The layer's keys and values of *every* token are
            appended (``kv="all"``), exactly what the dense layer would cache. Key positions for the causal
            rule come from kvlab's ``KVCache`` (any policy) or, for a transformers cache, are taken as the
            contiguous run ending at this step's last token.
        kv: ``"all"`` (the paper), ``"selected"`` (Table 3 row 4: only the selected tokens and the sink,
            token 0, give K and V) or ``"selected_no_sink"`` (the selected tokens only: row 4 with the sink's
            K/V removed as well); the last two run in prefill without a cache only.
        valid: ``(batch, k)`` bool or None: entries of ``selected`` that are padding (False) are computed but
            not written back (rows that select different numbers of tokens, e.g. while decoding).
        normed: ``input_layernorm(hidden_states)`` if the caller has it already (the router scored it).

    Returns:
        ``(batch, seq, hidden)``: the layer's output for the selected tokens, the input for the others.

    Pseudocode (pre-norm layer; Gemma3 adds its post-attention / pre- and post-feed-forward norms)::

        x = input_layernorm(h)                                    # all tokens
        K, V = rope(k_proj(x)), v_proj(x)                          # all tokens (kv="all")
        Q = rope(q_proj(x[sel]))                                   # selected tokens only
        a = h[sel] + o_proj(softmax(Q K^T / sqrt(d) + causal(pos[sel], pos)) V)
        h[sel] = a + mlp(post_attention_layernorm(a))
    """
    layer_kind(layer)  # raises for an unsupported layer
    if kv not in KV_MODES:
        raise ValueError(f"kv must be one of {KV_MODES}, got {kv!r}")
    attn = layer.self_attn
    batch, seq, _ = hidden_states.shape
    cos, sin = position_embeddings
    cos = cos.expand(batch, *cos.shape[1:])
    sin = sin.expand(batch, *sin.shape[1:])
    positions = positions.expand(batch, seq)

    normed = layer.input_layernorm(hidden_states) if normed is None else normed
    h_sel = take_rows(hidden_states, selected)
    x_sel = take_rows(normed, selected)

    # keys and values: every token (the paper) or the selected ones, with or without the sink (ablations)
    key_valid = None
    if kv == "all":
        x_kv, cos_kv, sin_kv, k_pos = normed, cos, sin, positions
    else:
        if past_key_values is not None:
            raise ValueError(f"kv={kv!r} (Table 3's ablation) runs without a cache: call the model with "
                             "use_cache=False")
        kv_index, key_valid = selected, valid
        if kv == "selected":  # the sink (token 0) keeps its K/V; where it is selected already, the copy is masked
            sel_valid = valid if valid is not None else torch.ones_like(selected, dtype=torch.bool)
            has_sink = (selected[:, :1] == 0) & sel_valid[:, :1]
            kv_index = torch.cat([torch.zeros_like(selected[:, :1]), selected], dim=1)
            key_valid = torch.cat([~has_sink, sel_valid], dim=1)
        x_kv, cos_kv, sin_kv = (take_rows(t, kv_index) for t in (normed, cos, sin))
        k_pos = positions.gather(1, kv_index)
    query, key, value = project_qkv(layer, x_sel, take_rows(cos, selected), take_rows(sin, selected),
                                    x_kv, cos_kv, sin_kv)
    if past_key_values is not None:
        key, value = past_key_values.update(key, value, attn.layer_idx)
        k_pos = _cached_positions(past_key_values, attn.layer_idx, positions, key.shape[2])

    if selected.shape[1] == 0:  # no token computed: the layer only gave (and cached) its keys and values
        return hidden_states

    # causal by original position (and Gemma3's sliding window); a query always sees itself
    q_pos = positions.gather(1, selected)[:, :, None]
    mask = q_pos >= k_pos[:, None, :]
    window = getattr(attn, "sliding_window", None)
    if window is not None:
        mask = mask & (q_pos - k_pos[:, None, :] < window)
    if key_valid is not None:
        mask = mask & key_valid[:, None, :]
    out = attention(query, key, value, mask[:, None], attn.scaling, logit_softcap(layer))
    out = attn.o_proj(out.transpose(1, 2).reshape(batch, selected.shape[1], -1))

    h_sel = h_sel + attention_update(layer, out)
    h_sel = h_sel + mlp_update(layer, h_sel)

    if valid is not None:  # padding entries write back their own input: a no-op
        h_sel = torch.where(valid[..., None], h_sel, take_rows(hidden_states, selected))
    index = selected[..., None].expand(-1, -1, hidden_states.shape[-1])
    return hidden_states.scatter(1, index, h_sel.to(hidden_states.dtype))


# ---------------------------------------------------------------------------------------------------
# Sec. 2: the sink layer and the observations behind Fig. 2-3


@dataclass
class SinkCurves:
    """Per-layer statistics of one input (means over batch rows and tokens ``i >= 1``).

    norm_ratio ``(L + 1,)``: ``||h_0|| / median_i ||h_i||`` of the residual stream at the input of layer ``l``
        (index ``L``: the last layer's output).
    cos_to_sink ``(L,)``: mean ``cos(h_bar_0, h_bar_i)`` of the normalised states at layer ``l`` (Fig. 2).
    cos_tokens ``(L, seq - 1)``: the same per token position ``i >= 1`` (mean over batch rows).
    sink_self_cos ``(L, L)``: ``cos(h_bar_0^a, h_bar_0^b)`` across layers (Fig. 3 a-b).
    token_self_cos ``(L, L)``: the same for the other tokens, averaged over them (Fig. 3 c-d).
    norm_spread ``(L,)``: coefficient of variation of ``||h_bar_i||`` over ``i >= 1`` (Eq. 3's assumption).
    sink_layer: the layer whose update raises ``norm_ratio`` the most (``argmax_l ratio[l+1] / ratio[l]``).
    """

    norm_ratio: torch.Tensor
    cos_to_sink: torch.Tensor
    cos_tokens: torch.Tensor
    sink_self_cos: torch.Tensor
    token_self_cos: torch.Tensor
    norm_spread: torch.Tensor
    sink_layer: int


def sink_curves(layer_inputs: list[torch.Tensor], layers: list[torch.nn.Module],
                final_output: torch.Tensor) -> SinkCurves:
    """Sec. 2's statistics from the residual stream.

    layer_inputs: ``L`` tensors ``(batch, seq, hidden)``, the input of each decoder layer; layers: the ``L``
    decoder layers (their input RMSNorm gives the normalised states); final_output: the last layer's output.
    """
    with torch.no_grad():
        stream = [h.float() for h in layer_inputs] + [final_output.float()]
        norms = torch.stack([h.norm(dim=-1) for h in stream])  # (L+1, batch, seq)
        norm_ratio = (norms[:, :, 0] / norms[:, :, 1:].median(dim=-1).values).mean(dim=1)
        jumps = norm_ratio[1:].log() - norm_ratio[:-1].log()
        sink_layer = int(jumps.argmax())

        unit = torch.stack([torch.nn.functional.normalize(layer.input_layernorm(h).float(), dim=-1)
                            for layer, h in zip(layers, layer_inputs)])  # (L, batch, seq, hidden)
        cos_tokens = torch.einsum("lbd,lbnd->lbn", unit[:, :, 0], unit[:, :, 1:]).mean(dim=1)
        cos_to_sink = cos_tokens.mean(dim=1)
        sink_self = torch.einsum("abd,cbd->acb", unit[:, :, 0], unit[:, :, 0]).mean(-1)
        token_self = torch.einsum("abnd,cbnd->acbn", unit[:, :, 1:], unit[:, :, 1:]).mean(dim=(-1, -2))
        bar_norms = torch.stack([layer.input_layernorm(h).float().norm(dim=-1)[:, 1:]
                                 for layer, h in zip(layers, layer_inputs)])  # (L, batch, seq-1)
        spread = (bar_norms.std(dim=-1) / bar_norms.mean(dim=-1)).mean(dim=1)
    return SinkCurves(norm_ratio.cpu(), cos_to_sink.cpu(), cos_tokens.cpu(), sink_self.cpu(), token_self.cpu(),
                      spread.cpu(), sink_layer)


def tokens_for_ratio(token_ratio: float, seq: int) -> int:
    """``k = int(token_ratio * seq)`` (Algorithm 1), guarded against float noise (``0.3 * 10 = 2.9999...``)."""
    return int(math.floor(token_ratio * seq + 1e-9))
