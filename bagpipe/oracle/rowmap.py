"""Dense indices 0, 1, 2, ... for the global row ids seen so far, so per-row state is small.

Why: the original oracle kept two int64 arrays over *every* row of every table (14 GB at Terabyte
scale). Mapping the rows actually seen to dense indices lets per-row state live in arrays that grow
with the rows seen. Two ways to map, both vectorised over a batch of keys:

* a *direct* table (an int32 array over the table's rows) for a small table: one gather, no
  hashing; its size is bounded by the caller's size limit, not by the rows seen;
* an open-addressing hash (linear probing, Fibonacci hashing, load <= 1/2) for every other id:
  each numpy pass over the pending keys settles most of them, so ``n`` keys cost a few O(n)
  passes. Keys and values are one ``[slots, 2]`` int64 array, so a probe touches one cache line.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

_EMPTY = -1
_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)
MAX_ROWS = np.iinfo(np.int32).max  # dense indices are int32


class RowMap:
    """``index(keys)`` / ``index_direct(table, local)``: dense int32 indices, new keys get the next.

    Args:
        direct_ranges: ``(first_id, num_rows)`` of each table mapped directly (ids
            ``first_id .. first_id + num_rows - 1``); callers pass those tables' ids only to
            ``index_direct`` and every other id only to ``index``.
        initial_slots: starting hash size (it doubles as needed).
    """

    def __init__(
        self, direct_ranges: Sequence[tuple[int, int]] = (), initial_slots: int = 1 << 16
    ) -> None:
        self._direct_first = [first for first, _ in direct_ranges]
        self._direct = [np.full(rows, _EMPTY, dtype=np.int32) for _, rows in direct_ranges]
        self._bits = max(4, (initial_slots - 1).bit_length())
        self._table = np.full((1 << self._bits, 2), _EMPTY, dtype=np.int64)  # [key, value]
        self._hashed = 0
        self._ids = np.empty(1024, dtype=np.int64)
        self.size = 0

    @property
    def ids(self) -> np.ndarray:
        """``ids[index]`` = the global id with that dense index (a view of ``size`` entries)."""
        return self._ids[: self.size]

    @property
    def nbytes(self) -> int:
        return self._table.nbytes + self._ids.nbytes + sum(d.nbytes for d in self._direct)

    def index_direct(self, table: int, local: np.ndarray) -> np.ndarray:
        """Dense indices of the unique rows ``local`` of direct table ``table``."""
        direct = self._direct[table]
        rows = direct[local]
        new = rows < 0
        if new.any():
            fresh = self._assign(local[new] + self._direct_first[table])
            rows[new] = fresh
            direct[local[new]] = fresh
        return rows

    def index(self, keys: np.ndarray) -> np.ndarray:
        """Dense indices of ``keys`` (int64, unique, non-negative) through the hash."""
        if 2 * (self._hashed + keys.size) > self._table.shape[0]:
            self._grow(2 * (self._hashed + keys.size))
        out = np.empty(keys.size, dtype=np.int32)
        self._probe(keys, out, assign_new=True)
        return out

    def _assign(self, keys: np.ndarray) -> np.ndarray:
        """Append new ``keys`` to ``ids``; their dense indices."""
        end = self.size + keys.size
        if end > MAX_ROWS:
            raise OverflowError(f"RowMap: more than {MAX_ROWS} distinct rows")
        if end > self._ids.size:
            bigger = np.empty(max(end, 2 * self._ids.size), dtype=np.int64)
            bigger[: self.size] = self._ids[: self.size]
            self._ids = bigger
        self._ids[self.size : end] = keys
        fresh = np.arange(self.size, end, dtype=np.int32)
        self.size = end
        return fresh

    def _slots(self, keys: np.ndarray) -> np.ndarray:
        hashed = keys.astype(np.uint64) * _MULTIPLIER
        return (hashed >> np.uint64(64 - self._bits)).astype(np.int64)

    def _probe(self, keys: np.ndarray, out: np.ndarray, *, assign_new: bool) -> None:
        """Find or claim a slot for every key; new keys get ``out`` (given or freshly assigned)."""
        table, mask = self._table, (1 << self._bits) - 1
        flat = table.reshape(-1)  # key of slot s at 2s, value at 2s + 1
        pending = np.arange(keys.size)
        slots = self._slots(keys)
        wanted = keys
        while pending.size:
            entries = table.take(slots, axis=0)  # (``table[slots]`` is 15x slower)
            found = entries[:, 0] == wanted
            if assign_new:
                out[pending[found]] = entries[found, 1]
            empty = entries[:, 0] == _EMPTY
            if empty.any():
                claimants, claimed = pending[empty], 2 * slots[empty]
                flat[claimed] = wanted[empty]  # several may race for a slot: one wins
                won = flat.take(claimed) == wanted[empty]
                winners, winner_keys = claimants[won], claimed[won] + 1
                if assign_new:
                    out[winners] = self._assign(keys[winners])
                flat[winner_keys] = out[winners]
                self._hashed += winners.size
                found[empty] = won
            keep = ~found
            pending, slots, wanted = pending[keep], (slots[keep] + 1) & mask, wanted[keep]

    def _grow(self, min_slots: int) -> None:
        used = self._table[self._table[:, 0] != _EMPTY]
        self._bits = max(self._bits + 1, (min_slots - 1).bit_length())
        self._table = np.full((1 << self._bits, 2), _EMPTY, dtype=np.int64)
        self._hashed = 0
        self._probe(used[:, 0], used[:, 1].astype(np.int32), assign_new=False)
