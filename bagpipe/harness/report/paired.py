"""Speedups as paired ratios with confidence intervals, and the rule that calls one "faster".

A sweep runs in blocks (:mod:`bagpipe.harness.run.blocks`): within a block every system ran once,
close together in time, so the ratio of two systems' iteration times *within* a block cancels
most of the machine's drift. Over blocks those ratios scatter; their geometric mean is the
speedup and a Student-t interval on their logarithms says how sure it is. A system is called
faster (or slower) than the reference only where the interval excludes 1.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from scipy import stats

CONFIDENCE = 0.95


@dataclass(frozen=True)
class PairedSpeedup:
    """The geometric mean of a system's within-block speedups and its confidence interval."""

    speedup: float
    low: float
    high: float
    blocks: int

    @property
    def verdict(self) -> str:
        """``faster``/``slower`` where the interval excludes 1, else ``within noise``."""
        side = self.side_of(1.0)
        if side != "across":
            return "faster" if side == "above" else "slower"
        return "within noise" if self.blocks >= 2 else "one block"

    def side_of(self, value: float) -> str:
        """Where the interval lies against ``value``: wholly ``above`` or ``below`` it, or
        ``across`` it (also with fewer than two blocks, where there is no interval)."""
        if self.low > value:
            return "above"
        if self.high < value:
            return "below"
        return "across"


def paired_speedup(ratios: Sequence[float], confidence: float = CONFIDENCE) -> PairedSpeedup:
    """``ratios``: reference time / own time, one per block (each from the same block)."""
    logs = [math.log(r) for r in ratios if r > 0 and math.isfinite(r)]
    if not logs:
        return PairedSpeedup(math.nan, math.nan, math.nan, 0)
    centre, half = mean_and_half_interval(logs, confidence)
    if len(logs) < 2:
        return PairedSpeedup(math.exp(centre), math.nan, math.nan, 1)
    return PairedSpeedup(math.exp(centre), math.exp(centre - half), math.exp(centre + half),
                         len(logs))


def mean_and_half_interval(
    values: Sequence[float], confidence: float = CONFIDENCE
) -> tuple[float, float]:
    """The mean of ``values`` (paired differences, or log ratios) and the half-width of its
    Student-t interval; nan for a single value, which has no interval."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, math.nan
    quantile = stats.t.ppf(0.5 + confidence / 2, len(values) - 1)
    return mean, quantile * statistics.stdev(values) / math.sqrt(len(values))
