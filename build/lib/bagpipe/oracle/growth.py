"""How the planner's arrays grow: ``Reserve`` builds the next, larger buffers a slice at a time
ahead of need, so that growing is a copy into memory already in place.

Why: the planner's per-row arrays double as rows are seen, and the first write to each page of a
fresh buffer costs far more than the write itself (a page fault and zeroing). Done all at once when
an array overflows, that stalled the planning thread for 0.66 s at 7.6 M rows, several whole
batches' worth of planning. A reserve spreads the cost: once the rows seen pass 3/4 of the capacity,
every call fills a slice of the next buffers (with the arrays' fill values) in proportion to the
rows added, so the buffers are complete before the rows seen reach the capacity. The owner of the
arrays then copies its rows over (``Growing``). Memory stays proportional to the rows seen: from
3/4 of the capacity C on, the arrays and the next buffers take 3C, as a plain doubling takes at
the moment it copies.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

START_FRACTION = 3 / 4  # of the capacity C: the next buffers (2C slots) are begun at 3C/4 rows
SLOTS_PER_ROW_ADDED = 16  # and filled 16 slots per row added: complete at 7C/8
EAGER_SLOTS = 1 << 20  # next buffers up to this size are filled at once


class Reserve:
    """Builds, a slice per ``advance``, the next buffers of arrays with these ``(dtype, fill)``.

    One thread owns a reserve; the buffers it returns are complete and no longer touched by it.
    """

    def __init__(self, layout: Sequence[tuple[type, int | bool]]) -> None:
        self._layout = list(layout)
        self.capacity = 0  # slots of the buffers last returned
        self._next: list[np.ndarray] = []
        self._filled = 0
        self._used = 0

    def advance(self, used: int) -> list[np.ndarray] | None:
        """Note that ``used`` rows are now seen; the next buffers once they are complete, else
        ``None``. New buffers are begun once ``used`` passes ``START_FRACTION`` of ``capacity``
        (not at once: growing by doubling leaves the rows at half the new capacity).
        """
        added, self._used = max(0, used - self._used), used
        if not self._next:
            if used <= START_FRACTION * self.capacity:
                return None
            size = max(2 * self.capacity, 2 * used)
            self._next = [np.empty(size, dtype=dtype) for dtype, _ in self._layout]
            self._filled = 0
            if size <= EAGER_SLOTS:
                added = size
        size = self._next[0].size
        stop = min(size, self._filled + SLOTS_PER_ROW_ADDED * added)
        for buffer, (_, fill) in zip(self._next, self._layout, strict=True):
            buffer[self._filled : stop] = fill
        self._filled = stop
        if stop < size:
            return None
        ready, self._next = self._next, []
        self.capacity = size
        return ready


class Growing:
    """The owner's side: arrays of a layout, grown as the rows in use grow, into a reserve's
    buffers when it has handed some over, else into buffers of twice the size filled on the spot
    (the stall a reserve avoids; ``stalls`` counts them)."""

    def __init__(self, layout: Sequence[tuple[type, int | bool]]) -> None:
        self._layout = list(layout)
        self.arrays: list[np.ndarray] = [
            np.full(0, fill, dtype=dtype) for dtype, fill in self._layout
        ]
        self.stalls = 0
        self._used = 0  # rows that may differ from the fills
        self._ready: list[np.ndarray] | None = None

    def cover(self, rows: int, ready: list[np.ndarray] | None = None) -> list[np.ndarray]:
        """The arrays, covering ``rows`` rows in use from now on; ``ready``: buffers a reserve
        has just completed, kept until a growth needs them."""
        if ready is not None:
            self._ready = ready
        if rows > self.arrays[0].size:
            buffers = self._ready
            if buffers is None or buffers[0].size < rows:
                size = max(rows, 2 * self.arrays[0].size)
                buffers = [np.full(size, fill, dtype=dtype) for dtype, fill in self._layout]
                self.stalls += 1
            for old, new in zip(self.arrays, buffers, strict=True):
                new[: self._used] = old[: self._used]
            self.arrays, self._ready = buffers, None
        self._used = rows
        return self.arrays
