"""Writes mapped ``Examples`` into shards (``shard_format``), one input file after another.

Rows are copied into a buffer of ``shard_rows`` rows per column; a full buffer (or the end of an
input file) becomes one shard's column files. Memory is the buffer, whatever the dataset's size.
The writer only ever writes into the directory it is given; making that directory look complete
(the manifest, then the rename) is the cache's job (``bagpipe.data.cache``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bagpipe.data.examples import Examples
from bagpipe.data.shard_format import SHARD_ROWS, Manifest, column_path


class ShardWriter:
    """Appends blocks of examples of the current input file; records shards in ``manifest``."""

    def __init__(self, directory: Path, manifest: Manifest, id_dtype: np.dtype,
                 shard_rows: int = SHARD_ROWS) -> None:
        self.directory, self.manifest = directory, manifest
        num_features = len(manifest.table_sizes)
        self._buffers: dict[str, np.ndarray] = {
            "labels": np.empty(shard_rows, np.int8),
            "dense": np.empty((shard_rows, manifest.num_dense), np.float32),
            "ids": np.empty((shard_rows, num_features), id_dtype),
        }
        self.shard_rows = shard_rows
        self._filled = 0
        self._file = -1

    def begin_file(self, index: int) -> None:
        """Rows appended from now on come from input file ``index``."""
        self._flush()
        self._file = index

    def append(self, block: Examples) -> None:
        assert block.labels is not None  # mapped blocks of a training file are labelled
        done = 0
        while done < len(block):
            take = min(len(block) - done, self.shard_rows - self._filled)
            rows, into = slice(done, done + take), slice(self._filled, self._filled + take)
            self._buffers["labels"][into] = block.labels[rows]
            self._buffers["dense"][into] = block.dense[rows]
            self._buffers["ids"][into] = block.ids[rows]
            self._filled += take
            done += take
            if self._filled == self.shard_rows:
                self._flush()
        self.manifest.positives += int(np.count_nonzero(block.labels))

    def close(self) -> None:
        """Write the last partial shard."""
        self._flush()

    def _flush(self) -> None:
        if self._filled == 0:
            return
        shard = len(self.manifest.shard_rows)
        for column, buffer in self._buffers.items():
            np.save(column_path(self.directory, shard, column), buffer[: self._filled])
        self.manifest.shard_rows.append(self._filled)
        self.manifest.shard_files.append(self._file)
        self._filled = 0
