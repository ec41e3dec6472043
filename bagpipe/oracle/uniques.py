"""Unique ids of one global batch, and for ids used by one example only, that example.

Why per column: each feature's ids lie in its own table's range, so the batch's sorted unique ids
are the per-column unique ids laid end to end in table order. A column over a small id span is
counted with ``np.bincount`` (linear, no sort); a column over a large span is sorted alone, which
is several times cheaper than one sort of all ``B*F`` ids. Columns whose id ranges overlap (raw
matrices need not follow a schema) fall back to one packed sort of the whole batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MAX_ID = (1 << 47) - 1  # planners pack an id with a 16-bit field into an int64
BINCOUNT_SPAN_PER_EXAMPLE = 4  # bincount a column whose id span is at most 4 x B (or 2**16)
_BINCOUNT_MIN_SPAN = 1 << 16


@dataclass(frozen=True)
class Segment:
    """The unique ids of one column (``column = -1``: of the whole batch) and their once-examples.

    ``ids`` are sorted int64 global ids; ``once_example[j]`` is the example (row of the ``[B, F]``
    matrix) that uses ``ids[j]`` if exactly one example does, else -1.
    """

    column: int
    ids: np.ndarray
    once_example: np.ndarray


def batch_segments(matrix: np.ndarray) -> list[Segment]:
    """Unique ids of a ``[B, F]`` global-id matrix in ascending order, as consecutive segments.

    Raises ``ValueError`` for ids outside ``[0, MAX_ID]``.
    """
    batch_size, num_columns = matrix.shape
    if matrix.size == 0:
        empty = np.empty(0, dtype=np.int64)
        return [Segment(-1, empty, empty)]
    columns = np.ascontiguousarray(matrix.T, dtype=np.int64)  # [F, B]
    lows, highs = columns.min(axis=1), columns.max(axis=1)
    if int(lows.min()) < 0 or int(highs.max()) > MAX_ID:
        bad = int(np.flatnonzero((lows < 0) | (highs > MAX_ID))[0])
        raise ValueError(
            f"column {bad} has global ids {int(lows[bad])}..{int(highs[bad])}; "
            f"they must lie in [0, 2**47)"
        )
    order = np.argsort(lows, kind="stable")
    if num_columns > 1 and bool(np.any(lows[order[1:]] <= highs[order[:-1]])):
        ids, positions = _packed_unique(columns.reshape(-1), int(highs.max()))
        examples = np.where(positions >= 0, positions % batch_size, -1)
        return [Segment(-1, ids, examples)]
    bincount_span = max(BINCOUNT_SPAN_PER_EXAMPLE * batch_size, _BINCOUNT_MIN_SPAN)
    segments = []
    for column in order.tolist():
        low, span = int(lows[column]), int(highs[column] - lows[column]) + 1
        local = columns[column] - low
        if span <= bincount_span:
            ids, examples = _counted_unique(local, span)
        else:
            ids, examples = _packed_unique(local, span - 1)
        segments.append(Segment(column, ids + low, examples))
    return segments


def _counted_unique(local: np.ndarray, span: int) -> tuple[np.ndarray, np.ndarray]:
    """Unique values of ``local`` (all in ``[0, span)``) and once-positions, by counting."""
    counts = np.bincount(local, minlength=span)
    present = np.flatnonzero(counts)
    position = np.empty(span, dtype=np.int64)
    position[local] = np.arange(local.size)  # one writer for every count-1 value
    return present, np.where(counts[present] == 1, position[present], -1)


def _packed_unique(flat: np.ndarray, max_value: int) -> tuple[np.ndarray, np.ndarray]:
    """Sorted unique values of ``flat`` (in ``[0, max_value]``) and, per value, its position in
    ``flat`` if it occurs once, else -1.

    One sort of ``value << bits | position`` gives both, where ``np.unique(return_index=True)``
    would need a slower stable argsort.
    """
    bits = max(1, (flat.size - 1).bit_length())
    if max_value >= 1 << (63 - bits):
        raise ValueError(f"global ids must lie below 2**{63 - bits} for a batch of {flat.size} ids")
    packed = (flat << bits) | np.arange(flat.size, dtype=np.int64)
    packed.sort()
    values = packed >> bits
    starts = np.flatnonzero(np.concatenate(([True], values[1:] != values[:-1])))
    counts = np.diff(np.append(starts, flat.size))
    positions = packed[starts] & ((1 << bits) - 1)
    return values[starts], np.where(counts == 1, positions, -1)
