"""DHSA at decode time (App. A): the whole KV cache is kept, each new token attends sparsely.

Paper: DHSA (arXiv:2510.24606), App. A "decode stage" and App. D (latency / memory of decoding). At a
decode step with ``T`` tokens so far (prompt ``n0`` + generated), the chunking is the prompt's chunks,
then all earlier generated tokens as one chunk, then the new token as its own chunk
(:func:`kvlab.dhsa.reference.decode_boundaries`); the new token's row of the chunk similarity is
upsampled and TopK-ed under ``N_b`` like a prefill row (:func:`kvlab.dhsa.api.dhsa_decode`)::

    for each new token t (one after the other):
        chunks = prompt_chunks + [n0, t) + [t, t + 1)
        out_t  = dhsa_decode(q_t, K[:t + 1], V[:t + 1], prompt_chunks, budget=N_b)   # reads <= N_b keys

Two pieces, one per kvlab door:

* :class:`DHSADecode`, the KV policy: it keeps every entry (``keep`` returns None). DHSA does not
  shrink the cache; it reads at most ``N_b`` of its keys per new token (plus one chunk vector per
  chunk). ``attend_budget`` is that ``N_b``; ``budget`` (entries held) is None, as for ``Full``.
* :func:`decode_attention`, the attention of the new tokens: :class:`~kvlab.dhsa.pattern.DHSAPattern`
  calls it for every query that arrives after its prefill, so ``use_pattern(model, DHSAPattern(...))``
  with ``KVCache(model, DHSADecode(...))`` is App. A end to end (:func:`kvlab.experiments.dhsa.measures.dhsa_generate`).

:func:`decode_memory` is the accounting App. D reports: bytes the cache holds and bytes one decode step
reads, for dense attention, DHSA and the cache-compressing baselines (StreamingLLM, H2O).

Reading (authors' legacy code): their Gemma runs decode densely ("TODO: add support for decoding
stage"); the text's App. A is what is built here, and ``DHSAPattern(decode="dense")`` (or
:func:`kvlab.dhsa.pattern.authors_pattern`) decodes densely as their code does.
"""
from __future__ import annotations

import torch

from kvlab.baselines import Full
from kvlab.core import check_choice, check_int

from .api import dhsa_decode

__all__ = ["DHSADecode", "decode_attention", "decode_mask", "decode_attention_sdpa", "decode_memory",
           "DECODE_METHODS"]

DECODE_METHODS = ("dense", "dhsa", "streamingllm", "h2o")


class DHSADecode(Full):
    """The KV policy of DHSA decoding: keep the full cache (App. A); attention over it is sparse.

    Args:
        attend_budget: ``N_b``, keys each new token attends to (initial and its own chunk included);
            None = every key (dense decoding).
        initial: first tokens every new token keeps (attention sinks; inside ``attend_budget``).
        positions: as :class:`~kvlab.core.Policy` (the full cache keeps original positions).

    Use it with the pattern that computes the sparse attention::

        with use_pattern(model, DHSAPattern(N_b, ...), dhsa_layers(model)):
            cache = KVCache(model, DHSADecode(N_b))
            model(prompt_ids, past_key_values=cache)          # sparse prefill, chunks recorded
            model(next_id, past_key_values=cache)             # App. A decode step, full cache
    """

    def __init__(self, attend_budget: int | None, *, initial: int = 4, positions: str = "original"):
        super().__init__(positions)
        self.attend_budget = None if attend_budget is None else check_int("attend_budget", attend_budget, 1)
        self.initial = check_int("initial", initial, 0)
        if self.attend_budget is not None and self.attend_budget < self.initial + 1:
            raise ValueError(f"attend_budget={attend_budget} must be >= initial ({initial}) + 1: a new token always "
                             "keeps the initial tokens and itself; raise attend_budget or lower initial")

    def attended(self, n: int) -> int:
        """Keys a new token reads when the cache holds ``n`` entries (itself included)."""
        check_int("n", n, 1)
        return n if self.attend_budget is None else min(self.attend_budget, n)


def decode_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, prompt_chunks, *,
                     budget: int | None, scale: float | None = None, **kw) -> torch.Tensor:
    """Attention of the last ``q_len`` tokens over the full cache by App. A, one new token at a time.

    Args:
        query: ``(batch, heads, q_len, dim)``, the new tokens (``q_len >= 1``; several when an answer is
            teacher-forced in one call).
        key, value: ``(batch, kv_heads, n, dim)``: the whole cache, the new tokens last.
        prompt_chunks: offsets ``[0, ..., n0]`` of the prompt's chunks, one tensor per sequence (list) or
            one shared; ``n0 <= n - q_len``.
        budget, scale, kw (``initial``, ``keep_diagonal``, ``aggregation``, ``share_heads``): as
            :func:`kvlab.dhsa.api.dhsa_decode`.

    New token ``t`` sees the keys ``<= t``; the new tokens before it (and any cached tokens after the
    prompt) form one chunk, ``t`` its own. Returns ``(batch, heads, q_len, dim)``.
    """
    bsz, _, q_len, _ = query.shape
    n = key.shape[2]
    if q_len < 1 or q_len > n:
        raise ValueError(f"query holds {q_len} new tokens but the cache {n} keys: need 1 <= q_len <= keys")
    per = prompt_chunks if isinstance(prompt_chunks, (list, tuple)) else [prompt_chunks] * bsz
    if len(per) != bsz:
        raise ValueError(f"prompt_chunks must be one offsets tensor or a list of {bsz} (one per sequence)")
    rows = []
    for t in range(n - q_len, n):
        i = t - (n - q_len)
        rows.append(torch.cat([
            dhsa_decode(query[b:b + 1, :, i:i + 1], key[b:b + 1, :, :t + 1], value[b:b + 1, :, :t + 1],
                        prompt_chunks=torch.as_tensor(per[b]).to(query.device), budget=budget, scale=scale, **kw)
            for b in range(bsz)], 0))
    return torch.cat(rows, 2)


@torch.no_grad()
def decode_mask(query: torch.Tensor, key: torch.Tensor, prompt_chunks, *, budget: int | None, initial: int = 0,
                local: int = 0, aggregation: str = "eq4", share_heads: bool = False,
                score_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The kept keys of every new token of :func:`decode_attention` (App. A, ``keep_diagonal=True``), all new
    tokens at once: ``(batch, heads | 1, q_len, n)`` bool, the masks :func:`kvlab.dhsa.api.dhsa_decode` builds one
    token after the other (a test pins it), without a token-level sort.

    New token ``t`` (the last ``q_len`` of the ``n`` keys) sees the prompt's chunks, the generated tokens
    ``[n0, t)`` as one chunk (their key sum from a cumulative sum) and itself. Its candidate chunks are ranked by
    ``q_t . k_C`` (ties: earlier chunk first), laid end to end, and it keeps the first ``budget - |forced|``
    candidate tokens, forced = the ``initial`` first keys and ``[max(t - local, initial), t]``. Aggregations
    ``"eq4" | "mean" | "sum"`` (``"padded_mean"`` depends on the longest chunk of each step: use the reference).
    """
    from .reference import AGGREGATIONS, chunk_index, chunk_representation

    if aggregation not in AGGREGATIONS or aggregation == "padded_mean":
        raise ValueError(f"aggregation must be 'eq4', 'mean' or 'sum' here, got {aggregation!r}; "
                         "decode_attention (the reference loop) takes 'padded_mean'")
    bsz, heads, q_len, _ = query.shape
    n = key.shape[2]
    per = prompt_chunks if isinstance(prompt_chunks, (list, tuple)) else [prompt_chunks] * bsz
    dev = query.device
    t = torch.arange(n - q_len, n, device=dev)  # positions of the new tokens
    j = torch.arange(n, device=dev)
    out = []
    for b in range(bsz):
        bd = torch.as_tensor(per[b]).to(dev).long()
        n0 = int(bd[-1])
        if n0 > n - q_len:
            raise ValueError(f"prompt_chunks end at {n0} but only {n - q_len} keys precede the {q_len} new tokens")
        qs, ks = query[b:b + 1].to(score_dtype), key[b:b + 1].to(score_dtype)
        if share_heads:
            qs, ks = qs.mean(1, keepdim=True), ks.mean(1, keepdim=True)
        g = qs.shape[1] // ks.shape[1]
        kc = chunk_representation(ks[..., :n0, :], bd, aggregation)  # (1, hk, C0, d)
        c0 = kc.shape[2]
        csum = torch.nn.functional.pad(ks[..., n0:, :].cumsum(-2), (0, 0, 1, 0))  # keys [n0, n0 + m) summed
        glen = (t - n0).to(score_dtype)  # generated tokens before each new token
        gsum = csum[..., t - n0, :]  # (1, hk, q_len, d)
        div = glen.clamp(min=1)[:, None]
        rep = {"sum": gsum, "mean": gsum / div, "eq4": gsum / div * div.sqrt()}[aggregation]
        s_prompt = qs @ kc.repeat_interleave(g, 1).transpose(-1, -2)  # (1, h, q_len, C0)
        s_gen = (qs * rep.repeat_interleave(g, 1)).sum(-1, keepdim=True)  # (1, h, q_len, 1)
        scores = torch.cat([s_prompt, s_gen], -1)[0]  # (h, q_len, C0 + 1)
        starts = torch.cat([bd[:-1], bd.new_tensor([n0])])  # (C0 + 1,)
        ends = torch.cat([bd[1:].expand(q_len, c0), t[:, None]], 1)  # (q_len, C0 + 1)
        ls = torch.minimum(t, (t - local).clamp(min=initial))  # first forced recent key of each new token
        cstart = starts.clamp(min=initial)
        clen = (torch.minimum(ends, ls[:, None]) - cstart[None, :]).clamp(min=0)
        is_cand = clen > 0
        forced = (j[None, :] <= t[:, None]) & ((j[None, :] < initial) | (j[None, :] >= ls[:, None]))  # (q_len, n)
        n_forced = forced.sum(-1)
        if budget is None or budget >= n:
            m = (j[None, :] <= t[:, None]).expand(scores.shape[0], q_len, n)
        else:
            if int(n_forced.max()) > budget:
                raise ValueError(f"budget={budget} must be >= initial ({initial}) + local ({local}) + 1 (the new "
                                 "token) at decode; raise budget or lower initial / local")
            order = torch.sort(scores.masked_fill(~is_cand, float("-inf")), dim=-1, descending=True,
                               stable=True).indices
            olen = torch.gather((clen * is_cand).expand_as(order), -1, order)
            before = torch.empty_like(order)
            before.scatter_(-1, order, olen.cumsum(-1) - olen)
            cidx = torch.cat([chunk_index(bd, n0).to(dev), torch.full((n - n0,), c0, device=dev)])
            place = before[..., cidx] + (j - cstart[cidx])  # (h, q_len, n)
            cand = (j[None, :] >= initial) & (j[None, :] < ls[:, None])
            m = ((place < (budget - n_forced)[:, None]) & cand) | forced
        out.append(m)
    return torch.stack(out)


def decode_attention_sdpa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, prompt_chunks, *,
                          budget: int | None, scale: float | None = None, **kw) -> torch.Tensor:
    """:func:`decode_attention` through :func:`decode_mask` and torch's ``scaled_dot_product_attention``: the same
    kept keys, every new token at once (the needle grid's fast path, ``DHSAPattern(backend="sdpa")``).
    ``kw``: ``initial``, ``local``, ``aggregation``, ``share_heads``. Returns ``(batch, heads, q_len, dim)``."""
    mask = decode_mask(query, key, prompt_chunks, budget=budget, **kw)
    g = query.shape[1] // key.shape[1]
    k, v = (key, value) if g == 1 else (key.repeat_interleave(g, 1), value.repeat_interleave(g, 1))
    return torch.nn.functional.scaled_dot_product_attention(query, k, v, attn_mask=mask, scale=scale)


def decode_memory(model_shape, prompt: int, generated: int, *, method: str, budget: int | None = None,
                  sliding_window: list | None = None, dtype: torch.dtype = torch.bfloat16,
                  chunk_size: int = 64) -> dict:
    """What one decode step holds and reads, in bytes, after ``prompt + generated`` tokens (App. D).

    Args:
        model_shape: a :class:`kvlab.memory.ModelShape` (or a name of ``kvlab.memory.MODEL_SHAPES``).
        prompt, generated: tokens so far (the new token included in ``generated``, ``>= 1``).
        method: ``"dense"`` (full cache, every key read), ``"dhsa"`` (full cache, ``min(N_b, n)`` keys
            read plus one key vector per chunk: the prompt's ``ceil(prompt / chunk_size)`` chunks and the two
            decode chunks), ``"streamingllm"`` / ``"h2o"`` (the cache holds ``min(budget, n)``; H2O also
            keeps one accumulated score per entry and head, in float32).
        budget: ``N_b`` for DHSA, the cache budget for StreamingLLM / H2O (None = unbounded).
        sliding_window: per layer, the window of local layers (None for global ones), e.g. Gemma3's
            ``model_state(model).sliding_window``; a local layer holds ``min(window, n)`` under dense and DHSA,
            ``min(window, budget, n)`` under StreamingLLM / H2O (kvlab's policies trim every layer).
        dtype: cache dtype. chunk_size: DHSA's mean chunk length (sets the number of chunk vectors).

    Returns:
        ``{"cache_bytes", "read_bytes", "entries", "read_entries"}``: bytes held by the cache (all
        layers), bytes one new token's attention reads, and the same in entries summed over layers
        (DHSA's chunk key vectors are in both byte counts, H2O's score buffers in ``cache_bytes``).
    """
    from kvlab.memory import MODEL_SHAPES

    check_choice("method", method, DECODE_METHODS)
    check_int("prompt", prompt, 0)
    check_int("generated", generated, 1)
    if budget is not None:
        check_int("budget", budget, 1)
    shape = MODEL_SHAPES[model_shape] if isinstance(model_shape, str) else model_shape
    windows = list(sliding_window) if sliding_window is not None else [None] * shape.layers
    if len(windows) != shape.layers:
        raise ValueError(f"sliding_window has {len(windows)} entries, the model {shape.layers} layers")
    n = prompt + generated
    per_entry = 2 * shape.kv_heads * shape.head_dim * torch.empty((), dtype=dtype).element_size()
    held = read = extra = extra_read = 0
    for w in windows:
        cap = n if budget is None else min(budget, n)
        if w is not None:  # a local layer holds its window; a compressing policy trims it like any layer
            kept = min(w, n) if method in ("dense", "dhsa") else min(w, cap)
            held += kept
            read += kept
            extra += kept * shape.heads * 4 if method == "h2o" else 0
            continue
        if method == "dense":
            held += n
            read += n
        elif method == "dhsa":
            held += n
            read += cap
            chunks = -(-prompt // chunk_size) + (2 if generated > 1 else 1)
            vectors = chunks * shape.kv_heads * shape.head_dim * torch.empty((), dtype=dtype).element_size()
            extra += vectors
            extra_read += vectors
        else:
            held += cap
            read += cap
            if method == "h2o":
                extra += cap * shape.heads * 4  # accumulated attention, float32, per query head
    return {"cache_bytes": held * per_entry + extra, "read_bytes": read * per_entry + extra_read,
            "entries": held, "read_entries": read}
