"""OrthoRank (Shin, Oh and Oh, ICML 2025, https://arxiv.org/abs/2507.03865): in chosen layers, only the tokens
most orthogonal to the attention sink are computed; the others pass by the residual but still give K and V.

Public names come from :mod:`kvlab.orthorank.api` (:func:`orthorank`, :func:`skip_layers`,
:func:`sink_profile`, :func:`search_layers`, :func:`perplexity`, ...); the specification is
:mod:`kvlab.orthorank.reference`, the routers :mod:`kvlab.orthorank.router`, layer choice and the baselines
(SLEB, Shortened LLaMA) :mod:`kvlab.orthorank.layers`, the GPU benchmark :mod:`kvlab.orthorank.bench`.
"""

from __future__ import annotations

import importlib

from kvlab.orthorank.api import __all__ as _api_all

__all__ = list(_api_all) + ["api", "reference", "router", "layers", "bench"]


def __getattr__(name: str):
    if name in ("api", "reference", "router", "layers", "bench"):
        return importlib.import_module(f"kvlab.orthorank.{name}")
    if name in __all__:
        return getattr(importlib.import_module("kvlab.orthorank.api"), name)
    raise AttributeError(f"module 'kvlab.orthorank' has no attribute {name!r}")
