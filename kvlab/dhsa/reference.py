"""DHSA in plain PyTorch: the specification and the oracle of the fast backends.

Paper: Xiong et al., "Long-Context Modeling with Dynamic Hierarchical Sparse Attention for On-Device
LLMs" (2025, arXiv:2510.24606; authors' code github.com/xiongsiheng/DHSA). Sec. 2.1-2.3 (Eq. 1-4),
App. A (prefill/decode workflow), App. B (labels Eq. 5-8, focal loss Eq. 9, inference with NMS).
The extracted text lost its equations; ``docs/papers/dhsa.md`` has our reading. Every reading
this module relies on is marked "reading:" and says whether it follows the text or the authors'
legacy code (``legacy/utils/helper.py``, ``legacy/boundary_predictor/*.py``).

The mechanism, for one sequence of ``N`` tokens and one head::

    boundaries b = [0 = b_0 < b_1 < ... < b_C = N]          # chunk c = tokens [b_c, b_{c+1})
    q_C = sqrt(|C|) * mean(q_i, i in C),  k_C likewise      # Eq. 4 (chunk_representation)
    S = Q_chunks @ K_chunks^T                               # (C, C) chunk similarity (Sec. 2.3)
    S_tok[i, j] = S[c(i), c(j)]                             # upsampling (Sec. 2.1 step 2)
    M[i, :] = TopK_j<=i (S_tok[i, :], N_b)                  # per-query budget, causal (dhsa_mask)
    O = softmax(Q K^T * scale, masked by M) @ V

Boundaries come from fixed-size chunking (the block-sparse baseline), from the labelling rule on a
model's own attention (oracle, Eq. 5-8), or from the learned boundary predictor (Eq. 1-3); the last two, the
focal loss (Eq. 9), NMS and the recall of a kept set are :mod:`kvlab.dhsa.boundary_predictor`.

Readings, in one place (each is repeated where it is used):

* text: Eq. 4 with the true length; the same chunks on the query and key side (the authors' legacy
  code chunks queries into fixed blocks); per-query TopK with budget ``N_b``, causal;
* ours, as parameters: ``initial`` first tokens and the diagonal chunk always kept, inside the
  budget (the code keeps 128 initial and 128 recent tokens); ties go to the earlier position;
  ``share_heads`` (the code averages heads; the text is silent); selection arithmetic in float32;
* code: labels (Eq. 5-7): queries ``j >= t + w`` sum their attention on the past and the future
  window, ratio ``max / min``; positions ``2w - 1 <= t < n - 2w`` only; soft label values
  ``alpha = 2``, ``beta = -2 ln 2`` (Eq. 8); focal ``gamma = 2``, ``pos_weight = 1.3`` (Eq. 9);
  oracle threshold 1.1 on the ratio, NMS window 8, ``N_c = 8 x`` the number of fixed blocks;
* text over code: the predictor's two windows are encoded separately (the code encodes the ``2w``
  tokens jointly: ``encoder="joint"``); soft labels are trained on (the code binarises them);
* NOTES.md's alternative reading of Eq. 5-7 is ``label_ratios(..., rule="notes")``.

Conventions: tensors are ``(batch, heads, seq, dim)``; keys/values may have fewer heads (GQA: query
head ``h`` reads key head ``h // (heads // kv_heads)``). A chunking is a 1-d LongTensor of *offsets*
``[0, b_1, ..., N]`` (strictly increasing), shared by the batch, or a list with one per sequence.
Everything here materialises ``(seq, seq)`` tensors: tests, notebooks and the ``"torch"`` backend.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

__all__ = [
    # chunkings
    "fixed_boundaries", "check_boundaries", "chunk_index", "chunk_lengths", "split_long_chunks",
    "decode_boundaries",
    # Eq. 4, similarity, upsampling, selection, attention
    "AGGREGATIONS", "chunk_representation", "represent_sums", "chunk_similarity", "upsample", "dhsa_mask", "block_query_mask",
    "INITIAL_RULES", "TIE_ORDERS",
    "dhsa_attention_reference", "dhsa_decode_reference", "kept_per_row", "max_forced", "local_starts",
    # chunk form of the kept set (what the kernels consume)
    "ChunkPlan", "chunk_plan", "plan_mask",
]

AGGREGATIONS = ("eq4", "mean", "padded_mean", "sum")


# ================================================================================================
# Chunkings
# ================================================================================================
def fixed_boundaries(n: int, chunk_size: int, device=None) -> torch.Tensor:
    """Offsets of fixed-size chunks ``[0, s, 2s, ..., n]`` (the last chunk may be shorter).

    This is the block-sparse baseline's chunking (the paper's "static chunking", Fig. 5 left).
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    b = list(range(0, n, chunk_size)) + [n]
    return torch.tensor(b, dtype=torch.long, device=device)


def check_boundaries(boundaries: torch.Tensor, n: int, name: str = "boundaries") -> torch.Tensor:
    """``boundaries`` as a LongTensor of offsets ``[0, ..., n]``, strictly increasing; else ValueError."""
    if not isinstance(boundaries, torch.Tensor):
        boundaries = torch.as_tensor(boundaries)
    if boundaries.dim() != 1 or boundaries.numel() < 2:
        raise ValueError(f"{name} must be a 1-d tensor of chunk offsets [0, ..., seq] with at least two "
                         f"entries, got shape {tuple(boundaries.shape)}")
    if boundaries.is_floating_point() or boundaries.dtype == torch.bool:
        raise ValueError(f"{name} must hold integer offsets, got dtype {boundaries.dtype}")
    boundaries = boundaries.long()
    if int(boundaries[0]) != 0 or int(boundaries[-1]) != n:
        raise ValueError(f"{name} must start at 0 and end at seq={n} (offsets of the chunks), got "
                         f"first={int(boundaries[0])}, last={int(boundaries[-1])}")
    if bool((boundaries[1:] <= boundaries[:-1]).any()):
        raise ValueError(f"{name} must be strictly increasing (no empty chunks)")
    return boundaries


def _per_batch(boundaries, bsz: int, n: int) -> list[torch.Tensor]:
    """One checked offsets tensor per sequence of the batch."""
    if isinstance(boundaries, torch.Tensor) and boundaries.dim() == 1:
        b = check_boundaries(boundaries, n)
        return [b] * bsz
    if isinstance(boundaries, torch.Tensor) and boundaries.dim() == 2:
        boundaries = list(boundaries)
    if not isinstance(boundaries, (list, tuple)) or len(boundaries) != bsz:
        raise ValueError(f"boundaries must be one 1-d offsets tensor or a list of {bsz} (one per sequence)")
    return [check_boundaries(b, n, f"boundaries[{i}]") for i, b in enumerate(boundaries)]


def chunk_lengths(boundaries: torch.Tensor) -> torch.Tensor:
    """``(C,)`` number of tokens of each chunk."""
    return boundaries[1:] - boundaries[:-1]


def chunk_index(boundaries: torch.Tensor, n: int | None = None) -> torch.Tensor:
    """``(n,)`` index of the chunk each token belongs to (``c(i)`` in the module docstring)."""
    n = int(boundaries[-1]) if n is None else n
    pos = torch.arange(n, device=boundaries.device)
    return torch.searchsorted(boundaries, pos, right=True) - 1


def split_long_chunks(boundaries: torch.Tensor, max_len: int) -> torch.Tensor:
    """Cut every chunk longer than ``max_len`` into pieces of at most ``max_len`` tokens.

    Ours, not the paper's: NMS with a cap on the number of chunks can leave a long stretch without a
    boundary; the diagonal chunk is always kept, so its length must fit the budget (``dhsa_mask``).
    """
    if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 1:
        raise ValueError(f"max_len must be an int >= 1 (longest chunk in tokens), got {max_len!r}")
    st, en = boundaries[:-1].long(), boundaries[1:].long()
    pieces = (en - st + max_len - 1) // max_len  # (C,) pieces of each chunk
    first = torch.repeat_interleave(st, pieces)
    offset = torch.arange(int(pieces.sum()), device=boundaries.device) - torch.repeat_interleave(
        pieces.cumsum(0) - pieces, pieces)
    return torch.cat([first + offset * max_len, boundaries[-1:].long()])


def decode_boundaries(prompt_boundaries: torch.Tensor, total: int) -> torch.Tensor:
    """Chunking at a decode step (App. A): the prompt's chunks, then all tokens generated before
    the current one as one chunk, then the current token as its own chunk.

    Args:
        prompt_boundaries: offsets ``[0, ..., n0]`` of the prompt (``n0`` prompt tokens).
        total: sequence length at this step, prompt + generated, the current token included.

    Reading (text, App. A): "the chunk ``C_{m+1}`` contains all previously generated tokens in the
    current decoding session; ``C_{m+2}`` contains only the current query token". At the first
    generated token there are no previous generated tokens and that chunk is left out (no empty chunks).
    """
    n0 = int(prompt_boundaries[-1])
    if total <= n0:
        raise ValueError(f"total={total} must exceed the prompt length {n0} (the current token is new)")
    extra = ([total - 1] if total - 1 > n0 else []) + [total]
    return torch.cat([prompt_boundaries.long(), torch.tensor(extra, dtype=torch.long,
                                                             device=prompt_boundaries.device)])


# ================================================================================================
# Eq. 4: chunk representation, chunk similarity, upsampling
# ================================================================================================
def chunk_representation(x: torch.Tensor, boundaries: torch.Tensor, aggregation: str = "eq4") -> torch.Tensor:
    """One vector per chunk from the token vectors in it.

    Args:
        x: ``(batch, heads, seq, dim)`` queries or keys.
        boundaries: offsets ``[0, ..., seq]``.
        aggregation: how a chunk ``C`` with sum ``s_C`` and true length ``|C|`` becomes a vector
            (``L = max |C|`` is the padded length):

            * ``"eq4"``: ``s_C / |C| * sqrt(|C|)`` (Eq. 4: the mean over the *unpadded* length, scaled
              by the square root of the length),
            * ``"mean"``: ``s_C / |C|`` (plain average pooling, the block-sparse baseline),
            * ``"padded_mean"``: ``s_C / L`` (average after zero padding every chunk to ``L``: the
              first pitfall of Sec. 2.3),
            * ``"sum"``: ``s_C``.

    Returns:
        ``(batch, heads, C, dim)`` in ``x.dtype``.

    Reading (text, Sec. 2.3; NOTES.md): ``q_C = sqrt(|C|) * mean(q_i)``. The authors' code
    (``avgpool_norm``) does the same for keys.
    """
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")
    if not isinstance(x, torch.Tensor) or x.dim() != 4:
        raise ValueError(f"x must be queries or keys of shape (batch, heads, seq, dim), got "
                         f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}: add the missing "
                         "dimensions (one head of one sequence (seq, dim) is x[None, None])")
    n = x.shape[-2]
    idx = chunk_index(boundaries, n).to(x.device)
    lengths = chunk_lengths(boundaries).to(x.device, x.dtype)  # (C,)
    sums = torch.zeros(*x.shape[:-2], lengths.numel(), x.shape[-1], dtype=x.dtype, device=x.device)
    sums.index_add_(-2, idx, x)
    return represent_sums(sums, lengths, aggregation)


def represent_sums(sums: torch.Tensor, lengths: torch.Tensor, aggregation: str) -> torch.Tensor:
    """A chunk's representation from the sum of its rows and its length (the last step of
    :func:`chunk_representation`: the sum, the mean over the longest chunk, the mean, or the mean scaled by the
    square root of the length, the paper's length-normalised aggregation)."""
    if aggregation == "sum":
        return sums
    if aggregation == "padded_mean":
        return sums / lengths.max()
    mean = sums / lengths[:, None]
    if aggregation == "mean":
        return mean
    return mean * lengths.sqrt()[:, None]


def chunk_similarity(q: torch.Tensor, k: torch.Tensor, boundaries: torch.Tensor, aggregation: str = "eq4",
                     share_heads: bool = False, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Chunk-level similarity ``S = Q_chunks @ K_chunks^T`` (Sec. 2.3).

    Args:
        q: ``(batch, heads, seq, dim)``; k: ``(batch, kv_heads, seq, dim)``.
        boundaries: offsets shared by queries and keys (the same chunking on both sides).
        share_heads: average queries over heads and keys over key heads first, giving one ``S``
            for all heads (the authors' code does this; the text does not say).
        dtype: arithmetic dtype of the selection (float32 by default, as the authors' code, which
            disables autocast for it; the same for every backend so that they keep the same keys).

    Returns:
        ``(batch, heads | 1, C, C)``.

    Reading (text): chunks are the same on the query and key side ("between chunks i and j"). The
    authors' legacy code chunks the queries into fixed blocks of ``block_size`` instead.
    """
    q = q.to(dtype)
    k = k.to(dtype)
    if share_heads:
        q = q.mean(dim=1, keepdim=True)
        k = k.mean(dim=1, keepdim=True)
    qc = chunk_representation(q, boundaries, aggregation)
    kc = chunk_representation(k, boundaries, aggregation)
    kc = kc.repeat_interleave(qc.shape[1] // kc.shape[1], dim=1)
    return qc @ kc.transpose(-1, -2)


def upsample(s: torch.Tensor, boundaries: torch.Tensor, n: int | None = None,
             q_boundaries: torch.Tensor | None = None) -> torch.Tensor:
    """Token-level scores: every token pair inherits its chunk pair's score (Sec. 2.1, step 2).

    ``s``: ``(..., Cq, Ck)``; returns ``(..., nq, nk)`` with ``out[..., i, j] = s[..., c(i), c(j)]``.
    ``q_boundaries`` (default ``boundaries``) chunks the rows.
    """
    qb = boundaries if q_boundaries is None else q_boundaries
    ki = chunk_index(boundaries, n).to(s.device)
    qi = chunk_index(qb, None if q_boundaries is not None else n).to(s.device)
    return s[..., qi, :][..., :, ki]


# ================================================================================================
# Selection: per-query TopK under the budget N_b, causal, initial + diagonal kept
# ================================================================================================
def _select_rows(token_scores: torch.Tensor, q_pos: torch.Tensor, diag_start: torch.Tensor,
                 budget: int | None, initial: int) -> torch.Tensor:
    """Keep mask of query rows from their token-level scores.

    Args:
        token_scores: ``(batch, heads, rows, n)``.
        q_pos: ``(rows,)`` position of each query row among the ``n`` keys.
        diag_start: ``(rows,)`` first key of the row's always-kept local range ``[diag_start, q_pos]``
            (its chunk's start when the diagonal chunk is kept, ``q_pos + 1`` when not).
        budget: keys per query, the forced ones included; None keeps every causal key.
        initial: the first ``initial`` keys are always kept (causally).

    Rule: forced = ``{j < initial} U [diag_start, q_pos]`` (causal); the remaining
    ``budget - |forced|`` keys are the causal non-forced keys with the highest scores, ties broken
    by lower position first (so a partly kept chunk keeps its first tokens).
    """
    n = token_scores.shape[-1]
    j = torch.arange(n, device=token_scores.device)
    causal = j[None, :] <= q_pos[:, None]  # (rows, n)
    if budget is None:
        return causal.expand(token_scores.shape).clone()
    forced = causal & ((j[None, :] < initial) | (j[None, :] >= diag_start[:, None]))
    n_forced = forced.sum(-1)  # (rows,)
    if int(n_forced.max()) > budget:
        worst = int(n_forced.argmax())
        raise ValueError(
            f"budget={budget} is smaller than the always-kept keys of query {int(q_pos[worst])} "
            f"({int(n_forced.max())} = initial tokens + its diagonal chunk so far): the budget must be "
            "at least initial + the longest chunk; raise budget or use shorter chunks")
    cand = causal & ~forced
    scores = token_scores.masked_fill(~cand, float("-inf"))
    order = torch.sort(scores, dim=-1, descending=True, stable=True).indices  # ties: lower j first
    rank = torch.empty_like(order)
    rank.scatter_(-1, order, torch.arange(n, device=order.device).expand_as(order))
    room = (budget - n_forced)[:, None]  # (rows, 1)
    return forced | (cand & (rank < room))


def local_starts(boundaries: torch.Tensor, local: int, initial: int) -> torch.Tensor:
    """``(C,)`` first key of each chunk's always-kept range before it: ``max(b_c - local, initial)``, at
    most ``b_c`` (ours, for the authors' "recent" keys: the ``local`` keys before the query's chunk are kept
    with the chunk, so a query keeps between ``local`` and ``local + |C|`` recent keys)."""
    st = boundaries[:-1]
    return torch.minimum(st, (st - local).clamp(min=initial))


def _causal_query_scores(q: torch.Tensor, k: torch.Tensor, bd: torch.Tensor, aggregation: str, share_heads: bool,
                         dtype: torch.dtype) -> torch.Tensor:
    """``(1, heads | 1, n, C)`` scores of each query row against every key chunk, with the row's chunk
    vector built from the queries of its chunk *up to the row* (Eq. 4 on ``[b_c, i]``): nothing after
    ``i`` enters row ``i``'s selection."""
    n = q.shape[-2]
    qs, ks = q.to(dtype), k.to(dtype)
    if share_heads:
        qs, ks = qs.mean(1, keepdim=True), ks.mean(1, keepdim=True)
    kc = chunk_representation(ks, bd, aggregation)
    kc = kc.repeat_interleave(qs.shape[1] // kc.shape[1], dim=1)
    cidx = chunk_index(bd, n).to(q.device)
    pos = torch.arange(n, device=q.device)
    csum = F.pad(qs.cumsum(-2), (0, 0, 1, 0))  # csum[..., i, :] = sum of rows < i
    start = bd.to(q.device)[cidx]
    sums = csum[..., pos + 1, :] - csum[..., start, :]  # sum over [b_c, i]
    length = (pos - start + 1).to(dtype)[:, None]
    if aggregation == "sum":
        rep = sums
    elif aggregation == "padded_mean":
        rep = sums / chunk_lengths(bd).max().to(dtype)
    elif aggregation == "mean":
        rep = sums / length
    else:
        rep = sums / length * length.sqrt()
    return rep @ kc.transpose(-1, -2)


def dhsa_mask(q: torch.Tensor, k: torch.Tensor, boundaries, budget: int | None, *, initial: int = 0,
              keep_diagonal: bool = True, aggregation: str = "eq4", share_heads: bool = False,
              score_dtype: torch.dtype = torch.float32, local: int = 0, dense_tail: int = 0,
              causal_query: bool = False) -> torch.Tensor:
    """The token-level sparsity mask ``M`` of DHSA prefill (Sec. 2.1, App. A "prefill stage").

    Args:
        q: ``(batch, heads, seq, dim)``; k: ``(batch, kv_heads, seq, dim)``.
        boundaries: offsets (one shared, or a list with one per sequence).
        budget: ``N_b``, keys kept per query *including* the initial and diagonal ones; ``None``
            (or ``>= seq``) keeps every causal key.
        initial: first tokens always kept (attention sinks).
        keep_diagonal: always keep the query's own chunk up to the query (the local, causal part).
        aggregation, share_heads, score_dtype: see :func:`chunk_similarity`.
        local: also always keep the ``local`` keys before the query's chunk (:func:`local_starts`; the
            authors' code keeps 128 "recent" keys); needs ``keep_diagonal``.
        dense_tail: the last ``dense_tail`` queries keep every causal key (the authors' dense question /
            "instruction" tokens at prefill).
        causal_query: build each row's chunk query from the queries of its chunk up to the row only
            (the row's own prefix, Eq. 4 on ``[b_c, i]``) instead of the whole chunk. The whole-chunk
            vector averages *later* queries, so under teacher forcing the selection of row ``i`` depends
            on tokens after ``i``: a leak in perplexity (notebook 07). Needs ``keep_diagonal``.

    Returns:
        ``(batch, heads | 1, seq, seq)`` bool, True = kept. Each row keeps exactly
        ``min(budget, row + 1)`` keys, all at positions ``<= row`` (every causal key in the dense tail).

    Reading (text, Sec. 2.1): "TopK selection with a per-query token budget N_b" over the upsampled
    scores, causal. The text does not say that initial tokens or the local chunk are always kept;
    the authors' code always keeps 128 initial ("global") and the 128 most recent ("local") tokens
    and splices them into the budget. Here both are parameters (``initial``, ``keep_diagonal`` and
    ``local``) and count against the budget, as in the code. Ties (whole chunks share a score) go to
    the earlier position.
    """
    bsz, _, n, _ = q.shape
    per = _per_batch(boundaries, bsz, n)
    if (local or causal_query) and not keep_diagonal:
        raise ValueError("local > 0 and causal_query=True need keep_diagonal=True (the query's own chunk is kept, "
                         "so its incomplete chunk vector never ranks keys); set keep_diagonal=True")
    if budget is not None and budget >= n:
        budget = None
    out = []
    pos = torch.arange(n, device=q.device)
    for b in range(bsz):
        bd = per[b].to(q.device)
        cidx = chunk_index(bd, n).to(q.device)
        if causal_query:
            rows = _causal_query_scores(q[b:b + 1], k[b:b + 1], bd, aggregation, share_heads, score_dtype)
            tok = rows[..., cidx]
        else:
            s = chunk_similarity(q[b:b + 1], k[b:b + 1], bd, aggregation, share_heads, score_dtype)
            tok = upsample(s, bd, n)
        diag = local_starts(bd, local, initial)[cidx] if keep_diagonal else pos + 1
        m = _select_rows(tok, pos, diag, budget, initial)
        if dense_tail:
            m[..., n - min(dense_tail, n):, :] = pos[None, :] <= pos[n - min(dense_tail, n):, None]
        out.append(m)
    return torch.cat(out, dim=0)


INITIAL_RULES = ("kvlab", "authors")
TIE_ORDERS = ("position", "topk")


def _authors_block_keep(tok: torch.Tensor, upper: torch.Tensor, budget: int, initial: int, local: int,
                        initial_rule: str, ties: str) -> torch.Tensor:
    """``(H, nqb, n)`` kept keys of each query block, block by block, by the named rules (see
    :func:`block_query_mask`). ``tok``: token-level scores ``(H, nqb, n)``; ``upper``: ``(nqb,)`` keys a block
    may see (``j < upper``)."""
    heads, nqb, n = tok.shape
    dev = tok.device
    pos = torch.arange(n, device=dev)
    keep = torch.zeros(heads, nqb, n, dtype=torch.bool, device=dev)
    for i in range(nqb):
        u = int(upper[i])
        if initial_rule == "authors":  # the recent keys are forced; the initial ones come by overwriting below
            recent = min(local, budget, u)
            forced = (pos >= u - recent) & (pos < u)
        else:
            forced = (pos < u) & ((pos < initial) | (pos >= u - local))
        cand = (pos < u) & ~forced
        room = max(0, budget - int(forced.sum()))
        k_sel = min(room, int(cand.sum()))
        row = tok[:, i].masked_fill(~cand[None], float("-inf"))
        if ties == "topk":  # torch.topk's order among equal scores (a chunk's tokens share one), as the code
            chosen = torch.topk(row, k_sel, dim=-1).indices
        else:  # equal scores: the earlier position first
            chosen = torch.sort(row, dim=-1, descending=True, stable=True).indices[:, :k_sel]
        if initial_rule == "authors":
            # the code's list: chosen + recent (+ padding with the last key), sorted ascending; its lowest
            # `initial` entries are then overwritten by keys 0 .. initial-1 (capped at the block's last key)
            pad = torch.full((heads, room - k_sel), n - 1, dtype=torch.long, device=dev)
            lst = torch.cat([chosen, pad, pos[forced][None].expand(heads, -1)], -1).sort(-1).values
            g = min(initial, lst.shape[-1])
            lst[:, :g] = torch.clamp(torch.arange(g, device=dev), max=max(u - 1, 0))[None]
            keep[:, i].scatter_(-1, lst, True)
        else:
            keep[:, i] = forced[None]
            keep[:, i].scatter_(-1, chosen, True)
    return keep & (pos[None, None, :] < upper[None, :, None])


def block_query_mask(q: torch.Tensor, k: torch.Tensor, boundaries, budget: int | None, *, query_block: int,
                     initial: int = 0, local: int = 0, aggregation: str = "eq4", share_heads: bool = False,
                     score_dtype: torch.dtype = torch.float32, dense_tail: int = 0, initial_rule: str = "kvlab",
                     ties: str = "position") -> torch.Tensor:
    """The kept set with *fixed query blocks* and dynamic key chunks: the selection of the authors' code.

    The text (Sec. 2.1) chunks queries and keys alike (:func:`dhsa_mask`); the authors' code chunks the keys
    by the boundaries and the queries into fixed blocks of ``query_block`` tokens, and one selection serves
    every query of a block::

        u_i      = min((i + 1) * query_block, n)          keys a block may see: j < u_i
        S[i, c]  = qblock_i . kchunk_c                    (Eq. 4 representations, ``aggregation``)
        forced_i = {j < initial} | {u_i - local <= j < u_i}    (128 "global" + 128 "recent" keys in the code:
                                                             with local = query_block, the block itself)
        ranked_i = the budget - |forced_i| other keys j < u_i with the highest S[i, c(j)]
        keep[t, j] = j <= t and j in forced_i | ranked_i  for every query t of block i

    Args:
        q: ``(batch, heads, seq, dim)``; k: ``(batch, kv_heads, seq, dim)``.
        boundaries: key chunk offsets (one shared, or a list with one per sequence).
        budget: keys per query block, forced ones included; None (or ``>= seq``) keeps every causal key.
        query_block: query block length (the code's ``block_size``: 128 in its needle script).
        initial, local: always-kept first keys and last keys before a block's end (both count in the budget).
        aggregation, share_heads, score_dtype: see :func:`chunk_similarity` (the code: ``"eq4"``, heads shared).
        dense_tail: the last ``dense_tail`` queries keep every causal key; the blocks cover the rest.

    Returns:
        ``(batch, heads | 1, seq, seq)`` bool, True = kept.

    Two rules, named (the authors' code is their ``legacy/utils/helper.py``):

    * ``initial_rule``: ``"kvlab"`` (above: the initial and recent keys are forced and the ranked keys fill exactly
      what they leave) or ``"authors"`` (``dhsa_sdpa``: the ``local`` recent keys are forced, ``budget - local``
      keys are ranked among all other visible keys, initial ones included, the list is sorted by position and
      its lowest ``initial`` entries are overwritten with keys ``0 .. initial-1``; a block then keeps at most
      ``budget`` distinct keys, fewer when ranked keys fall among the first ``initial``, and the ranked keys
      with the lowest positions are the ones lost);
    * ``ties`` (a chunk's tokens share one score): ``"position"`` (the earlier position first) or ``"topk"``
      (``torch.topk``'s order on the token-level scores, as ``_obtain_dhsa_mask``; it depends on the device).

    A query block's vector averages all its queries, later ones included (as in the code): for teacher-forced
    perplexity this is a leak (:func:`dhsa_mask` with ``causal_query``).
    """
    if initial_rule not in INITIAL_RULES:
        raise ValueError(f"initial_rule must be one of {INITIAL_RULES}, got {initial_rule!r}")
    if ties not in TIE_ORDERS:
        raise ValueError(f"ties must be one of {TIE_ORDERS}, got {ties!r}")
    if isinstance(query_block, bool) or not isinstance(query_block, int) or query_block < 1:
        raise ValueError(f"query_block must be an int >= 1 (query block length in tokens), got {query_block!r}")
    bsz, _, n, _ = q.shape
    per = _per_batch(boundaries, bsz, n)
    if budget is not None and budget >= n:
        budget = None
    dev = q.device
    pos = torch.arange(n, device=dev)
    causal = pos[None, :] <= pos[:, None]
    tail = min(dense_tail, n)
    sparse = n - tail
    qb_bd = fixed_boundaries(max(sparse, 1), query_block, device=dev)  # query blocks over the sparse rows
    upper = torch.clamp(qb_bd[:-1] + query_block, max=n)  # (nqb,) u_i (a short last block still reaches on)
    allowed = pos[None, :] < upper[:, None]  # (nqb, n)
    forced = allowed & ((pos[None, :] < initial) | (pos[None, :] >= (upper - local)[:, None]))
    out = []
    for b in range(bsz):
        bd = per[b].to(dev)
        if budget is None:
            keep = allowed[None]
        else:
            qq = q[b:b + 1, :, :max(sparse, 1)].to(score_dtype)
            kk = k[b:b + 1].to(score_dtype)
            if share_heads:
                qq, kk = qq.mean(dim=1, keepdim=True), kk.mean(dim=1, keepdim=True)
            qc = chunk_representation(qq, qb_bd, aggregation)
            kc = chunk_representation(kk, bd, aggregation)
            kc = kc.repeat_interleave(qc.shape[1] // kc.shape[1], dim=1)
            tok = (qc @ kc.transpose(-1, -2))[0][..., chunk_index(bd, n).to(dev)]  # (H, nqb, n)
            if initial_rule == "authors" or ties == "topk":
                keep = _authors_block_keep(tok, upper, budget, initial, local, initial_rule, ties)
            else:
                cand = allowed & ~forced
                order = torch.sort(tok.masked_fill(~cand[None], float("-inf")), dim=-1, descending=True,
                                   stable=True).indices
                rank = torch.empty_like(order)
                rank.scatter_(-1, order, torch.arange(n, device=dev).expand_as(order))
                room = (budget - forced.sum(-1)).clamp(min=0)  # (nqb,)
                keep = forced[None] | (cand[None] & (rank < room[None, :, None]))
        qidx = chunk_index(qb_bd, max(sparse, 1)).to(dev)[:sparse]  # block of each sparse row
        m = torch.empty(keep.shape[0], n, n, dtype=torch.bool, device=dev)
        m[:, :sparse] = keep[:, qidx] & causal[None, :sparse]
        m[:, sparse:] = causal[None, sparse:]
        out.append(m)
    return torch.stack(out)


def max_forced(boundaries: torch.Tensor, initial: int, keep_diagonal: bool = True, local: int = 0) -> int:
    """The most always-kept keys of any query: ``max_c (b_{c+1} - max(b_c - initial, 0))`` with the
    diagonal chunk (the last row of each chunk), plus the ``local`` keys before the chunk
    (:func:`local_starts`), ``min(initial, seq)`` without. A budget below this cannot be met."""
    n = int(boundaries[-1])
    if not keep_diagonal:
        return min(initial, n)
    st, en = boundaries[:-1], boundaries[1:]
    extra = st - local_starts(boundaries, local, initial)
    return int((en - (st - initial).clamp(min=0) + extra).max())


def kept_per_row(mask: torch.Tensor) -> torch.Tensor:
    """``(batch, heads, seq)`` number of kept keys of each query row."""
    return mask.sum(-1)


def _masked_attention(q, k, v, mask, scale):
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = (q @ k.transpose(-1, -2)) * scale
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def dhsa_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, boundaries, budget: int | None,
                             *, initial: int = 0, keep_diagonal: bool = True, aggregation: str = "eq4",
                             share_heads: bool = False, scale: float | None = None,
                             score_dtype: torch.dtype = torch.float32, local: int = 0, dense_tail: int = 0,
                             causal_query: bool = False) -> torch.Tensor:
    """DHSA prefill attention, eager and materialised (any dtype; pass float64 for the oracle).

    ``O = softmax(Q K^T * scale, masked by dhsa_mask(...)) @ V``; arguments as in :func:`dhsa_mask`.
    The selection is computed in ``score_dtype`` from the inputs' values, so float64 copies of
    bf16 inputs select exactly the keys the bf16 run selects.

    Returns:
        ``(batch, heads, seq, dim)`` in ``q.dtype``.
    """
    mask = dhsa_mask(q, k, boundaries, budget, initial=initial, keep_diagonal=keep_diagonal,
                     aggregation=aggregation, share_heads=share_heads, score_dtype=score_dtype, local=local,
                     dense_tail=dense_tail, causal_query=causal_query)
    return _masked_attention(q, k, v, mask, scale)


def dhsa_decode_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prompt_boundaries: torch.Tensor,
                          budget: int | None, *, initial: int = 0, keep_diagonal: bool = True,
                          aggregation: str = "eq4", share_heads: bool = False, scale: float | None = None,
                          score_dtype: torch.dtype = torch.float32, return_mask: bool = False, local: int = 0):
    """One decode step of DHSA (App. A, "decode stage").

    Args:
        q: ``(batch, heads, 1, dim)``, the current token's query.
        k, v: ``(batch, kv_heads, total, dim)``: the whole cache, the current token last.
        prompt_boundaries: offsets of the prompt's chunks (shared by the batch).
        budget, initial, keep_diagonal, aggregation, share_heads, scale, score_dtype, local: as in prefill
            (``local``: the ``local`` keys before the new token are always kept).

    Only the last row of ``S`` is computed: the current token's chunk (itself, ``q_C = q``)
    against every chunk of :func:`decode_boundaries`; it is upsampled and TopK-ed like a prefill row.
    The result equals the last row of :func:`dhsa_attention_reference` run on the whole sequence
    with those boundaries (a test pins this). The cache is kept whole; only attention is sparse.

    Returns:
        ``(batch, heads, 1, dim)`` (and the ``(batch, heads | 1, 1, total)`` mask if ``return_mask``).
    """
    total = k.shape[-2]
    bd = decode_boundaries(prompt_boundaries.to(q.device), total)
    qs, ks = q.to(score_dtype), k.to(score_dtype)
    if share_heads:
        qs, ks = qs.mean(1, keepdim=True), ks.mean(1, keepdim=True)
    kc = chunk_representation(ks, bd, aggregation)
    kc = kc.repeat_interleave(qs.shape[1] // kc.shape[1], dim=1)
    qc = chunk_representation(qs, torch.tensor([0, 1], device=q.device), aggregation)  # a 1-token chunk
    row = (qc @ kc.transpose(-1, -2))  # (batch, heads|1, 1, C)
    tok = row[..., chunk_index(bd, total).to(q.device)]
    pos = torch.tensor([total - 1], device=q.device)
    diag = local_starts(pos.new_tensor([total - 1, total]), local, initial) if keep_diagonal else pos + 1
    if budget is not None and budget >= total:
        budget = None
    mask = _select_rows(tok, pos, diag, budget, initial)
    out = _masked_attention(q, k, v, mask, scale)
    return (out, mask) if return_mask else out


# ================================================================================================
# Chunk form of the kept set: what the Triton and Flex backends consume
# ================================================================================================
class ChunkPlan:
    """The kept set of :func:`dhsa_mask` in chunk form, for ``keep_diagonal=True``.

    For one sequence, query chunk ``c`` and head ``h``: ``order[h, c]`` lists the candidate key
    chunks (every earlier chunk with a token at ``>= initial``) by decreasing score (ties: lower
    index first), ``tokens[h, c]`` their candidate tokens in that order (each chunk's tokens at
    ``>= initial``, ascending), truncated to the longest any row of ``c`` can use. Row ``i`` of
    chunk ``c`` keeps::

        [0, min(initial, i + 1))  U  [max(b_c, initial), i]  U  tokens[h, c, :room_i]
        room_i = budget - |forced_i|,   |forced_i| = i + 1 - max(b_c - initial, 0)

    which is exactly :func:`dhsa_mask`'s rule (the list is ranked, so a row's top ``room_i`` keys are
    a prefix of it). Tensors (per sequence ``b``):

    * ``starts[b]`` ``(C,)`` chunk offsets ``b_c`` (long), ``ends[b]``,
    * ``tokens[b]`` ``(heads | 1, C, L)`` int32 key positions, ``-1`` padding,
    * ``n_tokens[b]`` ``(heads | 1, C)`` int32 valid entries of ``tokens`` (``min(L, candidates)``).
    """

    def __init__(self, starts, ends, tokens, n_tokens, budget, initial, n):
        self.starts, self.ends, self.tokens, self.n_tokens = starts, ends, tokens, n_tokens
        self.budget, self.initial, self.n = budget, initial, n


def chunk_plan(q: torch.Tensor, k: torch.Tensor, boundaries, budget: int | None, *, initial: int = 0,
               aggregation: str = "eq4", share_heads: bool = False,
               score_dtype: torch.dtype = torch.float32, local: int = 0) -> ChunkPlan:
    """Rank the candidate chunks of every query chunk and list their tokens (:class:`ChunkPlan`).

    Same similarity and tie rule as :func:`dhsa_mask` (with ``keep_diagonal=True``); the list of a
    query chunk is cut at the room of its first row, the largest of the chunk. ``budget=None`` keeps
    every causal key (the list holds all earlier tokens). Memory: ``heads x C x L`` int32 per
    sequence with ``L <= budget``.

    ``local``: the keys ``[local_starts(b)[c], b_c)`` before query chunk ``c`` head its list (every row's
    room holds them: :func:`max_forced` counts them), then the ranked chunks' other tokens; the kernels
    take list prefixes, so they keep them without a change.
    """
    bsz, _, n, _ = q.shape
    per = _per_batch(boundaries, bsz, n)
    if budget is None or budget >= n:
        budget = n  # every causal key: no row has more than n
    starts, ends, toks, counts = [], [], [], []
    for b in range(bsz):
        bd = per[b].to(q.device)
        st, en = bd[:-1], bd[1:]
        C = st.numel()
        s = chunk_similarity(q[b:b + 1], k[b:b + 1], bd, aggregation, share_heads, score_dtype)[0]  # (H, C, C)
        cstart = st.clamp(min=initial)
        ls = local_starts(bd, local, initial)  # (C,) first local key before each query chunk
        # candidate tokens of key chunk c' for query chunk c, outside c's local range: (C query, C key)
        clen = (torch.minimum(en[None, :], ls[:, None]) - cstart[None, :]).clamp(min=0)
        ci = torch.arange(C, device=q.device)
        is_cand = (ci[None, :] < ci[:, None]) & (clen > 0)  # (C query, C key)
        forced_first = torch.minimum(st, torch.full_like(st, initial)) + 1  # |forced| of row b_c
        need = max_forced(bd, initial, local=local)
        if need > budget:
            raise ValueError(f"budget={budget} is smaller than the always-kept keys of some query ({need} = "
                             "initial tokens + its diagonal chunk): the budget must be at least initial + the "
                             "longest chunk; raise budget or use shorter chunks")
        room = budget - forced_first
        scores = s.masked_fill(~is_cand[None], float("-inf"))
        order = torch.sort(scores, dim=-1, descending=True, stable=True).indices  # (H, C, C)
        olen = torch.where(torch.gather(is_cand[None].expand_as(order), -1, order),
                           torch.gather(clen[None].expand_as(order), -1, order), 0)
        # rank 0 is the local range [ls_c, b_c) (empty without local), rank m >= 1 the chunk order[m - 1]
        loc = (st - ls)[None, :, None].expand(order.shape[0], C, 1)
        olen = torch.cat([loc, olen], -1)
        order = torch.cat([torch.full_like(order[..., :1], -1), order], -1)
        cum_after = olen.cumsum(-1)  # tokens listed up to and including rank m
        total = cum_after[..., -1]  # (H, C)
        n_tok = torch.minimum(total, room[None, :])
        L = max(int(n_tok.max()), 1)
        slot = torch.arange(L, device=q.device)
        m = torch.searchsorted(cum_after.contiguous(), slot.expand(*cum_after.shape[:-1], L).contiguous(),
                               right=True)  # rank whose range holds the slot
        m = m.clamp(max=C)
        before = torch.gather(cum_after, -1, m) - torch.gather(olen, -1, m)
        chunk = torch.gather(order, -1, m)
        first = torch.where(chunk < 0, ls[:, None].expand_as(chunk), cstart[chunk.clamp(min=0)])
        tok = first + (slot - before)
        tok = torch.where(slot < n_tok[..., None], tok, torch.full_like(tok, -1))
        starts.append(st)
        ends.append(en)
        toks.append(tok.to(torch.int32))
        counts.append(n_tok.to(torch.int32))
    return ChunkPlan(starts, ends, toks, counts, budget, initial, n)


def plan_mask(plan: ChunkPlan) -> torch.Tensor:
    """The ``(batch, heads | 1, seq, seq)`` bool mask a :class:`ChunkPlan` keeps (to test it)."""
    n, initial, budget = plan.n, plan.initial, plan.budget
    out = []
    for st, en, tok, cnt in zip(plan.starts, plan.ends, plan.tokens, plan.n_tokens):
        h = tok.shape[0]
        dev = tok.device
        mask = torch.zeros(h, n, n, dtype=torch.bool, device=dev)
        j = torch.arange(n, device=dev)
        for c in range(st.numel()):
            s0, e0 = int(st[c]), int(en[c])
            for i in range(s0, e0):
                forced = (j <= i) & ((j < initial) | (j >= max(s0, initial)))
                room = budget - int(forced.sum())
                mask[:, i] = forced
                for hh in range(h):
                    r = max(0, min(room, int(cnt[hh, c])))
                    sel = tok[hh, c, :r].long()
                    mask[hh, i, sel] = True
        out.append(mask)
    return torch.stack(out)
