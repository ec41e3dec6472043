"""``BatchSource`` implementations: batches drawn from the generator, or read from a row store.

Both are deterministic and random access (``source[i]`` never needs batches ``< i``), which the
oracle's lookahead and job recovery rely on, and both read only what is asked for: a trainer's
``slice`` makes or reads only its own rows, ``ids`` only the id columns.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

import numpy as np
import torch

from bagpipe.core.batch import Batch, DatasetSchema, slice_bounds
from bagpipe.data.examples import Examples
from bagpipe.data.generator import SyntheticGenerator
from bagpipe.data.shuffle import BlockShuffle


class _IndexedSource:
    """Shared sequence behaviour; subclasses read rows ``start .. stop`` of batch ``index``
    (``_read``) and the ids of a whole batch (``_read_ids``)."""

    schema: DatasetSchema
    batch_size: int
    num_batches: int

    def __len__(self) -> int:
        return self.num_batches

    def __getitem__(self, index: int) -> Batch:
        return self._read(self._check(index), 0, self.batch_size)

    def __iter__(self) -> Iterator[Batch]:
        return (self[i] for i in range(self.num_batches))

    def slice(self, index: int, part: int, parts: int) -> Batch:
        """``split_batch(self[index], parts)[part]``, reading only that slice's rows."""
        return self._read(self._check(index), *slice_bounds(self.batch_size, part, parts))

    def ids(self, index: int) -> torch.Tensor:
        """The ``[B, F]`` int64 ids of batch ``index``; no dense features or labels are read."""
        return torch.from_numpy(self._read_ids(self._check(index)))

    def _check(self, index: int) -> int:
        if not 0 <= index < self.num_batches:
            raise IndexError(f"batch {index} out of range [0, {self.num_batches})")
        return index

    def _read(self, index: int, start: int, stop: int) -> Batch:
        raise NotImplementedError

    def _read_ids(self, index: int) -> np.ndarray:
        raise NotImplementedError


class SyntheticSource(_IndexedSource):
    """Batch ``i`` of a split is the generator's rows ``i*B .. (i+1)*B`` of that split."""

    def __init__(
        self, generator: SyntheticGenerator, split: str, schema: DatasetSchema, batch_size: int, num_batches: int
    ) -> None:
        if batch_size < 1 or num_batches < 0:
            raise ValueError(f"batch_size={batch_size}, num_batches={num_batches}")
        self.generator, self.split, self.schema = generator, split, schema
        self.batch_size, self.num_batches = batch_size, num_batches

    def examples(self, index: int) -> Examples:
        """Batch ``index`` as numpy arrays (with raw dense values, for writers)."""
        return self.generator.examples(self.split, index, self.batch_size)

    def _read(self, index: int, start: int, stop: int) -> Batch:
        first = index * self.batch_size
        rows = self.generator.rows(self.split, first + start, first + stop)
        return rows.to_batch(self.schema.feature_names)

    def _read_ids(self, index: int) -> np.ndarray:
        first = index * self.batch_size
        return self.generator.ids(self.split, first, first + self.batch_size)


class RowStore(Protocol):
    """Rows addressable by position: in-memory ``Examples`` or prepared shards (``ShardSet``)."""

    def __len__(self) -> int: ...

    def take(self, index: np.ndarray | slice) -> Examples: ...

    def take_ids(self, index: np.ndarray | slice) -> np.ndarray: ...


class RowSource(_IndexedSource):
    """Consecutive ``batch_size`` runs of rows ``span`` of a row store, epoch after epoch.

    An epoch is ``rows // batch_size`` batches (the remainder is dropped). Batches past the first
    epoch wrap around. Without ``shuffle_seed`` every epoch reads the rows in store order, batch
    ``i`` being one contiguous run; with it, epoch ``e`` reads them in the order of a
    ``BlockShuffle`` seeded by ``shuffle_seed`` (its docstring states what that order guarantees:
    deterministic, every row once per epoch, bounded memory).
    """

    def __init__(
        self,
        store: RowStore,
        schema: DatasetSchema,
        batch_size: int,
        num_batches: int | None = None,
        shuffle_seed: int | None = None,
        span: tuple[int, int] | None = None,
    ) -> None:
        self.first, stop = span if span is not None else (0, len(store))
        self.rows = stop - self.first
        if not 0 <= self.first <= stop <= len(store):
            raise ValueError(f"rows {self.first}..{stop} are not within the store's {len(store)}")
        self.batches_per_epoch = self.rows // batch_size if batch_size > 0 else 0
        if self.batches_per_epoch < 1:
            raise ValueError(f"{self.rows} examples do not fill one batch of {batch_size}")
        self.store, self.schema, self.batch_size = store, schema, batch_size
        self.num_batches = self.batches_per_epoch if num_batches is None else num_batches
        self.shuffle = BlockShuffle(self.rows, shuffle_seed) if shuffle_seed is not None else None

    def _rows(self, index: int, start: int, stop: int) -> np.ndarray | slice:
        """Store positions of rows ``start .. stop`` of batch ``index``."""
        epoch, position = divmod(index, self.batches_per_epoch)
        first = position * self.batch_size
        if self.shuffle is None:
            return slice(self.first + first + start, self.first + first + stop)
        return self.first + self.shuffle.rows_at(epoch, first + start, first + stop)

    def _read(self, index: int, start: int, stop: int) -> Batch:
        return self.store.take(self._rows(index, start, stop)).to_batch(self.schema.feature_names)

    def _read_ids(self, index: int) -> np.ndarray:
        return self.store.take_ids(self._rows(index, 0, self.batch_size)).astype(np.int64, copy=False)


#: In-memory ``Examples`` are a ``RowStore``: a ``RowSource`` over them (small files, fixtures,
#: benchmarks) keeps its historical name.
ArraySource = RowSource
