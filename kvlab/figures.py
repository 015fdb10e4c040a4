"""Concept figures: each paper's cache or mask layout, drawn as the paper's own figure draws it.

One function per paper, each built from the library's reference code (so the picture is the mechanism the
notebooks run, not a drawing of it): a small, fixed example, every cell coloured by *why* it is kept.

* :func:`streamingllm_layout` - dense, window and sink + window attention (StreamingLLM, Fig. 1);
* :func:`sepllm_layout` - initial tokens, separators and neighbours (SepLLM, Fig. 1/3; ``kvlab.sepllm.reference``);
* :func:`lacache_layout` - the ladder across layers, bands and interleaved (LaCache, Fig. 2; ``kvlab.lacache``);
* :func:`dhsa_layout` - chunks, chunk similarity and the token mask under a budget (DHSA, Fig. 1; ``kvlab.dhsa``);
* :func:`reform_layout` - compress, gather, recompute across layers (REFORM, Fig. 1; ``kvlab.reform``);
* :func:`orthorank_layout` - routed layers computing the tokens most orthogonal to the sink (OrthoRank, Fig. 1).

Every function returns ``(figure, layout)``: ``layout`` is the integer array drawn (one code per category), so a
test can check it against the reference mechanism.
"""

from __future__ import annotations

import torch

__all__ = ["streamingllm_layout", "sepllm_layout", "lacache_layout", "dhsa_layout", "reform_layout",
           "orthorank_layout"]

# the colours of the categories (0 is always "not attended / not held")
_BLANK = "#ffffff"
_DROPPED = "#e4e4e4"


def _draw(ax, layout: torch.Tensor, colors: list[str], *, xlabel: str, ylabel: str, title: str,
          xticklabels=None, grid: bool = True):
    """Draw an integer ``layout`` (rows x columns) with one colour per code, thin white cell borders."""
    from matplotlib.colors import BoundaryNorm, ListedColormap

    cmap = ListedColormap(colors)
    norm = BoundaryNorm([i - 0.5 for i in range(len(colors) + 1)], len(colors))
    ax.imshow(layout.numpy(), cmap=cmap, norm=norm, interpolation="nearest", aspect="equal")
    rows, cols = layout.shape
    if grid:
        ax.set_xticks([c - 0.5 for c in range(1, cols)], minor=True)
        ax.set_yticks([r - 0.5 for r in range(1, rows)], minor=True)
        ax.grid(which="minor", color="white", lw=0.6)
        ax.tick_params(which="minor", length=0)
    if xticklabels is not None:
        ax.set_xticks(range(cols))
        ax.set_xticklabels(xticklabels, rotation=90, fontsize=7)
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)


def _legend(fig, names: list[str], colors: list[str], ncol: int | None = None):
    from matplotlib.patches import Patch

    handles = [Patch(facecolor=c, edgecolor="grey", lw=0.5, label=n) for n, c in zip(names, colors)]
    fig.legend(handles=handles, loc="lower center", ncol=ncol or len(handles), frameon=False, fontsize=8,
               bbox_to_anchor=(0.5, -0.02))


# ------------------------------------------------------------------------------------------------ StreamingLLM


def streamingllm_layout(n: int = 12, sink: int = 2, window: int = 4):
    """Query x key masks of dense attention, a sliding window and StreamingLLM (sinks + window), Fig. 1 (a, b, d)
    of the paper: ``layout`` is ``(3, n, n)``, codes 0 future, 1 evicted, 2 attended, 3 attention sink."""
    import matplotlib.pyplot as plt

    q, k = torch.arange(n)[:, None], torch.arange(n)[None, :]
    causal = k <= q
    recent = causal & (q - k < window)
    dense = causal.long() * 2
    windowed = causal.long() + recent.long()  # 1 evicted, 2 recent
    sinks = windowed.clone()
    sinks[causal & (k < sink)] = 3
    layout = torch.stack([dense, windowed, sinks])
    colors = [_BLANK, _DROPPED, "#4c72b0", "#dd8452"]
    fig, axes = plt.subplots(1, 3, figsize=(10, 3.8))
    titles = ["dense attention", f"window attention ({window} keys)", f"StreamingLLM ({sink} sinks + {window} keys)"]
    for ax, panel, title in zip(axes, layout, titles):
        _draw(ax, panel, colors, xlabel="key position", ylabel="query position", title=title)
    _legend(fig, ["evicted", "attended", "attention sink (always kept)"], colors[1:])
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    return fig, layout


# ------------------------------------------------------------------------------------------------ SepLLM

_SENTENCE = "The cat sat , then it slept . A dog came in , barked twice and left . Quiet again .".split()


def sepllm_layout(words: list[str] | None = None, init: int = 2, neighbors: int = 3):
    """The SepLLM mask (Eq. 1-2, Fig. 3 of the paper) on a short sentence, word tokens: ``layout`` is
    ``(n, n)``, codes 0 future, 1 dropped, 2 neighbour, 3 separator, 4 initial token. The kept cells are exactly
    :func:`kvlab.sepllm.reference.sepllm_mask`."""
    import matplotlib.pyplot as plt

    from kvlab.sepllm.reference import sepllm_mask

    words = list(words or _SENTENCE)
    n = len(words)
    is_sep = torch.tensor([[w in {".", ",", ";", ":", "!", "?", "\n"} for w in words]])
    kept = sepllm_mask(is_sep, init, neighbors)[0]
    q, k = torch.arange(n)[:, None], torch.arange(n)[None, :]
    layout = (k <= q).long()  # 1: causal but dropped
    layout[kept & (q - k < neighbors)] = 2
    layout[kept & is_sep[0][None, :] & ~(q - k < neighbors)] = 3
    layout[kept & (k < init)] = 4
    colors = [_BLANK, _DROPPED, "#4c72b0", "#55a868", "#dd8452"]
    fig, ax = plt.subplots(figsize=(7, 6.4))
    _draw(ax, layout, colors, xlabel="key", ylabel="query",
          title=f"SepLLM mask: {init} initial tokens, every separator, {neighbors} neighbours",
          xticklabels=words)
    ax.set_yticks(range(n))
    ax.set_yticklabels(words, fontsize=7)
    _legend(fig, ["dropped", "neighbour", "separator", "initial token"], colors[1:])
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    return fig, layout


# ------------------------------------------------------------------------------------------------ LaCache


def lacache_layout(num_layers: int = 8, length: int = 30, span: int = 4, overlap: int = 2, sink: int = 2):
    """One application of LaCache's ladder (Fig. 2 of the paper) in both layouts: ``layout`` is
    ``(2, num_layers, length)``, codes 0 freed, 1 kept by the ladder, 2 attention sink, 3 not yet compacted (the
    trailing partial group). Kept cells are exactly :func:`kvlab.lacache.reference.ladder_mask`."""
    import matplotlib.pyplot as plt

    from kvlab.lacache.reference import LadderGeometry, ladder_mask

    geometry = LadderGeometry(num_layers, span, overlap)
    full_groups = (length - sink) // geometry.group
    tail = torch.arange(length) >= sink + full_groups * geometry.group
    panels = []
    for layout_name in ("bands", "interleaved"):
        kept = ladder_mask(geometry, length, layout_name, sink=sink)
        code = kept.long()
        code[:, :sink] = 2
        code[:, tail] = 3
        panels.append(code)
    layout = torch.stack(panels)
    colors = ["#e4e4e4", "#4c72b0", "#dd8452", "#8fb3d9"]
    fig, axes = plt.subplots(2, 1, figsize=(9, 5.4))
    for ax, panel, name in zip(axes, layout, ("bands (the paper's figure)", "interleaved (the authors' code)")):
        _draw(ax, panel, colors, xlabel="token position", ylabel="layer",
              title=f"LaCache ladder, {name}: span {span}, overlap {overlap}")
    _legend(fig, ["freed", "kept by the ladder", "attention sink", "newest tokens (not compacted yet)"], colors)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    return fig, layout


# ------------------------------------------------------------------------------------------------ DHSA


def dhsa_layout(boundaries: tuple[int, ...] = (0, 3, 5, 11, 14, 20, 23), n: int = 26, budget: int = 9,
                initial: int = 1, seed: int = 0):
    """DHSA on random queries and keys with variable-length chunks (Fig. 1 of the paper): the chunk similarity
    upsampled to token pairs (left) and the token mask under a budget of ``budget`` keys per query (right).
    ``layout`` is the mask ``(n, n)``, codes 0 future, 1 dropped, 2 selected by chunk score, 3 own chunk
    (diagonal), 4 initial token; its kept cells are exactly :func:`kvlab.dhsa.reference.dhsa_mask`."""
    import matplotlib.pyplot as plt

    from kvlab.dhsa.reference import chunk_index, chunk_similarity, dhsa_mask, upsample

    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 1, n, 8, generator=g)
    k = torch.randn(1, 1, n, 8, generator=g)
    bd = torch.tensor(list(boundaries) + [n])
    kept = dhsa_mask(q, k, bd, budget, initial=initial)[0, 0]
    scores = upsample(chunk_similarity(q, k, bd), bd, n)[0, 0]
    chunk = chunk_index(bd, n)
    qi, ki = torch.arange(n)[:, None], torch.arange(n)[None, :]
    causal = ki <= qi
    layout = causal.long()
    layout[kept] = 2
    layout[kept & (chunk[None, :] == chunk[:, None])] = 3
    layout[kept & (ki < initial)] = 4
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4.8))
    shown = scores.masked_fill(~causal, float("nan")).numpy()
    a.imshow(shown, cmap="viridis", interpolation="nearest")
    a.set(title="chunk similarity, upsampled to token pairs", xlabel="key", ylabel="query")
    colors = [_BLANK, _DROPPED, "#4c72b0", "#55a868", "#dd8452"]
    _draw(b, layout, colors, xlabel="key", ylabel="query", title=f"token mask, {budget} keys per query")
    for ax in (a, b):
        for edge in bd[1:-1].tolist():
            ax.axvline(edge - 0.5, color="black", lw=0.6)
            ax.axhline(edge - 0.5, color="black", lw=0.6)
    _legend(fig, ["dropped", "selected by chunk score", "own chunk (causal)", "initial token"], colors[1:])
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    return fig, layout


# ------------------------------------------------------------------------------------------------ REFORM


def reform_layout(num_layers: int = 10, length: int = 48, exit_layer: int = 6, budget: int = 12,
                  evidence: tuple[int, int] = (27, 30), pool: int = 5, recompute: int = 14, seed: int = 0):
    """REFORM's three stages across layers (Fig. 1 of the paper), on a synthetic input: compress (what each layer
    holds after recurrent chunked forwarding: initial, heavy-hitter and recent entries, only up to the early-exit
    layer), gather (per-token similarity to the question, max-pooled, the top tokens kept), recompute (the gathered
    tokens run through every layer). ``layout`` is ``(2, num_layers, length)``, codes 0 not held, 1 never run
    (above the exit), 2 held, 3 evidence held, 4 recomputed."""
    import matplotlib.pyplot as plt
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(seed)
    held = torch.zeros(num_layers, length, dtype=torch.long)
    held[exit_layer:] = 1
    for layer in range(exit_layer):  # initial + recent + heavy hitters that differ from layer to layer
        heavy = torch.randperm(length - 8, generator=g)[: budget - 6] + 3
        held[layer, :3] = 2
        held[layer, -3:] = 2
        held[layer, heavy] = 2
    lo, hi = evidence
    similarity = torch.rand(length, generator=g) * 0.5
    similarity[lo:hi] = 0.9 + 0.1 * torch.rand(hi - lo, generator=g)
    pooled = F.max_pool1d(similarity[None, None], pool, stride=1, padding=pool // 2)[0, 0]
    gathered = torch.topk(pooled, recompute).indices
    second = torch.zeros(num_layers, length, dtype=torch.long)
    second[:, gathered] = 4
    layout = torch.stack([held, second])
    held_ev = held.clone()
    held_ev[(held == 2) & (torch.arange(length)[None, :] >= lo) & (torch.arange(length)[None, :] < hi)] = 3
    colors = [_BLANK, _DROPPED, "#4c72b0", "#c44e52", "#55a868"]
    fig, axes = plt.subplots(3, 1, figsize=(9, 7.4), gridspec_kw={"height_ratios": [3, 1.4, 3]})
    _draw(axes[0], held_ev, colors, xlabel="input token", ylabel="layer",
          title=f"1. compress: entries held after the last chunk (budget {budget}, exit after layer {exit_layer - 1})")
    axes[1].bar(range(length), pooled.numpy(), color=["#55a868" if i in set(gathered.tolist()) else "#bbbbbb"
                                                      for i in range(length)])
    axes[1].axvspan(lo - 0.5, hi - 0.5, color="#c44e52", alpha=0.2)
    axes[1].set(xlim=(-0.5, length - 0.5), ylabel="score",
                title=f"2. gather: similarity to the question, max-pooled over {pool}; top {recompute} kept")
    _draw(axes[2], second, colors, xlabel="input token", ylabel="layer",
          title="3. recompute: the gathered tokens (and the question) through every layer")
    _legend(fig, ["never run (above the exit)", "held", "evidence held", "gathered / recomputed"], colors[1:])
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    return fig, layout


# ------------------------------------------------------------------------------------------------ OrthoRank


def orthorank_layout(num_layers: int = 10, n: int = 16, routed: tuple[int, ...] = (5, 6, 7, 8),
                     token_ratio: float = 0.33, seed: int = 0):
    """OrthoRank's routed layers (Fig. 1 / Algorithm 1 of the paper) on synthetic hidden states: in a routed layer
    only the ``token_ratio`` tokens most orthogonal to the sink (smallest ``|h_0 . h_i|``, Eq. 4) are computed,
    every token still gives its key and value, and the sink is never selected. ``layout`` is
    ``(num_layers, n)``, codes 1 computed (dense layer), 2 K/V only (not selected), 3 selected, 4 the sink in a
    routed layer; selection is :func:`kvlab.orthorank.reference.select_topk` on
    :func:`~kvlab.orthorank.reference.alignment`."""
    import matplotlib.pyplot as plt

    from kvlab.orthorank.reference import alignment, select_topk

    g = torch.Generator().manual_seed(seed)
    sink_direction = torch.randn(16, generator=g)
    layout = torch.ones(num_layers, n, dtype=torch.long)
    k = int(token_ratio * n)
    for layer in routed:
        # tokens turn towards the sink with depth (Fig. 2): a growing share of the sink's direction
        states = torch.randn(1, n, 16, generator=g) + (0.3 + 0.1 * layer) * torch.rand(1, n, 1, generator=g) * \
            sink_direction
        states[0, 0] = 6 * sink_direction
        chosen = select_topk(alignment(states), k)[0]
        layout[layer] = 2
        layout[layer, chosen] = 3
        layout[layer, 0] = 4
    colors = [_BLANK, "#8fb3d9", _DROPPED, "#4c72b0", "#dd8452"]
    fig, ax = plt.subplots(figsize=(8, 4.4))
    _draw(ax, layout, colors, xlabel="token position (0: the sink)", ylabel="layer",
          title=f"OrthoRank: routed layers {list(routed)} compute {k} of {n} tokens,\n"
          "those most orthogonal to the sink")
    _legend(fig, ["computed (dense layer)", "keys and values only", "selected: computed", "sink (never selected)"],
            colors[1:], ncol=2)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    return fig, layout
