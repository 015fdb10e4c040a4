"""OrthoRank (Shin, Oh and Oh, ICML 2025, https://arxiv.org/abs/2507.03865): in chosen layers, only the tokens
most orthogonal to the attention sink are computed; the others pass by the residual but still give K and V.

Public names come from :mod:`kvlab.orthorank.api` (:func:`orthorank`, :func:`skip_layers`,
:func:`sink_profile`, :func:`search_layers`, :func:`perplexity`, ...); the specification is
:mod:`kvlab.orthorank.reference`, the routers :mod:`kvlab.orthorank.router`, layer choice and the baselines
(SLEB, Shortened LLaMA) :mod:`kvlab.orthorank.layers`; the experiments and the GPU benchmark live in
:mod:`kvlab.experiments`.
"""
from kvlab.core.lazy import attach

__getattr__, __dir__, __all__ = attach(
    __name__,
    submodules=["api", "layers", "reference", "router", "triton"],
    names={
        "api": ["orthorank", "skip_layers", "OrthoRankRouter", "SkipLayer", "CRITERIA", "DECODE_MODES", "KV_MODES",
                "SinkProfile", "sink_profile", "Plan", "LayerSearch", "use_plan", "search_layers",
                "taylor_importance", "text_windows", "perplexity", "layers_for_sparsity", "nominal_sparsity",
                "flop_sparsity", "after_sink"],
    },
)
