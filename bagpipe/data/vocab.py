"""Vocabulary mapping (DLRM style, with an optional frequency threshold), built with bounded memory.

A counting pass over the data gives every table's distinct values and how often each occurs; the
values seen at least ``threshold`` times become the vocabulary, sorted, so the mapping does not
depend on the order of the rows. Rows: 0 is the missing value (an empty field); with a threshold
above 1, row 1 is every rarer value and the vocabulary takes rows ``2 .. n+1``, else rows
``1 .. n`` (the "+1" convention of DLRM's dictionaries and Bagpipe's Avazu tables).

Why spill: Terabyte has 882M distinct raw values, 14 GB of (value, count) pairs. ``Counter`` keeps
each block's per-table (value, count) pairs in memory only up to ``budget_pairs``; then it merges
them per table and appends them to files, one per (table, value range) ("bucket": the top bits of
the 32-bit value, so buckets in order are values in order). Finishing merges one bucket of one table
at a time and appends its kept values to the table's vocabulary file (with no spill before, the
pairs held are merged directly). Peak memory: the budget, or one bucket, whichever is larger; never
every value. Lookups read the vocabulary files memory-mapped.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

BUDGET_PAIRS = 1 << 23  # 128 MB of (value, count) pairs held between spills
BUCKETS = 64
_BUCKET_SHIFT = np.uint64(32 - 6)  # 64 buckets over the 32-bit hash space; larger keys: the last


class Vocabulary:
    """One table's sorted kept values and the rows they map to (module docstring)."""

    def __init__(self, keys: np.ndarray, has_rare_row: bool) -> None:
        self.keys = keys
        self.first_row = 2 if has_rare_row else 1
        self.has_rare_row = has_rare_row

    @property
    def rows(self) -> int:
        return int(self.keys.size) + self.first_row

    def lookup(self, keys: np.ndarray, missing: np.ndarray) -> np.ndarray:
        """``[N]`` uint64 values -> int64 rows (0 when missing, 1 when rare)."""
        pos = np.searchsorted(self.keys, keys)
        found = pos < self.keys.size
        found[found] = self.keys[pos[found]] == keys[found]
        if not self.has_rare_row and not np.all(found | missing):
            raise KeyError("a value missing from the vocabulary (vocabularies cover the whole input)")
        return np.where(missing, 0, np.where(found, pos + self.first_row, 1)).astype(np.int64)


def _merge(keys: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted distinct keys and their summed counts."""
    distinct, inverse = np.unique(keys, return_inverse=True)
    return distinct, np.bincount(inverse, weights=counts, minlength=distinct.size).astype(np.int64)


class Counter:
    """Counts every table's values over one pass, spilling to ``spill_dir`` (module docstring)."""

    def __init__(self, num_tables: int, spill_dir: Path, budget_pairs: int = BUDGET_PAIRS) -> None:
        self.num_tables = num_tables
        self.spill_dir = spill_dir
        self.budget_pairs = budget_pairs
        self._pending: list[list[tuple[np.ndarray, np.ndarray]]] = [[] for _ in range(num_tables)]
        self._held = 0
        self._spilled = False
        spill_dir.mkdir(parents=True, exist_ok=True)

    def add(self, keys: np.ndarray, missing: np.ndarray) -> None:
        """One block's ``[N, F]`` keys (uint64) and missing flags."""
        for f in range(self.num_tables):
            distinct, counts = np.unique(keys[~missing[:, f], f], return_counts=True)
            self._pending[f].append((distinct, counts))
            self._held += distinct.size
        if self._held > self.budget_pairs:
            self._spill()

    def finish(self, threshold: int, out_dir: Path) -> list[Vocabulary]:
        """Every table's vocabulary (values seen at least ``threshold`` times), written to
        ``out_dir/t<table>.u64`` and read back memory-mapped."""
        if self._spilled:
            self._spill()
        out_dir.mkdir(parents=True, exist_ok=True)
        vocabularies = []
        for f in range(self.num_tables):
            path = out_dir / f"t{f}.u64"
            with open(path, "wb") as out:
                parts = (self._read_bucket(f, b) for b in range(BUCKETS)) if self._spilled \
                    else [self._take_pending(f)]
                for keys, counts in parts:  # in value order: buckets are value ranges
                    keys, counts = _merge(keys, counts)
                    keys[counts >= threshold].tofile(out)
            vocabularies.append(Vocabulary(_read_u64(path), has_rare_row=threshold > 1))
        return vocabularies

    def _take_pending(self, table: int) -> tuple[np.ndarray, np.ndarray]:
        pending, self._pending[table] = self._pending[table], []
        return (np.concatenate([k for k, _ in pending] or [np.zeros(0, np.uint64)]),
                np.concatenate([c for _, c in pending] or [np.zeros(0, np.int64)]))

    def _spill(self) -> None:
        self._spilled = True
        for f in range(self.num_tables):
            keys, counts = _merge(*self._take_pending(f))
            buckets = np.minimum(keys >> _BUCKET_SHIFT, BUCKETS - 1)
            edges = np.searchsorted(buckets, np.arange(BUCKETS + 1))
            for bucket in np.flatnonzero(np.diff(edges)).tolist():
                part = slice(edges[bucket], edges[bucket + 1])
                with open(self._bucket_path(f, bucket, "keys"), "ab") as out:
                    keys[part].tofile(out)
                with open(self._bucket_path(f, bucket, "counts"), "ab") as out:
                    counts[part].tofile(out)
        self._held = 0

    def _bucket_path(self, table: int, bucket: int, what: str) -> Path:
        return self.spill_dir / f"t{table}.b{bucket}.{what}"

    def _read_bucket(self, table: int, bucket: int) -> tuple[np.ndarray, np.ndarray]:
        keys_path = self._bucket_path(table, bucket, "keys")
        if not keys_path.exists():
            return np.zeros(0, np.uint64), np.zeros(0, np.int64)
        keys = np.fromfile(keys_path, dtype=np.uint64)
        counts = np.fromfile(self._bucket_path(table, bucket, "counts"), dtype=np.int64)
        keys_path.unlink()
        self._bucket_path(table, bucket, "counts").unlink()
        return keys, counts


def _read_u64(path: Path) -> np.ndarray:
    if path.stat().st_size == 0:
        return np.zeros(0, np.uint64)
    return np.memmap(path, dtype=np.uint64, mode="r")

