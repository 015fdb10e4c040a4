"""``python -m kvlab run dhsa-table2``: see :mod:`kvlab.experiments.dhsa.grid`."""
from kvlab.experiments.dhsa.grid import check, run
from kvlab.experiments.dhsa.grid import parser as _parser

__all__ = ["parser", "check", "run"]


def parser():
    return _parser("table2")
