"""Paired speedups: the geometric mean of within-block ratios and a t interval on their logs."""

from __future__ import annotations

import math

import pytest

from bagpipe.harness.report.paired import mean_and_half_interval, paired_speedup


def test_the_interval_is_students_t_on_the_logs() -> None:
    got = paired_speedup([1.2, 1.5, 1.35])
    logs = [math.log(1.2), math.log(1.5), math.log(1.35)]
    mean = sum(logs) / 3
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / 2)
    half = 4.302652729911275 * sd / math.sqrt(3)  # t(0.975, 2 degrees of freedom)
    assert got.speedup == pytest.approx(math.exp(mean))
    assert (got.low, got.high) == pytest.approx((math.exp(mean - half), math.exp(mean + half)))
    assert got.blocks == 3


def test_faster_only_where_the_interval_excludes_one() -> None:
    assert paired_speedup([1.30, 1.32, 1.31]).verdict == "faster"
    assert paired_speedup([0.70, 0.72, 0.71]).verdict == "slower"
    assert paired_speedup([0.9, 1.3, 1.1]).verdict == "within noise"  # mean > 1, interval spans 1
    assert paired_speedup([1.5]).verdict == "one block"
    assert math.isnan(paired_speedup([]).speedup)


def test_a_mean_of_differences_gets_the_same_t_interval() -> None:
    """The collectives bench's milliseconds per step: a mean and its t half-width, no logs."""
    mean, half = mean_and_half_interval([1.0, 2.0, 3.0])
    assert (mean, half) == pytest.approx((2.0, 4.302652729911275 * 1.0 / math.sqrt(3)))
    mean, half = mean_and_half_interval([-0.5])
    assert mean == -0.5 and math.isnan(half)
