"""Hand-worked streams: every expected set below is derived by hand in the comments.

Both planners (the set-based reference and the fast ``OracleCacher``) must produce exactly these.
"""

from __future__ import annotations

import numpy as np
import pytest

from bagpipe.oracle import CapacityError, OracleConfig, RoundPlan, StepPlan

# T = 2 trainers, B = 2 examples (example 0 -> trainer 0, example 1 -> trainer 1), F = 1 feature,
# L = 2, ci = 1 (round r = step r).
STREAM = [[1, 2], [1, 3], [4, 4], [2, 5], [1, 5], [6, 6]]
# uses: 1 @ 0,1,4   2 @ 0,3   3 @ 1   4 @ 2 (twice)   5 @ 3,4   6 @ 5 (twice)


def _matrices(stream: list[list[int]]) -> list[np.ndarray]:
    return [np.array(batch, dtype=np.int64).reshape(len(batch), 1) for batch in stream]


def _lists(plan: StepPlan | RoundPlan) -> dict[str, object]:
    return {k: (v.tolist() if hasattr(v, "tolist") else v) for k, v in plan.__dict__.items()}


def step(i: int, now: list[int], later: list[int], single: list[int], owner: list[int]) -> dict:
    return {
        "step": i,
        "sync_now": now,
        "sync_later": later,
        "singleton": single,
        "singleton_owner": owner,
    }


def rnd(
    r: int, first: int, last: int, evict: list[int], wb: list[int], pf: list[int], po: list[int]
):
    return {
        "round_index": r,
        "first_step": first,
        "last_step": last,
        "evict": evict,
        "writeback_owner": wb,
        "prefetch": pf,
        "prefetch_owner": po,
    }


EXPECTED = [
    # round 0 (step 0): nothing resident; fetch U_0 = {1, 2}. Row 2's only use in the round is a
    # singleton use (count 1, next use 3 > 0 + L) by trainer 1, so only trainer 1 fetches it.
    rnd(0, 0, 0, [], [], [1, 2], [-1, 1]),
    # round 1 (step 1): no row is eligible yet (cutoff (1-1)*1-2 = -2). Fetch 3: its only use is a
    # singleton use by trainer 1 (never used again).
    rnd(1, 1, 1, [], [], [3], [1]),
    # step 0: 1 is used at step 1 too (sync now); 2 is a singleton of trainer 1.
    step(0, [1], [], [2], [1]),
    # round 2 (step 2): cutoff -1, nothing eligible; fetch 4 (used twice: shared, -1).
    rnd(2, 2, 2, [], [], [4], [-1]),
    # step 1: 1 (trainer 0; next use 4 > 1 + 2) and 3 (trainer 1; never again) are singletons.
    step(1, [], [], [1, 3], [0, 1]),
    # round 3 (step 3): cutoff 0. Row 2's latest use (step 0) was trainer 1's singleton: stale on
    # trainer 0, evicted now, written back by trainer 1, then refetched (after the barrier) for
    # step 3 where it is trainer 0's singleton (only trainer 0 fetches). 5 is shared (used at 4).
    rnd(3, 3, 3, [2], [1], [2, 5], [0, -1]),
    # step 2: 4 appears twice (not a singleton) and not at step 3: sync later.
    step(2, [], [4], [], []),
    # round 4 (step 4): cutoff 1. Rows 1 and 3 had singleton latest uses at step 1 (trainers 0, 1):
    # evicted, each written back by its owner. Row 1 is refetched; its only use in round 4 is a
    # singleton use by trainer 0.
    rnd(4, 4, 4, [1, 3], [0, 1], [1], [0]),
    # step 3: 5 is used at step 4 (sync now); 2 is trainer 0's singleton (never used again).
    step(3, [5], [], [2], [0]),
    # round 5 (step 5): cutoff 2. Row 4 (latest use 2, never used again) has an expired lease:
    # evicted; it is the only shared evicted row, so chunk 0 (trainer 0) writes it back. Fetch 6.
    rnd(5, 5, 5, [4], [0], [6], [-1]),
    # step 4: 1 (trainer 0) and 5 (trainer 1) are never used again: singletons.
    step(4, [], [], [1, 5], [0, 1]),
    # step 5: the last step; 6 appears twice: sync later.
    step(5, [], [6], [], []),
    # flush: resident {1, 2, 5, 6}; 1 and 2 were trainer 0's singletons, 5 trainer 1's; 6 is shared.
    rnd(6, 6, 5, [1, 2, 5, 6], [0, 0, 1, 0], [], []),
]


def test_hand_stream_plans(planner) -> None:
    plans, stats = planner(
        _matrices(STREAM), OracleConfig(num_trainers=2, lookahead=2, cleanup_interval=1)
    )
    assert [_lists(p) for p in plans] == EXPECTED
    # resident after each round: {1,2}, +3, +4, -2+2+5, -1-3+1, -4+6 -> peak 5 after round 3
    assert stats.peak_resident_rows == 5
    assert stats.rows_prefetched == 8 and stats.row_fetches == 2 + 1 + 1 + 1 + 2 + 1 + 1 + 2 + 1
    assert stats.singleton_rows == 6 and stats.sync_now_rows == 2 and stats.sync_later_rows == 2


# Capacity: T = 1, B = 1, F = 2, L = 4, ci = 2.
CAP_STREAM = [[1, 2], [1, 3], [4, 5], [4, 6], [1, 7], [2, 7], [1, 8], [1, 8]]
# uses: 1 @ 0,1,4,6,7   2 @ 0,5   3 @ 1   4 @ 2,3   5 @ 2   6 @ 3   7 @ 4,5   8 @ 6,7


def test_belady_keeps_soonest_next_use(planner) -> None:
    cfg = OracleConfig(num_trainers=1, lookahead=4, cleanup_interval=2, capacity=7)
    plans, stats = planner(_matrices(CAP_STREAM), cfg)
    rounds = {p.round_index: _lists(p) for p in plans if isinstance(p, RoundPlan)}
    # round 0 fetches {1,2,3}; round 1 fetches {4,5,6}: 6 rows <= 7.
    assert rounds[0]["prefetch"] == [1, 2, 3] and rounds[1]["prefetch"] == [4, 5, 6]
    # With T = 1 no copy goes stale, so singleton rows stay while they fit. Round 2 (steps 4,5)
    # uses {1,7,2}: fetch {7} -> 7 resident. Round 3 (steps 6,7; cutoff (3-1)*2-2 = 2; horizon
    # 7+4 = 11) uses {1,8}: fetching 8 makes 8 > 7, so one eligible row not used in round 3 goes:
    # candidates 3 (latest use 1) and 5 (latest use 2), neither used again (next use "never"):
    # the tie goes to the larger id, 5. No lease broken.
    assert rounds[2]["evict"] == [] and rounds[2]["prefetch"] == [7]
    assert rounds[3]["evict"] == [5] and rounds[3]["prefetch"] == [8]
    assert stats.peak_resident_rows == 7
    assert stats.capacity_evictions == 1 and stats.lease_breaks == 0


def test_capacity_error_names_min_capacity(planner) -> None:
    # Same stream, capacity 6. Round 2 needs rows of steps 1..5 = {1,2,3,4,5,6,7} = 7 > 6 -> error.
    cfg = OracleConfig(num_trainers=1, lookahead=4, cleanup_interval=2, capacity=6)
    with pytest.raises(CapacityError) as info:
        planner(_matrices(CAP_STREAM), cfg)
    assert info.value.min_capacity == 7


# Belady choice: T = 1, B = 1, F = 2, L = 8, ci = 2, capacity 6.
BELADY_STREAM = [[1, 2], [3, 4], [5, 6], [5, 6], [5, 6], [5, 6], [1, 5], [3, 6], [2, 4], [2, 4]]
# uses: 1 @ 0,6   2 @ 0,8,9   3 @ 1,7   4 @ 1,8,9   5 @ 2..6   6 @ 2..5,7


def test_reused_rows_stay_resident_when_they_fit(planner) -> None:
    cfg = OracleConfig(num_trainers=1, lookahead=8, cleanup_interval=2, capacity=6)
    plans, stats = planner(_matrices(BELADY_STREAM), cfg)
    rounds = {p.round_index: _lists(p) for p in plans if isinstance(p, RoundPlan)}
    # rounds 0, 1 fetch {1,2,3,4} and {5,6}: 6 resident, full. Round 2 (steps 4,5) needs nothing.
    # Round 3 (steps 6,7; cutoff 2): 1..4 eligible (latest uses 0, 1), none a singleton (all
    # reused within L = 8). Round 3 uses {1,3,5,6}, all resident: no fetch, no eviction.
    assert rounds[3]["prefetch"] == [] and rounds[3]["evict"] == []
    # Round 4 (steps 8,9) uses {2,4}, resident too. The cache never overflows: no forced evictions.
    assert stats.capacity_evictions == 0
    # With capacity 5, round 1 must make room for {5,6}: eligible rows are those with latest use
    # <= (1-1)*2-2 = -2: none, and rows used by steps 0..3 = 6 > 5 -> CapacityError(min 6).
    with pytest.raises(CapacityError):
        planner(_matrices(BELADY_STREAM), OracleConfig(1, 8, 2, capacity=5))


BELADY_STREAM_2 = [[1, 2], [1, 2], [3, 4], [3, 4], [5, 6], [5, 6], [2, 3], [1, 4], [1, 4]]
# uses: 1 @ 0,1,7,8   2 @ 0,1,6   3 @ 2,3,6   4 @ 2,3,7,8   5 @ 4,5   6 @ 4,5


def test_no_eviction_when_working_set_fits(planner) -> None:
    # T=1, L=8, ci=2, capacity 6. Rounds 0, 1 fetch {1,2} and {3,4} (4 resident). Round 2 (steps
    # 4,5; cutoff 0) fetches {5,6}: 6 resident, fits. Round 3 (steps 6,7; cutoff 2; horizon 8+8)
    # uses {1,2,3,4}: all resident, nothing to fetch. Round 4 (step 8) uses {1,4}: resident.
    _, stats = planner(_matrices(BELADY_STREAM_2), OracleConfig(1, 8, 2, capacity=6))
    assert stats.capacity_evictions == 0 and stats.rows_prefetched == 6
    # Capacity 5: round 2 needs rows of steps 1..5 = {1,2,3,4,5,6} = 6 > 5 -> error.
    with pytest.raises(CapacityError):
        planner(_matrices(BELADY_STREAM_2), OracleConfig(1, 8, 2, capacity=5))


BELADY_STREAM_3 = [[1, 2], [1, 2], [3, 4], [3, 4], [5, 6], [5, 6], [7, 8], [1, 8], [2, 8], [2, 8]]
# uses: 1 @ 0,1,7   2 @ 0,1,8,9   3 @ 2,3   4 @ 2,3   5 @ 4,5   6 @ 4,5   7 @ 6   8 @ 6..9


def test_forced_eviction_breaks_a_lease(planner) -> None:
    # T=1, L=8, ci=2. Rounds 0, 1, 2 fetch {1,2}, {3,4}, {5,6} (6 resident). Round 3 (steps 6,7;
    # cutoff (3-1)*2-2 = 2) needs the rows of steps 3..7 at once: {3,4} (step 3's delayed update is
    # still pending), {5,6}, {7,8}, {1,8} = 7 rows. Capacity 6 -> CapacityError(min 7).
    with pytest.raises(CapacityError) as info:
        planner(_matrices(BELADY_STREAM_3), OracleConfig(1, 8, 2, capacity=6))
    assert info.value.min_capacity == 7
    # With capacity 7: round 3 needs 7 rows; resident {1..6} + fetch {7,8} = 8 -> evict 1 row among
    # eligible rows (latest use <= 2) not used in round 3: {2} (latest use 1, next use 8 <= 1 + 8:
    # a lease break). Round 4 (steps 8,9; cutoff 4) uses {2,8}: fetching 2 makes 8 > 7 again;
    # candidates 3 and 4 (latest use 3, never used again; 5, 6 have latest use 5 > 4): evict 4.
    plans, stats = planner(_matrices(BELADY_STREAM_3), OracleConfig(1, 8, 2, capacity=7))
    rounds = {p.round_index: _lists(p) for p in plans if isinstance(p, RoundPlan)}
    assert rounds[3]["evict"] == [2] and rounds[3]["prefetch"] == [7, 8]
    assert rounds[4]["evict"] == [4] and rounds[4]["prefetch"] == [2]
    assert stats.capacity_evictions == 2 and stats.lease_breaks == 1


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="cleanup_interval"):
        OracleConfig(num_trainers=2, lookahead=10, cleanup_interval=6)
    with pytest.raises(ValueError, match="num_trainers"):
        OracleConfig(num_trainers=0)
    with pytest.raises(ValueError, match="capacity"):
        OracleConfig(num_trainers=1, capacity=0)
    assert OracleConfig(num_trainers=1).ci == 50
    assert OracleConfig(num_trainers=1, lookahead=2).ci == 1
