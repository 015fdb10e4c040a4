"""SepLLM's tailored streaming design (Sec. 3.3, Fig. 4, App. B, Eq. 3-4) as a plain-Python reference.

Four blocks hold original positions, oldest first, with capacities ``a`` (initial), ``s`` (separators),
``w`` (local window) and ``c`` (everything), ``a + s + w < c``::

    push(token):
        if |initial| < a:  initial.append(token)          # fill the attention sinks first
        else:
            local.append(token)
            if |local| > w: past.append(local.popleft())  # overflow of the local window
        if |initial| + |sep| + |past| + |local| > c:       # compression (Fig. 4, iteration 1)
            sep.extend(separators of past)                 # FIFO: keep the newest s
            past.clear()

Our reading of "compression is triggered when Size_run reaches c": the cache may hold ``c`` entries and
the token that would take it past ``c`` triggers compression, so ``Size_run <= c`` always holds (as the
paper states) and StreamingLLM with ``cache_size=c`` holds exactly as many entries at most. Then the
neighbour count ``n = |past| + |local|`` runs through ``w, w+1, ..., c-a-s`` once the separator block is
full, whose mean is Eq. 3, ``(w + c - a - s) / 2``, and the mean runtime size is Eq. 4,
``(w + c + a + s) / 2``.

:class:`FourBlockCache` is the readable reference; :func:`simulate` runs it over a stream of separator
flags and records the block sizes after every token (the curves of Fig. 7). The decoding policy
:class:`kvlab.policies.SepLLMStreaming` implements the same rule on a model's cache and is tested against
this class step by step.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from kvlab.core.checks import check_int

__all__ = ["FourBlockCache", "StreamTrace", "simulate", "eq3_limit", "eq4_limit", "check_sizes"]


def check_sizes(init: int, sep: int, local: int, cache: int) -> None:
    """Validate ``a, s, w, c`` (Sec. 3.3: ``a + s + w < c``); raise ``TypeError``/``ValueError``."""
    for name, value, minimum in (("init", init, 0), ("sep", sep, 0), ("local", local, 1), ("cache", cache, 2)):
        check_int(name, value, minimum)
    if init + sep + local >= cache:
        raise ValueError(f"SepLLM's streaming cache needs init + sep + local < cache (a + s + w < c, Sec. 3.3); "
                         f"got {init} + {sep} + {local} = {init + sep + local} >= {cache}")


def eq3_limit(init: int, sep: int, local: int, cache: int) -> float:
    """Eq. 3: long-run mean number of neighbouring entries, ``(w + c - a - s) / 2``."""
    return (local + cache - init - sep) / 2


def eq4_limit(init: int, sep: int, local: int, cache: int) -> float:
    """Eq. 4: long-run mean runtime KV size, ``(w + c + a + s) / 2``."""
    return (local + cache + init + sep) / 2


@dataclass
class FourBlockCache:
    """The four blocks of Fig. 4 over original positions. ``push(position, is_sep)`` one token at a time."""

    init: int
    sep: int
    local: int
    cache: int
    initial: list[int] = field(default_factory=list)
    separators: deque = field(default_factory=deque)
    past: list[int] = field(default_factory=list)
    window: deque = field(default_factory=deque)
    flags: dict[int, bool] = field(default_factory=dict)
    compressions: int = 0

    def __post_init__(self):
        check_sizes(self.init, self.sep, self.local, self.cache)

    @property
    def size(self) -> int:
        return len(self.initial) + len(self.separators) + len(self.past) + len(self.window)

    @property
    def neighbors(self) -> int:
        return len(self.past) + len(self.window)

    def positions(self) -> list[int]:
        """Everything held, oldest first (initial, separators, past window, local window)."""
        return [*self.initial, *self.separators, *self.past, *self.window]

    def push(self, position: int, is_sep: bool) -> bool:
        """Add one token; returns True when it triggered a compression."""
        self.flags[position] = bool(is_sep)
        if len(self.initial) < self.init:
            self.initial.append(position)
        else:
            self.window.append(position)
            if len(self.window) > self.local:
                self.past.append(self.window.popleft())
        if self.size <= self.cache:
            return False
        for p in self.past:
            if self.flags[p]:
                self.separators.append(p)
                if len(self.separators) > self.sep:
                    self.separators.popleft()  # FIFO: the oldest separator leaves first
        for p in self.past:
            del self.flags[p]
        self.past.clear()
        self.compressions += 1
        return True


@dataclass
class StreamTrace:
    """Block sizes after every token of a simulated stream (arrays of length ``m``)."""

    init: int
    sep: int
    local: int
    cache: int
    initial: np.ndarray
    separators: np.ndarray
    past: np.ndarray
    window: np.ndarray

    @property
    def neighbors(self) -> np.ndarray:
        return self.past + self.window

    @property
    def size(self) -> np.ndarray:
        return self.initial + self.separators + self.past + self.window

    def running_mean(self, what: str = "size") -> np.ndarray:
        """``bar x_m = (1/m) sum_{k<=m} x(k)`` for ``what`` in {"size", "neighbors"}: Eq. 3-4's left sides."""
        x = getattr(self, what).astype(np.float64)
        return np.cumsum(x) / np.arange(1, len(x) + 1)

    @property
    def m0(self) -> int | None:
        """First step (1-based) after which the separator block stays full; None if it never fills."""
        full = self.separators >= self.sep
        if not full.any():
            return None
        last_not_full = np.nonzero(~full)[0]
        return int(last_not_full[-1] + 2) if last_not_full.size else 1

    def period(self) -> int | None:
        """Tokens between compressions once periodic: ``c - a - s - w + 1``, measured."""
        drops = np.nonzero(np.diff(self.neighbors) < 0)[0]
        m0 = self.m0
        if m0 is None:
            return None
        drops = drops[drops >= m0]
        return int(np.median(np.diff(drops))) if drops.size > 2 else None


def simulate(is_sep: Sequence[bool] | np.ndarray, init: int, sep: int, local: int, cache: int) -> StreamTrace:
    """Run :class:`FourBlockCache` over a stream with separator flags ``is_sep`` (length ``m``)."""
    flags = np.asarray(is_sep, dtype=bool)
    fb = FourBlockCache(init, sep, local, cache)
    m = len(flags)
    out = np.zeros((4, m), dtype=np.int64)
    for t in range(m):
        fb.push(t, bool(flags[t]))
        out[0, t], out[1, t], out[2, t], out[3, t] = len(fb.initial), len(fb.separators), len(fb.past), len(fb.window)
    return StreamTrace(init, sep, local, cache, *out)
