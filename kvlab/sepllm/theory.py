"""How far information travels under a sparse causal mask, layer by layer (SepLLM Sec. 5, App. J-K).

A mask ``M`` (``M[q, k]``: query ``q`` reads key ``k``; the diagonal included) is one layer of message
passing: after ``L`` layers, token ``q`` can depend on token ``j`` exactly when there is a chain
``j = k_0 -> k_1 -> ... -> k_L = q`` with ``M[k_{i+1}, k_i]`` (waiting in place is allowed). The *hop
distance* ``hops[q, j]`` is the smallest such ``L``; ``max_j hops[q, j]`` is how many layers token ``q``
needs to have seen everything before it.

Why separators help (the causal counterpart of Lemma K.4's ``ceil(s / l)`` "token transmission" steps):
with neighbours ``q - k < n`` a hop moves information at most ``n - 1`` positions forward, so a sliding
window needs ``ceil((q - j) / (n - 1))`` layers. Under SepLLM's mask, information only has to walk to the
next separator (or initial token) at or after ``j``, which every later query reads directly::

    hops[q, j] = 0                                         if q == j
               = min(ceil((q - j) / (n - 1)),              # neighbours only
                     ceil(g_j / (n - 1)) + 1)              # walk to the next kept key p = j + g_j, then jump
    where g_j = p - j for the first separator/initial token p >= j with p < q (else the first branch only)

so the worst case over a text is about ``ceil(s / (n - 1)) + 1`` layers, ``s`` the longest run of tokens
without a separator; the paper's encoder proof (window ``[i - l, i + l]``) needs ``ceil(s / l)`` steps.
:func:`hop_distance` computes hops by breadth-first search over the mask (boolean matrix products) and
:func:`hop_distance_formula` by the closed form; tests pin them equal.
"""

from __future__ import annotations

import math

import torch

__all__ = ["hop_distance", "hop_distance_formula", "layers_to_see_everything", "longest_gap", "keep_mask"]


def keep_mask(far: torch.Tensor, init: int, neighbors: int) -> torch.Tensor:
    """``(T, T)`` bool mask of one sequence: ``k <= q and (k < init or q - k < neighbors or far[k])``.

    ``far``: ``(T,)`` bool (separators for SepLLM; all False for a sliding window with sinks).
    """
    from kvlab.sepllm.reference import sepllm_mask

    return sepllm_mask(far.bool()[None], init, neighbors)[0]


@torch.no_grad()
def hop_distance(mask: torch.Tensor, max_layers: int | None = None) -> torch.Tensor:
    """``(T, T)`` int64: layers needed for token ``j`` (column) to reach token ``q`` (row); -1 if never
    (above the diagonal, or beyond ``max_layers``). ``mask``: ``(T, T)`` bool, causal, diagonal set."""
    t = mask.shape[0]
    if mask.shape != (t, t):
        raise ValueError(f"mask must be square (T, T), got {tuple(mask.shape)}")
    m = (mask | torch.eye(t, dtype=torch.bool, device=mask.device)).float()
    hops = torch.full((t, t), -1, dtype=torch.long, device=mask.device)
    reach = torch.eye(t, device=mask.device)
    hops[reach.bool()] = 0
    limit = max_layers if max_layers is not None else t
    for layer in range(1, limit + 1):
        new = (m @ reach).clamp_(max=1.0)
        fresh = new.bool() & ~reach.bool()
        if not bool(fresh.any()):
            break
        hops[fresh] = layer
        reach = new
    return hops


def hop_distance_formula(far: torch.Tensor, init: int, neighbors: int) -> torch.Tensor:
    """The closed form of the module docstring, ``(T, T)`` int64 (-1 above the diagonal)."""
    far = far.bool().clone()
    far[:init] = True
    t = far.numel()
    step = max(neighbors - 1, 0)
    pos = torch.arange(t)
    # next kept key at or after j (T if none)
    nxt = torch.full((t,), t, dtype=torch.long)
    last = t
    for j in range(t - 1, -1, -1):
        if far[j]:
            last = j
        nxt[j] = last
    q, j = pos[:, None], pos[None, :]
    big = torch.full((t, t), 1 << 40, dtype=torch.long)
    direct = torch.where(q - j <= step, torch.ones_like(big), big) if step == 0 else -(-(q - j) // step)
    gap = (nxt[None, :] - j).expand(t, t)
    via = torch.where(gap == 0, torch.ones_like(big), -(-gap // step) + 1) if step > 0 else \
        torch.where(gap == 0, torch.ones_like(big), big)
    via = torch.where(nxt[None, :] < q, via, big)
    hops = torch.minimum(direct, via)
    hops = torch.where(q == j, torch.zeros_like(hops), hops)
    hops = torch.where(hops >= (1 << 40), torch.full_like(hops, -1), hops)
    return torch.where(j > q, torch.full_like(hops, -1), hops)


def layers_to_see_everything(hops: torch.Tensor) -> torch.Tensor:
    """``(T,)``: for each query, the layers it needs to depend on every earlier token (-1 if it never does)."""
    unreachable = (hops < 0) & torch.ones_like(hops, dtype=torch.bool).tril()
    worst = hops.clamp(min=0).max(dim=1).values
    return torch.where(unreachable.any(dim=1), torch.full_like(worst, -1), worst)


def longest_gap(far: torch.Tensor, init: int = 0) -> int:
    """Longest run of consecutive tokens that are neither separators nor initial tokens (``s`` of App. J)."""
    kept = far.bool().clone()
    kept[:init] = True
    best = run = 0
    for flag in kept.tolist():
        run = 0 if flag else run + 1
        best = max(best, run)
    return best


def sliding_window_layers(distance: int, neighbors: int) -> int:
    """Layers a sliding window of ``neighbors`` needs to carry information ``distance`` tokens forward."""
    if neighbors < 2:
        raise ValueError("a window of 1 (the query only) never moves information")
    return math.ceil(distance / (neighbors - 1))
