"""Dense indices 0, 1, 2, ... for the global row ids seen so far, so per-row state is small.

Why: the original oracle kept two int64 arrays over *every* row of every table (14 GB at Terabyte
scale). Mapping the rows actually seen to dense indices lets per-row state live in arrays that grow
with the rows seen. Two ways to map, both vectorised over a batch of ids:

* a *direct* array (int32 over the table's rows): one gather, no hashing. A table is mapped
  directly if it is small (a fixed bound) or once the rows seen in it reach
  ``DIRECT_MIN_SEEN_FRACTION`` of its rows: from then on the array costs at most 128 B per row
  seen, about what the hash and the per-row state cost for those rows anyway, so memory stays
  proportional to the rows seen while the common case becomes one gather;
* an open-addressing hash (linear probing, Fibonacci hashing, load <= 1/2) for every other id:
  a lookup pass settles the known ids, one call numbers the new ones, an insert pass places them;
  each numpy pass settles most of the pending keys, so ``n`` keys cost a few O(n) passes. Keys
  and values are one ``[slots, 2]`` int64 array, so a probe touches one cache line.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise

import numpy as np

from bagpipe.oracle.growth import Growing, Reserve

_EMPTY = -1
_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)
_IDS_LAYOUT = [(np.int64, 0)]
MAX_ROWS = np.iinfo(np.int32).max  # dense indices are int32
DIRECT_MIN_SEEN_FRACTION = 1 / 32


class RowMap:
    """``index(ids, columns, bounds)``: dense int32 indices; a new id gets the next free one.

    Args:
        tables: ``(first_id, num_rows)`` of each column's table (ids ``first_id .. first_id +
            num_rows - 1``); empty if the ids' tables are unknown (then every id is hashed).
        direct_rows_max: tables of at most this many rows are mapped directly from the start.
        initial_slots: starting hash size (it doubles as needed).
    """

    def __init__(
        self,
        tables: Sequence[tuple[int, int]] = (),
        *,
        direct_rows_max: int = 0,
        initial_slots: int = 1 << 16,
    ) -> None:
        self._tables = list(tables)
        # int32 arrays of direct tables laid end to end: the small tables share the first, each
        # batch of tables gone direct gets its own (no copy), so a batch's ids take one gather per
        # array; ``_where[column] = (array, delta)``: a global id's position is id + delta
        self._arrays: list[np.ndarray] = []
        self._where: dict[int, tuple[int, int]] = {}
        self._seen = [0] * len(self._tables)  # rows seen per hashed table
        self._add_direct([c for c, (_, rows) in enumerate(self._tables) if rows <= direct_rows_max])
        self._initial_bits = max(4, (initial_slots - 1).bit_length())
        self._bits = self._initial_bits
        self._table = np.full((1 << self._bits, 2), _EMPTY, dtype=np.int64)  # [key, value]
        self._hashed = 0  # keys in the hash, dead ones included
        self._dead_ranges: list[tuple[int, int]] = []  # id ranges of tables gone direct
        self._id_arrays = Growing(_IDS_LAYOUT)
        (self._ids,) = self._id_arrays.arrays
        self._ids_reserve = Reserve(_IDS_LAYOUT)  # grows ``_ids`` without a stall
        self.size = 0

    @property
    def ids(self) -> np.ndarray:
        """``ids[index]`` = the global id with that dense index (a view of ``size`` entries)."""
        return self._ids[: self.size]

    def is_direct(self, column: int) -> bool:
        return column in self._where

    def index(self, ids: np.ndarray, columns: Sequence[int], bounds: np.ndarray) -> np.ndarray:
        """Dense indices of ``ids`` (unique, non-negative), given as per-column segments.

        ``ids[bounds[k]:bounds[k+1]]`` belong to column ``columns[k]`` (``-1``: unknown tables).
        New ids get the next indices (direct tables' first, then hashed ones, in segment order).
        """
        rows = np.empty(ids.size, dtype=np.int32)
        edges = bounds.tolist()
        segments = [(c, edges[k], edges[k + 1]) for k, c in enumerate(columns)]
        for array, direct in enumerate(self._arrays):
            mine = [seg for seg in segments if self._where.get(seg[0], (-1,))[0] == array]
            if mine:
                where = _positions(mine)
                deltas = [self._where[column][1] for column, _, _ in mine]
                sizes = [stop - start for _, start, stop in mine]
                delta = deltas[0] if len(mine) == 1 else np.repeat(deltas, sizes)
                rows[where] = self._index_direct(direct, ids[where], delta)
        hashed = [seg for seg in segments if seg[0] not in self._where]
        if hashed:
            where = _positions(hashed)
            rows[where], new = self._index_hashed(ids[where])
            self._count_new(hashed, new)
        return rows

    def _index_direct(
        self, direct: np.ndarray, ids: np.ndarray, delta: np.ndarray | int
    ) -> np.ndarray:
        at = ids + delta
        rows = direct.take(at)
        new = np.flatnonzero(rows < 0)
        if new.size:
            fresh = self._assign(ids.take(new))
            rows[new] = fresh
            direct[at.take(new)] = fresh
        return rows

    def _index_hashed(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Dense indices of ``keys`` through the hash, and which of them were new."""
        if 2 * (self._hashed + keys.size) > self._table.shape[0]:
            self._rehash(2 * (self._hashed + keys.size))
        rows = np.empty(keys.size, dtype=np.int32)
        new = self._lookup(keys, rows)
        if new.any():
            fresh = self._assign(keys[new])
            rows[new] = fresh
            self._insert(keys[new], fresh)
        return rows, new

    def _count_new(self, hashed: list[tuple[int, int, int]], new: np.ndarray) -> None:
        """Count the new rows of each hashed table; map a table directly once it is dense enough."""
        if not self._tables:
            return
        sizes = [stop - start for _, start, stop in hashed]
        ends = np.cumsum(sizes)
        new_so_far = np.concatenate(([0], np.cumsum(new)))
        counts = (new_so_far[ends] - new_so_far[ends - sizes]).tolist()
        switched = []
        for (column, _, _), count in zip(hashed, counts, strict=True):
            if column < 0:  # ids of unknown tables
                continue
            self._seen[column] += count
            if self._seen[column] >= DIRECT_MIN_SEEN_FRACTION * self._tables[column][1]:
                switched.append(column)
        if switched:
            self._go_direct(switched)

    def _go_direct(self, columns: list[int]) -> None:
        """Map ``columns``' tables directly from now on.

        Their keys stay in the hash, never probed again, until its next rehash drops them.
        """
        self._add_direct(columns)
        ids, direct = self.ids, self._arrays[-1]
        for column in columns:
            first, num_rows = self._tables[column]
            dense = np.flatnonzero((ids >= first) & (ids < first + num_rows))
            direct[ids[dense] + self._where[column][1]] = dense
            self._dead_ranges.append((first, first + num_rows))

    def _add_direct(self, columns: list[int]) -> None:
        """A new array (all ``_EMPTY``) for the tables of ``columns``, end to end.

        Filled at once: first touching its pages in order is far cheaper than by a random scatter.
        """
        if not columns:
            return
        used = 0
        for column in columns:
            self._where[column] = (len(self._arrays), used - self._tables[column][0])
            used += self._tables[column][1]
        self._arrays.append(np.full(used, _EMPTY, dtype=np.int32))

    def _assign(self, keys: np.ndarray) -> np.ndarray:
        """Append new ``keys`` to ``ids``; their dense indices."""
        end = self.size + keys.size
        if end > MAX_ROWS:
            raise OverflowError(f"RowMap: more than {MAX_ROWS} distinct rows")
        (self._ids,) = self._id_arrays.cover(end, self._ids_reserve.advance(end))
        self._ids[self.size : end] = keys
        fresh = np.arange(self.size, end, dtype=np.int32)
        self.size = end
        return fresh

    def _slots(self, keys: np.ndarray) -> np.ndarray:
        hashed = keys.astype(np.uint64) * _MULTIPLIER
        return (hashed >> np.uint64(64 - self._bits)).astype(np.int64)

    def _lookup(self, keys: np.ndarray, out: np.ndarray) -> np.ndarray:
        """Fill ``out`` for the keys in the hash; a mask of the others (a probe met an empty slot)."""
        table, mask = self._table, (1 << self._bits) - 1
        absent = np.zeros(keys.size, dtype=bool)
        pending = np.arange(keys.size)
        slots = self._slots(keys)
        wanted = keys
        while pending.size:
            entries = table.take(slots, axis=0)  # (``table[slots]`` is 15x slower)
            stored = entries[:, 0]
            found = stored == wanted
            out[pending[found]] = entries[found, 1]
            empty = stored == _EMPTY
            absent[pending[empty]] = True
            keep = ~(found | empty)
            pending, slots, wanted = pending[keep], (slots[keep] + 1) & mask, wanted[keep]
        return absent

    def _insert(self, keys: np.ndarray, values: np.ndarray) -> None:
        """Place ``keys`` (absent, unique) with their ``values`` at the first free slot from home."""
        flat, mask = self._table.reshape(-1), (1 << self._bits) - 1  # slot s: key 2s, value 2s+1
        self._hashed += keys.size
        slots = self._slots(keys)
        while keys.size:
            free = flat.take(2 * slots) == _EMPTY
            claimed, claimants = 2 * slots[free], keys[free]
            flat[claimed] = claimants  # several may race for a slot: one wins
            won = flat.take(claimed) == claimants
            flat[claimed[won] + 1] = values[free][won]
            free[free] = won
            keep = ~free
            keys, values, slots = keys[keep], values[keep], (slots[keep] + 1) & mask

    def _rehash(self, min_slots: int) -> None:
        """A table with room for ``min_slots`` keys at load 1/2, without the directly mapped keys."""
        used = self._table[self._table[:, 0] != _EMPTY]
        for low, high in self._dead_ranges:
            used = used[(used[:, 0] < low) | (used[:, 0] >= high)]
        self._dead_ranges.clear()
        min_slots -= 2 * (self._hashed - used.shape[0])
        self._bits = max(self._initial_bits, (max(1, min_slots) - 1).bit_length())
        self._table = np.full((1 << self._bits, 2), _EMPTY, dtype=np.int64)
        self._hashed = 0
        self._insert(used[:, 0].copy(), used[:, 1].copy())


def _positions(segments: list[tuple[int, int, int]]) -> np.ndarray | slice:
    """The positions covered by ``(column, start, stop)`` segments (a slice if they abut)."""
    if all(a[2] == b[1] for a, b in pairwise(segments)):
        return slice(segments[0][1], segments[-1][2])
    starts = np.array([start for _, start, _ in segments])
    sizes = np.array([stop - start for _, start, stop in segments])
    before = np.cumsum(sizes) - sizes  # positions in the concatenation before each segment
    return np.repeat(starts - before, sizes) + np.arange(int(sizes.sum()))
