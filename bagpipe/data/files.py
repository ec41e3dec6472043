"""Raw input files as mapped ``Examples``, one block at a time: what preprocessing consumes.

Categorical value -> row, two modes (``mapping``):

* ``"hash_mod"`` (default): ``codec.keys_to_rows`` with fixed table sizes (DLRM's
  ``max_ind_range``: the modulo of the value's hash; Criteo's empty field -> row 0). One pass, no
  state, distinct values may collide. Table sizes come from the preset at the configured scale, so a
  file written from the generator at that scale reads back to the generator's exact ids.
* ``"vocab"``: a counting pass builds each table's vocabulary first (``bagpipe.data.vocab``), then
  values get their vocabulary rows. No collisions; the table sizes come from the data. Like DLRM's
  dictionaries, the vocabulary spans all rows read.

JSON lines already hold table rows, so no mapping applies to them.
"""

from __future__ import annotations

import glob
import os
import zlib
from collections.abc import Callable, Generator, Iterator, Sequence
from functools import partial

import numpy as np

from bagpipe.data.codec import keys_to_rows
from bagpipe.data.examples import Examples, dlrm_dense_transform
from bagpipe.data.readers import RawBlock, ReadStats, iter_avazu_csv, iter_criteo_tsv, iter_jsonl
from bagpipe.data.segments import ordered_map

#: Maps one table's ``[N]`` uint64 keys and missing flags to ``[N]`` int64 rows.
ColumnMap = Callable[[np.ndarray, np.ndarray], np.ndarray]


def expand_paths(path: str) -> list[str]:
    """A file, or a glob such as ``/data/day_*.gz`` (sorted: day files in day order)."""
    paths = sorted(glob.glob(path)) if glob.has_magic(path) else [path]
    if not paths:
        raise FileNotFoundError(f"no file matches path={path!r}")
    return paths


def raw_blocks(
    kind: str, path: str, skip_bad_rows: bool, stats: ReadStats
) -> Generator[RawBlock, None, None]:
    """Parsed rows of one Criteo TSV or Avazu CSV file, categorical values as keys."""
    if kind == "criteo_tsv":
        return iter_criteo_tsv(path, skip_bad_rows=skip_bad_rows, stats=stats)
    if kind == "avazu_csv":
        return iter_avazu_csv(path, skip_bad_rows=skip_bad_rows, stats=stats)
    raise ValueError(f"no raw-key reader for kind {kind!r}")


def hash_mod_columns(kind: str, table_sizes: Sequence[int]) -> list[ColumnMap]:
    """Per-table hash-mod maps; Criteo's empty field keeps row 0, Avazu (no empty fields) hashes
    every value."""
    reserve_missing = kind == "criteo_tsv"
    return [partial(keys_to_rows, rows=rows, reserve_missing=reserve_missing) for rows in table_sizes]


def map_block(path: str, block: RawBlock, *, columns: Sequence[ColumnMap]) -> Examples:
    """A parsed block as labelled examples: table rows for keys, DLRM-transformed dense values."""
    if block.labels is None:
        raise ValueError(f"{path}: no labels (a test file?); a training dataset needs them")
    if len(columns) != block.keys.shape[1]:
        raise ValueError(f"{path} has {block.keys.shape[1]} categorical features, the schema "
                         f"{len(columns)}")
    ids = np.empty(block.keys.shape[::-1], dtype=np.int64)  # column-major, like the keys
    for f, column in enumerate(columns):
        ids[f] = column(block.keys[:, f], block.key_missing[:, f])
    return Examples(block.labels, dlrm_dense_transform(block.dense_raw), ids.T)


def mapped_blocks(
    kind: str, path: str, columns: Sequence[ColumnMap], table_sizes: Sequence[int], num_dense: int,
    skip_bad_rows: bool, stats: ReadStats, then: Callable[[Examples], Examples] | None = None,
) -> Iterator[Examples]:
    """Every row of one file as ``Examples`` (``columns`` map keys; JSON lines are checked against
    ``table_sizes`` instead), each block passed through ``then`` if given: on the read threads,
    so a consumer's per-block work runs there rather than in its own thread."""
    if kind == "jsonl":
        blocks: Iterator[Examples] = iter_jsonl(
            path, table_sizes, num_dense=num_dense, skip_bad_rows=skip_bad_rows, stats=stats)
        yield from map(then, blocks) if then is not None else blocks
        return
    work = partial(map_block, path, columns=columns)
    yield from ordered_map(work if then is None else lambda block: then(work(block)),
                           raw_blocks(kind, path, skip_bad_rows, stats))  # on the read threads


_SAMPLE_BYTES = 1 << 20


def estimate_rows(path: str) -> int:
    """About the rows of one file: its size over the line length of its first MiB, scaled by the
    first MiB's compression ratio for a ``.gz`` (for progress bars and disk-space checks)."""
    with open(path, "rb") as handle:
        head = handle.read(_SAMPLE_BYTES)
    sample, ratio = head, 1.0
    if path.endswith(".gz") and head:
        sample = zlib.decompressobj(zlib.MAX_WBITS | 16).decompress(head)
        ratio = len(sample) / len(head)
    bytes_per_row = max(1, len(sample) // max(1, sample.count(b"\n")))
    return int(os.path.getsize(path) * ratio / bytes_per_row) + 1
