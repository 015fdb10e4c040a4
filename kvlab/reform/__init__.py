"""REFORM (Song et al., 2025, https://arxiv.org/abs/2506.01215): compress, gather, recompute — inputs far
beyond the context window.

Public names: :func:`reform_generate` (text out), :func:`reform_answer_nll` (teacher-forced NLL of a
reference answer, the small-model proxy), :func:`reform_gather` (which tokens are recomputed, for
pictures), :func:`load_heads` / :func:`parse_heads` (embedding heads); head choice by Mean Normalized Rank
lives in :mod:`kvlab.reform.heads` (``python -m kvlab.reform.heads --model smollm2-135m --out heads.json``),
the synthetic tasks in :mod:`kvlab.reform.tasks`, the baselines at equal budget in
:mod:`kvlab.reform.compare`, and the specification (Algorithm 1) in :mod:`kvlab.reform.reference`.

Names are resolved lazily, so importing :mod:`kvlab.reform` loads no model code.
"""

from __future__ import annotations

import importlib

__all__ = ["reform_generate", "reform_answer_nll", "reform_gather", "load_heads", "parse_heads", "ReformOutput",
           "Head", "reference", "api", "heads", "tasks", "compare"]

_FROM_API = {"reform_generate", "reform_answer_nll", "reform_gather", "load_heads", "parse_heads", "ReformOutput"}


def __getattr__(name: str):
    if name in ("reference", "api", "heads", "tasks", "compare"):
        return importlib.import_module(f"kvlab.reform.{name}")
    if name in _FROM_API:
        return getattr(importlib.import_module("kvlab.reform.api"), name)
    if name == "Head":
        return importlib.import_module("kvlab.reform.reference").Head
    raise AttributeError(f"module 'kvlab.reform' has no attribute {name!r}")
