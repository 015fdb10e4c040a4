"""Where chunks end: DHSA's boundary labels, the learned boundary predictor, NMS, and how much a kept set keeps.

Paper: DHSA (arXiv:2510.24606), Sec. 2.2 (the predictor, Eq. 1-3) and App. B (labels from attention, Eq. 5-8;
focal loss, Eq. 9; inference with NMS). The attention that uses the chunks (Eq. 4, the selection, App. A) is the
specification in :mod:`kvlab.dhsa.reference`; this module decides the chunk boundaries it is given, and measures
the share of dense attention a kept set holds (``attention_recall``, ``best_recall``).

The pipeline::

    r_t   = label_ratios(attn, w)                      # Eq. 5-7: do later queries treat [t-w, t) and [t, t+w) alike?
    y_t   = soft_labels(r_t)                           # Eq. 8
    p_t   = sigmoid(BoundaryPredictor(keys)_t)         # Eq. 1-3, trained with focal_bce_loss (Eq. 9)
    b     = nms_boundaries(p, threshold, nms_window)   # App. B inference: the kept peaks are the chunk ends

Readings (code = the authors' ``legacy/boundary_predictor``): see :mod:`kvlab.dhsa.reference`'s list; the labelling
rule follows the code (``rule="code"``), NOTES.md's alternative is ``rule="notes"``.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .reference import split_long_chunks

__all__ = [
    # labels, boundary selection, predictor, loss (App. B)
    "label_ratios", "label_valid", "soft_labels", "select_boundaries", "nms_boundaries", "oracle_boundaries",
    "key_features", "unrotate_keys", "BoundaryPredictor", "focal_bce_loss", "predict_boundaries", "on_device_of",
    # what a mask keeps of dense attention
    "attention_recall", "best_recall",
]


# ================================================================================================
# App. B: labels from attention (Eq. 5-8), boundary selection with NMS
# ================================================================================================
def label_valid(n: int, window: int, device=None) -> torch.Tensor:
    """``(n,)`` bool: positions that get a label and a prediction.

    Reading (authors' code, ``smooth_ends``): positions ``2w - 1 <= t < n - 2w``, so both windows
    are inside the sequence and later queries exist; the text does not say how ends are handled.
    """
    t = torch.arange(n, device=device)
    return (t >= 2 * window - 1) & (t < n - 2 * window)


def label_ratios(attn: torch.Tensor, window: int, *, rule: str = "code", horizon: int | None = None,
                 eps: float = 1e-6) -> torch.Tensor:
    """Attention ratio ``r_t`` of every position ``t`` (App. B, Eq. 5-7), in float64.

    Args:
        attn: ``(..., n, n)`` attention probabilities (rows = queries); average heads first (the
            authors' code averages the heads of a layer).
        window: ``w``, the size of the past window ``[t-w+1, t]`` and of the future window ``[t+1, t+w]``.
        rule: which reading of Eq. 5-7:

            * ``"code"`` (default; the authors' ``_compute_cumulative_attention_mass_ratio``): the
              queries ``j`` that see the whole future window (``t + w <= j < t + w + horizon``) sum their
              attention on the past window (Eq. 5, ``a_past``) and on the future window (Eq. 6,
              ``a_fut``); ``r_t = (max + eps) / (min + eps)`` (Eq. 7): large when later tokens treat
              the two sides of ``t`` differently. Matches the text: "the outer sum index iterates over
              future tokens (beyond t), the inner sum over the tokens in the corresponding window".
            * ``"notes"`` (NOTES.md's reading): the queries ``j in (t, t+w]`` sum their attention on
              ``(t, j]`` (right) and on ``[t-w+1, t]`` (left); ``r_t = right / (left + eps)``: large
              where the text after ``t`` stops looking back.
        horizon: ``"code"`` only: how many queries from ``t + w`` on count (the code uses the
            sliding window for local layers and all later queries for global ones; None = all).

    Returns:
        ``(..., n)`` float64 ratios; positions outside :func:`label_valid` get 1 (no evidence).
    """
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    if rule not in ("code", "notes"):
        raise ValueError(f"rule must be 'code' or 'notes', got {rule!r}")
    a = attn.to(torch.float64)
    n = a.shape[-1]
    w = window
    t = torch.arange(n, device=a.device)
    valid = label_valid(n, w, a.device)
    if rule == "code":
        # integral image I[r, c] = sum of a[:r, :c]; rect(r1, r2, c1, c2) sums rows [r1, r2), cols [c1, c2)
        integ = F.pad(a.cumsum(-2).cumsum(-1), (1, 0, 1, 0))

        def rect(r1, r2, c1, c2):
            def at(r, c):
                return integ[..., r, c]
            return at(r2, c2) - at(r1, c2) - at(r2, c1) + at(r1, c1)

        tc = t.clamp(min=w - 1, max=max(n - w - 1, w - 1))  # keep indices in range; invalid t are reset below
        r1 = (tc + w).clamp(max=n)  # first query that sees the whole future window (itself included)
        r2 = torch.full_like(r1, n) if horizon is None else (tc + w + horizon).clamp(max=n)
        past = rect(r1, r2, tc - w + 1, tc + 1)  # Eq. 5
        fut = rect(r1, r2, tc + 1, (tc + w + 1).clamp(max=n))  # Eq. 6
        ratio = (torch.maximum(past, fut) + eps) / (torch.minimum(past, fut) + eps)  # Eq. 7
    else:
        ratio = torch.ones(*a.shape[:-2], n, dtype=torch.float64, device=a.device)
        right = torch.zeros_like(ratio)
        left = torch.zeros_like(ratio)
        rowc = F.pad(a.cumsum(-1), (1, 0))  # rowc[..., j, c] = sum of a[j, :c]
        for d in range(1, w + 1):  # query j = t + d
            j = (t + d).clamp(max=n - 1)
            rj = rowc[..., j, :]  # (..., n(t), n+1)
            ok = (t + d < n).to(a.dtype)
            take = lambda c: torch.gather(rj, -1, c.expand(*rj.shape[:-1])[..., None])[..., 0]  # noqa: E731
            right = right + ok * (take((j + 1).clamp(max=n)) - take((t + 1).clamp(max=n)))
            left = left + ok * (take((t + 1).clamp(max=n)) - take((t - w + 1).clamp(min=0)))
        ratio = right / (left + eps)
    return torch.where(valid, ratio, torch.ones_like(ratio))


def soft_labels(ratios: torch.Tensor, alpha: float = 2.0, beta: float = -2.0 * math.log(2.0),
                base: float = math.e, eps: float = 1e-6) -> torch.Tensor:
    """Soft boundary label ``y_t = sigmoid(alpha * log_base(r_t + eps) + beta)`` (App. B, Eq. 8).

    Reading: the symbols (slope ``alpha``, offset ``beta``, base ``b``) are the text's; the values
    are the authors' training script's (``alpha = 2``, ``beta = ln 2`` subtracted inside the
    product: ``sigmoid(2 (ln r - ln 2))``, i.e. ``y = 0.5`` at ``r = 2``). The script then binarises
    ``y >= 0.5``; the text trains on the soft ``y`` ("in line with knowledge distillation"), so do we
    (:func:`kvlab.dhsa.training` has ``hard_labels`` for the script's variant).
    """
    return torch.sigmoid(alpha * torch.log(ratios + eps) / math.log(base) + beta)


def select_boundaries(scores: torch.Tensor, *, max_chunks: int, threshold: float | None,
                      nms_window: int = 8, valid: torch.Tensor | None = None,
                      sure: torch.Tensor | None = None) -> torch.Tensor:
    """Offsets from per-position boundary scores: threshold, sort, NMS, at most ``max_chunks`` chunks.

    Args:
        scores: ``(n,)`` score of "position ``t`` ends a chunk" (a ratio or a probability).
        max_chunks: ``N_c``: at most ``N_c - 1`` interior boundaries (the end of the sequence is always one).
        threshold: keep positions with score ``> threshold`` (None: no threshold).
        nms_window: a selected position suppresses every other candidate within this distance
            (``|t - s| <= nms_window``); 0 disables NMS.
        valid: ``(n,)`` bool, positions that may be boundaries (default :func:`label_valid`-like: all
            but the last).
        sure: ``(n,)`` bool, positions that are boundaries whatever their score (e.g. a newline);
            they count against ``max_chunks`` first and suppress their neighbours.

    Returns:
        offsets ``[0, t_1 + 1, ..., n]`` (a boundary at ``t`` means chunk ends at ``t``; App. B).

    Reading (text, App. B "Inference"): threshold -> sort descending -> greedy NMS -> top ``N_c``;
    positions 0 and ``n`` are always boundaries (App. B labelling paragraph).
    """
    n = scores.numel()
    if max_chunks < 1:
        raise ValueError(f"max_chunks must be >= 1, got {max_chunks}")
    if nms_window < 0:
        raise ValueError(f"nms_window must be >= 0, got {nms_window}")
    ok = torch.ones(n, dtype=torch.bool, device=scores.device) if valid is None else valid.clone().bool()
    ok[n - 1] = False  # the sequence end is a boundary anyway
    sc = scores.detach().to(torch.float64).cpu()
    ok = ok.cpu()
    order: list[int] = []
    if sure is not None:
        order += [int(t) for t in torch.nonzero(sure.cpu() & ok).flatten()]
    cand = ok.clone()
    if threshold is not None:
        cand &= sc > threshold
    idx = torch.nonzero(cand).flatten()
    idx = idx[torch.sort(sc[idx], descending=True, stable=True).indices]
    order += idx.tolist()
    blocked = torch.zeros(n, dtype=torch.bool)
    chosen: list[int] = []
    for t in order:
        if len(chosen) >= max_chunks - 1:
            break
        if blocked[t]:
            continue
        chosen.append(t)
        if nms_window:
            blocked[max(0, t - nms_window): t + nms_window + 1] = True
        else:
            blocked[t] = True
    ends = sorted(t + 1 for t in chosen)
    return torch.tensor([0] + ends + [n], dtype=torch.long, device=scores.device)


def nms_boundaries(scores: torch.Tensor, *, max_chunks: int, threshold: float | None, nms_window: int = 8,
                   valid: torch.Tensor | None = None, sure: torch.Tensor | None = None) -> list[torch.Tensor]:
    """:func:`select_boundaries` for a batch ``(batch, n)`` of scores, on their device, without a loop over
    positions: the same offsets (a test pins it), one tensor per sequence.

    Greedy NMS in rank order (sure positions first, then score descending, ties to the lower position)
    selects exactly the positions that, round after round, rank first among the live candidates within
    ``nms_window`` of them; each round keeps those, removes every candidate within the window of a kept
    one, and repeats until none is live (a few rounds on predictor outputs). The ``max_chunks - 1``
    best-ranked kept positions are the boundaries (greedy keeps positions in rank order, so its cap is a
    prefix of that order).
    """
    if scores.dim() != 2:
        raise ValueError(f"scores must be (batch, n), got {tuple(scores.shape)}")
    if max_chunks < 1:
        raise ValueError(f"max_chunks must be >= 1, got {max_chunks}")
    if nms_window < 0:
        raise ValueError(f"nms_window must be >= 0, got {nms_window}")
    bsz, n = scores.shape
    if n < 1:
        raise ValueError("scores must cover at least one position (n >= 1): a chunking of 0 tokens has no end "
                         "boundary; skip empty sequences")
    dev = scores.device
    ok = torch.ones(bsz, n, dtype=torch.bool, device=dev) if valid is None else valid.to(dev).bool().expand(bsz, n)
    ok = ok.clone()
    ok[:, n - 1] = False  # the sequence end is a boundary anyway
    sc = scores.detach().float()
    cand = ok if threshold is None else ok & (sc > threshold)
    firsts = torch.zeros_like(cand) if sure is None else sure.to(dev).bool().expand(bsz, n) & ok
    live = cand | firsts
    # rank: sure positions by index, then candidates by score (descending), ties to the lower index
    key = torch.where(firsts, torch.full_like(sc, float("inf")), sc)
    order = torch.sort(key, dim=-1, descending=True, stable=True).indices
    rank = torch.empty(bsz, n, dtype=torch.float32, device=dev)
    rank.scatter_(-1, order, torch.arange(n, device=dev, dtype=torch.float32).expand(bsz, n).contiguous())
    chosen = torch.zeros_like(live)
    width = 2 * nms_window + 1
    rounds = 0
    while True:
        r = torch.where(live, rank, torch.full_like(rank, float("inf")))
        low = -F.max_pool1d(-r[:, None], width, stride=1, padding=nms_window)[:, 0]  # window minimum
        pick = live & (r == low)
        chosen |= pick
        near = F.max_pool1d(pick[:, None].float(), width, stride=1, padding=nms_window)[:, 0] > 0
        live &= ~near
        rounds += 1
        if rounds % 4 == 0 and not bool(live.any()):
            break
    out = []
    r = torch.where(chosen, rank, torch.full_like(rank, float("inf")))
    keep = min(max_chunks - 1, n)
    best = torch.topk(r, keep, dim=-1, largest=False).indices if keep else torch.zeros(bsz, 0, dtype=torch.long,
                                                                                       device=dev)
    for b in range(bsz):
        t = best[b][chosen[b, best[b]]]
        ends = torch.sort(t + 1).values
        out.append(torch.cat([ends.new_zeros(1), ends, ends.new_full((1,), n)]))
    return out


def oracle_boundaries(attn: torch.Tensor, *, window: int = 4, max_chunks: int, threshold: float | None = 1.1,
                      nms_window: int = 8, rule: str = "code", horizon: int | None = None) -> torch.Tensor:
    """Boundaries from a layer's own attention (``(n, n)`` or ``(heads, n, n)``, heads averaged):
    :func:`label_ratios` then :func:`select_boundaries` on the ratios (the hard labels of App. B).

    Reading (authors' code): ratio threshold ``theta = 1.1``, NMS window 8.
    """
    if not isinstance(attn, torch.Tensor) or attn.dim() not in (2, 3) or attn.shape[-1] != attn.shape[-2]:
        raise ValueError(f"attn must be one layer's attention map of shape (n, n) or (heads, n, n), got "
                         f"{tuple(attn.shape) if isinstance(attn, torch.Tensor) else type(attn).__name__}: for a "
                         "(batch, heads, n, n) map pass one row, attn[b]")
    if attn.dim() == 3:
        attn = attn.mean(0)
    r = label_ratios(attn, window, rule=rule, horizon=horizon)
    return select_boundaries(r, max_chunks=max_chunks, threshold=threshold, nms_window=nms_window,
                             valid=label_valid(attn.shape[-1], window, attn.device))


# ================================================================================================
# Eq. 1-3: the boundary predictor; Eq. 9: focal BCE
# ================================================================================================
def key_features(k: torch.Tensor) -> torch.Tensor:
    """``(batch, kv_heads, seq, dim)`` keys -> ``(batch, seq, kv_heads * dim)`` predictor input
    (the key heads side by side, as the authors' code does)."""
    b, h, n, d = k.shape
    return k.transpose(1, 2).reshape(b, n, h * d)


def unrotate_keys(k: torch.Tensor, rope_theta: float, positions: torch.Tensor | None = None) -> torch.Tensor:
    """Undo the rotary embedding of ``(batch, kv_heads, seq, dim)`` keys: the keys before RoPE.

    RoPE (``rotate_half`` layout, Llama/Qwen/Gemma) rotates the pair ``(i, i + dim/2)`` of the key at position
    ``m`` by ``m * theta^(-2i/dim)``; the inverse rotation (the same angle, negated) gives back the layer's
    projected key, which carries no absolute position. ``positions``: ``(seq,)`` or ``(batch, seq)``; default
    ``0 .. seq-1`` (a prefill from scratch). Computed in float32 (angles up to ``8192`` radians need it)."""
    b, h, n, d = k.shape
    if positions is None:
        positions = torch.arange(n, device=k.device)
    pos = positions.to(k.device, torch.float32)
    inv_freq = 1.0 / (rope_theta ** (torch.arange(0, d, 2, device=k.device, dtype=torch.float32) / d))
    ang = pos[..., None] * inv_freq  # (..., seq, dim/2)
    ang = torch.cat([ang, ang], -1)
    while ang.dim() < 4:
        ang = ang.unsqueeze(-3)  # broadcast over heads (and batch)
    kf = k.float()
    half = torch.cat([-kf[..., d // 2:], kf[..., : d // 2]], -1)  # rotate_half
    return (kf * ang.cos() - half * ang.sin()).to(k.dtype)


class BoundaryPredictor(nn.Module):
    """``P(position t ends a chunk)`` from the keys around ``t`` (Sec. 2.2, Eq. 1-3; App. B).

    Eq. 1 (encoder): windows ``K_left = k[t-w+1 .. t]``, ``K_right = k[t+1 .. t+w]`` (zero padded at
    the ends), each through multi-head self-attention, mean pooling, the output projection and a
    LayerNorm -> ``l``, ``r``.
    Eq. 2 (fusion): ``f = [l, r, |l - r|, l * r, cos(l, r)]`` (``4C + 1`` features).
    Eq. 3 (MLP): ``p = sigmoid(W2 relu(W1 f + b1) + b2)``; :meth:`forward` returns the logit.

    Every token belongs to ``2w`` windows, so its query/key/value projections are computed once and
    the windows gathered from them; pooling before the (linear) output projection is the same as
    after it. The LayerNorm comes after pooling (ours; the authors' code normalises each token's
    output, then pools): this makes the encoder ``2w`` times cheaper, which is what lets training
    run on a CPU.

    Args:
        channels: feature size ``C`` (``kv_heads * head_dim`` of the model; one predictor is shared
            by all layers, as in the paper: "a single model shared across layers and datasets").
        window: ``w`` (paper: 4, "8 tokens per position").
        heads: attention heads of the encoder (paper: 8); must divide ``channels``.
        hidden: hidden size of the MLP (paper: 256).
        encoder: ``"separate"`` attends within each window (reading of the text: "each window is
            processed by a MHA module with pooling"); ``"joint"`` attends over the ``2w`` tokens
            together and pools each half (the authors' ``BoundarySimilarityAttn``).
        input_norm: LayerNorm (no affine) on the keys first. Ours: keys of different layers differ
            in scale by orders of magnitude and one predictor serves all of them; the authors feed
            raw keys.
        rope_theta: None (the authors' input: the keys as attention sees them, RoPE applied), or the model's
            RoPE base: :meth:`features` undoes the rotation first (:func:`unrotate_keys`), so the predictor sees
            no absolute position and a text gets the same boundaries wherever it sits in the input (ours: a
            predictor on rotated keys trained on 1,024-token windows places boundaries by position past them).
    """

    def __init__(self, channels: int, window: int = 4, heads: int = 8, hidden: int = 256,
                 encoder: str = "separate", input_norm: bool = True, rope_theta: float | None = None):
        super().__init__()
        for name, val in (("channels", channels), ("window", window), ("heads", heads), ("hidden", hidden)):
            if isinstance(val, bool) or not isinstance(val, int) or val < 1:
                raise ValueError(f"{name} must be an int >= 1, got {val!r}")
        if channels % heads:
            raise ValueError(f"heads={heads} must divide channels={channels} (multi-head attention)")
        if encoder not in ("separate", "joint"):
            raise ValueError(f"encoder must be 'separate' or 'joint', got {encoder!r}")
        self.channels, self.window, self.heads, self.hidden = channels, window, heads, hidden
        if rope_theta is not None and (isinstance(rope_theta, bool) or not rope_theta > 0):
            raise ValueError(f"rope_theta must be None or the model's RoPE base (> 0), got {rope_theta!r}")
        self.encoder, self.input_norm = encoder, input_norm
        self.rope_theta = None if rope_theta is None else float(rope_theta)
        self.norm_in = nn.LayerNorm(channels, elementwise_affine=False) if input_norm else nn.Identity()
        self.qkv = nn.Linear(channels, 3 * channels)
        self.proj = nn.Linear(channels, channels)
        self.norm = nn.LayerNorm(channels)
        self.mlp = nn.Sequential(nn.Linear(4 * channels + 1, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def config(self) -> dict:
        cfg = dict(channels=self.channels, window=self.window, heads=self.heads, hidden=self.hidden,
                   encoder=self.encoder, input_norm=self.input_norm)
        if self.rope_theta is not None:  # files without it load as before
            cfg["rope_theta"] = self.rope_theta
        return cfg

    def features(self, k: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """The predictor's input from ``(batch, kv_heads, seq, dim)`` RoPE-rotated keys: :func:`key_features`,
        after :func:`unrotate_keys` when the predictor was trained on keys without position (``rope_theta``).
        ``positions``: the keys' positions (default ``0 .. seq-1``)."""
        if self.rope_theta is not None:
            k = unrotate_keys(k, self.rope_theta, positions)
        return key_features(k)

    def _pooled_attention(self, q, k, v, first: int, size: int) -> torch.Tensor:
        """Self-attention inside the window of ``size`` tokens starting ``first`` tokens after each
        block start, mean-pooled over its tokens: ``(b, n, h, dh)``.

        ``q, k, v``: ``(b, n + 2w - 1, h, dh)`` projections of the padded sequence; block ``t`` is
        padded tokens ``t .. t + 2w - 1``. Mean pooling of ``att @ v`` over the window's queries is
        ``sum_j abar_j v_j`` with ``abar_j`` the column means of the attention matrix, so the
        ``(window x dim)`` outputs are never formed.
        """
        n = q.shape[1] - 2 * self.window + 1
        dh = q.shape[-1]
        rows = []
        for i in range(size):  # scores[..., i, j] = q[t + first + i] . k[t + first + j]
            qi = q[:, first + i: first + i + n]
            rows.append(torch.stack([(qi * k[:, first + j: first + j + n]).sum(-1) for j in range(size)], -1))
        att = (torch.stack(rows, -2) / math.sqrt(dh)).softmax(-1)  # (b, n, h, size, size)
        abar = att.mean(-2)  # (b, n, h, size)
        return sum(abar[..., j, None] * v[:, first + j: first + j + n] for j in range(size))

    def encode(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(batch, seq, C)`` key features -> ``l, r``, each ``(batch, seq, C)`` (Eq. 1)."""
        x = self.norm_in(x.to(self.qkv.weight.dtype))  # float32, or the predictor's dtype (a bf16 fast path)
        b, n, c = x.shape
        w, h = self.window, self.heads
        xp = F.pad(x, (0, 0, w - 1, w))  # zero padding at both ends, as the authors' unfold
        q, k, v = self.qkv(xp).view(b, n + 2 * w - 1, 3, h, c // h).unbind(2)  # projections, once per token
        if self.encoder == "separate":  # each window on its own
            l = self._pooled_attention(q, k, v, 0, w)
            r = self._pooled_attention(q, k, v, w, w)
        else:  # the 2w tokens together, pooled per half
            size = 2 * w
            rows = []
            for i in range(size):
                qi = q[:, i: i + n]
                rows.append(torch.stack([(qi * k[:, j: j + n]).sum(-1) for j in range(size)], -1))
            att = (torch.stack(rows, -2) / math.sqrt(c // h)).softmax(-1)  # (b, n, h, 2w, 2w)
            out_l = att[..., :w, :].mean(-2)
            out_r = att[..., w:, :].mean(-2)
            l = sum(out_l[..., j, None] * v[:, j: j + n] for j in range(size))
            r = sum(out_r[..., j, None] * v[:, j: j + n] for j in range(size))
        enc = self.norm(self.proj(torch.stack([l, r], 2).reshape(b, n, 2, c)))
        return enc[:, :, 0], enc[:, :, 1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x``: ``(batch, seq, C)`` key features (:func:`key_features`) -> ``(batch, seq)`` logits."""
        if x.dim() != 3 or x.shape[-1] != self.channels:
            raise ValueError(f"x must be (batch, seq, {self.channels}) key features, got {tuple(x.shape)}")
        l, r = self.encode(x)
        cos = F.cosine_similarity(l, r, dim=-1, eps=1e-6)[..., None]
        f = torch.cat([l, r, (l - r).abs(), l * r, cos], dim=-1)  # Eq. 2
        return self.mlp(f).squeeze(-1)  # Eq. 3 (the logit; sigmoid gives p_t)


def focal_bce_loss(logits: torch.Tensor, targets: torch.Tensor, *, pos_weight: float = 1.3, gamma: float = 2.0,
                   mask: torch.Tensor | None = None) -> torch.Tensor:
    """Focal binary cross-entropy with a positive-class weight (App. B, Eq. 9), mean over ``mask``::

        p = sigmoid(z),  p_t = y p + (1 - y)(1 - p)
        L = mean_t (1 - p_t)^gamma * -[w_pos y log p + (1 - y) log(1 - p)]

    Reading: the text's symbols (``w_pos`` "fixed positive-class weight", ``gamma`` "focal
    parameter", soft ``y``); the values and the form of ``p_t`` for soft labels are the authors'
    (``pos_weight = 1.3``, ``gamma = 2``, ``legacy/boundary_predictor/loss.py``).
    """
    targets = targets.to(logits.dtype)
    bce = F.binary_cross_entropy_with_logits(
        logits, targets, pos_weight=torch.tensor(pos_weight, dtype=logits.dtype, device=logits.device),
        reduction="none")
    p = torch.sigmoid(logits)
    p_t = p * targets + (1 - p) * (1 - targets)
    loss = (1 - p_t).pow(gamma) * bce
    if mask is None:
        return loss.mean()
    m = mask.to(loss.dtype)
    return (loss * m).sum() / m.sum().clamp(min=1.0)


def on_device_of(predictor, x: torch.Tensor):
    """``predictor`` with its weights on ``x``'s device: moved there in place (``nn.Module.to``) when they are
    elsewhere, so that a predictor loaded on the CPU (``load_predictor(path)``, ``shipped_predictor(name)``) runs on
    CUDA keys, and one trained on a GPU runs on CPU keys. Works on a ``torch.compile`` wrapper too."""
    param = next(predictor.parameters(), None)
    if param is not None and param.device != x.device:
        predictor.to(x.device)
    return predictor


def _check_prediction_args(threshold, max_chunks, nms_window, max_len):
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0.0 <= float(threshold) < 1.0:
        raise ValueError(f"threshold must be a probability in [0, 1) (boundaries are positions with p > threshold), "
                         f"got {threshold!r}: a value >= 1 or NaN keeps no boundary and gives one chunk; the default "
                         "is 0.5, the authors' logit threshold 1.1 is p = 0.75")
    for name, val, lo in (("max_chunks", max_chunks, 1), ("nms_window", nms_window, 0)):
        if isinstance(val, bool) or not isinstance(val, int) or val < lo:
            raise ValueError(f"{name} must be an int >= {lo}, got {val!r}")
    if max_len is not None and (isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 1):
        raise ValueError(f"max_len must be None (no cut) or an int >= 1 (longest chunk in tokens), got {max_len!r}")


@torch.no_grad()
def predict_boundaries(predictor: BoundaryPredictor, k: torch.Tensor, *, max_chunks: int, threshold: float = 0.5,
                       nms_window: int = 8, max_len: int | None = None) -> list[torch.Tensor]:
    """Chunkings of a batch from its keys: predictor probabilities, then NMS (:func:`nms_boundaries`).

    This is the specification in PyTorch; :func:`kvlab.dhsa.api.predict_boundaries` chooses between it and the fast
    path (:func:`kvlab.dhsa.chunking.predict_boundaries_fast`, the same offsets) by ``backend``.

    Args:
        k: ``(batch, kv_heads, seq, dim)`` keys of the layer (RoPE applied, as the authors' code).
        max_chunks: ``N_c``. threshold: on the probability, in ``[0, 1)`` (the authors' code thresholds
            the logit at 1.1, i.e. ``p > 0.75``). nms_window: App. B ("e.g. 8 or 64").
        max_len: cut chunks longer than this (:func:`split_long_chunks`; ours); None: no cut.

    One predictor call for the whole batch and every position; the NMS runs on the keys' device
    (no loop over positions), so ``torch.compile(predictor)`` can be passed as ``predictor`` (it
    must be a :class:`BoundaryPredictor` or a compiled one). The predictor runs in its own dtype
    (``predictor.to(torch.bfloat16)`` is the fast path on a GPU).

    Returns:
        one offsets tensor per sequence, on ``k``'s device.
    """
    _check_prediction_args(threshold, max_chunks, nms_window, max_len)
    module = getattr(predictor, "_orig_mod", predictor)  # torch.compile wraps the module
    if not isinstance(module, BoundaryPredictor):
        raise TypeError(f"predictor must be a BoundaryPredictor (or torch.compile of one), got "
                        f"{type(predictor).__name__}")
    x = module.features(k)
    p = torch.sigmoid(on_device_of(predictor, x)(x).float())  # the predictor on the keys' device
    n = x.shape[1]
    valid = label_valid(n, module.window, x.device)
    out = nms_boundaries(p, max_chunks=max_chunks, threshold=threshold, nms_window=nms_window, valid=valid)
    return [split_long_chunks(bd, max_len) for bd in out] if max_len else out


# ================================================================================================
# Recall: how much dense attention mass a mask keeps
# ================================================================================================
def _dense_probs(q, k, scale):
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1).to(torch.float64)
    q = q.to(torch.float64)
    n = q.shape[-2]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = (q @ k.transpose(-1, -2)) * scale
    causal = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
    return torch.softmax(s.masked_fill(~causal, float("-inf")), dim=-1)


def attention_recall(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """Share of dense causal attention mass the mask keeps, per head: ``mean_i sum_{j kept} P[i, j]``.

    Args:
        q ``(batch, heads, seq, dim)``, k ``(batch, kv_heads, seq, dim)``, mask ``(batch, heads | 1, seq, seq)``.

    Returns:
        ``(batch, heads)`` float64 in ``[0, 1]``; 1 when the mask keeps every causal key.
    """
    p = _dense_probs(q, k, scale)
    return (p * mask).sum(-1).mean(-1)


def best_recall(q: torch.Tensor, k: torch.Tensor, budget: int, scale: float | None = None) -> torch.Tensor:
    """The most any mask with ``budget`` keys per query can keep: each row's top-``budget`` dense
    probabilities (token-level TopK on the true attention). ``(batch, heads)``."""
    p = _dense_probs(q, k, scale)
    kk = min(budget, p.shape[-1])
    return p.topk(kk, dim=-1).values.sum(-1).mean(-1)
