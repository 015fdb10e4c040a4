"""Argument checks shared by every method: one message shape, "NAME must be CONSTRAINT, got VALUE".

Every public entry point of kvlab validates its arguments with these before doing any work, so a bad
value fails at once with the argument's name, the rule it broke and what it was, instead of deep inside
torch or transformers (or, worse, silently: ``int(2.7) == 2``).
"""

from __future__ import annotations

import math
from typing import Any, Iterable

import torch

__all__ = ["check_int", "check_float", "check_choice", "check_tensor", "check_token_ids", "check_parameters",
           "check_notebook_parameters", "declared_parameters", "parameter_problems", "blank_parameters"]


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
    gives the string ``'abc'``). Called right after the parameters, this turns a wrong value into one clear
    error at once instead of a failure minutes later (the same rules as :func:`check_notebook_parameters`, which
    the command-line entry points apply before they start a kernel):

    - the type, and the element types of a list, dict or tuple (``[1, 2]`` is not a ``list[str]``); an int is
      accepted where a float is declared, and ``None`` where the annotation allows it (``int | None``);
    - finiteness: NaN and infinities are refused in every float;
    - range: a number whose declared default is >= 0 (a count, size, rate or fraction) must not be negative, and
      a string whose declared default is not blank (a prompt, a name, a path) must not be blank unless its comment
      says what the empty string means (``other: str = "gemma3-270m"  # another tokenizer ("" for none)``);
    - names: a name papermill injected that the parameters cell does not declare (``-p max_tokenz 5``) is an
      error that suggests the declared name nearest to it (papermill itself only warns).
    """
    annotations = namespace.get("__annotations__", {})
    defaults = _declared_defaults(namespace.get("In"), annotations)
    declared = {name: (_resolve_annotation(t), defaults.get(name, _NO_DEFAULT)) for name, t in annotations.items()}
    values = {name: namespace[name] for name in annotations if name in namespace}
    injected = _injected_names(namespace.get("In"))
    values.update({name: namespace.get(name) for name in injected if name not in annotations})
    blank_ok = set()
    history = namespace.get("In")
    for source in history if isinstance(history, (list, tuple)) else ():
        if isinstance(source, str) and ":" in source:
            blank_ok |= blank_parameters(source)
    _raise_problems(parameter_problems(declared, values, blank_ok=blank_ok), "notebook parameters")


_NO_DEFAULT = object()


def _resolve_annotation(declared: Any) -> Any:
    """An annotation object from a string (postponed annotations, or the source of a parameters cell); None when
    it cannot be read (then the value is not type-checked)."""
    import typing

    if not isinstance(declared, str):
        return declared
    try:
        return eval(declared, {"__builtins__": {}}, {"typing": typing, "list": list, "dict": dict, "tuple": tuple,
                                                      "int": int, "float": float, "str": str, "bool": bool,
                                                      "None": None, "Optional": typing.Optional,
                                                      "Union": typing.Union, "Any": typing.Any})
    except Exception:  # noqa: BLE001 - an annotation we cannot read is not checked
        return None


def _type_name(t: Any) -> str:
    return getattr(t, "__name__", None) if not getattr(t, "__args__", None) else str(t).replace("typing.", "")


def _matches(value: Any, declared: Any) -> bool | None:
    """Whether ``value`` is of the declared type, element types included; None when the type cannot be checked."""
    import types
    import typing

    if declared is None or declared is typing.Any:
        return None
    if declared is type(None):
        return value is None
    origin = typing.get_origin(declared)
    args = typing.get_args(declared)
    if origin in (typing.Union, types.UnionType):
        results = [_matches(value, a) for a in args]
        return True if any(r is True for r in results) else (None if any(r is None for r in results) else False)
    if origin is None:
        return _matches_plain(value, declared)
    if origin in (list, tuple, set, frozenset):
        return _matches_sequence(value, origin, args)
    if origin is dict:
        return isinstance(value, dict) and (not args or all(
            _matches(k, args[0]) is not False and _matches(v, args[1]) is not False for k, v in value.items()))
    return None


def _matches_plain(value: Any, declared: Any) -> bool | None:
    """A bare class: an int is a float, a bool is no int."""
    if not isinstance(declared, type):
        return None
    if declared is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if isinstance(value, bool) and declared is not bool:
        return False
    return isinstance(value, declared)


def _matches_sequence(value: Any, origin: type, args: tuple) -> bool:
    """``list[T]``, ``tuple[T, ...]``, ``tuple[A, B]``, ``set[T]``: the container, then every element."""
    container = (list, tuple) if origin in (list, tuple) else origin
    if not isinstance(value, container):
        return False
    if not args:
        return True
    if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
        return len(value) == len(args) and all(_matches(v, a) is not False for v, a in zip(value, args))
    return all(_matches(v, args[0]) is not False for v in value)


def _numbers(value: Any):
    """Every number inside ``value`` (itself, or the elements of nested lists, tuples and dict values)."""
    if isinstance(value, bool):
        return
    if isinstance(value, (int, float)):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _numbers(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _numbers(v)


def parameter_problems(declared: dict[str, tuple[Any, Any]], values: dict[str, Any], *,
                       blank_ok: Iterable[str] = ()) -> list[tuple[str, str]]:
    """What is wrong with ``values`` against a parameters cell ``declared`` (name -> (annotation, default)):
    a list of (kind, line), kind "name", "type" or "range"; empty when every value is fine. ``blank_ok``: the
    text parameters whose comment says what an empty value means (:func:`blank_parameters`)."""
    import difflib

    problems = []
    for name, value in values.items():
        if name not in declared:
            near = difflib.get_close_matches(name, list(declared), n=1, cutoff=0.6)
            hint = f"did you mean {near[0]!r}?" if near else f"the declared names are {sorted(declared)}"
            problems.append(("name", f"  {name}: not a parameter of this notebook ({hint})"))
            continue
        annotation, default = declared[name]
        ok = _matches(value, annotation)
        if ok is False:
            problems.append(("type", f"  {name}: expected {_type_name(annotation)}, got {type(value).__name__} "
                                     f"{value!r}"))
            continue
        numbers = list(_numbers(value))
        if any(isinstance(x, float) and not math.isfinite(x) for x in numbers):
            problems.append(("range", f"  {name} must be finite, got {value!r}"))
            continue
        if (isinstance(value, str) and not value.strip() and isinstance(default, str) and default.strip()
                and name not in blank_ok):
            problems.append(("range", f"  {name} must not be empty (its default is {default!r}: text the notebook "
                                      f"reads, a name or a path), got {value!r}; pass a non-empty value"))
            continue
        floor = list(_numbers(default)) if default is not _NO_DEFAULT else []
        if floor and min(floor) >= 0 and numbers and min(numbers) < 0:
            problems.append(("range", f"  {name} must be >= 0 (its default is {default!r}: a count, size, rate or "
                                      f"fraction), got {value!r}"))
    return problems


def _raise_problems(problems: list[tuple[str, str]], what: str) -> None:
    if not problems:
        return
    kinds = {k for k, _ in problems}
    lines = "\n".join(line for _, line in problems)
    if kinds == {"range"}:
        raise ValueError(f"{what} out of range (checked before any work):\n{lines}")
    if kinds == {"name"}:
        raise ValueError(f"{what}: names the parameters cell does not declare (papermill would inject them as "
                         f"new variables no cell reads; fix the name):\n{lines}")
    raise TypeError(f"{what} of the wrong type or name (papermill: -p NAME VALUE parses numbers, true/false, None "
                    f"and YAML lists such as [1, 2]; quote nothing else):\n{lines}")


def _parameters_source(notebook) -> str:
    import json
    from pathlib import Path

    nb = json.loads(Path(notebook).read_text(encoding="utf-8"))
    cells = [c for c in nb.get("cells", []) if "parameters" in c.get("metadata", {}).get("tags", [])]
    if not cells:
        raise ValueError(f"{notebook}: no cell tagged 'parameters' (papermill needs one to inject values)")
    source = cells[0]["source"]
    return "".join(source) if isinstance(source, list) else source


def declared_parameters(notebook) -> dict[str, tuple[Any, Any]]:
    """The parameters a notebook's cell tagged ``parameters`` declares: name -> (annotation, default), read from
    its source (``max_tokens: int = 4096  # ...``) without running it."""
    import ast
    import json
    from pathlib import Path

    source = _parameters_source(notebook)
    found: dict[str, tuple[Any, Any]] = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            try:
                default = ast.literal_eval(node.value) if node.value is not None else _NO_DEFAULT
            except (ValueError, TypeError, SyntaxError, RecursionError):
                default = _NO_DEFAULT
            found[node.target.id] = (_resolve_annotation(ast.unparse(node.annotation)), default)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    try:
                        found[target.id] = (None, ast.literal_eval(node.value))
                    except (ValueError, TypeError, SyntaxError, RecursionError):
                        found[target.id] = (None, _NO_DEFAULT)
    return found


def check_notebook_parameters(notebook, values: dict, where: str = "") -> None:
    """Check ``values`` (a YAML set, ``-p`` overrides, a sweep task's parameters) against the parameters cell of
    ``notebook`` before any work starts: names (a misspelt one suggests the declared name), types with element
    types, finiteness and ranges, as :func:`check_parameters` checks them inside the kernel. Raises ValueError or
    TypeError naming ``where`` (e.g. the YAML file), each bad parameter, the rule and the value."""
    from pathlib import Path

    what = f"{Path(notebook).name}: parameters" + (f" from {where}" if where else "")
    blank_ok = blank_parameters(_parameters_source(notebook))
    _raise_problems(parameter_problems(declared_parameters(notebook), dict(values), blank_ok=blank_ok), what)


def blank_parameters(source: str) -> set[str]:
    """The text parameters of a parameters cell ``source`` that may be empty: those whose comment names the empty
    string (``""`` or ``''``), which is where the cell says what an empty value means."""
    import io
    import re
    import tokenize

    names = set()
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, SyntaxError):
        return names
    lines = source.splitlines()
    for tok in tokens:
        if tok.type == tokenize.COMMENT and ('""' in tok.string or "''" in tok.string):
            match = re.match(r"\s*([A-Za-z_]\w*)\s*:", lines[tok.start[0] - 1])
            if match:
                names.add(match.group(1))
    return names


def _injected_names(history: Any) -> list[str]:
    """Names papermill's injected cell assigns (its source starts with ``# Parameters``), from IPython's ``In``."""
    import ast

    names: list[str] = []
    for tree in _history_trees(history, lambda source: source.lstrip().startswith("# Parameters")):
        for node in tree.body:
            if isinstance(node, ast.Assign):
                names += [t.id for t in node.targets if isinstance(t, ast.Name) and t.id not in names]
    return names


def _history_trees(history: Any, accept):
    """The parsed cells of IPython's input history ``In`` whose source ``accept`` takes (cells that do not parse are
    skipped)."""
    import ast

    if not isinstance(history, (list, tuple)):
        return
    for source in history:
        if isinstance(source, str) and accept(source):
            try:
                yield ast.parse(source)
            except SyntaxError:
                continue


def _declared_defaults(history: Any, annotations: dict) -> dict[str, Any]:
    """The defaults the notebook's parameters cell declares (``max_tokens: int = 4096``), read from IPython's
    input history ``In`` (papermill's injected cell assigns without annotations, so it is not taken). A
    parameter whose declared default is a non-negative number must not be negative: ``-p max_tokens -5`` then
    fails in the check cell instead of many cells later."""
    import ast

    found: dict[str, Any] = {}
    for tree in _history_trees(history, lambda source: ":" in source):
        for node in tree.body:
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None
                    and node.target.id in annotations and node.target.id not in found):
                try:
                    found[node.target.id] = ast.literal_eval(node.value)
                except (ValueError, TypeError, SyntaxError, RecursionError):
                    continue
    return found
