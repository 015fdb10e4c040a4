"""Pictures of attention and of KV caches. Every function draws on a matplotlib ``Axes`` and returns it;
the ``interactive_*`` helpers only wrap them in ipywidgets sliders, so notebooks also run headless."""

from __future__ import annotations

from typing import Sequence

import torch

__all__ = [
    "PolicyExplorer",
    "attention_heatmap",
    "interactive_attention",
    "interactive_lacache",
    "interactive_sepllm",
    "interactive_streaming",
    "kept_positions",
    "kept_positions_image",
    "kv_trace_plot",
    "niah_heatmap",
    "ppl_curve_plot",
    "replay_policy",
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


def replay_policy(policy, steps: int, num_layers: int = 1, token_ids: Sequence[int] | torch.Tensor | None = None):
    """Run ``policy.keep`` over a stream of ``steps`` tokens without a model: one entry per layer per step.

    Returns ``(kept, trace)``: ``kept`` ``(num_layers, steps)`` bool, which original positions each layer holds
    at the end; ``trace`` ``(steps, num_layers)`` long, entries held after each step (what ``KVCache.trace``
    records on a real model). ``token_ids`` (default: zeros) feed policies that look at tokens (SepLLM).
    Policies that need attention scores (H2O, TOVA) need a model: use ``kvlab.eval.streaming_perplexity``."""
    from kvlab.core import LayerView

    if getattr(policy, "needs_scores", False):
        raise ValueError(f"{type(policy).__name__} needs attention scores, which only a model gives; replay "
                         "policies that decide from positions and tokens (StreamingLLM, SepLLM, LaCache)")
    if steps < 1 or num_layers < 1:
        raise ValueError(f"steps and num_layers must be >= 1, got {steps} and {num_layers}")
    ids = torch.zeros(steps, dtype=torch.long) if token_ids is None else torch.as_tensor(token_ids).long()
    if ids.numel() < steps:
        raise ValueError(f"token_ids has {ids.numel()} entries, fewer than steps={steps}")
    held = [torch.zeros(0, dtype=torch.long) for _ in range(num_layers)]
    states = [{} for _ in range(num_layers)]
    trace = torch.zeros(steps, num_layers, dtype=torch.long)
    for t in range(steps):
        for layer in range(num_layers):
            pos = torch.cat([held[layer], torch.tensor([t])])
            view = LayerView(layer, num_layers, t + 1, pos[None], ids[pos][None], None, None, states[layer])
            keep = policy.keep(view)
            held[layer] = pos if keep is None else pos[torch.as_tensor(keep).reshape(-1)]
            trace[t, layer] = held[layer].numel()
    kept = torch.zeros(num_layers, steps, dtype=torch.bool)
    for layer, pos in enumerate(held):
        kept[layer, pos] = True
    return kept, trace


class PolicyExplorer:
    """Sliders over a policy's settings; every change replays the policy (:func:`replay_policy`) and draws the
    kept positions per layer and the KV trace. ``widget`` is the ipywidgets box to display (the notebook shows
    the explorer itself); ``update(**values)`` sets sliders, redraws and returns ``(kept, trace)``, so the
    explorer also runs headless (tests, papermill)."""

    def __init__(self, make_policy, sliders: dict[str, tuple[int, int, int]], steps: int, num_layers: int = 1,
                 token_ids=None, title: str = ""):
        import ipywidgets as widgets

        self.make_policy, self.steps, self.num_layers, self.token_ids, self.title = (
            make_policy, steps, num_layers, token_ids, title)
        self.sliders = {name: widgets.IntSlider(value=v, min=lo, max=hi, description=name, continuous_update=False)
                        for name, (v, lo, hi) in sliders.items()}
        self.message = widgets.HTML()
        self.output = widgets.Output()
        self.widget = widgets.VBox([widgets.HBox(list(self.sliders.values())), self.message, self.output])
        for slider in self.sliders.values():
            slider.observe(lambda _change: self.update(), names="value")
        self.kept, self.trace = None, None
        self.update()

    def values(self) -> dict[str, int]:
        return {name: s.value for name, s in self.sliders.items()}

    def update(self, **values):
        """Set the named sliders (others keep their value), replay, redraw; returns ``(kept, trace)``, or
        ``(None, None)`` with the policy's error shown when the settings are invalid."""
        import matplotlib.pyplot as plt

        unknown = set(values) - set(self.sliders)
        if unknown:
            raise ValueError(f"unknown settings {sorted(unknown)}; this explorer has {list(self.sliders)}")
        for slider in self.sliders.values():  # set silently, then replay once
            slider.unobserve_all("value")
        for name, value in values.items():
            self.sliders[name].value = value
        for slider in self.sliders.values():
            slider.observe(lambda _change: self.update(), names="value")
        try:
            policy = self.make_policy(**self.values())
            self.kept, self.trace = replay_policy(policy, self.steps, self.num_layers, self.token_ids)
        except ValueError as err:
            self.message.value = f"<b>invalid settings:</b> {err}"
            self.kept, self.trace = None, None
            return None, None
        self.message.value = f"{policy!r}: {int(self.trace[-1].max())} entries held at the end"
        self.output.clear_output(wait=True)
        with self.output:
            fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3), gridspec_kw={"width_ratios": [2, 1]})
            kept_positions_image(self.kept, ax=left, title=self.title or "kept positions (black)")
            right.plot(self.trace.float().mean(dim=1).numpy())
            right.set_xlabel("step")
            right.set_ylabel("entries held (mean over layers)")
            fig.tight_layout()
            plt.show()
            plt.close(fig)
        return self.kept, self.trace

    def _ipython_display_(self):
        from IPython.display import display

        display(self.widget)


def interactive_streaming(steps: int = 120) -> PolicyExplorer:
    """StreamingLLM explorer: ``sink`` and ``window`` sliders (cache size = sink + window)."""
    from kvlab.policies import StreamingLLM

    return PolicyExplorer(lambda sink, window: StreamingLLM(sink=sink, window=window),
                          {"sink": (4, 0, 16), "window": (32, 1, 96)}, steps, title="StreamingLLM")


def interactive_sepllm(steps: int = 200, sep_every: int = 7) -> PolicyExplorer:
    """SepLLM streaming explorer: ``a`` (initial), ``s`` (separators), ``w`` (local window), ``c`` (capacity)
    on a stream where every ``sep_every``-th token is a separator (token id 1)."""
    from kvlab.policies import SepLLMStreaming

    ids = [int(t % sep_every == sep_every - 1) for t in range(steps)]
    return PolicyExplorer(lambda a, s, w, c: SepLLMStreaming(init=a, sep=s, local=w, cache=c, separators=[1]),
                          {"a": (4, 0, 16), "s": (8, 0, 32), "w": (16, 1, 64), "c": (48, 2, 128)}, steps,
                          token_ids=ids, title="SepLLM: initial, separators, local window")


def interactive_lacache(steps: int = 160, num_layers: int = 30) -> PolicyExplorer:
    """LaCache explorer: span ``S``, overlap ``O`` and the per-layer ``budget``, on ``num_layers`` layers
    (SmolLM2-135M has 30)."""
    from kvlab.policies import LaCache

    return PolicyExplorer(lambda S, O, budget: LaCache(budget, span=S, overlap=O),
                          {"S": (8, 1, num_layers), "O": (4, 0, num_layers - 1), "budget": (64, 8, 160)}, steps,
                          num_layers=num_layers, title="LaCache: kept positions per layer")
