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
from collections.abc import Iterator, Sequence
from typing import Literal

import numpy as np

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
    ``mapping`` does not apply and ids are checked against ``table_sizes``).
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
    parts = []
    for block in _raw_blocks(kind, paths, skip_bad_rows, stats):
        if block.labels is None:
            raise ValueError(f"{path}: no labels (a test file?); a training dataset needs them")
        ids = np.empty(block.keys.shape[::-1], dtype=np.int64)  # column-major, like the keys
        for f, rows in enumerate(sizes):
            keys, missing = block.keys[:, f], block.key_missing[:, f]
            ids[f] = (vocabularies[f].lookup(keys, missing) if vocabularies is not None
                      else keys_to_rows(keys, missing, rows, reserve_missing))
        parts.append(Examples.from_raw(block.labels, block.dense_raw, block.dense_missing, ids.T))
    return Examples.concat(parts, num_dense, num_features), sizes, stats
