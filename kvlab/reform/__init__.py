"""REFORM (Song et al., 2025, https://arxiv.org/abs/2506.01215): compress, gather, recompute — inputs far
beyond the context window.

Public names: :func:`reform_generate` (text out), :func:`reform_answer_nll` (teacher-forced NLL of a
reference answer, the small-model proxy), :func:`reform_gather` (which tokens are recomputed, for
pictures), :func:`load_heads` / :func:`parse_heads` (embedding heads); head choice by Mean Normalized Rank
lives in :mod:`kvlab.reform.heads` (``python -m kvlab.reform.heads --model smollm2-135m --out heads.json``),
and the specification (Algorithm 1) in :mod:`kvlab.reform.reference`. The synthetic tasks are
:mod:`kvlab.eval.tasks`; the baselines at equal budget and the experiments live in :mod:`kvlab.experiments`.

Names are resolved lazily, so importing :mod:`kvlab.reform` loads no model code.
"""
from kvlab.core.lazy import attach

__getattr__, __dir__, __all__ = attach(
    __name__,
    submodules=["api", "heads", "reference", "triton"],
    names={
        "api": ["reform_generate", "reform_answer_nll", "reform_gather", "load_heads", "parse_heads", "ReformOutput"],
        "reference": ["Head"],
    },
)
