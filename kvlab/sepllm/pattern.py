"""Prefill/training attention patterns of SepLLM and its baselines (Sec. 3.1-3.2, Sec. 4.7, App. I).

A pattern replaces attention in chosen layers (``kvlab.core.use_pattern``). All patterns here keep,
for query ``q`` and key ``k <= q``::

    k < init                      # initial tokens (attention sinks)
    or q - k < neighbors          # the n nearest tokens, the query itself included (n = 1: diagonal only)
    or far[k]                     # keys every later query keeps: separators (SepLLM) or every delta-th
                                  # position (FixLLM); none (StreamingLLM)

which is Eq. 1-2 of the paper with ``M[q, k] = 1`` exactly there. ``far`` depends only on the key, so the
same rule also says what a decoding cache must physically hold (:mod:`kvlab.sepllm.policy`): prefilling
with a pattern and decoding token by token with the matching policy give the same NLL (tested).

* :class:`SepLLMPattern` — ``far = is separator``; backend ``"mask"`` builds the boolean mask
  (:func:`kvlab.sepllm.reference.sepllm_mask`) and runs SDPA, ``"torch" | "flex" | "triton"`` call
  :func:`kvlab.sepllm.sep_attention`. With ``separators=()`` it is StreamingLLM's mask.
* :class:`FixLLMPattern` — App. I: one token every ``interval`` positions instead of separators.
  Our reading: the kept position closes its block of ``interval`` tokens (``k % interval == interval-1``),
  as a separator closes its segment.
* :class:`HeadwisePattern` — Table 9's naive baseline: ``window_heads`` of the query heads use a sliding
  window of ``neighbors`` (plus ``init`` sinks, 0 by default as in the paper), the others full attention.

:func:`kv_ratio` gives each pattern's kept share of the causal entries (the paper's r.KV for a fixed text),
:func:`pattern_nll` the teacher-forced NLL of a text under a pattern, in one pass or chunk by chunk.
"""

from __future__ import annotations

from typing import Iterable

import torch

from kvlab.core import AttentionCall, AttentionPattern, MaskPattern, check_choice, check_int, kv_ratio, use_pattern
from kvlab.sepllm.reference import kept_fraction, sepllm_mask
from kvlab.sepllm.separators import SeparatorSet

__all__ = ["SepLLMPattern", "FixLLMPattern", "HeadwisePattern", "StreamingPattern", "kv_ratio", "match_neighbors",
           "pattern_nll"]

_BACKENDS = ("mask", "torch", "flex", "triton")


class _KeepPattern(MaskPattern):
    """Initial + neighbours + ``far`` keys. Subclasses define :meth:`far`."""

    def __init__(self, init: int, neighbors: int, backend: str):
        self.init = check_int("init", init, 0)
        self.neighbors = check_int("neighbors", neighbors, 1)
        self.backend = check_choice("backend", backend, _BACKENDS)
        super().__init__(self.mask, name=type(self).__name__)

    def far(self, positions: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:  # pragma: no cover
        """``(batch, n)`` bool: keys that every later query sees."""
        raise NotImplementedError

    def mask(self, call: AttentionCall) -> torch.Tensor:
        """``(batch, 1, q, n)`` bool for any query/key positions (a chunk attending to a cache included)."""
        far = self.far(call.k_positions, call.k_token_ids)
        diff = call.q_positions[:, None, :, None] - call.k_positions[:, None, None, :]
        static = (call.k_positions[:, None, None, :] < self.init) | (diff < self.neighbors)
        return (static | far[:, None, None, :]) & (diff >= 0)

    def __call__(self, query, key, value, call: AttentionCall) -> torch.Tensor:
        n = key.shape[2]
        # A prefill from scratch (kvlab knows it without a host sync) can use the kernels; anything else
        # (keys from a cache, a sliding-window layer) takes the position-general mask.
        fresh = call.fresh and query.shape[2] == n and call.sliding_window is None
        if not fresh:  # keys from a cache, or a sliding-window layer: the position-general mask
            return super().__call__(query, key, value, call)
        far = self.far(call.k_positions, call.k_token_ids)
        if self.backend == "mask":
            mask = sepllm_mask(far, self.init, self.neighbors)[:, None]
            return torch.nn.functional.scaled_dot_product_attention(
                query, key, value, attn_mask=mask, scale=call.scaling, enable_gqa=query.shape[1] != key.shape[1])
        from kvlab.sepllm.api import sep_attention

        return sep_attention(query, key, value, far, self.init, self.neighbors, scale=call.scaling,
                             backend=self.backend)

    def kept_fraction(self, token_ids: torch.Tensor) -> float:
        """Kept entries over causal entries for ``token_ids`` ``(batch, T)`` (one fresh prefill)."""
        ids = token_ids if token_ids.dim() == 2 else token_ids[None]
        pos = torch.arange(ids.shape[1], device=ids.device).expand_as(ids)
        return kept_fraction(self.far(pos, ids), self.init, self.neighbors)


class SepLLMPattern(_KeepPattern):
    """SepLLM's mask (Eq. 1-2, Fig. 3): initial, every earlier separator, ``neighbors`` nearest tokens.

    Args:
        separators: separator token ids, or a tokenizer (then :func:`separator_ids` of it).
        init: initial tokens ``a`` (paper: 3 in the training-free runs, 4 in streaming).
        neighbors: ``n``; key ``k`` is a neighbour of query ``q`` when ``q - k < n``.
        backend: ``"mask"`` (reference mask + SDPA; CPU default) or a backend of
            :func:`kvlab.sepllm.sep_attention` (``"torch"``, ``"flex"``, ``"triton"``).
    """

    def __init__(self, separators, init: int = 3, neighbors: int = 256, *, backend: str = "mask"):
        self._separators = SeparatorSet(separators)
        super().__init__(init, neighbors, backend)

    @property
    def separators(self) -> torch.Tensor:
        """The separator ids, sorted ``(k,)``."""
        return self._separators.ids

    def far(self, positions, token_ids):
        return self._separators.flags(token_ids)

    def __repr__(self) -> str:
        return f"SepLLMPattern(init={self.init}, neighbors={self.neighbors}, separators={self.separators.numel()})"


class StreamingPattern(SepLLMPattern):
    """StreamingLLM's mask: ``init`` sinks and ``neighbors`` nearest tokens (SepLLM without separators).

    Equals decoding with ``StreamingLLM(sink=init, window=neighbors - 1, positions="original")``.
    """

    def __init__(self, init: int = 3, neighbors: int = 256, *, backend: str = "mask"):
        super().__init__((), init, neighbors, backend=backend)

    def __repr__(self) -> str:
        return f"StreamingPattern(init={self.init}, neighbors={self.neighbors})"


class FixLLMPattern(_KeepPattern):
    """FixLLM (App. I, Table 17): initial, neighbours, and one key every ``interval`` positions
    (``k % interval == interval - 1``) instead of separators. ``interval=1`` is full attention."""

    def __init__(self, init: int = 3, neighbors: int = 256, interval: int = 8, *, backend: str = "mask"):
        self.interval = check_int("interval", interval, 1)
        super().__init__(init, neighbors, backend)

    def far(self, positions, token_ids):
        return positions % self.interval == self.interval - 1

    def __repr__(self) -> str:
        return f"FixLLMPattern(init={self.init}, neighbors={self.neighbors}, interval={self.interval})"


class HeadwisePattern(AttentionPattern):
    """Table 9's naive baseline: the first ``window_heads`` of ``num_heads`` query heads attend to a
    sliding window of ``neighbors`` tokens (plus ``init`` sinks), the remaining heads attend to everything.

    With grouped-query attention a KV head is only saved when all its query heads slide; the paper counts
    r.KV per query head (Table 9 uses 20..30 of Llama-3-8B's 32 query heads), and so does :func:`kv_ratio`.
    """

    def __init__(self, window_heads: int, num_heads: int, neighbors: int = 256, init: int = 0):
        self.num_heads = check_int("num_heads", num_heads, 1)
        self.window_heads = check_int("window_heads", window_heads, 0)
        if window_heads > num_heads:
            raise ValueError(f"window_heads ({window_heads}) must be <= num_heads ({num_heads})")
        self.neighbors = check_int("neighbors", neighbors, 1)
        self.init = check_int("init", init, 0)

    def mask(self, call: AttentionCall) -> torch.Tensor:
        """``(batch, heads, q, n)`` bool."""
        diff = call.q_positions[:, None, :, None] - call.k_positions[:, None, None, :]
        causal = call.causal_mask()
        window = causal & ((diff < self.neighbors) | (call.k_positions[:, None, None, :] < self.init))
        sliding = torch.arange(self.num_heads, device=diff.device)[None, :, None, None] < self.window_heads
        return torch.where(sliding, window, causal)

    def __call__(self, query, key, value, call: AttentionCall) -> torch.Tensor:
        if query.shape[1] != self.num_heads:
            raise ValueError(f"HeadwisePattern was built for {self.num_heads} query heads, the model has "
                             f"{query.shape[1]}")
        return torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=self.mask(call), scale=call.scaling,
            enable_gqa=query.shape[1] != key.shape[1])

    def kept_fraction(self, token_ids: torch.Tensor) -> float:
        ids = token_ids if token_ids.dim() == 2 else token_ids[None]
        none = torch.zeros_like(ids, dtype=torch.bool)
        window = kept_fraction(none, self.init, self.neighbors)
        return (self.window_heads * window + (self.num_heads - self.window_heads)) / self.num_heads

    def __repr__(self) -> str:
        return (f"HeadwisePattern(window_heads={self.window_heads}/{self.num_heads}, neighbors={self.neighbors}, "
                f"init={self.init})")


@torch.no_grad()
def pattern_nll(model, token_ids: torch.Tensor, pattern: AttentionPattern | None = None, *,
                layers: Iterable[int] | None = None, chunk_size: int | None = None, policy=None) -> torch.Tensor:
    """Teacher-forced NLL (nats) of tokens ``1..T-1`` of ``token_ids`` ``(1, T)`` under ``pattern``.

    ``chunk_size=None``: one forward pass with the pattern (memory grows as ``T^2``).
    ``chunk_size=k``: feed ``k`` tokens at a time through a :class:`~kvlab.core.KVCache` whose ``policy``
    drops what the pattern would never show again (e.g. ``SepLLM`` for ``SepLLMPattern``), the pattern
    masking each chunk against the kept entries: the same numbers at a cost linear in ``T``.
    """
    from kvlab.core import KVCache

    ids = token_ids if token_ids.dim() == 2 else token_ids[None]
    device = next(model.parameters()).device
    ids = ids.to(device)
    with use_pattern(model, pattern, layers):
        if chunk_size is None:
            logits = model(input_ids=ids, use_cache=False).logits
        else:
            check_int("chunk_size", chunk_size, 1)
            if policy is None:
                raise ValueError("chunk_size needs the policy that physically drops what the pattern hides")
            cache = KVCache(model, policy)
            logits = torch.cat([model(input_ids=ids[:, s:s + chunk_size], past_key_values=cache,
                                      use_cache=True).logits for s in range(0, ids.shape[1], chunk_size)], dim=1)
    return torch.nn.functional.cross_entropy(logits[0, :-1].float(), ids[0, 1:], reduction="none").double().cpu()



def match_neighbors(make, target: float, token_ids: torch.Tensor, lo: int = 1, hi: int | None = None) -> int:
    """Smallest ``n`` with ``make(n).kept_fraction(token_ids) >= target``: the window that gives a baseline
    the same runtime KV as SepLLM (how Table 1 sets StrmLLM's ``n=380`` and Table 9 each row's ``n``).

    ``make``: ``n -> pattern``, e.g. ``lambda n: StreamingPattern(3, n)``. Binary search; kept share grows
    with ``n``. Returns ``hi`` (default: the sequence length) when the target is out of reach.
    """
    hi = token_ids.shape[-1] if hi is None else hi
    while lo < hi:
        mid = (lo + hi) // 2
        if make(mid).kept_fraction(token_ids) < target:
            lo = mid + 1
        else:
            hi = mid
    return lo
