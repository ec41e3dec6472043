"""Transitional: ``bagpipe/bench/oracle.py`` still imports the plotting helpers from here.

They live in :mod:`bagpipe.harness.report.plotting`; delete this module once the benchmark imports
them from there.
"""

from bagpipe.harness.report.plotting import pyplot, save_figure

__all__ = ["pyplot", "save_figure"]
