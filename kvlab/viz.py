"""Pictures of attention and of KV caches. Every function draws on a matplotlib ``Axes`` and returns it;
the ``interactive_*`` helpers only wrap them in ipywidgets sliders, so notebooks also run headless."""

from __future__ import annotations

from typing import Sequence

import torch

__all__ = [
    "attention_heatmap",
    "interactive_attention",
    "kept_positions",
    "kept_positions_image",
    "kv_trace_plot",
    "niah_heatmap",
    "ppl_curve_plot",
]


def _axes(ax, figsize=(6, 4)):
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=figsize)
    return ax


def attention_heatmap(attn: torch.Tensor, tokens: Sequence[str] | None = None, *, ax=None, title: str = "",
                      log: bool = False):
    """Heat map of one head's attention ``(q, n)``; rows are queries, columns keys, labelled by ``tokens``
    (keep inputs small: labels are readable up to ~60 tokens). ``log=True`` shows log10 probabilities."""
    import matplotlib.pyplot as plt

    a = attn.detach().float().cpu()
    if a.dim() != 2:
        raise ValueError(f"attention_heatmap takes one head's (q, n) matrix, got shape {tuple(a.shape)}")
    ax = _axes(ax, (7, 6))
    data = torch.log10(a.clamp_min(1e-6)) if log else a
    im = ax.imshow(data.numpy(), cmap="viridis", aspect="auto", interpolation="nearest")
    if tokens is not None:
        shown = [t.replace("\n", "\\n") for t in tokens]
        ax.set_xticks(range(a.shape[1]), shown[-a.shape[1]:], rotation=90, fontsize=7)
        ax.set_yticks(range(a.shape[0]), shown[-a.shape[0]:], fontsize=7)
    ax.set_xlabel("key")
    ax.set_ylabel("query")
    ax.set_title(title)
    plt.colorbar(im, ax=ax, label="log10 attention" if log else "attention")
    return ax


def interactive_attention(maps: torch.Tensor, tokens: Sequence[str] | None = None, log: bool = False):
    """Layer and head sliders over ``maps`` ``(layers, heads, q, n)`` (from ``capture_attention``).

    Returns the widget; with no widget front end it still draws layer 0, head 0."""
    import matplotlib.pyplot as plt

    def show(layer: int = 0, head: int = 0):
        attention_heatmap(maps[layer, head], tokens, title=f"layer {layer}, head {head}", log=log)
        plt.show()

    try:
        import ipywidgets as widgets
    except ImportError:  # plain Python: draw the first map
        show()
        return None
    return widgets.interact(show, layer=widgets.IntSlider(0, 0, maps.shape[0] - 1),
                            head=widgets.IntSlider(0, 0, maps.shape[1] - 1))


def kv_trace_plot(results: dict[str, "object"] | Sequence["object"], *, ax=None, per_layer: int | None = None):
    """Entries held after each step, one line per run (``StreamingResult`` objects, or a dict name ->
    result). ``per_layer=i`` plots layer ``i`` instead of the mean over layers."""
    ax = _axes(ax)
    items = results.items() if isinstance(results, dict) else [(r.policy, r) for r in results]
    for name, r in items:
        trace = r.kv_trace if per_layer is None else r.kv_trace_per_layer[:, per_layer]
        ax.plot(trace.numpy(), label=f"{name} (mean {r.mean_kv:.0f})")
    ax.set_xlabel("decoding step")
    ax.set_ylabel("KV entries held" + ("" if per_layer is None else f" (layer {per_layer})"))
    ax.legend(fontsize=8)
    return ax


def kept_positions(cache) -> torch.Tensor:
    """``(layers, seen)`` bool: which original positions each layer of a ``KVCache`` holds (batch row 0)."""
    out = torch.zeros(len(cache.layers), max(cache.seen, 1), dtype=torch.bool)
    for i, layer in enumerate(cache.layers):
        if layer.is_initialized and layer.size:
            out[i, layer.positions[0].cpu()] = True
    return out


def kept_positions_image(cache_or_mask, *, ax=None, title: str = ""):
    """Layer x position picture of what a cache holds (a ``KVCache`` or a ``(layers, positions)`` mask)."""
    mask = cache_or_mask if isinstance(cache_or_mask, torch.Tensor) else kept_positions(cache_or_mask)
    ax = _axes(ax, (8, 3))
    ax.imshow(mask.float().numpy(), cmap="Greys", aspect="auto", interpolation="nearest", vmin=0, vmax=1)
    ax.set_xlabel("original token position")
    ax.set_ylabel("layer")
    ax.set_title(title or f"kept entries (black), {int(mask.sum())} in all")
    return ax


def niah_heatmap(result, *, ax=None, value: str = "accuracy"):
    """Needle/passkey grid of a ``RetrievalResult``: context length (rows) x depth (columns)."""
    import matplotlib.pyplot as plt

    grid = getattr(result, value).float()
    ax = _axes(ax, (6, 3.5))
    cmap = "RdYlGn" if value == "accuracy" else "RdYlGn_r"
    im = ax.imshow(grid.numpy(), cmap=cmap, aspect="auto", vmin=0 if value == "accuracy" else None,
                   vmax=1 if value == "accuracy" else None)
    ax.set_xticks(range(len(result.depths)), [f"{d:.0%}" for d in result.depths])
    ax.set_yticks(range(len(result.lengths)), [str(n) for n in result.lengths])
    ax.set_xlabel("needle depth")
    ax.set_ylabel("context tokens")
    for i in range(grid.shape[0]):
        for j in range(grid.shape[1]):
            ax.text(j, i, f"{grid[i, j]:.2f}", ha="center", va="center", fontsize=8)
    ax.set_title(f"{result.task}: {value}")
    plt.colorbar(im, ax=ax)
    return ax


def ppl_curve_plot(results: dict[str, "object"] | Sequence["object"], every: int = 256, *, ax=None,
                   mark: int | None = None):
    """Perplexity of consecutive blocks of ``every`` tokens along the stream, one line per run;
    ``mark`` draws a vertical line (e.g. the model's training length)."""
    ax = _axes(ax)
    items = results.items() if isinstance(results, dict) else [(r.policy, r) for r in results]
    for name, r in items:
        curve = r.ppl_curve(every)
        ax.plot([(i + 1) * every for i in range(len(curve))], curve.numpy(), marker="o", ms=3, label=name)
    if mark is not None:
        ax.axvline(mark, color="grey", ls="--", lw=1)
    ax.set_yscale("log")
    ax.set_xlabel("token position")
    ax.set_ylabel(f"perplexity (blocks of {every})")
    ax.legend(fontsize=8)
    return ax
