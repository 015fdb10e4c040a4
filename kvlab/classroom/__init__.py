"""The classroom: student versions of the assignments in ``lessons/`` and their grading.

:mod:`.lessons` makes the student copies and runs ``python -m kvlab lessons make|grade``; :mod:`.grading` runs each
student's code in a confined child and judges its answers on plain data.
"""
from kvlab.core.lazy import attach

__getattr__, __dir__, __all__ = attach(__name__, submodules=["grading", "lessons"], names={})
