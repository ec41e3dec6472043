"""A batch source: a deterministic, random-access sequence of global batches.

Random access (``source[i]``) is what makes lookahead cheap (the oracle cacher peeks at batches
``i+1 .. i+L``, HET at ``i+1``) and what lets a recovered job resume at a data position. Every source
yields the same batches in the same order for the same seed.

Two narrower reads let each role read only what it uses, as it would on a host of its own:

* ``source.slice(index, part, parts)``: trainer ``part``'s slice of batch ``index``, exactly
  ``split_batch(source[index], parts)[part]`` (``bagpipe.core.batch``), reading or generating only
  that slice's rows;
* ``source.ids(index)``: the ``[B, F]`` per-table ids of batch ``index`` (no dense features, no
  labels), what Bagpipe's oracle plans on ahead of the trainers.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol, runtime_checkable

import torch

from bagpipe.core.batch import Batch, DatasetSchema


@runtime_checkable
class BatchSource(Protocol):
    """``len(source)`` global batches of ``batch_size`` examples each, addressable by index."""

    schema: DatasetSchema
    batch_size: int

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> Batch: ...

    def __iter__(self) -> Iterator[Batch]: ...

    def slice(self, index: int, part: int, parts: int) -> Batch:
        """``split_batch(self[index], parts)[part]``, reading only that slice's rows."""
        ...

    def ids(self, index: int) -> torch.Tensor:
        """``ids_matrix(self[index])``: ``[B, F]`` int64 per-table ids, nothing else read."""
        ...
