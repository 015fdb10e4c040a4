"""kvlab: learn and experiment with how language models keep, drop and compress their KV cache.

The names a user meets::

    model, tokenizer = kvlab.load_model()               # SmolLM2-135M by default (kvlab.models)
    cache = kvlab.KVCache(model, kvlab.policies.StreamingLLM(sink=4, window=252))
    kvlab.eval.streaming_perplexity(model, tokenizer, text, policy)
    kvlab.datasets.load_text("wikitext")
    kvlab.viz.*                                          # pictures

Layout: :mod:`kvlab.core` (the step protocol: cache, policies, patterns, routers), :mod:`kvlab.baselines`,
one folder per paper holding only its mechanism (:mod:`kvlab.sepllm`, :mod:`kvlab.lacache`, ...),
:mod:`kvlab.kernels` (shared kernels), :mod:`kvlab.eval` (method-agnostic evaluation and tasks),
:mod:`kvlab.policies` (index of every policy); :mod:`kvlab.experiments` (each paper's experiments, benchmarks,
the claims ledger, the leaderboard, sweeps) and :mod:`kvlab.classroom` (lessons and grading) import the
mechanism, never the reverse.
Submodules are imported lazily so that ``import kvlab`` stays light.
"""

from __future__ import annotations

import importlib
import pkgutil

__version__ = "0.1.0"
__all__ = ["KVCache", "load_model", "check_parameters", "results_dir", "analysis", "assets", "baselines", "classroom", "core",
           "datasets", "dhsa", "eval", "experiments", "kernels", "lacache", "memory", "models", "orthorank",
           "policies", "reform", "sepllm", "testing", "viz"]


def results_dir(*parts: str):
    """The committed results folder ``benchmarks/results`` (joined with ``parts``), for notebooks that print the
    full-size numbers beside their own: ``$KVLAB_RESULTS`` if set, else the first ``benchmarks/results`` found from
    the current directory upward (a notebook opened from the repository's ``notebooks/``, or its copy under
    ``build/`` that CI runs). The results live in the repository, not in the installed package."""
    import os
    from pathlib import Path

    env = os.environ.get("KVLAB_RESULTS")
    here = Path.cwd().resolve()
    found = Path(env) if env else next((d / "benchmarks" / "results" for d in (here, *here.parents)
                                        if (d / "benchmarks" / "results").is_dir()), None)
    if found is None or not found.is_dir():
        raise FileNotFoundError(f"no benchmarks/results folder above {here}: open the notebook from the kvlab "
                                "repository's notebooks/ folder, or set KVLAB_RESULTS to that folder")
    return found.joinpath(*parts)


def __getattr__(name: str):
    if name == "KVCache":
        from kvlab.core import KVCache

        return KVCache
    if name == "load_model":
        from kvlab.models import load_model

        return load_model
    if name == "check_parameters":
        from kvlab.core.checks import check_parameters

        return check_parameters
    if name in {m.name for m in pkgutil.iter_modules(__path__)} and not name.startswith("_"):
        return importlib.import_module(f"kvlab.{name}")
    raise AttributeError(f"module 'kvlab' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__) | {m.name for m in pkgutil.iter_modules(__path__)})
