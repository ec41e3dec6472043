"""The prepared-dataset format: column files per shard, and the manifest that says it is complete.

A prepared dataset is one directory::

    manifest.json              written last: its presence means every shard below is complete
    00000.labels.npy           int8    [n]         0/1
    00000.dense.npy            float32 [n, Dd]     DLRM transform already applied
    00000.ids.npy              int32   [n, F]      table rows (int64 when a table exceeds 2**31 rows)
    00001.labels.npy ...       the next shard; a shard holds rows of one input file only
    vocab/t<f>.u64             (``mapping=vocab``) table f's sorted values, raw uint64

Why ``.npy`` per column group: read through ``numpy.memmap`` (no parse, no copy until rows are
gathered), it read a shuffled 4096-row batch out of a 1M-row shard in 1.8 ms (2.5 ms on a second
run) against 1.6 ms for Arrow IPC ``take`` on the same data, and 0.5 ms for a contiguous batch; the
two formats are equally fast, ``.npy`` needs nothing beyond numpy. A row's ids are stored together
(``[n, F]``, not one file per table) because every reader wants all of them at once.

Shards never span input files, so each file's first row is known (Terabyte's last day is its eval
split) and a shard is written in one go from a buffer of ``SHARD_ROWS`` rows.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
SHARD_ROWS = 1 << 19  # ~82 MB of Kaggle-shaped rows: the writer's buffer
COLUMNS = ("labels", "dense", "ids")


def column_path(directory: Path, shard: int, column: str) -> Path:
    return directory / f"{shard:05d}.{column}.npy"


def column_width(manifest: Manifest, column: str) -> tuple[int, ...]:
    """The shape of one row of ``column`` (labels: a scalar)."""
    return {"labels": (), "dense": (manifest.num_dense,), "ids": (len(manifest.table_sizes),)}[column]


def id_dtype(table_sizes: tuple[int, ...] | list[int]) -> np.dtype:
    """int32 ids unless a table has more rows than int32 can number."""
    return np.dtype(np.int32 if max(table_sizes, default=0) <= np.iinfo(np.int32).max else np.int64)


@dataclass
class SourceFile:
    """One input file: its fingerprint, the rows kept and the malformed rows skipped."""

    fingerprint: dict[str, object]
    rows: int = 0
    bad_rows: int = 0


@dataclass
class Manifest:
    """What a prepared dataset holds and how it was made (``manifest.json``).

    ``spec`` is the preparation's identity (kind, preset, mapping, table sizes or threshold, ...),
    ``shard_rows[i]`` the rows of shard ``i`` and ``shard_files[i]`` the input file it came from.
    """

    key: str
    spec: dict[str, object]
    table_sizes: list[int]
    num_dense: int
    files: list[SourceFile] = field(default_factory=list)
    shard_rows: list[int] = field(default_factory=list)
    shard_files: list[int] = field(default_factory=list)
    positives: int = 0
    prepare_s: float = 0.0
    format: int = FORMAT_VERSION

    @property
    def rows(self) -> int:
        return sum(self.shard_rows)

    @property
    def bad_rows(self) -> int:
        return sum(f.bad_rows for f in self.files)

    def file_first_rows(self) -> list[int]:
        """The first row of each input file in the prepared row space."""
        starts = np.concatenate(([0], np.cumsum([f.rows for f in self.files])))
        return [int(s) for s in starts[:-1]]

    def save(self, directory: Path) -> None:
        (directory / MANIFEST).write_text(json.dumps(dataclasses.asdict(self), indent=1))

    @classmethod
    def load(cls, directory: Path) -> Manifest:
        saved = json.loads((directory / MANIFEST).read_text())
        if saved.get("format") != FORMAT_VERSION:
            raise ValueError(f"{directory}: prepared with format {saved.get('format')}, this code "
                             f"reads {FORMAT_VERSION}; delete the directory to prepare it again")
        saved["files"] = [SourceFile(**f) for f in saved["files"]]
        return cls(**saved)
