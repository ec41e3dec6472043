"""Read a whole raw file (or a set of day files) into ``Examples`` with table rows for ids.

Categorical value -> row, two modes (``mapping``):

* ``"hash_mod"`` (default): ``codec.keys_to_rows`` with fixed table sizes (DLRM's
  ``max_ind_range``: the modulo of the value's hash; Criteo's empty field -> row 0). One pass, no
  state, distinct values may collide. Table sizes come from the preset at the configured scale, so a
  file written from the generator at that scale reads back to the generator's exact ids.
* ``"vocab"``: a pre-pass collects each table's distinct values (chunk by chunk, merged), then sorted
  values get rows ``1 .. n`` and the table has ``n + 1`` rows (row 0 = missing). No collisions; the
  table sizes come from the data. Like DLRM's dictionaries, the vocabulary spans all rows read.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterator, Sequence
from typing import Literal

import numpy as np
import pyarrow as pa

from bagpipe.core.memory import small_pages
from bagpipe.data.codec import Vocabulary, keys_to_rows
from bagpipe.data.examples import Examples
from bagpipe.data.readers import RawBlock, ReadStats, iter_avazu_csv, iter_criteo_tsv, iter_jsonl

Mapping = Literal["hash_mod", "vocab"]
MAPPINGS: tuple[str, ...] = ("hash_mod", "vocab")


def expand_paths(path: str) -> list[str]:
    """A file, or a glob such as ``/data/day_*.gz`` (sorted: day files in day order)."""
    paths = sorted(glob.glob(path)) if glob.has_magic(path) else [path]
    if not paths:
        raise FileNotFoundError(f"no file matches path={path!r}")
    return paths


def _raw_blocks(kind: str, paths: Sequence[str], skip_bad_rows: bool, stats: ReadStats) -> Iterator[RawBlock]:
    for path in paths:
        if kind == "criteo_tsv":
            yield from iter_criteo_tsv(path, skip_bad_rows=skip_bad_rows, stats=stats)
        elif kind == "avazu_csv":
            yield from iter_avazu_csv(path, skip_bad_rows=skip_bad_rows, stats=stats)
        else:
            raise ValueError(f"no raw-key reader for kind {kind!r}")


def _build_vocabularies(kind: str, paths: Sequence[str], skip_bad_rows: bool) -> list[Vocabulary]:
    distinct: list[np.ndarray] | None = None
    for block in _raw_blocks(kind, paths, skip_bad_rows, ReadStats()):
        present = [np.unique(block.keys[~block.key_missing[:, f], f]) for f in range(block.keys.shape[1])]
        distinct = present if distinct is None else [np.union1d(a, b) for a, b in zip(distinct, present, strict=True)]
    if distinct is None:
        raise ValueError(f"no rows in {list(paths)}: cannot build a vocabulary")
    return [Vocabulary(keys) for keys in distinct]


@small_pages()  # the output and every block's arrays are fresh memory, written once
def read_examples(
    kind: str,
    path: str,
    *,
    table_sizes: Sequence[int],
    num_dense: int,
    mapping: Mapping = "hash_mod",
    skip_bad_rows: bool = False,
) -> tuple[Examples, tuple[int, ...], ReadStats]:
    """All rows of ``path`` as labelled ``Examples``, the table sizes used, and the read stats.

    ``kind`` is ``"criteo_tsv"``, ``"avazu_csv"`` or ``"jsonl"`` (JSON lines already hold rows, so
    ``mapping`` does not apply and ids are checked against ``table_sizes``). Reads without
    numpy's huge-page advice (``bagpipe.core.memory.small_pages``: a 500k-row file read 20-40%
    faster).
    """
    paths = expand_paths(path)
    stats = ReadStats()
    num_features = len(table_sizes)
    if kind == "jsonl":
        parts = [block for p in paths for block in iter_jsonl(
            p, table_sizes, num_dense=num_dense, skip_bad_rows=skip_bad_rows, stats=stats)]
        return Examples.concat(parts, num_dense, num_features), tuple(table_sizes), stats
    reserve_missing = kind == "criteo_tsv"  # Avazu has no empty fields: every value is hashed
    vocabularies = _build_vocabularies(kind, paths, skip_bad_rows) if mapping == "vocab" else None
    sizes = tuple(v.rows for v in vocabularies) if vocabularies is not None else tuple(table_sizes)
    if len(sizes) != num_features:
        raise ValueError(f"{kind} has {len(sizes)} categorical features, the schema {num_features}")
    out = _Output(_estimate_rows(paths), num_dense, num_features)
    for block in _raw_blocks(kind, paths, skip_bad_rows, stats):
        if block.labels is None:
            raise ValueError(f"{path}: no labels (a test file?); a training dataset needs them")
        ids = np.empty(block.keys.shape[::-1], dtype=np.int64)  # column-major, like the keys
        for f, rows in enumerate(sizes):
            keys, missing = block.keys[:, f], block.key_missing[:, f]
            ids[f] = (vocabularies[f].lookup(keys, missing) if vocabularies is not None
                      else keys_to_rows(keys, missing, rows, reserve_missing))
        out.append(Examples.from_raw(block.labels, block.dense_raw, block.dense_missing, ids.T))
    return out.examples(), sizes, stats


_SAMPLE_BYTES = 1 << 20


def _estimate_rows(paths: Sequence[str]) -> int:
    """About 1.25x the rows of ``paths``: their size over the line length of the first file's
    first MiB (decompressed). Compressed files are underestimated; ``_Output`` then grows."""
    with pa.input_stream(paths[0]) as stream:  # compression detected from the extension
        sample = stream.read(_SAMPLE_BYTES)
    bytes_per_row = max(1, len(sample) // max(1, sample.count(b"\n")))
    return sum(os.path.getsize(p) for p in paths) * 5 // (4 * bytes_per_row) + 1024


class _Output:
    """The read ``Examples``, written block by block into arrays sized from an estimate.

    Keeping every block until one final concatenation would hold (and page in) the data twice; here
    each block is copied once and freed. The arrays take their dtypes and widths from the first
    block (a field a block lacks stays ``None``, as in ``Examples.concat``). Capacity doubles when
    the estimate falls short; the result is views of the rows written, and pages past them are never
    touched, so an over-estimate costs address space, not memory.
    """

    def __init__(self, capacity: int, num_dense: int, num_features: int) -> None:
        self.capacity, self.num_dense, self.num_features = capacity, num_dense, num_features
        self.rows = 0
        self.arrays: list[np.ndarray | None] | None = None

    def append(self, block: Examples) -> None:
        parts = (block.labels, block.dense, block.ids, block.dense_raw, block.dense_missing)
        if self.arrays is None:
            self.arrays = [None if part is None else np.empty((self.capacity, *part.shape[1:]), part.dtype)
                           for part in parts]
        start, end = self.rows, self.rows + len(block)
        if end > self.capacity:
            self.capacity = max(end, 2 * self.capacity)
            self.arrays = [None if a is None else _grown(a, self.capacity, start) for a in self.arrays]
        for array, part in zip(self.arrays, parts, strict=True):
            if array is not None:
                array[start:end] = part
        self.rows = end

    def examples(self) -> Examples:
        if self.arrays is None:  # no blocks at all
            return Examples.concat([], self.num_dense, self.num_features)
        labels, dense, ids, raw, missing = (None if a is None else a[: self.rows] for a in self.arrays)
        assert dense is not None and ids is not None
        return Examples(labels, dense, ids, raw, missing)


def _grown(array: np.ndarray, capacity: int, rows: int) -> np.ndarray:
    """``array`` with room for ``capacity`` rows, its first ``rows`` rows copied."""
    bigger = np.empty((capacity, *array.shape[1:]), array.dtype)
    bigger[:rows] = array[:rows]
    return bigger
