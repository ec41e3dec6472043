"""Writes mapped ``Examples`` into shards (``shard_format``), one input file after another.

Blocks are held (not copied) until they make ``shard_rows`` rows, or the input file ends; then each
column file is written as its ``.npy`` header followed by every block's rows, cast on the way. Memory
is one shard's blocks, whatever the dataset's size.
The writer only ever writes into the directory it is given; making that directory look complete
(the manifest, then the rename) is the cache's job (``bagpipe.data.cache``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bagpipe.data.examples import Examples
from bagpipe.data.shard_format import COLUMNS, SHARD_ROWS, Manifest, column_path, column_width


def shard_layout(block: Examples, id_dtype: np.dtype) -> Examples:
    """``block`` as the shards store it: labels int8, dense float32, ids ``id_dtype``, each
    row-major and contiguous. The writer lays out whatever it is given; a producer with threads to
    spare calls this first (preparing does, on the read threads), which leaves the writer's
    thread only copying bytes into files (``ShardWriter.append``'s cost was a sixth of
    preparing's CPU time, all of it on the one thread that consumes the blocks)."""
    assert block.labels is not None
    return Examples(np.ascontiguousarray(block.labels, dtype=np.int8),
                    np.ascontiguousarray(block.dense, dtype=np.float32),
                    np.ascontiguousarray(block.ids, dtype=id_dtype))


class ShardWriter:
    """Appends blocks of examples of the current input file; records shards in ``manifest``."""

    def __init__(self, directory: Path, manifest: Manifest, id_dtype: np.dtype,
                 shard_rows: int = SHARD_ROWS) -> None:
        self.directory, self.manifest = directory, manifest
        self.id_dtype: np.dtype = id_dtype
        self.shard_rows = shard_rows
        self._pending: list[Examples] = []  # the next shard's rows, not yet copied anywhere
        self._held = 0
        self._file = -1

    def begin_file(self, index: int) -> None:
        """Rows appended from now on come from input file ``index``."""
        self._flush()
        self._file = index

    def append(self, block: Examples) -> None:
        assert block.labels is not None  # mapped blocks of a training file are labelled
        self.manifest.positives += int(np.count_nonzero(block.labels))
        while len(block):
            take = min(len(block), self.shard_rows - self._held)
            self._pending.append(block.take(slice(0, take)))
            self._held += take
            block = block.take(slice(take, len(block)))
            if self._held == self.shard_rows:
                self._flush()

    def close(self) -> None:
        """Write the last partial shard."""
        self._flush()

    def _flush(self) -> None:
        """The pending rows as one shard: each column's header, then every block's rows."""
        if not self._pending:
            return
        shard = len(self.manifest.shard_rows)
        dtypes: dict[str, np.dtype] = {"labels": np.dtype(np.int8), "dense": np.dtype(np.float32),
                                       "ids": self.id_dtype}
        for column in COLUMNS:
            with open(column_path(self.directory, shard, column), "wb") as out:
                np.lib.format.write_array_header_1_0(out, {
                    "descr": np.lib.format.dtype_to_descr(dtypes[column]), "fortran_order": False,
                    "shape": (self._held, *column_width(self.manifest, column))})
                for block in self._pending:
                    values = getattr(block, column)
                    np.ascontiguousarray(values, dtype=dtypes[column]).tofile(out)
        self.manifest.shard_rows.append(self._held)
        self.manifest.shard_files.append(self._file)
        self._pending, self._held = [], 0
