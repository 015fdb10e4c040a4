"""SepLLM attention in plain PyTorch: the specification and the oracle of the fast backends.

Paper: SepLLM, "Accelerate Large Language Models by Compressing One Segment into One Separator"
(Chen et al., ICML 2025, https://arxiv.org/abs/2412.12094), Sec. 3.1-3.2, Eq. 1-2, Fig. 3.

During training and prefill every query sees, among the keys before it,

* the ``init`` initial tokens (attention sinks),
* every separator token (". , ? ! ; : \\t \\n" ...; which ids count is the tokenizer's business:
  the caller passes a boolean ``is_sep`` per position),
* the ``neighbors`` nearest tokens, itself included.

Our reading of "the closest n tokens" (the paper gives no formula): key ``k`` is a neighbour of
query ``q`` when ``0 <= q - k < n``, so ``n`` counts the query itself; ``n = 1`` keeps only the
diagonal. In pseudocode, for one sequence::

    M[q, k] = k <= q and (k < init or q - k < neighbors or is_sep[k])
    S = (Q @ K^T) * scale;  S[~M] = -inf
    O = softmax(S, dim=-1) @ V                                          # Eq. 1-2

Everything here materialises the ``(seq, seq)`` mask, so it is meant for short sequences: tests,
notebooks, and the ``"torch"`` backend of :func:`kvlab.sepllm.sep_attention`.
"""
from __future__ import annotations

import math

import torch

__all__ = ["sepllm_mask", "kept_fraction", "touched_block_fraction", "sep_attention_reference"]


def sepllm_mask(is_sep: torch.Tensor, init: int, neighbors: int) -> torch.Tensor:
    """Boolean SepLLM mask, ``True`` where query ``q`` (row) may attend to key ``k`` (column).

    Args:
        is_sep: ``(batch, seq)`` bool, separator flag of each position.
        init: number of initial tokens every query sees (``a`` in the paper).
        neighbors: window size ``n``; ``q - k < n`` is visible (the query itself included).

    Returns:
        ``(batch, seq, seq)`` bool.
    """
    n = is_sep.shape[-1]
    pos = torch.arange(n, device=is_sep.device)
    q, k = pos[:, None], pos[None, :]
    causal = k <= q
    static = (k < init) | (q - k < neighbors)  # (seq, seq), same for every sequence
    return causal & (static[None] | is_sep[:, None, :].bool())


def kept_fraction(is_sep: torch.Tensor, init: int, neighbors: int) -> float:
    """Kept entries of the SepLLM mask over the entries of the causal mask, without building it.

    This is the physical limit on saved work: a kernel that touches only kept entries does this
    fraction of dense causal attention's arithmetic. Counts per query ``q`` (0-based):
    ``min(q+1, n)`` neighbours, plus the initial tokens and separators at ``k <= q - n``.
    """
    b, n = is_sep.shape
    pos = torch.arange(n, device=is_sep.device)
    far = is_sep.bool().clone()
    far[:, :init] = True  # initial tokens are kept whether or not they are separators
    far_before = torch.cumsum(far.long(), dim=1)  # far_before[:, j] = kept far keys at <= j
    window = torch.clamp(pos + 1, max=neighbors)
    last_far = pos - neighbors  # keys <= q - n are outside the window
    far_count = torch.where(last_far >= 0, far_before[:, last_far.clamp(min=0)], 0)
    kept = (window[None] + far_count).sum().item()
    causal = b * n * (n + 1) // 2
    return kept / causal


def touched_block_fraction(is_sep: torch.Tensor, init: int, neighbors: int, block: int = 128) -> float:
    """Share of the causal ``block x block`` tiles that hold at least one kept entry.

    This is the work a block-sparse kernel (FlexAttention's ``BlockMask``) does relative to dense
    causal attention: a tile is skipped only when it is empty. Compare with :func:`kept_fraction`.
    Materialises the mask: for short sequences.
    """
    mask = sepllm_mask(is_sep, init, neighbors)
    b, n, _ = mask.shape
    nb = -(-n // block)
    pad = nb * block - n
    mask = torch.nn.functional.pad(mask, (0, pad, 0, pad))
    tiles = mask.view(b, nb, block, nb, block).any(dim=4).any(dim=2)  # (batch, nb, nb)
    causal_tiles = b * nb * (nb + 1) // 2
    return tiles.sum().item() / causal_tiles


def sep_attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    is_sep: torch.Tensor,
    init: int,
    neighbors: int,
    scale: float | None = None,
) -> torch.Tensor:
    """SepLLM attention, eager and materialised, in the dtype of the inputs.

    Args:
        q: ``(batch, heads, seq, dim)``.
        k, v: ``(batch, kv_heads, seq, dim)``; ``heads`` is a multiple of ``kv_heads`` (GQA: query
            head ``h`` reads key/value head ``h // (heads // kv_heads)``).
        is_sep: ``(batch, seq)`` bool.
        init, neighbors: see :func:`sepllm_mask`.
        scale: softmax scale, default ``1 / sqrt(dim)``.

    Returns:
        ``(batch, heads, seq, dim)``, same dtype as ``q``. Pass float64 inputs for the oracle.
    """
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    mask = sepllm_mask(is_sep, init, neighbors)[:, None]  # (batch, 1, seq, seq)
    scores = (q @ k.transpose(-1, -2)) * scale
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v
