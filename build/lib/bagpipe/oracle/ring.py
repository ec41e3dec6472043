"""``UseRing``: the next use of every (step, unique id) use of the steps in the planner's window.

Each step owns a contiguous block of an int32 ring (never split across the ring's end), so a
step's next uses are a view, not a gather. Reading batch ``b`` writes ``b`` into the block slot of
each id's previous use (if that step is still live). Steps are released oldest first; the ring
grows (to a window's worth of blocks, or by half) only when the live blocks no longer fit, so in
steady state nothing is allocated.
"""

from __future__ import annotations

from collections import deque

import numpy as np

NEVER = np.iinfo(np.int32).max  # "no next use known"


class UseRing:
    """Blocks of next uses for live steps, allocated and released in step order."""

    def __init__(self, initial_slots: int = 1 << 20, max_live_steps: int = 1024) -> None:
        self._values = np.full(initial_slots, NEVER, dtype=np.int32)
        self._live: deque[tuple[int, int, int]] = deque()  # (step, base, count), oldest first
        # by step % size; a power of two, so that ``step & (size - 1)`` is the remainder
        self._bases = np.zeros(1 << (max(2, max_live_steps) - 1).bit_length(), dtype=np.int64)
        self._counts = np.zeros(self._bases.size, dtype=np.int64)
        self._used = 0

    @property
    def oldest_step(self) -> int:
        """The oldest live step (the next step to be added if none is live)."""
        return self._live[0][0] if self._live else -1

    def add(self, step: int, count: int) -> None:
        """A block of ``count`` slots (all ``NEVER``) for ``step``, newer than every live step."""
        if len(self._live) >= self._bases.size:
            self._rebase(self._values.size, 2 * self._bases.size)
        base = self._free_base(count)
        if base is None:  # room for a full window of blocks like this one, or half as much again
            steady = count * self._bases.size
            self._rebase(max(self._values.size * 3 // 2, (self._used + count) * 3 // 2, steady))
            base = self._free_base(count)
            assert base is not None
        self._values[base : base + count] = NEVER
        self._live.append((step, base, count))
        self._bases[step % self._bases.size] = base
        self._counts[step % self._bases.size] = count
        self._used += count

    def release_oldest(self) -> None:
        _, _, count = self._live.popleft()
        self._used -= count

    def next_uses(self, step: int) -> np.ndarray:
        """The live block of ``step`` (a view: next use of each of its ids, ``NEVER`` if unseen)."""
        base = int(self._bases[step % self._bases.size])
        count = int(self._counts[step % self._bases.size])
        return self._values[base : base + count]

    def record(self, steps: np.ndarray, positions: np.ndarray, next_step: int) -> None:
        """Set the next use of use ``positions[j]`` of step ``steps[j]`` (live steps) to ``next_step``."""
        slots = self._bases.take(steps & (self._bases.size - 1)) + positions
        self._values[slots] = next_step

    def _free_base(self, count: int) -> int | None:
        if not self._live:
            return 0 if count <= self._values.size else None
        head = self._live[0][1]
        _, newest_base, newest_count = self._live[-1]
        tail = newest_base + newest_count
        if head <= newest_base:  # live blocks do not wrap: free space after them and before them
            if tail + count <= self._values.size:
                return tail
            return 0 if count <= head else None
        return tail if tail + count <= head else None

    def _rebase(self, num_slots: int, num_bases: int | None = None) -> None:
        """Copy the live blocks, in order, to the start of a ring of ``num_slots`` slots."""
        values = np.empty(num_slots, dtype=np.int32)  # ``add`` fills each block it hands out
        bases = np.zeros(num_bases or self._bases.size, dtype=np.int64)
        counts = np.zeros(bases.size, dtype=np.int64)
        live: deque[tuple[int, int, int]] = deque()
        base = 0
        for step, old_base, count in self._live:
            values[base : base + count] = self._values[old_base : old_base + count]
            live.append((step, base, count))
            bases[step % bases.size] = base
            counts[step % bases.size] = count
            base += count
        self._values, self._bases, self._counts, self._live = values, bases, counts, live
