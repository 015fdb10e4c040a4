"""DHSA prefill attention with PyTorch FlexAttention: a block mask from the ranked chunk lists and
an exact ``mask_mod``.

Paper: DHSA (arXiv:2510.24606), Sec. 2.1 / App. A. Specification:
:func:`kvlab.dhsa.reference.dhsa_attention_reference` (``keep_diagonal=True``); the kept set is
the :class:`~kvlab.dhsa.reference.ChunkPlan` one (initial keys, diagonal chunk, a prefix of the
query chunk's ranked list). This is the "FlexAttention block top-k" point of comparison for the
Triton kernel: Flex skips a ``128 x 128`` tile only when no query of it keeps any key of it, and
evaluates ``mask_mod`` inside every tile it does not skip.

``mask_mod(b, h, i, j)`` answers "does query ``i`` keep key ``j``" from small tables, without an
``(seq, seq)`` mask: chunk ids ``cid``, chunk starts, and ``first[b, h, c, k]``, the list slot where
key chunk ``k``'s tokens start in query chunk ``c``'s list (a large number when absent)::

    forced = j <= i and (j < initial or j >= max(b_c, initial))
    listed = first[c, k] + (j - max(b_k, initial)) < room_i,   room_i = budget - |forced_i|

On CUDA the attention call goes through ``torch.compile``; on CPU FlexAttention runs eagerly and
materialises scores (small tests only).
"""
from __future__ import annotations

import math

import torch

from .reference import ChunkPlan, chunk_index, chunk_plan

__all__ = ["dhsa_block_mask", "dhsa_attention_flex"]

_COMPILED = {}
_ABSENT = 1 << 30


def _flex_fn():
    from torch.nn.attention.flex_attention import flex_attention

    if not torch.cuda.is_available():
        return flex_attention
    if "flex" not in _COMPILED:
        _COMPILED["flex"] = torch.compile(flex_attention, dynamic=False)
    return _COMPILED["flex"]


def _tables(plan: ChunkPlan):
    """Padded per-batch tables: cid (B, N), start (B, C), cand_start (B, C), first (B, Hs, C, C)."""
    n, initial = plan.n, plan.initial
    bsz = len(plan.starts)
    dev = plan.starts[0].device
    c_max = max(s.numel() for s in plan.starts)
    hs = plan.tokens[0].shape[0]
    cid = torch.zeros(bsz, n, dtype=torch.int32, device=dev)
    start = torch.zeros(bsz, c_max, dtype=torch.int32, device=dev)
    first = torch.full((bsz, hs, c_max, c_max), _ABSENT, dtype=torch.int32, device=dev)
    for b, (st, en, tok, cnt) in enumerate(zip(plan.starts, plan.ends, plan.tokens, plan.n_tokens)):
        bd = torch.cat([st, en[-1:]])
        ci = chunk_index(bd, n)
        cid[b] = ci.to(torch.int32)
        start[b, : st.numel()] = st.to(torch.int32)
        C, L = tok.shape[1], tok.shape[2]
        slot = torch.arange(L, device=dev).expand(hs, C, L)
        live = slot < cnt[..., None]
        kchunk = ci[tok.clamp(min=0).long()]  # (hs, C, L) key chunk of each listed token
        idx = (torch.arange(C, device=dev)[None, :, None] * c_max + kchunk).where(live, 0)
        vals = torch.where(live, slot, torch.full_like(slot, _ABSENT)).to(torch.int32)
        flat = first[b].view(hs, -1)
        flat.scatter_reduce_(1, idx.reshape(hs, -1), vals.reshape(hs, -1), reduce="amin")
    cand_start = start.clamp(min=initial)
    return cid, start, cand_start, first


def touched_blocks(plan: ChunkPlan, block: int):
    """``(B, Hs, nq, nk)`` bool: query tile ``qb`` keeps at least one key of key tile ``kb``."""
    n, initial = plan.n, plan.initial
    bsz = len(plan.starts)
    dev = plan.starts[0].device
    hs = plan.tokens[0].shape[0]
    nb = -(-n // block)
    out = torch.zeros(bsz, hs, nb, nb, dtype=torch.bool, device=dev)
    qb_all = torch.arange(nb, device=dev)
    init_kb = -(-initial // block)
    # initial keys: every query tile sees key tiles < ceil(initial / block), causally
    out[..., :, :init_kb] = (qb_all[None, :init_kb] <= qb_all[:, None]) if init_kb else False
    for b, (st, en, tok, cnt) in enumerate(zip(plan.starts, plan.ends, plan.tokens, plan.n_tokens)):
        q_lo, q_hi = st // block, (en - 1) // block  # query tiles of each chunk
        span = int((q_hi - q_lo).max()) + 1
        # diagonal: tiles from the chunk's first key tile to each of its query tiles
        for oq in range(span):
            for ok in range(oq + 1):
                qb, kb = q_lo + oq, q_lo + ok
                live = qb <= q_hi
                out[b, :, qb[live], kb[live]] = True
        # ranked lists
        C, L = tok.shape[1], tok.shape[2]
        live = torch.arange(L, device=dev).expand(hs, C, L) < cnt[..., None]
        kb = tok.clamp(min=0).long() // block
        for oq in range(span):
            qb = (q_lo + oq)[None, :, None].expand(hs, C, L)
            ok = live & (qb <= q_hi[None, :, None])
            h_idx = torch.arange(hs, device=dev)[:, None, None].expand(hs, C, L)
            out[b, h_idx[ok], qb[ok], kb[ok]] = True
    return out


def dhsa_block_mask(plan: ChunkPlan, block_size: int = 128):
    """FlexAttention ``BlockMask`` with DHSA's exact kept set (tiles from the plan, ``mask_mod`` inside)."""
    from torch.nn.attention.flex_attention import BlockMask

    cid, start, cand_start, first = _tables(plan)
    budget, initial = plan.budget, plan.initial
    shared = first.shape[1] == 1

    def mask_mod(b, h, q_idx, kv_idx):
        c = cid[b, q_idx]
        kc = cid[b, kv_idx]
        s = start[b, c]
        excess = torch.clamp(s - initial, min=0)
        forced = (kv_idx <= q_idx) & ((kv_idx < initial) | (kv_idx >= torch.clamp(s, min=initial)))
        room = budget - (q_idx + 1 - excess)
        hh = 0 if shared else h
        slot = first[b, hh, c, kc] + (kv_idx - cand_start[b, kc])
        listed = (kc < c) & (kv_idx >= initial) & (slot < room)
        return forced | listed

    touched = touched_blocks(plan, block_size)
    num = touched.sum(-1).to(torch.int32)
    idx = torch.argsort(touched.to(torch.int8), dim=-1, descending=True, stable=True).to(torch.int32)
    return BlockMask.from_kv_blocks(num, idx, BLOCK_SIZE=block_size, mask_mod=mask_mod, seq_lengths=(plan.n, plan.n))


def dhsa_attention_flex(q, k, v, boundaries, budget, *, initial: int = 0, aggregation: str = "eq4",
                        share_heads: bool = False, scale: float | None = None, plan: ChunkPlan | None = None,
                        block_mask=None, block_size: int = 128) -> torch.Tensor:
    """DHSA attention through FlexAttention. Shapes as the reference; ``plan`` / ``block_mask`` may
    be passed to reuse them (a benchmark times building them apart)."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    if block_mask is None:
        if plan is None:
            plan = chunk_plan(q, k, boundaries, budget, initial=initial, aggregation=aggregation,
                              share_heads=share_heads)
        block_mask = dhsa_block_mask(plan, block_size)
    gqa = q.shape[1] != k.shape[1]
    return _flex_fn()(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=gqa)
