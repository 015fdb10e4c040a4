"""The classroom: student versions of the assignments in ``lessons/`` and their grading.

:mod:`.lessons` makes the student copies and grades them (its command line ``python -m kvlab lessons make|grade``: :mod:`.cli`); :mod:`.grading` runs each
student's code in a confined child and judges its answers on plain data.
"""
from kvlab.core.lazy import attach

__getattr__, __dir__, __all__ = attach(__name__, submodules=["cli", "grading", "lessons"], names={})
