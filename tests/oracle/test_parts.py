"""The fast planner's parts: per-column uniques, the row map, the next-use ring."""

from __future__ import annotations

import numpy as np
import pytest

from bagpipe.oracle.ring import NEVER, UseRing
from bagpipe.oracle.rowmap import RowMap
from bagpipe.oracle.uniques import batch_segments


def _expected(matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    ids, first, counts = np.unique(matrix, return_index=True, return_counts=True)
    return ids, np.where(counts == 1, first // matrix.shape[1], -1)


@pytest.mark.parametrize("spans", [(5, 3, 10**6), (7, 7, 7)])  # disjoint tables / overlapping
def test_batch_segments_equal_np_unique(spans: tuple[int, ...]) -> None:
    rng = np.random.default_rng(0)
    disjoint = len(set(spans)) == len(spans)
    offsets = np.cumsum((0, *spans[:-1])) if disjoint else np.zeros(len(spans), dtype=np.int64)
    matrix = np.stack(
        [o + rng.integers(0, s, 50) for o, s in zip(offsets, spans, strict=True)], axis=1
    )
    segments = batch_segments(matrix)
    assert (len(segments) == len(spans)) == disjoint
    ids = np.concatenate([s.ids for s in segments])
    once = np.concatenate([s.once_example for s in segments])
    expected_ids, expected_once = _expected(matrix)
    assert np.array_equal(ids, expected_ids) and np.array_equal(once, expected_once)


def test_batch_segments_reject_negative_ids() -> None:
    with pytest.raises(ValueError, match="column 1"):
        batch_segments(np.array([[1, -3]]))


def test_rowmap_hash_and_direct_share_one_index() -> None:
    rowmap = RowMap(direct_ranges=[(100, 10)], initial_slots=16)
    rng = np.random.default_rng(1)
    seen: dict[int, int] = {}
    for _ in range(30):  # grows the hash several times
        keys = np.unique(rng.integers(0, 100, 20) * 7919 + 1000)
        local = np.unique(rng.integers(0, 10, 4))
        rows = np.concatenate([rowmap.index(keys), rowmap.index_direct(0, local)])
        for key, row in zip(
            np.concatenate([keys, local + 100]).tolist(), rows.tolist(), strict=True
        ):
            assert seen.setdefault(key, row) == row
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
