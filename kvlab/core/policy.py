"""The KV-policy interface: after each forward step, which cached entries each layer keeps.

A policy sees a :class:`~kvlab.core.LayerView` (token ids, original positions, attention scores when it
sets ``needs_scores``) and returns the indices to keep, oldest first, or ``None`` to keep everything. The
cache then physically drops the rest (:class:`~kvlab.core.KVCache`). Policies may differ per layer (LaCache)
and may keep per-layer scratch state in ``view.state`` (SepLLM's four blocks).
"""

from __future__ import annotations

import torch

from kvlab.core.checks import check_choice
from kvlab.core.views import LayerView, StaticView

__all__ = ["Policy", "POSITION_MODES", "indices_from_mask"]

POSITION_MODES = ("cache", "original", "insertion")


class Policy:
    """Base class. Subclasses set ``needs_scores`` / ``positions`` and implement :meth:`keep`.

    positions: ``"cache"`` — the model sees positions within the cache (kept keys re-rotated, as
    StreamingLLM does); ``"original"`` — every token keeps its position in the stream; ``"insertion"`` — a
    new token is rotated at the current cache length and cached keys keep their first rotation (what the
    official SepLLM/StreamingLLM code does on transformers 4.33 without ``position_ids``: SepLLM Table 8's
    "no shift").

    Batch: ``batch_rows`` says what a policy supports: ``"equal"`` (every row keeps the same number of
    entries: count-based policies), ``"one"`` (the kept set depends on the tokens, so rows would differ:
    batch size 1 only).
    """

    needs_scores: bool = False
    batch_rows: str = "equal"

    @classmethod
    def for_budget(cls, cache: int, *, tokenizer=None) -> "Policy":
        """The policy holding at most ``cache`` entries per layer, split into its parts by the method's own rule
        (each method defines it; harnesses call only this). ``tokenizer``: for methods that read token ids
        (SepLLM's separators); the others ignore it."""
        raise TypeError(f"{cls.__name__} has no budget rule (it is not a cache-budget method)")
    #: Why the policy has no :meth:`static_keep` rule (the fast decode engine then falls back to the
    #: hooks engine and says so); None once a subclass implements it.
    static_reason: str | None = "it has no static keep rule (Policy.static_keep) yet"

    def __init__(self, positions: str = "original"):
        self.positions = check_choice("positions", positions, POSITION_MODES)

    def keep(self, view: "LayerView") -> torch.Tensor | None:
        """Indices ``(m,)`` or ``(batch, m)`` of the entries of ``view`` to keep, ascending; None keeps all."""
        raise NotImplementedError

    def static_keep(self, view: "StaticView") -> torch.Tensor | None:
        """The same decision as :meth:`keep`, as a ``(rows, C)`` bool mask over the fixed slots of a
        :class:`~kvlab.core.StaticKVCache` (None keeps every live slot), for every layer and stream at once
        (one row per pair; ``view.layer`` says each row's layer), computed with device tensors only: no
        ``.item()``, no shape that depends on the data, so a decode step can be captured in a CUDA graph.
        Called after every one-token step (a row then holds at most ``budget + 1`` entries). Scratch state
        lives in ``view.state`` (``(rows, ...)`` tensors from :meth:`static_state`, updated in place).
        """
        raise NotImplementedError(f"{type(self).__name__}: {self.static_reason}")

    def static_state(self, rows: int, device) -> dict[str, torch.Tensor]:
        """Initial scratch tensors for :meth:`static_keep`, one entry per row (a StaticKVCache resets to them)."""
        return {}

    def check_model(self, num_layers: int) -> None:
        """Raise if the policy cannot run on a model with ``num_layers`` layers (LaCache's span, ...)."""

    def check_vocab(self, vocab_size: int) -> None:
        """Raise if the policy's token ids cannot occur in a vocabulary of ``vocab_size`` (SepLLM's separators)."""

    @property
    def budget(self) -> int | None:
        """Most entries a layer holds after a step (a maximum, per layer), or None when unbounded."""
        return None

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({fields})"


def indices_from_mask(keep: torch.Tensor) -> torch.Tensor | None:
    """``(batch, n)`` bool -> ascending indices (``(m,)`` for one row, ``(batch, m)`` otherwise), or None
    when every entry is kept. Rows must keep equally many entries."""
    if bool(keep.all()):
        return None
    if keep.shape[0] == 1:
        return keep[0].nonzero().squeeze(1)
    counts = keep.sum(dim=1)
    if not bool((counts == counts[0]).all()):
        raise NotImplementedError("the rows of the batch would keep different numbers of entries; "
                                  "kvlab's cache needs equal counts per row: run batch size 1")
    return keep.nonzero()[:, 1].view(keep.shape[0], -1)
