"""The oracle's guarantees on random streams (hypothesis): the fast planner equals the reference,
and its plans replay cleanly on simulated trainer caches.

``streams.replay`` checks that every row a step reads is resident and fresh where it is read, that
an evicted row is written back from a fresh copy by one trainer, and that the capacity is never
exceeded. On top of it: every residency ends in exactly one write-back (a row is evicted once
after each prefetch, the flush plan included), and both planners refuse a capacity below what a
round needs with the same minimum.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from bagpipe.oracle import CapacityError, OracleConfig, RoundPlan
from bagpipe.oracle.reference import plan_reference
from tests.oracle.conftest import Plans, plan_fast, plan_fast_with_tables
from tests.oracle.streams import min_capacity, replay
from tests.oracle.test_against_reference import _same

PROPERTY = settings(max_examples=60, deadline=None, derandomize=True, database=None)


@st.composite
def streams(draw: st.DrawFn) -> tuple[list[np.ndarray], OracleConfig, tuple[int, ...]]:
    """A short stream of ``[B, F]`` global-id matrices over 1-3 small tables, and a config."""
    trainers = draw(st.integers(1, 3))
    ci = draw(st.integers(1, 3))
    lookahead = draw(st.integers(2 * ci, 2 * ci + 3))
    table_sizes = tuple(draw(st.lists(st.integers(1, 12), min_size=1, max_size=3)))
    batch_size = trainers * draw(st.integers(1, 3))
    num_steps = draw(st.integers(1, 14))
    offsets = np.cumsum((0, *table_sizes[:-1]))
    rows = st.lists(
        st.tuples(*[st.integers(0, size - 1) for size in table_sizes]),
        min_size=batch_size, max_size=batch_size,
    )
    stream = [np.array(draw(rows), dtype=np.int64) + offsets for _ in range(num_steps)]
    config = OracleConfig(trainers, lookahead, ci)
    capacity = draw(st.none() | st.integers(0, 4).map(lambda extra: min_capacity(stream, config)
                                                        + extra))
    return stream, OracleConfig(trainers, lookahead, ci, capacity), table_sizes


def _assert_same_plans(got: Plans, expected: Plans) -> None:
    assert len(got) == len(expected)
    for index, (a, b) in enumerate(zip(got, expected, strict=True)):
        assert _same(a, b), f"plan {index}: {a} != {b}"


@PROPERTY
@given(streams())
def test_fast_planner_equals_reference_and_replays(
    case: tuple[list[np.ndarray], OracleConfig, tuple[int, ...]],
) -> None:
    stream, config, table_sizes = case
    expected, expected_stats = plan_reference(stream, config)
    got, stats = plan_fast(stream, config)
    _assert_same_plans(got, expected)
    assert stats.counts() == expected_stats.counts()
    told, _ = plan_fast_with_tables(stream, config, table_sizes, direct_rows_max=6)
    _assert_same_plans(told, expected)
    replay(stream, config, got)
    prefetched: Counter[int] = Counter()
    evicted: Counter[int] = Counter()
    for plan in got:
        if isinstance(plan, RoundPlan):
            prefetched.update(plan.prefetch.tolist())
            evicted.update(plan.evict.tolist())
    assert evicted == prefetched  # one write-back per residency, none twice, none lost
    assert stats.rows_prefetched == sum(prefetched.values())
    assert stats.rows_evicted == stats.rows_written_back == sum(evicted.values())
    if config.capacity is not None:
        assert stats.peak_resident_rows <= config.capacity


@PROPERTY
@given(streams(), st.integers(1, 3))
def test_capacity_below_a_rounds_needs_is_refused_alike(
    case: tuple[list[np.ndarray], OracleConfig, tuple[int, ...]], short: int
) -> None:
    stream, config, _ = case
    unbounded = OracleConfig(config.num_trainers, config.lookahead, config.ci)
    capacity = min_capacity(stream, unbounded) - short
    assume(capacity >= 1)
    small = OracleConfig(config.num_trainers, config.lookahead, config.ci, capacity)
    outcomes = []
    for planner in (plan_reference, plan_fast):
        try:
            plans, _ = planner(stream, small)
        except CapacityError as error:
            outcomes.append(error.min_capacity)
        else:
            replay(stream, small, plans)
            outcomes.append(None)
    assert outcomes[0] == outcomes[1]
    if outcomes[0] is not None:
        assert capacity < outcomes[0] <= min_capacity(stream, unbounded)
