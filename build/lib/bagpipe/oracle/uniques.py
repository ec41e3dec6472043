"""Unique ids of one global batch, and for ids used once, the trainer that uses them.

Why per column: each feature's ids lie in its own table's range, so the batch's sorted unique ids
are the per-column unique ids laid end to end in table order. The columns are handled in two
blocks, each with a fixed handful of numpy calls whatever the number of columns:

* columns over a small id span are laid side by side in one compact space and counted with one
  ``np.bincount`` (linear, no sort); one scatter records a using trainer per id;
* the other columns are sorted in one call, row by row, as ``local id << b | trainer`` keys (``b``
  bits hold the trainer), int32 when they fit: a sort gives the unique ids, their use counts (run
  lengths) and, for ids used once, the trainer, without an argsort or a second pass.

Only the trainer of a once-used id matters to the planner (it owns the singleton), not the example.
Columns whose id ranges overlap (raw matrices need not follow a schema) are sorted as one row.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MAX_ID = (1 << 47) - 1  # planners pack an id with a 16-bit field into an int64
BINCOUNT_SPAN_PER_EXAMPLE = 4  # count a column whose id span is at most 4 x B (or 2**16)
_BINCOUNT_MIN_SPAN = 1 << 16
_INT32_KEYS = 1 << 31


@dataclass(frozen=True)
class BatchUniques:
    """A batch's unique ids in ascending order, as consecutive per-column segments.

    ``ids[bounds[k]:bounds[k+1]]`` are the unique ids of column ``columns[k]`` (``-1``: of the
    whole batch, when columns overlap); ``once_owner[j]`` is the trainer whose slice of the batch
    holds the only use of ``ids[j]``, or -1 if it is used more than once.
    """

    ids: np.ndarray
    once_owner: np.ndarray
    columns: tuple[int, ...]
    bounds: np.ndarray


def batch_uniques(
    matrix: np.ndarray, num_trainers: int, owner_dtype: type[np.signedinteger]
) -> BatchUniques:
    """Unique ids of a ``[B, F]`` global-id matrix (``B`` a multiple of ``num_trainers``).

    Raises ``ValueError`` for ids outside ``[0, MAX_ID]``.
    """
    batch_size, num_columns = matrix.shape
    if matrix.size == 0:
        return BatchUniques(
            np.empty(0, np.int64), np.empty(0, owner_dtype), (-1,), np.zeros(2, np.int64)
        )
    columns_ids = np.ascontiguousarray(matrix.T, dtype=np.int64)  # [F, B]: contiguous reductions
    owners = np.arange(batch_size) // (batch_size // num_trainers)
    owner_bits = (num_trainers - 1).bit_length()
    lows, highs = columns_ids.min(axis=1), columns_ids.max(axis=1)
    if int(lows.min()) < 0 or int(highs.max()) > MAX_ID:
        bad = int(np.flatnonzero((lows < 0) | (highs > MAX_ID))[0])
        raise ValueError(
            f"column {bad} has global ids {int(lows[bad])}..{int(highs[bad])}; "
            f"they must lie in [0, 2**47)"
        )
    order = np.argsort(lows, kind="stable")
    if num_columns > 1 and bool(np.any(lows[order[1:]] <= highs[order[:-1]])):
        keys = ((columns_ids << owner_bits) | owners).reshape(1, -1)
        ids, once, bounds = _sorted_runs(keys, owner_bits, np.zeros(1, np.int64), owner_dtype)
        return BatchUniques(ids, once, (-1,), bounds)

    spans = highs - lows + 1
    small = spans[order] <= max(BINCOUNT_SPAN_PER_EXAMPLE * batch_size, _BINCOUNT_MIN_SPAN)
    blocks = []  # (columns, ids, once, per-column bounds)
    for counted, columns in ((True, order[small]), (False, order[~small])):
        if not columns.size:
            continue
        block = columns_ids[columns]
        if counted:
            found = _counted(block, lows[columns], spans[columns], owners, owner_dtype)
        else:
            block -= lows[columns, None]
            if (int(spans[columns].max()) << owner_bits) - 1 < _INT32_KEYS:
                block = block.astype(np.int32)  # and shift in int32: half the bytes to move
            block <<= owner_bits
            block |= owners.astype(block.dtype)
            found = _sorted_runs(block, owner_bits, lows[columns], owner_dtype)
        blocks.append((columns.tolist(), *found))
    if len(blocks) == 1:
        columns, ids, once, bounds = blocks[0]
        return BatchUniques(ids, once, tuple(columns), bounds)
    return _interleaved(blocks, order.tolist())


def _counted(
    block: np.ndarray,
    lows: np.ndarray,
    spans: np.ndarray,
    owners: np.ndarray,
    owner_dtype: type[np.signedinteger],
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Unique ids of columns with small spans (``block``: ``[c, B]`` ids, ascending ranges starting
    at ``lows``; overwritten) by counting.

    The columns are shifted side by side into ``[0, sum(spans))``, so one bincount serves all.
    The trainer of a once-used id is recorded only for the columns that have one (the smallest
    tables' ids are all used many times over).
    """
    starts = np.concatenate(([0], np.cumsum(spans)))
    block += (starts[:-1] - lows)[:, None]  # compact
    counts = np.bincount(block.reshape(-1), minlength=int(starts[-1]))
    present = np.flatnonzero(counts > 0)  # (a bool mask: 5x faster than int64 counts)
    single = counts == 1
    with_single = np.flatnonzero(np.logical_or.reduceat(single, starts[:-1]))
    user = np.empty(counts.size, dtype=owner_dtype)  # read only where a count is 1
    if with_single.size:
        written = block if with_single.size == block.shape[0] else block[with_single]
        user[written.reshape(-1)] = np.tile(owners.astype(owner_dtype), with_single.size)
    once = np.where(single.take(present), user.take(present), owner_dtype(-1))
    bounds = np.searchsorted(present, starts)
    ids = present + np.repeat(lows - starts[:-1], np.diff(bounds))
    return ids, once, bounds


def _sorted_runs(
    keys: np.ndarray, owner_bits: int, lows: np.ndarray, owner_dtype: type[np.signedinteger]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Unique ids of each row of ``keys`` (``[c, n]``, ``local id << owner_bits | trainer``).

    Sorts each row in place; a run of one local id is one unique id, ``lows[row] + local``.
    """
    keys.sort(axis=1)
    values = keys >> owner_bits
    starts_run = np.empty(keys.shape, dtype=bool)
    starts_run[:, 0] = True
    np.not_equal(values[:, 1:], values[:, :-1], out=starts_run[:, 1:])
    starts = np.flatnonzero(starts_run)
    single = np.diff(starts, append=keys.size) == 1
    first_keys = keys.reshape(-1)[starts]
    once = np.where(single, first_keys & ((1 << owner_bits) - 1), -1).astype(owner_dtype)
    bounds = np.searchsorted(starts, np.arange(keys.shape[0] + 1) * keys.shape[1])
    ids = (first_keys >> owner_bits).astype(np.int64) + np.repeat(lows, np.diff(bounds))
    return ids, once, bounds


def _interleaved(
    blocks: list[tuple[list[int], np.ndarray, np.ndarray, np.ndarray]], order: list[int]
) -> BatchUniques:
    """The blocks' per-column segments laid out in ``order`` (ascending id ranges)."""
    segment: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for columns, ids, once, bounds in blocks:
        edges = bounds.tolist()
        for k, column in enumerate(columns):
            segment[column] = (ids[edges[k] : edges[k + 1]], once[edges[k] : edges[k + 1]])
    sizes = [segment[c][0].size for c in order]
    return BatchUniques(
        np.concatenate([segment[c][0] for c in order]),
        np.concatenate([segment[c][1] for c in order]),
        tuple(order),
        np.concatenate(([0], np.cumsum(sizes))),
    )
