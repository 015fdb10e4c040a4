"""The two policies every paper compares against: keep everything, and attention sinks + window."""

from __future__ import annotations

import torch

from kvlab.core import LayerView, Policy, check_int

__all__ = ["Full", "StreamingLLM"]


class Full(Policy):
    """Keep everything: the vanilla dense KV cache."""

    def __init__(self, positions: str = "original"):
        super().__init__(positions)

    static_reason = None

    def keep(self, view: LayerView) -> torch.Tensor | None:
        return None

    def static_keep(self, view) -> torch.Tensor | None:
        return None


class StreamingLLM(Policy):
    """Attention sinks + sliding window (Xiao et al. 2023, "Efficient Streaming Language Models with
    Attention Sinks"; the baseline of SepLLM Sec. 4.5, LaCache Table 1, and the others).

    After every step each layer keeps its ``sink`` oldest entries and its ``window`` newest ones, so the
    next token attends to ``sink + window`` cached entries plus itself. Give ``cache_size`` instead of
    ``window`` to get ``window = cache_size - sink``; give both and ``sink + window <= cache_size`` is checked.

    Pseudocode (per layer, n entries held)::

        if n <= sink + window: keep all
        else: keep [0, sink) + [n - window, n)
    """

    def __init__(self, sink: int = 4, window: int | None = None, *, cache_size: int | None = None,
                 positions: str = "cache"):
        super().__init__(positions)
        self.sink = check_int("sink", sink, 0)
        if window is None and cache_size is None:
            raise ValueError("StreamingLLM needs window= (recent entries kept) or cache_size= (sink + window)")
        if cache_size is not None:
            check_int("cache_size", cache_size, 1)
            if window is None:
                window = cache_size - sink
                if window < 1:
                    raise ValueError(f"cache_size ({cache_size}) must exceed sink ({sink}) to leave room for a window")
            elif sink + window > cache_size:
                raise ValueError(f"sink + window ({sink} + {window} = {sink + window}) must be <= cache_size "
                                 f"({cache_size}); lower one of them or raise cache_size")
        self.window = check_int("window", window, 1)

    @classmethod
    def for_budget(cls, cache: int, *, tokenizer=None) -> "StreamingLLM":
        """4 attention sinks (the paper's choice) and a window of ``cache - 4``."""
        return cls(sink=4, cache_size=cache)

    static_reason = None

    @property
    def budget(self) -> int:
        return self.sink + self.window

    def static_keep(self, view) -> torch.Tensor:
        """Slot ``i`` of a row holding ``n`` is kept iff ``i < sink`` or ``i >= n - window`` (all when
        ``n <= sink + window``, which the rule already gives)."""
        return (view.slots < self.sink) | (view.slots >= view.length[:, None] - self.window)

    def keep(self, view: LayerView) -> torch.Tensor | None:
        n = view.size
        if n <= self.sink + self.window:
            return None
        device = view.positions.device
        return torch.cat([torch.arange(self.sink, device=device), torch.arange(n - self.window, n, device=device)])
