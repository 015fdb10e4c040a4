"""LaCache (Shi et al., ICML 2025, https://arxiv.org/abs/2507.14204): a ladder-shaped KV cache across
layers with iterative compaction.

Public names: :class:`LaCache` (the policy, also ``kvlab.policies.LaCache``), :func:`ladder_geometry`,
:func:`ladder_pattern` (Fig. 2), :func:`compaction_snapshots` (Fig. 4); the theory helpers live in
:mod:`kvlab.lacache.coverage` and the specification in :mod:`kvlab.lacache.reference`.

Names are resolved lazily so that ``kvlab.policies`` can import the reference without a cycle.
"""

from __future__ import annotations

import importlib

__all__ = ["LaCache", "LAYOUTS", "ladder_geometry", "ladder_pattern", "compaction_snapshots", "chunked_perplexity",
           "ppl_at_lengths", "decode_throughput", "coverage",
           "reference"]


def __getattr__(name: str):
    if name in ("coverage", "reference", "api"):
        return importlib.import_module(f"kvlab.lacache.{name}")
    if name in __all__:
        return getattr(importlib.import_module("kvlab.lacache.api"), name)
    raise AttributeError(f"module 'kvlab.lacache' has no attribute {name!r}")
