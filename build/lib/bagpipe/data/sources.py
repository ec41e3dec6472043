"""``BatchSource`` implementations: batches drawn from the generator, or sliced from arrays.

Both are deterministic and random access (``source[i]`` never needs batches ``< i``), which the
oracle's lookahead and job recovery rely on.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from bagpipe.core.batch import Batch, DatasetSchema
from bagpipe.data.examples import Examples
from bagpipe.data.generator import SyntheticGenerator


class _IndexedSource:
    """Shared sequence behaviour; subclasses implement ``_make(index)``."""

    schema: DatasetSchema
    batch_size: int
    num_batches: int

    def __len__(self) -> int:
        return self.num_batches

    def __getitem__(self, index: int) -> Batch:
        if not 0 <= index < self.num_batches:
            raise IndexError(f"batch {index} out of range [0, {self.num_batches})")
        return self._make(index)

    def __iter__(self) -> Iterator[Batch]:
        return (self._make(i) for i in range(self.num_batches))

    def _make(self, index: int) -> Batch:
        raise NotImplementedError


class SyntheticSource(_IndexedSource):
    """Batch ``i`` of a split is the generator's block ``(split, i)`` (seeded by seed, split, i)."""

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

    def _make(self, index: int) -> Batch:
        return self.examples(index).to_batch(self.schema.feature_names)


class ArraySource(_IndexedSource):
    """Consecutive ``batch_size`` slices of in-memory examples.

    An epoch is ``len(examples) // batch_size`` batches (the remainder is dropped). Batches past the
    first epoch wrap around. With ``shuffle_seed`` each epoch ``e`` visits the rows in a permutation
    seeded by ``(shuffle_seed, e)``; without it, in file order every epoch.
    """

    def __init__(
        self,
        examples: Examples,
        schema: DatasetSchema,
        batch_size: int,
        num_batches: int | None = None,
        shuffle_seed: int | None = None,
    ) -> None:
        self.batches_per_epoch = len(examples) // batch_size if batch_size > 0 else 0
        if self.batches_per_epoch < 1:
            raise ValueError(f"{len(examples)} examples do not fill one batch of {batch_size}")
        self.examples, self.schema, self.batch_size = examples, schema, batch_size
        self.num_batches = self.batches_per_epoch if num_batches is None else num_batches
        self.shuffle_seed = shuffle_seed

    def _rows(self, index: int) -> np.ndarray | slice:
        epoch, position = divmod(index, self.batches_per_epoch)
        start = position * self.batch_size
        if self.shuffle_seed is None:
            return slice(start, start + self.batch_size)
        order = np.random.default_rng([self.shuffle_seed, epoch]).permutation(len(self.examples))
        return order[start : start + self.batch_size]

    def _make(self, index: int) -> Batch:
        return self.examples.take(self._rows(index)).to_batch(self.schema.feature_names)
