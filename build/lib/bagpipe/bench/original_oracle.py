"""The ORIGINAL Bagpipe oracle's algorithm, re-implemented to time ours against (bagpipe.md §2.2).

Faithful to its costs, not to its outputs (nothing here is returned or checked): dense per-row
int64 ``last_seen`` / ``lease`` arrays over every row of every table, built before the first batch
whatever rows the stream touches, and per-table ``np.unique`` and ``isin`` / ``setdiff1d`` per
batch. Its per-table unique/once computation is timed apart from its planning, since our figure
includes our unique/once (like with like: the sum).
"""

from __future__ import annotations

import time
from collections import deque

import numpy as np

__all__ = ["original_oracle", "state_bytes"]

#: Per table of one batch: its unique ids (table-local) and those used exactly once.
_TableUniques = list[tuple[np.ndarray, np.ndarray]]


def original_oracle(
    batches: list[np.ndarray], sizes: list[int], lookahead: int
) -> dict[str, float]:
    """The original oracle's per-batch work over ``batches`` (tables of ``sizes`` rows).

    Returns seconds spent in the per-table unique/once computation (``unique_s``) and in
    planning proper (``plan_s``).
    """
    # allocated before the clocks start, as the original does once at start-up
    last_seen = [np.full(size, -1, dtype=np.int64) for size in sizes]
    lease = [np.full(size, -1, dtype=np.int64) for size in sizes]
    started = time.perf_counter()
    uniques = _per_table_uniques(batches, sizes)
    unique_s = time.perf_counter() - started
    started = time.perf_counter()
    _plan(uniques, last_seen, lease, lookahead)
    return {"unique_s": unique_s, "plan_s": time.perf_counter() - started}


def state_bytes(sizes: list[int]) -> int:
    """The original's per-row state: two int64 arrays over every row of every table."""
    return 2 * 8 * sum(sizes)


def _per_table_uniques(batches: list[np.ndarray], sizes: list[int]) -> list[_TableUniques]:
    offsets = np.cumsum([0, *sizes[:-1]])
    per_batch = []
    for matrix in batches:
        tables = []
        for f in range(len(sizes)):
            ids, counts = np.unique(matrix[:, f] - offsets[f], return_counts=True)
            tables.append((ids, ids[counts == 1]))
        per_batch.append(tables)
    return per_batch


def _plan(
    uniques: list[_TableUniques],
    last_seen: list[np.ndarray],
    lease: list[np.ndarray],
    lookahead: int,
) -> None:
    """Each batch's sync-now/later split as it is read; each step's prefetch, leases and
    no-sync ids once ``lookahead`` later batches are known (per table: dense state arrays)."""
    window: deque = deque()
    num_tables = len(last_seen)
    for b in range(len(uniques)):
        now_later = []
        for f in range(num_tables):
            ids, _ = uniques[b][f]
            last_seen[f][ids] = b
            following = uniques[b + 1][f][0] if b + 1 < len(uniques) else ids[:0]
            now = ids[np.isin(ids, following, assume_unique=True)]
            now_later.append((now, np.setdiff1d(ids, now, assume_unique=True)))
        window.append((b, now_later))
        if len(window) < lookahead and b + 1 < len(uniques):
            continue
        i, now_later = window.popleft()
        for f in range(num_tables):
            ids, once = uniques[i][f]
            _prefetch = ids[lease[f][ids] < i]
            seen = last_seen[f][ids]
            reuse = ids[(seen > i) & (seen <= i + lookahead)]
            lease[f][reuse] = last_seen[f][reuse]
            no_sync = once[last_seen[f][once] == i]
            _later = np.setdiff1d(now_later[f][1], no_sync, assume_unique=True)
