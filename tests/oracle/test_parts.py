"""The fast planner's parts: per-column uniques, the row map, the next-use ring, array growth."""

from __future__ import annotations

import numpy as np
import pytest

from bagpipe.oracle import growth
from bagpipe.oracle.cacher import _sorted_with_owner
from bagpipe.oracle.growth import Growing, Reserve
from bagpipe.oracle.ring import NEVER, UseRing
from bagpipe.oracle.rowmap import RowMap
from bagpipe.oracle.uniques import batch_uniques


def _expected(matrix: np.ndarray, num_trainers: int) -> tuple[np.ndarray, np.ndarray]:
    ids, first, counts = np.unique(matrix, return_index=True, return_counts=True)
    per_trainer = matrix.shape[0] // num_trainers
    return ids, np.where(counts == 1, first // matrix.shape[1] // per_trainer, -1)


# disjoint tables (counted with and without once-used ids, sorted int32 and int64 keys) /
# overlapping
@pytest.mark.parametrize("spans", [(5, 3, 10**6, 2**40), (5, 1000, 3, 10**6, 2**40), (7, 7, 7)])
@pytest.mark.parametrize("num_trainers", [1, 3])
def test_batch_uniques_equal_np_unique(spans: tuple[int, ...], num_trainers: int) -> None:
    rng = np.random.default_rng(0)
    disjoint = len(set(spans)) == len(spans)
    offsets = np.cumsum((0, *spans[:-1])) if disjoint else np.zeros(len(spans), dtype=np.int64)
    matrix = np.stack(
        [o + rng.integers(0, s, 60) for o, s in zip(offsets, spans, strict=True)], axis=1
    )
    found = batch_uniques(matrix, num_trainers, np.int8)
    assert (found.columns == tuple(range(len(spans)))) == disjoint
    expected_ids, expected_once = _expected(matrix, num_trainers)
    assert np.array_equal(found.ids, expected_ids)
    assert np.array_equal(found.once_owner, expected_once)
    for k, column in enumerate(found.columns if disjoint else ()):
        segment = found.ids[found.bounds[k] : found.bounds[k + 1]]
        assert np.array_equal(segment, np.unique(matrix[:, column]))


def test_batch_uniques_reject_negative_ids() -> None:
    with pytest.raises(ValueError, match="column 1"):
        batch_uniques(np.array([[1, -3]]), 1, np.int8)


def test_rowmap_direct_hashed_and_switched_tables_share_one_index() -> None:
    # table 0 (10 rows) is direct from the start; table 1 (3200 rows) goes direct once
    # 1/32 of its rows are seen; ids of unknown tables (-1) are hashed for good
    rowmap = RowMap([(100, 10), (1000, 3200)], direct_rows_max=10, initial_slots=16)
    rng = np.random.default_rng(1)
    seen: dict[int, int] = {}
    switched_at = None
    for step in range(30):  # grows the hash several times
        segments = [
            np.unique(rng.integers(100, 110, 4)),
            np.unique(rng.integers(1000, 4200, 9)),
            np.unique(rng.integers(0, 100, 20) * 7919 + 10**6),
        ]
        ids = np.concatenate(segments)
        bounds = np.cumsum([0, *(s.size for s in segments)])
        rows = rowmap.index(ids, (0, 1, -1), bounds)
        for key, row in zip(ids.tolist(), rows.tolist(), strict=True):
            assert seen.setdefault(key, row) == row
        if switched_at is None and rowmap.is_direct(1):
            switched_at = step
    assert rowmap.is_direct(0) and not rowmap.is_direct(-1)
    assert switched_at is not None and switched_at > 0
    assert sorted(seen.values()) == list(range(rowmap.size))
    assert all(rowmap.ids[row] == key for key, row in seen.items())


def test_use_ring_wraps_and_grows_keeping_live_blocks() -> None:
    ring = UseRing(initial_slots=8, max_live_steps=2)
    live: dict[int, np.ndarray] = {}
    for step, count in enumerate([3, 4, 2, 6, 1, 9, 0, 5]):
        ring.add(step, count)
        live[step] = np.full(count, NEVER)
        if step >= 1 and live[step - 1].size:
            ring.record(np.array([step - 1]), np.array([0]), step)
            live[step - 1][0] = step
        while len(live) > 3:
            ring.release_oldest()
            del live[min(live)]
        for s, expected in live.items():
            assert np.array_equal(ring.next_uses(s), expected)


LAYOUT = [(np.int64, -1), (np.bool_, False), (np.int32, NEVER)]


def test_a_reserve_is_ready_before_the_rows_outgrow_the_arrays(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rows seen grow 1000 at a time to 200k: every growth finds complete reserve buffers, so the
    owner never fills buffers itself; each growth keeps the rows in use."""
    monkeypatch.setattr(growth, "EAGER_SLOTS", 1024)  # larger buffers are filled a slice a call
    reserve, owner = Reserve(LAYOUT), Growing(LAYOUT)
    used, growths = 0, 0
    for seen in range(1000, 200_001, 1000):
        before = owner.arrays[0]
        arrays = owner.cover(seen, reserve.advance(seen))
        if arrays[0] is not before:
            growths += 1
            for array, (dtype, fill) in zip(arrays, LAYOUT, strict=True):
                assert array.dtype == dtype and np.all(array[used:] == fill)
                assert np.array_equal(array[:used], np.full(used, 7, dtype=dtype))
        for array in arrays:
            array[used:seen] = 7  # the rows now in use
        used = seen
    assert growths >= 7 and owner.stalls == 0
    assert owner.arrays[0].size <= 4 * used  # memory stays proportional to the rows seen


def test_growing_fills_new_buffers_when_a_reserve_is_too_small() -> None:
    owner = Growing(LAYOUT)
    for array in owner.cover(3):
        array[:3] = [0, 1, 2] if array.dtype != np.bool_ else True
    small = [np.empty(5, dtype=dtype) for dtype, _ in LAYOUT]
    bigger = owner.cover(6, small)
    assert bigger[0] is not small[0] and bigger[0].size == 6 and owner.stalls == 2
    assert bigger[0].tolist() == [0, 1, 2] + [-1] * 3
    assert bigger[1].tolist() == [True] * 3 + [False] * 3
    assert bigger[2].tolist() == [0, 1, 2] + [NEVER] * 3


def test_sorted_with_owner_takes_int64_keys_from_the_first_id_that_would_overflow_int32() -> None:
    bits = (8).bit_length()  # owners -1..7 take 4 bits: ids below 2**27 fit int32 keys
    owners = np.array([6, -1, 0, 7, 3])
    for largest in ((1 << 27) - 1, 1 << 27, (1 << 28) - 1, 1 << 35):
        ids = np.array([largest, 5, 0, largest - 3, 7])
        sorted_ids, sorted_owners = _sorted_with_owner(ids, owners, bits)
        order = np.argsort(ids)
        assert sorted_ids.tolist() == ids[order].tolist(), largest
        assert sorted_owners.tolist() == owners[order].tolist(), largest


# int32 keys (ids and owners fit 31 bits) / int64 keys
@pytest.mark.parametrize("top", [1 << 20, 1 << 40])
def test_sorted_with_owner_sorts_ids_and_carries_their_owners(top: int) -> None:
    rng = np.random.default_rng(1)
    ids = rng.choice(top, 5000, replace=False)
    owners = rng.integers(-1, 8, ids.size)
    sorted_ids, sorted_owners = _sorted_with_owner(ids, owners, (8).bit_length())
    order = np.argsort(ids)
    assert sorted_ids.dtype == sorted_owners.dtype == np.int64
    assert np.array_equal(sorted_ids, ids[order])
    assert np.array_equal(sorted_owners, owners[order])
