"""The KV-policy interface and the two policies every paper compares against.

A policy decides, after each forward step and for each layer, which cached entries stay. It sees a
:class:`~kvlab.cache.LayerView` (token ids, original positions, attention scores when it sets
``needs_scores``) and returns the indices to keep, oldest first, or ``None`` to keep everything. The cache
then physically drops the rest (:class:`~kvlab.cache.KVCache`). Policies may differ per layer (LaCache)
and may keep per-layer scratch state in ``view.state`` (SepLLM's four blocks).
"""

from __future__ import annotations

import torch

from kvlab.cache import LayerView

__all__ = ["Policy", "Full", "StreamingLLM"]

_POSITION_MODES = ("cache", "original")


def _check_int(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


class Policy:
    """Base class. Subclasses set ``needs_scores`` / ``positions`` and implement :meth:`keep`.

    positions: ``"cache"`` — the model sees positions within the cache (kept keys re-rotated, as
    StreamingLLM does); ``"original"`` — every token keeps its position in the stream.
    """

    needs_scores: bool = False

    def __init__(self, positions: str = "original"):
        if positions not in _POSITION_MODES:
            raise ValueError(f"positions must be one of {_POSITION_MODES}, got {positions!r}")
        self.positions = positions

    def keep(self, view: LayerView) -> torch.Tensor | None:
        """Indices ``(m,)`` or ``(batch, m)`` of the entries of ``view`` to keep, ascending; None keeps all."""
        raise NotImplementedError

    def check_model(self, num_layers: int) -> None:
        """Raise if the policy cannot run on a model with ``num_layers`` layers (LaCache's span, ...)."""

    @property
    def budget(self) -> int | None:
        """Most entries a layer holds after a step, or None when unbounded."""
        return None

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({fields})"


class Full(Policy):
    """Keep everything: the vanilla dense KV cache."""

    def __init__(self, positions: str = "original"):
        super().__init__(positions)

    def keep(self, view: LayerView) -> torch.Tensor | None:
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
        self.sink = _check_int("sink", sink, 0)
        if window is None and cache_size is None:
            raise ValueError("StreamingLLM needs window= (recent entries kept) or cache_size= (sink + window)")
        if cache_size is not None:
            _check_int("cache_size", cache_size, 1)
            if window is None:
                window = cache_size - sink
                if window < 1:
                    raise ValueError(f"cache_size ({cache_size}) must exceed sink ({sink}) to leave room for a window")
            elif sink + window > cache_size:
                raise ValueError(f"sink + window ({sink} + {window} = {sink + window}) must be <= cache_size "
                                 f"({cache_size}); lower one of them or raise cache_size")
        self.window = _check_int("window", window, 1)

    @property
    def budget(self) -> int:
        return self.sink + self.window

    def keep(self, view: LayerView) -> torch.Tensor | None:
        n = view.size
        if n <= self.sink + self.window:
            return None
        device = view.positions.device
        return torch.cat([torch.arange(self.sink, device=device), torch.arange(n - self.window, n, device=device)])
