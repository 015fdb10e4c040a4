"""LaCache (Shi et al., ICML 2025, https://arxiv.org/abs/2507.14204): a ladder-shaped KV cache across
layers with iterative compaction.

Public names: :class:`LaCache` (the policy, also ``kvlab.policies.LaCache``), :func:`ladder_geometry`,
:func:`ladder_pattern` (Fig. 2), :func:`compaction_snapshots` (Fig. 4); the theory helpers live in
:mod:`kvlab.lacache.coverage` and the specification in :mod:`kvlab.lacache.reference`. The perplexity and
throughput measurements of the paper's tables use :mod:`kvlab.eval` (``chunked_perplexity``,
``ppl_at_lengths``, ``decode_throughput``).
"""

from kvlab.lacache import coverage, reference
from kvlab.lacache.api import LAYOUTS, compaction_snapshots, ladder_geometry, ladder_pattern
from kvlab.lacache.policy import LaCache

__all__ = ["LaCache", "LAYOUTS", "ladder_geometry", "ladder_pattern", "compaction_snapshots", "coverage",
           "reference"]
