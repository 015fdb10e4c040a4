"""Why DHSA normalises chunk representations by ``sqrt(length)`` (Eq. 4), and how much of dense
attention a chunking keeps at a given budget.

Paper: DHSA (arXiv:2510.24606), Sec. 2.3: "average pooling after padding is problematic, as zero
embeddings from padding dilute the average, and average pooling is sensitive to chunk length".

A worked model (ours; the paper gives no analysis). Keys ``k_i`` i.i.d. with mean 0 and covariance
``sigma^2 I``, a query ``q``. A chunk of ``n`` keys scores ``q . agg(k)``; with the sum ``s = sum k_i``:

=================  ====================  ==============================  =========================
aggregation        vector                null score std (no relevant key)  one relevant key ``q . k* = mu``
=================  ====================  ==============================  =========================
sum                ``s``                 ``sigma |q| sqrt(n)``            ``mu``
mean               ``s / n``             ``sigma |q| / sqrt(n)``          ``mu / n``
padded mean (L)    ``s / L``             ``sigma |q| sqrt(n) / L``        ``mu / L``
Eq. 4              ``s / sqrt(n)``       ``sigma |q|``                    ``mu / sqrt(n)``
=================  ====================  ==============================  =========================

Only Eq. 4 gives every length the same null distribution, so a TopK over chunks of mixed lengths is
not tilted towards short chunks (mean: their scores spread wider, so they win the extremes) or long
ones (sum, padded mean). Its signal-to-noise for one relevant key, ``mu / (sigma |q| sqrt(n))``, is
the sum's: a long chunk still needs a stronger match, as it should, since selecting it costs more of
the budget. :func:`null_score_std`, :func:`selection_rates` and :func:`needle_win_rates` check the
table by sampling.

Note on the query side: per-query TopK ranks the chunks of one query row, and ``sqrt(|C_q|)`` is one
positive factor on that row, so Eq. 4 on queries does not change the selection; only the keys' does.

The model assumes keys of mean 0. Real keys are not centred: with a mean ``m``, a chunk of ``n`` keys scores
``sqrt(n) q . m + (noise of std sigma |q|)`` under Eq. 4, so its score moves with ``sqrt(n)`` by the *bias*
``q . m``, upwards for queries with ``q . m > 0`` and downwards for the others. :func:`key_mean_bias` measures
``q . m`` against the content spread ``std_j(q . k_j)`` on a layer's real queries and keys, and
:func:`real_key_selection_rates` repeats :func:`selection_rates` with real keys (notebook 07): where the bias
is comparable to the spread, Eq. 4 is not length-neutral.
"""
from __future__ import annotations

import torch

from .reference import AGGREGATIONS, chunk_representation, dhsa_mask
from .boundary_predictor import attention_recall, best_recall

__all__ = ["null_score_std", "selection_rates", "needle_win_rates", "recall_by_chunking", "key_mean_bias",
           "real_key_selection_rates"]


def _chunk_scores(q: torch.Tensor, keys: list[torch.Tensor], aggregation: str) -> torch.Tensor:
    """Scores ``(trials, chunks)`` of chunks (each ``(trials, n_c, dim)``) for queries ``(trials, dim)``."""
    lengths = [k.shape[1] for k in keys]
    x = torch.cat(keys, dim=1)[:, None]  # (trials, 1, sum n, dim): one "head"
    b = torch.tensor([0] + lengths).cumsum(0)
    rep = chunk_representation(x, b, aggregation)[:, 0]  # (trials, chunks, dim)
    return (rep * q[:, None]).sum(-1)


def null_score_std(lengths, dim: int = 64, trials: int = 4000, seed: int = 0) -> dict[str, torch.Tensor]:
    """Standard deviation of a chunk's score over random keys and queries, per length and aggregation.

    ``lengths``: chunk lengths to compare (they are scored together, so ``padded_mean`` pads to the
    longest). Returns ``{aggregation: (len(lengths),) float64}``; Eq. 4 is flat, mean falls as
    ``1/sqrt(n)``, sum rises as ``sqrt(n)``.
    """
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(trials, dim, generator=g, dtype=torch.float64) / dim ** 0.5
    keys = [torch.randn(trials, n, dim, generator=g, dtype=torch.float64) for n in lengths]
    return {a: _chunk_scores(q, keys, a).std(0) for a in AGGREGATIONS}


def selection_rates(lengths, dim: int = 64, trials: int = 4000, seed: int = 0) -> dict[str, torch.Tensor]:
    """How often the chunk of each length scores highest among one chunk of every length (random keys,
    no relevant key). Unbiased = ``1 / len(lengths)`` for every length. ``{aggregation: (len(lengths),)}``."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(trials, dim, generator=g, dtype=torch.float64) / dim ** 0.5
    keys = [torch.randn(trials, n, dim, generator=g, dtype=torch.float64) for n in lengths]
    out = {}
    for a in AGGREGATIONS:
        win = _chunk_scores(q, keys, a).argmax(-1)
        out[a] = torch.bincount(win, minlength=len(lengths)).double() / trials
    return out


def needle_win_rates(lengths, strength: float = 1.0, dim: int = 64, trials: int = 4000,
                     seed: int = 0) -> dict[str, torch.Tensor]:
    """How often a chunk holding one relevant key ranks first against one random chunk of every length.

    For each ``n`` in ``lengths``: a chunk of ``n`` keys, one of them with ``q . k* = strength`` (``q``
    unit norm, other keys ``N(0, I/dim)``, so a random key scores with std ``dim ** -0.5``), competes
    with random chunks of every length in ``lengths``. Returns ``{aggregation: (len(lengths),)}`` win
    rates. With the mean, short random chunks out-shout a long chunk holding the key; with the sum
    (or padded mean), long random chunks do; Eq. 4 gives each competitor the same noise.
    """
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(trials, dim, generator=g, dtype=torch.float64)
    q = q / q.norm(dim=-1, keepdim=True)
    rivals = [torch.randn(trials, n, dim, generator=g, dtype=torch.float64) / dim ** 0.5 for n in lengths]
    out = {a: torch.zeros(len(lengths), dtype=torch.float64) for a in AGGREGATIONS}
    for i, n in enumerate(lengths):
        k = torch.randn(trials, n, dim, generator=g, dtype=torch.float64) / dim ** 0.5
        k[:, 0] = k[:, 0] - (k[:, 0] * q).sum(-1, keepdim=True) * q + strength * q  # q . k_0 = strength
        for a in AGGREGATIONS:
            s = _chunk_scores(q, [k] + rivals, a)
            out[a][i] = (s.argmax(-1) == 0).double().mean()
    return out


def recall_by_chunking(q: torch.Tensor, k: torch.Tensor, budget: int, chunkings: dict, *, initial: int = 0,
                       scale: float | None = None) -> dict[str, float]:
    """Share of dense attention mass kept by each chunking at the same budget, averaged over heads.

    Args:
        q ``(batch, heads, seq, dim)``, k ``(batch, kv_heads, seq, dim)`` (a layer's, RoPE applied).
        chunkings: ``{name: (offsets or list of offsets, aggregation)}``.
    Returns:
        ``{name: recall}`` plus ``"best"``: each row's top-``budget`` dense probabilities (no mask with
        that budget keeps more).
    """
    out = {}
    for name, (bd, agg) in chunkings.items():
        m = dhsa_mask(q, k, bd, budget, initial=initial, aggregation=agg)
        out[name] = float(attention_recall(q, k, m, scale).mean())
    out["best"] = float(best_recall(q, k, budget, scale).mean())
    return out


def key_mean_bias(q: torch.Tensor, k: torch.Tensor, *, start: int = 64) -> dict[str, torch.Tensor]:
    """The zero-mean assumption of the Eq. 4 analysis, measured on one layer's queries and keys.

    Args:
        q ``(batch, heads, seq, dim)``, k ``(batch, kv_heads, seq, dim)`` (RoPE applied, as attention sees them).
        start: queries before this position are skipped (too few past keys for a mean).

    For query ``i`` of head ``h``: ``m_i`` = mean of its past keys ``k_0..k_i``, ``bias = q_i . m_i`` and
    ``spread = std_j(q_i . k_j)`` over the same keys (the content part of the scores the model's analysis
    calls ``sigma |q|``). Returns float64 tensors ``(batch, heads, seq - start)``: ``"bias"``, ``"spread"``,
    ``"ratio"`` = ``|bias| / spread``. Under the model's assumption the ratio is about ``1 / sqrt(i)``.
    """
    g = q.shape[1] // k.shape[1]
    qd = q.double()
    kd = k.double().repeat_interleave(g, 1)
    n = q.shape[2]
    s = qd @ kd.transpose(-1, -2)  # (b, h, n, n) raw scores
    causal = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
    cnt = causal.sum(-1).double()  # keys per row
    sm = s.masked_fill(~causal, 0.0)
    mean = sm.sum(-1) / cnt  # q_i . mean(k_0..k_i)
    var = (sm.pow(2).sum(-1) / cnt - mean.pow(2)).clamp(min=0)
    bias, spread = mean[..., start:], var.sqrt()[..., start:]
    return {"bias": bias, "spread": spread, "ratio": bias.abs() / spread.clamp(min=1e-12)}


def real_key_selection_rates(q: torch.Tensor, k: torch.Tensor, lengths, *, samples: int = 400, head: int | None = None,
                             seed: int = 0) -> dict[str, torch.Tensor]:
    """:func:`selection_rates` on a layer's real keys: for ``samples`` random queries ``i`` (and heads), one
    random run of consecutive past keys of each length in ``lengths`` (non-overlapping, all before ``i``)
    competes; returns ``{aggregation: (len(lengths),)}`` how often each length scores highest. Length-neutral
    = ``1 / len(lengths)`` each; with centred keys Eq. 4 is (:func:`selection_rates`)."""
    gen = torch.Generator().manual_seed(seed)
    g = q.shape[1] // k.shape[1]
    n = q.shape[2]
    need = sum(lengths)
    if n <= need + 1:
        raise ValueError(f"seq={n} must exceed the summed lengths {need} + 1")
    wins = {a: torch.zeros(len(lengths), dtype=torch.float64) for a in AGGREGATIONS}
    for _ in range(samples):
        i = int(torch.randint(need + 1, n, (1,), generator=gen))
        h = head if head is not None else int(torch.randint(0, q.shape[1], (1,), generator=gen))
        b = int(torch.randint(0, q.shape[0], (1,), generator=gen))
        # non-overlapping runs: shuffle the lengths, place them left to right with random gaps before i
        order = torch.randperm(len(lengths), generator=gen).tolist()
        slack = i - need
        cuts = sorted(torch.randint(0, slack + 1, (len(lengths),), generator=gen).tolist())
        gaps = [cuts[0]] + [cuts[j] - cuts[j - 1] for j in range(1, len(cuts))]
        pos, keys = 0, [None] * len(lengths)
        for gap, li in zip(gaps, order):
            st = pos + gap
            keys[li] = k[b, h // g, st: st + lengths[li]].double()[None]
            pos = st + lengths[li]
        qi = q[b, h, i].double()[None]
        for a in AGGREGATIONS:
            wins[a][int(_chunk_scores(qi, keys, a).argmax(-1))] += 1
    return {a: w / samples for a, w in wins.items()}
