"""``python -m kvlab run orthorank-zeroshot``: see :mod:`kvlab.experiments.orthorank.commands`."""
from kvlab.experiments.orthorank.commands import check, run
from kvlab.experiments.orthorank.commands import parser as _parser

__all__ = ["parser", "check", "run"]


def parser():
    return _parser("zeroshot")
