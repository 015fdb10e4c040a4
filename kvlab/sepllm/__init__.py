"""SepLLM (https://arxiv.org/abs/2412.12094): initial, separator and neighbouring tokens.

Public names: :func:`sep_attention` (prefill/training attention under the SepLLM mask, backends
``"torch" | "flex" | "triton"``), :func:`sepllm_mask` (the boolean mask itself), :func:`kept_fraction`
(share of causal entries the mask keeps); separators of a tokenizer (:func:`separator_ids`); prefill
patterns for models (:class:`SepLLMPattern` and the baselines); the four-block streaming cache and Eq. 3-4
(:mod:`.streaming`); reachability (:mod:`.theory`), training with masks (:mod:`.training`); the
generation-stage policies :class:`SepLLM`, :class:`SepLLMStreaming` and :class:`FixLLM` (:mod:`.policy`, also
in ``kvlab.policies``); experiments and benchmarks live in :mod:`kvlab.experiments` (``python -m kvlab bench sepllm ops|prefill|train|tune``).
"""
from kvlab.core.lazy import attach

__getattr__, __dir__, __all__ = attach(
    __name__,
    submodules=["api", "flex", "pattern", "policy", "reference", "separators", "streaming", "theory", "training",
                "triton"],
    names={
        "api": ["BACKENDS", "sep_attention"],
        "pattern": ["FixLLMPattern", "HeadwisePattern", "SepLLMPattern", "StreamingPattern", "kv_ratio",
                    "match_neighbors", "pattern_nll"],
        "policy": ["FixLLM", "SepLLM", "SepLLMStreaming"],
        "reference": ["kept_fraction", "sepllm_mask"],
        "separators": ["SEPARATOR_SETS", "SEPARATORS", "SeparatorSet", "describe_separators", "is_separator",
                       "separator_ids"],
        "streaming": ["FourBlockCache", "StreamTrace", "eq3_limit", "eq4_limit", "simulate"],
    },
)
