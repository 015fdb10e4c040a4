"""``python -m kvlab bench METHOD WHAT [options]``: each method's GPU benchmarks, one module per method here.

``METHOD`` is a module of this package (``sepllm``, ``kernels``, ``dhsa``, ...); its ``main(argv)`` takes ``WHAT``
and the options (``python -m kvlab bench METHOD --help``). The names of the first release
(``bench ops|prefill|train|tune|decode``) still work and say where they moved.
"""
from __future__ import annotations

import importlib
import pkgutil
import sys

__all__ = ["main", "methods"]

_MOVED = {"ops": "sepllm", "prefill": "sepllm", "train": "sepllm", "tune": "sepllm", "decode": "kernels"}


def methods() -> list[str]:
    """The methods that have benchmarks (the modules of this package)."""
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    known = methods()
    if not argv or argv[0] in ("-h", "--help"):
        print(f"usage: python -m kvlab bench METHOD WHAT [options]\n\nmethods: {', '.join(known)}\n"
              "(python -m kvlab bench METHOD --help lists what each measures)")
        return 0
    method, rest = argv[0], argv[1:]
    if method in _MOVED:
        print(f"kvlab bench: '{method}' is now 'bench {_MOVED[method]} {method}'", file=sys.stderr)
        method, rest = _MOVED[method], argv
    if method not in known:
        print(f"kvlab bench: unknown method {method!r}; choose one of {', '.join(known)}", file=sys.stderr)
        return 2
    module = importlib.import_module(f"{__name__}.{method}")
    return module.main(rest) or 0


if __name__ == "__main__":
    sys.exit(main())
