"""Lazy package namespaces (PEP 562): a package names its submodules and public names, and each loads on first use.

Every paper folder's ``__init__`` is one call of :func:`attach`, so ``import kvlab.dhsa.reference`` loads the
reference and the core, never the package's other modules (the Triton paths, the predictor's training, ...).
"""
from __future__ import annotations

import importlib

__all__ = ["attach"]


def attach(package: str, submodules: list[str], names: dict[str, list[str]]):
    """``(__getattr__, __dir__, __all__)`` for ``package``.

    ``submodules``: modules reachable as attributes (``kvlab.dhsa.theory``); ``names``: for each submodule, the
    public names it gives the package (``{"api": ["dhsa_attention", ...]}``).
    """
    where = {name: module for module, listed in names.items() for name in listed}
    if len(where) != sum(len(v) for v in names.values()):
        raise ValueError(f"{package}: a public name is listed under two submodules")
    public = sorted(set(where) | set(submodules))

    def __getattr__(name: str):
        if name in submodules:
            return importlib.import_module(f"{package}.{name}")
        if name in where:
            return getattr(importlib.import_module(f"{package}.{where[name]}"), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return public

    return __getattr__, __dir__, public
