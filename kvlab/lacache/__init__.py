"""LaCache (Shi et al., ICML 2025, https://arxiv.org/abs/2507.14204): a ladder-shaped KV cache across
layers with iterative compaction.

Public names: :class:`LaCache` (the policy, also ``kvlab.policies.LaCache``), :func:`ladder_geometry`,
:func:`ladder_pattern` (Fig. 2), :func:`compaction_snapshots` (Fig. 4); the theory helpers live in
:mod:`kvlab.lacache.coverage` and the specification in :mod:`kvlab.lacache.reference`. The perplexity and
throughput measurements of the paper's tables use :mod:`kvlab.eval` (``chunked_perplexity``,
``ppl_at_lengths``, ``decode_throughput``).
"""
from kvlab.core.lazy import attach

__getattr__, __dir__, __all__ = attach(
    __name__,
    submodules=["api", "coverage", "policy", "reference"],
    names={
        "api": ["LAYOUTS", "compaction_snapshots", "ladder_geometry", "ladder_pattern"],
        "policy": ["LaCache"],
    },
)
