"""SepLLM (https://arxiv.org/abs/2412.12094): initial, separator and neighbouring tokens.

Public names: :func:`sep_attention` (prefill/training attention under the SepLLM mask, backends
``"torch" | "flex" | "triton"``), :func:`sepllm_mask` (the boolean mask itself) and
:func:`kept_fraction` (share of causal entries the mask keeps).
"""
from .api import BACKENDS, sep_attention
from .reference import kept_fraction, sepllm_mask

__all__ = ["sep_attention", "sepllm_mask", "kept_fraction", "BACKENDS"]
