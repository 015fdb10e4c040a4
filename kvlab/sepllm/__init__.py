"""SepLLM (https://arxiv.org/abs/2412.12094): initial, separator and neighbouring tokens.

Public names: :func:`sep_attention` (prefill/training attention under the SepLLM mask, backends
``"torch" | "flex" | "triton"``), :func:`sepllm_mask` (the boolean mask itself), :func:`kept_fraction`
(share of causal entries the mask keeps); separators of a tokenizer (:func:`separator_ids`); prefill
patterns for models (:class:`SepLLMPattern` and the baselines); the four-block streaming cache and Eq. 3-4
(:mod:`.streaming`); reachability (:mod:`.theory`), training with masks (:mod:`.training`) and MMLU k-shot
under a mask (:mod:`.mmlu`); the
generation-stage policies :class:`SepLLM`, :class:`SepLLMStreaming` and :class:`FixLLM` (:mod:`.policy`, also
in ``kvlab.policies``); GPU benchmarks in :mod:`.bench` (``python -m kvlab bench sepllm ops|prefill|train|tune``).
"""
from . import mmlu, theory, training
from .api import BACKENDS, sep_attention
from .pattern import (FixLLMPattern, HeadwisePattern, SepLLMPattern, StreamingPattern, kv_ratio,
                       match_neighbors, pattern_nll)
from .policy import FixLLM, SepLLM, SepLLMStreaming
from .reference import kept_fraction, sepllm_mask
from .separators import (SEPARATOR_SETS, SEPARATORS, SeparatorSet, describe_separators, is_separator,
                         separator_ids)
from .streaming import FourBlockCache, StreamTrace, eq3_limit, eq4_limit, simulate

__all__ = [
    "BACKENDS", "sep_attention", "sepllm_mask", "kept_fraction",
    "SepLLM", "SepLLMStreaming", "FixLLM",
    "SEPARATORS", "SEPARATOR_SETS", "SeparatorSet", "describe_separators", "is_separator", "separator_ids",
    "SepLLMPattern", "StreamingPattern", "FixLLMPattern", "HeadwisePattern", "kv_ratio", "match_neighbors",
    "pattern_nll",
    "FourBlockCache", "StreamTrace", "eq3_limit", "eq4_limit", "simulate",
    "mmlu", "theory", "training",
]
