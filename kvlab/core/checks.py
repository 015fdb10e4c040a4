"""Argument checks shared by every method: one message shape, "NAME must be CONSTRAINT, got VALUE".

Every public entry point of kvlab validates its arguments with these before doing any work, so a bad
value fails at once with the argument's name, the rule it broke and what it was, instead of deep inside
torch or transformers (or, worse, silently: ``int(2.7) == 2``).
"""

from __future__ import annotations

import math
from typing import Any, Iterable

import torch

__all__ = ["check_int", "check_float", "check_choice", "check_tensor", "check_token_ids", "check_parameters"]


def check_int(name: str, value: Any, minimum: int | None = None, maximum: int | None = None) -> int:
    """``value`` as an int in ``[minimum, maximum]``; bools and floats (even 2.0) are refused."""
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_floating_point():
            value = int(value)
        else:
            raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {value}")
    return int(value)


def check_float(name: str, value: Any, low: float | None = None, high: float | None = None, *,
                low_open: bool = False, high_open: bool = False) -> float:
    """``value`` as a finite float in the interval given (closed by default; ``*_open`` excludes a bound)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    if low is not None and (value <= low if low_open else value < low):
        raise ValueError(f"{name} must be {'>' if low_open else '>='} {low}, got {value}")
    if high is not None and (value >= high if high_open else value > high):
        raise ValueError(f"{name} must be {'<' if high_open else '<='} {high}, got {value}")
    return value


def check_choice(name: str, value: Any, choices: Iterable[Any]) -> Any:
    choices = tuple(choices)
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")
    return value


def check_tensor(name: str, value: Any, dims: int | tuple[int, ...] | None = None, *,
                 dtype: torch.dtype | tuple[torch.dtype, ...] | None = None, shape_doc: str = "") -> torch.Tensor:
    """A tensor with ``dims`` dimensions and one of the dtypes given."""
    doc = f" {shape_doc}" if shape_doc else ""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor{doc}, got {type(value).__name__}")
    if dims is not None:
        allowed = (dims,) if isinstance(dims, int) else dims
        if value.dim() not in allowed:
            raise ValueError(f"{name} must have {' or '.join(map(str, allowed))} dimensions{doc}, "
                             f"got shape {tuple(value.shape)}")
    if dtype is not None:
        allowed_dt = (dtype,) if isinstance(dtype, torch.dtype) else dtype
        if value.dtype not in allowed_dt:
            raise ValueError(f"{name} must have dtype {' or '.join(map(str, allowed_dt))}, got {value.dtype}")
    return value


def check_token_ids(name: str, ids: Any, vocab_size: int | None = None) -> torch.Tensor:
    """Token ids: an integer tensor of shape ``(seq,)`` or ``(batch, seq)``, each in ``[0, vocab_size)``."""
    if not isinstance(ids, torch.Tensor):
        raise TypeError(f"{name} must be a str or a tensor of token ids, got {type(ids).__name__}")
    if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise ValueError(f"{name} must hold integer token ids, got dtype {ids.dtype}; "
                         "pass tokenizer(text).input_ids or a long tensor")
    if ids.dim() not in (1, 2):
        raise ValueError(f"{name} must have shape (seq,) or (batch, seq), got {tuple(ids.shape)}; "
                         "squeeze extra dimensions (e.g. ids.reshape(1, -1))")
    if ids.numel():
        low, high = int(ids.min()), int(ids.max())
        if low < 0 or (vocab_size is not None and high >= vocab_size):
            raise ValueError(f"{name} must be token ids in [0, {vocab_size}) (the model's vocabulary), "
                             f"got values in [{low}, {high}]")
    return ids.long()


def check_parameters(namespace: dict) -> None:
    """Check a notebook's parameters against the types its parameters cell declares.

    The parameters cell annotates each value (``max_tokens: int = 4096``), which records the type in the
    notebook's ``__annotations__``; papermill's injected cell then assigns plain values (``-p max_tokens abc``
    gives the string ``'abc'``). Called right after the parameters, this turns a wrong type into one clear
    error at once instead of a failure minutes later: an int is accepted where a float is declared, and
    ``None`` where the default is None (``int | None``).
    """
    import types
    import typing

    annotations = namespace.get("__annotations__", {})
    defaults = _declared_defaults(namespace.get("In"), annotations)
    bad = []
    signs = []
    for name, declared in annotations.items():
        if name not in namespace:
            continue
        value = namespace[name]
        if isinstance(declared, str):  # postponed annotations
            try:
                declared = eval(declared, {"typing": typing, "list": list, "dict": dict, "tuple": tuple})
            except Exception:  # noqa: BLE001 - an annotation we cannot read is not checked
                continue
        origin = typing.get_origin(declared)
        allowed = typing.get_args(declared) if origin in (typing.Union, types.UnionType) else (declared,)
        allowed = tuple(typing.get_origin(a) or a for a in allowed)
        allowed = tuple(type(None) if a is None else a for a in allowed)
        if float in allowed:
            allowed = allowed + (int,)
        if not all(isinstance(a, type) for a in allowed):
            continue
        if isinstance(value, bool) and bool not in allowed:
            bad.append((name, declared, value))
        elif not isinstance(value, allowed):
            bad.append((name, declared, value))
        elif _negative_against_default(value, defaults.get(name)):
            signs.append(f"  {name} must be >= 0 (its default is {defaults[name]!r}: a count, size, rate or "
                         f"fraction), got {value!r}")
    if signs and not bad:
        raise ValueError("notebook parameters out of range (checked before any work):\n" + "\n".join(signs))
    if bad:
        lines = "\n".join(f"  {name}: expected {getattr(t, '__name__', t)}, got {type(v).__name__} {v!r}"
                          for name, t, v in bad)
        raise TypeError(f"notebook parameters of the wrong type (papermill: -p NAME VALUE parses numbers, "
                        f"true/false and None; quote nothing else):\n{lines}")


def _negative_against_default(value: Any, default: Any) -> bool:
    numbers = (int, float)
    return (isinstance(value, numbers) and not isinstance(value, bool) and isinstance(default, numbers)
            and not isinstance(default, bool) and default >= 0 and value < 0)


def _declared_defaults(history: Any, annotations: dict) -> dict[str, Any]:
    """The defaults the notebook's parameters cell declares (``max_tokens: int = 4096``), read from IPython's
    input history ``In`` (papermill's injected cell assigns without annotations, so it is not taken). A
    parameter whose declared default is a non-negative number must not be negative: ``-p max_tokens -5`` then
    fails in the check cell instead of many cells later."""
    import ast

    found: dict[str, Any] = {}
    if not isinstance(history, (list, tuple)):
        return found
    for source in history:
        if not isinstance(source, str) or ":" not in source:
            continue
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        for node in tree.body:
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None
                    and node.target.id in annotations and node.target.id not in found):
                try:
                    found[node.target.id] = ast.literal_eval(node.value)
                except (ValueError, TypeError, SyntaxError, RecursionError):
                    continue
    return found
