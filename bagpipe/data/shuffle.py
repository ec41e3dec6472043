"""A deterministic, random-access shuffle of a row range that never holds the whole permutation.

A full permutation of every row per epoch (what an in-memory source can afford) costs 8 bytes a row:
366 MB for Kaggle, 35 GB for Terabyte, in every process that replays the stream. This shuffle keeps
only a block order and one window's permutation, and still lets any position be looked up without
the ones before it (the oracle peeks ahead, a recovered job resumes mid-epoch).

Epoch ``e`` of ``rows`` rows, ``block_rows`` rows a block, ``window_blocks`` blocks a window::

    rows            [b0      | b1      | b2      | b3      | b4  ]   blocks of consecutive rows
    block order e   [b3      | b0      | b4  | b2      | b1      ]   seeded by (seed, e)
    windows         [w0 = b3 b0         | w1 = b4 b2 | w2 = b1   ]   window_blocks blocks each (2 here)
    stream e        each window's rows in a permutation seeded by (seed, e, window)

Position ``p`` of epoch ``e`` is the row at ``p`` of that stream.

What it guarantees:

* **Determinism.** The row at ``(epoch, position)`` depends only on ``seed``, ``rows``,
  ``block_rows`` and ``window_blocks``: not on the batch size, the process, or the order of reads.
  The same seed gives the same order; another seed, another order.
* **Every row once per epoch.** Each epoch's stream is a permutation of the range, so reading
  positions ``0 .. rows-1`` visits every row exactly once. (A source dropping an epoch's last partial
  batch skips those positions' rows in that epoch; they are other rows in the next.)
* **Mixing.** Within a window the order is uniformly random. Rows of different windows mix only
  through the block order: the rows of one block always land in one window of an epoch, at most
  ``window_blocks * block_rows`` positions apart, so a batch draws from ``window_blocks`` (or,
  straddling two windows, up to twice as many) blocks of the range. That is the price of bounded
  memory, the same trade as a streaming shuffle buffer.

Memory: the block order (``rows / block_rows`` entries) and the permutations of the few windows
looked up most recently (4 bytes a row of a window), whatever the range's size.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

BLOCK_ROWS = 1 << 15
WINDOW_BLOCKS = 16  # 512k rows a window: 2 MB of permutation
_CACHED_WINDOWS = 4  # a batch straddles at most two; slices and ids of the same step reuse them
_TAG_BLOCKS, _TAG_WINDOW = 11, 12


class BlockShuffle:
    """Epoch-seeded block order plus in-window permutations (see the module docstring)."""

    def __init__(
        self, rows: int, seed: int, block_rows: int = BLOCK_ROWS, window_blocks: int = WINDOW_BLOCKS
    ) -> None:
        if rows < 1 or block_rows < 1 or window_blocks < 1:
            raise ValueError(f"rows={rows}, block_rows={block_rows}, window_blocks={window_blocks}: "
                             "all must be positive")
        self.rows, self.seed = rows, seed
        self.block_rows, self.window_blocks = block_rows, window_blocks
        self.num_blocks = -(-rows // block_rows)
        self._orders: OrderedDict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = OrderedDict()
        self._windows: OrderedDict[tuple[int, int], np.ndarray] = OrderedDict()

    def __getstate__(self) -> dict:
        """Pickled without the cached orders (sent to role processes: they rebuild on use)."""
        state = dict(self.__dict__)
        state["_orders"], state["_windows"] = OrderedDict(), OrderedDict()
        return state

    def rows_at(self, epoch: int, start: int, stop: int) -> np.ndarray:
        """The rows (``0 .. rows-1``) at positions ``start .. stop`` of epoch ``epoch``'s stream."""
        if not 0 <= start <= stop <= self.rows:
            raise IndexError(f"positions {start}..{stop} outside an epoch of {self.rows} rows")
        order, ends, window_starts = self._order(epoch)
        positions = np.arange(start, stop, dtype=np.int64)
        windows = np.searchsorted(window_starts, positions, side="right") - 1
        shuffled = np.empty_like(positions)
        for window in np.unique(windows).tolist():
            mine = windows == window
            base = int(window_starts[window])
            perm = self._window(epoch, window, int(window_starts[window + 1]) - base)
            shuffled[mine] = base + perm[positions[mine] - base]
        slot = np.searchsorted(ends, shuffled, side="right")  # the block at each shuffled position
        block = order[slot]
        return block * self.block_rows + shuffled - (ends[slot] - self._block_sizes(block))

    def _block_sizes(self, blocks: np.ndarray) -> np.ndarray:
        return np.minimum(self.block_rows, self.rows - blocks * self.block_rows)

    def _order(self, epoch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Epoch ``epoch``'s block order, where each of its blocks ends in the stream, and where
        each window starts (plus the stream's end)."""
        cached = self._orders.get(epoch)
        if cached is None:
            order = np.random.default_rng([self.seed, _TAG_BLOCKS, epoch]).permutation(self.num_blocks)
            ends = np.cumsum(self._block_sizes(order))
            window_starts = np.concatenate(([0], ends[self.window_blocks - 1::self.window_blocks]))
            if window_starts[-1] != self.rows:
                window_starts = np.append(window_starts, self.rows)
            cached = order, ends, window_starts
            self._orders[epoch] = cached
            while len(self._orders) > 2:
                self._orders.popitem(last=False)
        return cached

    def _window(self, epoch: int, window: int, size: int) -> np.ndarray:
        """The permutation of window ``window``'s ``size`` positions in epoch ``epoch`` (int32)."""
        key = (epoch, window)
        perm = self._windows.get(key)
        if perm is None:
            rng = np.random.default_rng([self.seed, _TAG_WINDOW, epoch, window])
            perm = rng.permutation(size).astype(np.int32)
            self._windows[key] = perm
            while len(self._windows) > _CACHED_WINDOWS:
                self._windows.popitem(last=False)
        else:
            self._windows.move_to_end(key)
        return perm
