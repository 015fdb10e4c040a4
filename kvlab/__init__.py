"""kvlab: learn and experiment with how language models keep, drop and compress their KV cache.

The names a user meets::

    model, tokenizer = kvlab.load_model()               # SmolLM2-135M by default (kvlab.models)
    cache = kvlab.KVCache(model, kvlab.policies.StreamingLLM(sink=4, window=252))
    kvlab.eval.streaming_perplexity(model, tokenizer, text, policy)
    kvlab.datasets.load_text("wikitext")
    kvlab.viz.*                                          # pictures

Submodules are imported lazily so that ``import kvlab`` stays light.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"
__all__ = ["KVCache", "load_model", "assets", "datasets", "eval", "integration", "policies", "viz", "sepllm"]

_SUBMODULES = {"assets", "datasets", "eval", "integration", "policies", "viz", "sepllm", "cache", "models",
               "decode", "bench"}


def __getattr__(name: str):
    if name == "KVCache":
        from kvlab.cache import KVCache

        return KVCache
    if name == "load_model":
        from kvlab.models import load_model

        return load_model
    if name in _SUBMODULES:
        return importlib.import_module(f"kvlab.{name}")
    raise AttributeError(f"module 'kvlab' has no attribute {name!r}")
