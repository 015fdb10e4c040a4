"""Compare a checked notebook cell's printed numbers with a stated tolerance, not character by character.

A cell marked ``# NBVAL_CHECK_OUTPUT`` prints a few rounded key numbers. Recorded on one machine, they can differ
in the last digit on another: a different CPU, thread count or BLAS splits a sum differently, and a perplexity
of 0.8424 rounds to 0.842 here and 0.846 there. nbval compares outputs as strings, so such a check would pass
where it was recorded and fail on the next machine. This plugin keeps nbval's comparison and, only where that
fails, compares again number by number:

* the text between numbers must be the same (runs of spaces count as one, so a column may shift);
* two numbers agree when ``|a - b| <= max(RTOL * max(|a|, |b|), one unit of the last printed digit)``,
  with ``RTOL = 0.01`` (1 %): ``0.842`` vs ``0.846`` agree, ``0.50`` vs ``0.75`` do not, ``1140`` vs ``1141``
  agree, ``1140`` vs ``1160`` do not;
* the output streams must be the same (a warning on stderr that was not recorded still fails).

``scripts/notebooks.py prepare`` writes a ``conftest.py`` beside the prepared notebooks that loads this plugin,
so ``pytest build/notebooks --nbval-lax`` uses it however it is started. ``tests/test_notebook_checks.py`` runs a
checked notebook with one thread (CI records with two) and compares with :func:`texts_agree`.
"""

from __future__ import annotations

import math
import re

RTOL = 0.01
NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?|nan|inf", re.IGNORECASE)


def _unit(token: str) -> float:
    """One unit of the last printed digit of ``token`` (``0.842`` -> 0.001, ``1.5e-03`` -> 1e-04)."""
    mantissa, _, exponent = token.lower().partition("e")
    decimals = len(mantissa.split(".", 1)[1]) if "." in mantissa else 0
    return 10.0 ** (int(exponent or 0) - decimals)


def numbers_agree(expected: str, found: str, rtol: float = RTOL) -> bool:
    """Whether two printed numbers agree under the rule in the module docstring."""
    a, b = float(expected), float(found)
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    if math.isinf(a) or math.isinf(b):
        return a == b
    allowed = max(rtol * max(abs(a), abs(b)), _unit(expected), _unit(found))
    return abs(a - b) <= allowed * (1 + 1e-9)


def _split(text: str) -> tuple[list[str], list[str]]:
    """The text between numbers (whitespace runs collapsed) and the numbers, in order."""
    numbers = NUMBER.findall(text)
    words = [re.sub(r"\s+", " ", part) for part in NUMBER.split(text)]
    return words, numbers


def texts_agree(expected: str, found: str, rtol: float = RTOL) -> tuple[bool, str]:
    """Compare two printed outputs: same words, numbers within tolerance. Returns (agree, first difference)."""
    if expected == found:
        return True, ""
    words_e, nums_e = _split(expected)
    words_f, nums_f = _split(found)
    if len(nums_e) != len(nums_f):
        return False, f"{len(nums_e)} numbers expected, {len(nums_f)} found"
    for x, y in zip(words_e, words_f):
        if x != y:
            return False, f"text differs: expected {x!r}, found {y!r}"
    for i, (x, y) in enumerate(zip(nums_e, nums_f)):
        if not numbers_agree(x, y, rtol):
            return False, (f"number {i + 1}: expected {x}, found {y} (allowed: {rtol:.0%} or one unit of the last "
                           "printed digit)")
    return True, ""


def _streams(outputs) -> dict[str, str] | None:
    """stdout/stderr texts of a cell's outputs, or None when it has any other kind of output."""
    texts: dict[str, str] = {}
    for out in outputs:
        if out.get("output_type") != "stream":
            return None
        texts[out["name"]] = texts.get(out["name"], "") + out["text"]
    return texts


def pytest_configure(config):
    try:
        from nbval.plugin import IPyNbCell
    except ImportError:  # nbval not installed: nothing to patch
        return
    if getattr(IPyNbCell.compare_outputs, "_kvlab_tolerant", False):
        return
    strict = IPyNbCell.compare_outputs

    def compare_outputs(self, test, ref, skip_compare=None):
        if strict(self, test, ref, skip_compare):
            return True
        found, expected = _streams(test), _streams(ref)
        if found is None or expected is None or set(found) != set(expected):
            return False
        for name, text in expected.items():
            ok, why = texts_agree(self.sanitize(text), self.sanitize(found[name]))
            if not ok:
                self.comparison_traceback.append(f"numbers compared with tolerance: {why}")
                return False
        self.comparison_traceback = []
        return True

    compare_outputs._kvlab_tolerant = True
    IPyNbCell.compare_outputs = compare_outputs
