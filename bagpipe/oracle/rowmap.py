"""A vectorised open-addressing hash map from global row ids to dense indices 0, 1, 2, ...

Why: the original oracle kept two int64 arrays over *every* row of every table (14 GB at Terabyte
scale). Mapping the rows actually seen to dense indices lets per-row state live in small arrays that
grow with the rows seen. The map probes linearly, a whole batch of keys per numpy pass; each pass
resolves most keys (load factor <= 1/2), so a lookup of ``n`` keys costs a few O(n) passes.
"""

from __future__ import annotations

import numpy as np

_EMPTY = -1
_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing: spreads consecutive ids


class RowMap:
    """``index(keys)`` returns each key's dense index, assigning the next free ones to new keys."""

    def __init__(self, initial_slots: int = 1 << 16) -> None:
        self._bits = max(4, (initial_slots - 1).bit_length())
        self._keys = np.full(1 << self._bits, _EMPTY, dtype=np.int64)
        self._values = np.empty(1 << self._bits, dtype=np.int64)
        self._ids = np.empty(1 << (self._bits - 1), dtype=np.int64)
        self.size = 0

    @property
    def ids(self) -> np.ndarray:
        """``ids[index]`` = the key with that dense index (a view of the first ``size`` entries)."""
        return self._ids[: self.size]

    @property
    def nbytes(self) -> int:
        return self._keys.nbytes + self._values.nbytes + self._ids.nbytes

    def _slots(self, keys: np.ndarray) -> np.ndarray:
        hashed = keys.astype(np.uint64) * _MULTIPLIER
        return (hashed >> np.uint64(64 - self._bits)).astype(np.int64)

    def index(self, keys: np.ndarray) -> np.ndarray:
        """Dense indices of ``keys`` (int64, unique, non-negative), inserting the unseen ones."""
        if 2 * (self.size + keys.size) > self._keys.size:
            self._grow(2 * (self.size + keys.size))
        out = np.empty(keys.size, dtype=np.int64)
        self._probe(keys, out, assign_new=True)
        return out

    def _probe(self, keys: np.ndarray, out: np.ndarray, *, assign_new: bool) -> None:
        """Find or claim a slot for every key; new keys get ``out`` (given or freshly assigned)."""
        mask = (1 << self._bits) - 1
        pending = np.arange(keys.size)
        slots = self._slots(keys)
        while pending.size:
            wanted = keys[pending]
            found = self._keys[slots] == wanted
            if assign_new:
                out[pending[found]] = self._values[slots[found]]
            empty = self._keys[slots] == _EMPTY
            claimants = pending[empty]
            claimed_slots = slots[empty]
            self._keys[claimed_slots] = keys[claimants]  # several may race for a slot: one wins
            won = self._keys[claimed_slots] == keys[claimants]
            winners, winner_slots = claimants[won], claimed_slots[won]
            if assign_new:
                new_values = np.arange(self.size, self.size + winners.size)
                out[winners] = new_values
                self._ids[new_values] = keys[winners]
                self.size += winners.size
            self._values[winner_slots] = out[winners]
            settled = found
            settled[empty] = won
            keep = ~settled
            pending, slots = pending[keep], (slots[keep] + 1) & mask

    def _grow(self, min_slots: int) -> None:
        old_ids = self.ids.copy()
        self._bits = max(self._bits + 1, (min_slots - 1).bit_length())
        self._keys = np.full(1 << self._bits, _EMPTY, dtype=np.int64)
        self._values = np.empty(1 << self._bits, dtype=np.int64)
        self._ids = np.empty(1 << (self._bits - 1), dtype=np.int64)
        self._ids[: old_ids.size] = old_ids
        self._probe(old_ids, np.arange(old_ids.size, dtype=np.int64), assign_new=False)
