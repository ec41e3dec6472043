"""Reads rows of a prepared dataset by position, touching only the rows asked for.

Every read maps the column files it needs for the duration of that read only, and copies the
requested rows out: a process holds no mapping between reads, so its resident memory is the rows it
has asked for, not the pages of every shard it has ever read (an open mapping keeps each page it
touched counted in the process's RSS). Column headers are parsed once and kept. A ``ShardSet``
pickles as a path and a few small arrays, so role processes can be handed one cheaply.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bagpipe.data.examples import Examples
from bagpipe.data.shard_format import Manifest, column_path, column_width

_OUT_DTYPES = {"labels": np.dtype(np.int8), "dense": np.dtype(np.float32), "ids": np.dtype(np.int64)}


class ShardSet:
    """The rows of a prepared dataset directory, in input order (a ``RowStore``)."""

    def __init__(self, directory: Path, manifest: Manifest) -> None:
        self.directory, self.manifest = directory, manifest
        self.starts = np.concatenate(([0], np.cumsum(manifest.shard_rows))).astype(np.int64)
        self._headers: dict[tuple[int, str], tuple[np.dtype, tuple[int, ...], int]] = {}

    def __len__(self) -> int:
        return int(self.starts[-1])

    def take(self, index: np.ndarray | slice) -> Examples:
        """Rows ``index`` (ascending or not) as labelled ``Examples`` (ids int64)."""
        labels, dense, ids = self._gather(index, ("labels", "dense", "ids"))
        return Examples(labels, dense, ids)

    def take_ids(self, index: np.ndarray | slice) -> np.ndarray:
        """Only the ``[N, F]`` int64 ids of rows ``index``."""
        (ids,) = self._gather(index, ("ids",))
        return ids

    def _gather(self, index: np.ndarray | slice, columns: tuple[str, ...]) -> list[np.ndarray]:
        rows = np.arange(*index.indices(len(self)), dtype=np.int64) if isinstance(index, slice) \
            else np.asarray(index, dtype=np.int64)
        if rows.size and (rows.min() < 0 or rows.max() >= len(self)):
            raise IndexError(f"rows outside [0, {len(self)}) of {self.directory}")
        order = np.argsort(rows, kind="stable")  # read each shard's rows in file order
        ordered = rows[order]
        shards = np.searchsorted(self.starts, ordered, side="right") - 1
        edges = np.flatnonzero(np.diff(shards)) + 1
        out = [np.empty((rows.size, *column_width(self.manifest, c)), _OUT_DTYPES[c]) for c in columns]
        for group in np.split(np.arange(rows.size), edges):
            if not group.size:
                continue
            shard = int(shards[group[0]])
            local = ordered[group] - self.starts[shard]
            contiguous = bool(np.all(np.diff(local) == 1))  # a run of rows: read as a slice
            picks = slice(int(local[0]), int(local[-1]) + 1) if contiguous else local
            for array, column in zip(out, columns, strict=True):
                array[order[group]] = self._mapped(shard, column)[picks]
        return out

    def _mapped(self, shard: int, column: str) -> np.ndarray:
        """Shard ``shard``'s column, mapped read-only (released when the array is dropped)."""
        key = (shard, column)
        if key not in self._headers:
            self._headers[key] = _read_header(column_path(self.directory, shard, column))
        dtype, shape, offset = self._headers[key]
        if 0 in shape:
            return np.empty(shape, dtype)
        return np.memmap(column_path(self.directory, shard, column), dtype, "r", offset, shape)


def _read_header(path: Path) -> tuple[np.dtype, tuple[int, ...], int]:
    """``(dtype, shape, data offset)`` of a C-ordered ``.npy`` file."""
    with open(path, "rb") as handle:
        version = np.lib.format.read_magic(handle)
        read = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                else np.lib.format.read_array_header_2_0)
        shape, fortran, dtype = read(handle)
        if fortran:
            raise ValueError(f"{path}: Fortran-ordered column; prepared shards are C-ordered")
        return np.dtype(dtype), tuple(shape), handle.tell()
