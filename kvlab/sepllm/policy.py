"""SepLLM's decoding policies (Sec. 3.2-3.3) and the fixed-interval variant FixLLM (App. I).

* :class:`SepLLM` — the fundamental design: after every step a layer keeps the ``init`` initial entries,
  every separator, and the ``neighbors - 1`` newest entries, so the next query sees ``neighbors``
  neighbours counting itself (the reading of :mod:`kvlab.sepllm.reference`: ``q - k < n``). With original
  positions this is exactly :class:`kvlab.sepllm.SepLLMPattern` at decode time (tested).
* :class:`FixLLM` — the same with "every ``interval``-th position" in place of "is a separator".
* :class:`SepLLMStreaming` — the tailored streaming design: four blocks (initial ``a``, separators ``s``,
  past window, local window ``w``), compression when the total would pass ``c``, separator FIFO, and
  positions within the cache (StreamingLLM's shift) by default. Reference: :mod:`kvlab.sepllm.streaming`.

SepLLM and SepLLMStreaming decide from the token ids, so rows of a batch would keep different counts: the hooks
engine (:class:`~kvlab.core.KVCache`) runs them at batch size 1, the static engine (:class:`~kvlab.eval.FastDecoder`,
a count per row) batched. FixLLM only looks at positions and runs batched in both.
"""

from __future__ import annotations

import warnings

import torch

from kvlab.core import LayerView, Policy, check_int, indices_from_mask
from kvlab.sepllm.separators import SeparatorSet
from kvlab.sepllm.streaming import check_sizes

__all__ = ["SepLLM", "SepLLMStreaming", "FixLLM"]


def _single_row(view: LayerView, name: str) -> None:
    if view.positions.shape[0] != 1:
        raise NotImplementedError(
            f"{name} keeps a different number of entries per sequence (it reads the tokens), and kvlab's "
            f"cache needs equal counts per row: run batch size 1")
    if bool((view.token_ids < 0).any()):
        raise ValueError(f"{name} needs token ids to find separators; the model was fed inputs_embeds")


def _warn_no_separators(name: str, instead: str) -> None:
    # Kept legal on purpose: the window-only rows of the papers' ablations (e.g. with full_layers) use it.
    warnings.warn(f"{name}(separators=[]) has no separator ids: it keeps only the initial and neighbouring entries, "
                  f"a sink + window cache (StreamingLLM) reported under {name}'s name. Pass separator ids "
                  f"(kvlab.sepllm.separator_ids(tokenizer)) for SepLLM, or kvlab.policies.{instead} for the window "
                  "cache", UserWarning, stacklevel=3)


def _separator_lookup(policy, token_ids: torch.Tensor) -> torch.Tensor:
    """``policy._sep.flags(token_ids)`` as a table lookup (``torch.isin`` is not capturable on every backend); the
    table is made once per device and kept on the policy."""
    table = policy.__dict__.setdefault("_lookup", {}).get(token_ids.device)
    if table is None:
        top = int(policy._sep.ids.max()) + 1 if len(policy._sep) else 0
        table = torch.zeros(top + 1, dtype=torch.bool)  # the last entry: "not a separator"
        table[policy._sep.ids] = True
        table = policy._lookup[token_ids.device] = table.to(token_ids.device)
    outside = (token_ids < 0) | (token_ids >= table.numel() - 1)
    return table[torch.where(outside, table.numel() - 1, token_ids)]


class SepLLM(Policy):
    """SepLLM, fundamental design (Sec. 3.1-3.2, Fig. 3 right): keep initial, separator and neighbouring KV.

    Args:
        init: initial tokens ``a`` (3 in the paper's training-free tables).
        neighbors: ``n``; the next query sees the ``n - 1`` newest cached entries plus itself.
        separators: token ids, or a tokenizer (then :func:`kvlab.sepllm.separator_ids`).
        positions: ``"original"`` (default: equals the prefill mask), ``"cache"`` or ``"insertion"``.
        full_layers: layers that keep every entry (the paper's "H/T" variants, Figs. 9-11: first and last
            layers with full attention); negative indices count from the end, e.g. ``(0, -1)``.

    Pseudocode (per layer, after each step; the next query sits at position ``seen``)::

        keep entry k  iff  pos[k] < init  or  seen - pos[k] < neighbors  or  is_separator(token[k])

    The cache grows with the separators seen (no bound): that is what :class:`SepLLMStreaming` fixes.
    """

    batch_rows = "one"

    def __init__(self, init: int = 3, neighbors: int = 256, *, separators=None, positions: str = "original",
                 full_layers=()):
        super().__init__(positions)
        self.init = check_int("init", init, 0)
        self.neighbors = check_int("neighbors", neighbors, 1)
        self._sep = SeparatorSet(separators)
        if not len(self._sep) and type(self).far is SepLLM.far:
            _warn_no_separators(type(self).__name__, "StreamingLLM(init, neighbors)")
        self.full_layers = tuple(check_int("full_layers entry", i) for i in full_layers)

    def check_model(self, num_layers: int) -> None:
        bad = [i for i in self.full_layers if not -num_layers <= i < num_layers]
        if bad:
            raise ValueError(f"full_layers {bad} are outside the model's {num_layers} layers: use indices in "
                             f"{-num_layers}..{num_layers - 1}")

    @property
    def separators(self) -> torch.Tensor:
        return self._sep.ids

    def check_vocab(self, vocab_size: int) -> None:
        self._sep.check_vocab(vocab_size)

    def far(self, view: LayerView) -> torch.Tensor:
        _single_row(view, type(self).__name__)
        return self._sep.flags(view.token_ids)

    def keep(self, view: LayerView) -> torch.Tensor | None:
        if view.layer_idx in {i % view.num_layers for i in self.full_layers}:
            return None
        pos = view.positions
        near = (pos < self.init) | (view.seen - pos < self.neighbors)
        return indices_from_mask(near | self.far(view))

    static_reason = None

    def _static_far(self, view) -> torch.Tensor:
        """``(rows, C)`` bool: the slots :meth:`far` keeps, for every layer and stream at once."""
        return _separator_lookup(self, view.token_ids)

    def static_keep(self, view) -> torch.Tensor:
        """:meth:`keep` on the slots of every row (layer and stream) at once: initial, neighbouring or far (separator)
        entries; the rows of ``full_layers`` keep everything. Rows of one batch may keep different counts here (the
        static cache holds a count per row), so the static engine runs SepLLM batched."""
        pos = view.positions
        keep = (pos < self.init) | (view.seen - pos < self.neighbors) | self._static_far(view)
        if self.full_layers:  # compared one layer at a time: no host-to-device copy (legal inside a CUDA graph capture)
            full = torch.zeros_like(view.layer, dtype=torch.bool)
            for layer in sorted({i % view.num_layers for i in self.full_layers}):
                full |= view.layer == layer
            keep = keep | full[:, None]
        return keep

    def __repr__(self) -> str:
        full = f", full_layers={self.full_layers}" if self.full_layers else ""
        return (f"{type(self).__name__}(init={self.init}, neighbors={self.neighbors}, "
                f"separators={self.separators.numel()}, positions={self.positions!r}{full})")


class FixLLM(SepLLM):
    """FixLLM (App. I, Table 17): SepLLM with one entry every ``interval`` positions instead of separators.

    Keeps ``pos < init``, ``seen - pos < neighbors`` and ``pos % interval == interval - 1``.
    ``interval=1`` keeps everything; an interval longer than the stream is StreamingLLM.
    """

    batch_rows = "equal"

    def __init__(self, init: int = 3, neighbors: int = 256, interval: int = 8, *, positions: str = "original"):
        super().__init__(init, neighbors, separators=(), positions=positions)
        self.interval = check_int("interval", interval, 1)

    def far(self, view: LayerView) -> torch.Tensor:
        return view.positions % self.interval == self.interval - 1

    def _static_far(self, view) -> torch.Tensor:
        return view.positions % self.interval == self.interval - 1

    def __repr__(self) -> str:
        return (f"FixLLM(init={self.init}, neighbors={self.neighbors}, interval={self.interval}, "
                f"positions={self.positions!r})")


class SepLLMStreaming(Policy):
    """SepLLM's tailored streaming design (Sec. 3.3, Fig. 4): four blocks under a total capacity ``cache``.

    Args:
        init: ``a``, initial cache (0 for the "no initial tokens" ablation of Table 8).
        sep: ``s``, separator cache (FIFO).
        local: ``w``, local window cache.
        cache: ``c``, total capacity; ``init + sep + local < cache`` is required.
        separators: token ids or a tokenizer.
        positions: ``"cache"`` (default, the paper's positional shift), ``"insertion"`` (Table 8's "no shift" as the
            official code runs it: new token at the cache length, cached keys never re-rotated) or
            ``"original"`` (stream positions).

    A layer's entries are ordered by position, so the blocks are ranges: ``[0, a)`` initial, then the
    separator block (entries older than the past window), then the past window, then the newest ``w``
    (local window). ``view.state["past_start"]`` remembers where the past window begins::

        if held > cache:                                    # compression
            seps = separator block + separators of the past window; keep the newest `sep` of them
            keep initial + seps + local window;  past_start = first position of the local window
    """

    batch_rows = "one"

    def __init__(self, init: int = 4, sep: int = 64, local: int = 256, cache: int = 800, *, separators=None,
                 positions: str = "cache"):
        super().__init__(positions)
        check_sizes(init, sep, local, cache)
        self.init, self.sep, self.local, self.cache = init, sep, local, cache
        self._sep = SeparatorSet(separators)
        if not len(self._sep):
            _warn_no_separators(type(self).__name__, "StreamingLLM(init, cache - init)")
        elif sep == 0:
            # Kept legal on purpose, as separators=[] is: a window-only ablation row
            warnings.warn(f"{type(self).__name__}(sep=0) keeps no separator: a sink + window cache (StreamingLLM) "
                          f"reported under {type(self).__name__}'s name. Pass sep >= 1 for SepLLM, or "
                          "kvlab.policies.StreamingLLM(init, cache - init) for the window cache", UserWarning,
                          stacklevel=2)

    @classmethod
    def for_budget(cls, cache: int, *, tokenizer=None) -> "SepLLMStreaming":
        """kvlab's split of a total capacity ``c`` into the four blocks: ``a = 4`` initial tokens, ``s = c // 4``
        separators, ``w = c // 2`` local window; the remaining quarter is the past window, where separators wait
        for the next compression. (The paper's own settings, such as ``(4, 32, 224, 324)`` or ``(4, 64, 256,
        800)``, are passed to the constructor as they are.) ``tokenizer``: the separators' source."""
        if tokenizer is None:
            raise ValueError("SepLLMStreaming.for_budget needs tokenizer= (its separator ids)")
        return cls(init=4, sep=cache // 4, local=cache // 2, cache=cache, separators=tokenizer)

    @property
    def budget(self) -> int:
        return self.cache

    def check_vocab(self, vocab_size: int) -> None:
        self._sep.check_vocab(vocab_size)

    def keep(self, view: LayerView) -> torch.Tensor | None:
        n = view.size
        if n <= self.cache:
            return None
        _single_row(view, "SepLLMStreaming")
        pos = view.positions[0]
        past_start = view.state.get("past_start", self.init)
        initial = pos < self.init
        local = torch.zeros_like(initial)
        local[max(n - self.local, 0):] = True
        local &= ~initial
        candidates = (pos >= self.init) & ~local & ((pos < past_start) | self._sep.flags(view.token_ids[0]))
        seps = candidates.nonzero().squeeze(1)
        seps = seps[max(seps.numel() - self.sep, 0):] if self.sep > 0 else seps[:0]
        keep = initial | local
        keep[seps] = True
        first_local = local.nonzero()
        view.state["past_start"] = int(pos[first_local[0, 0]]) if first_local.numel() else view.seen
        return keep.nonzero().squeeze(1)

    static_reason = None

    def static_state(self, rows: int, device) -> dict[str, torch.Tensor]:
        return {"past_start": torch.full((rows,), self.init, dtype=torch.long, device=device)}

    def _separator_lookup(self, token_ids: torch.Tensor) -> torch.Tensor:
        return _separator_lookup(self, token_ids)

    def static_keep(self, view) -> torch.Tensor:
        """:meth:`keep` on the slots of every row (layer and stream) at once: the blocks are masks, "the newest ``sep``
        separator candidates" counts candidates from the newest slot down (a reversed cumsum), and
        ``past_start`` is a per-row tensor updated only in rows that compress."""
        n, slots, pos, live = view.length[:, None], view.slots, view.positions, view.live
        past_start = view.state["past_start"]
        compress = n > self.cache  # (B, 1)
        initial = pos < self.init
        local = (slots >= n - self.local) & ~initial & live
        candidates = live & ~initial & ~local & ((pos < past_start[:, None]) | self._separator_lookup(view.token_ids))
        newer = candidates.flip(1).cumsum(1).flip(1)  # candidates at this slot or newer
        keep = initial | local | (candidates & (newer <= self.sep))
        first_local = pos.gather(1, local.long().argmax(dim=1, keepdim=True))[:, 0]
        start = torch.where(local.any(dim=1), first_local, view.seen)
        past_start.copy_(torch.where(compress[:, 0], start, past_start))
        return keep | ~compress

    def __repr__(self) -> str:
        return (f"SepLLMStreaming(init={self.init}, sep={self.sep}, local={self.local}, cache={self.cache}, "
                f"separators={len(self._sep)}, positions={self.positions!r})")
