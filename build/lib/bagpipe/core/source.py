"""A batch source: a deterministic, random-access sequence of global batches.

Random access (``source[i]``) is what makes lookahead cheap (the oracle cacher peeks at batches
``i+1 .. i+L``, HET at ``i+1``) and what lets a recovered job resume at a data position. Every source
yields the same batches in the same order for the same seed.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol, runtime_checkable

from bagpipe.core.batch import Batch, DatasetSchema


@runtime_checkable
class BatchSource(Protocol):
    """``len(source)`` global batches of ``batch_size`` examples each, addressable by index."""

    schema: DatasetSchema
    batch_size: int

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> Batch: ...

    def __iter__(self) -> Iterator[Batch]: ...
