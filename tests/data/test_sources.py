"""``ArraySource``: fixed order, epochs wrap, seeded shuffle, random access."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bagpipe.core.batch import DatasetSchema, ids_matrix
from bagpipe.data import ArraySource, BatchSource
from bagpipe.data.examples import Examples


def _examples(n: int) -> tuple[Examples, DatasetSchema]:
    ids = np.stack([np.arange(n), np.arange(n) % 7], 1).astype(np.int64)
    examples = Examples((np.arange(n) % 2).astype(np.int8), np.zeros((n, 1), np.float32), ids)
    return examples, DatasetSchema("t", 1, (n, 7), ("cat_0", "cat_1"))


def test_array_source_order_wrap_and_shuffle() -> None:
    examples, schema = _examples(100)
    plain = ArraySource(examples, schema, batch_size=30, num_batches=5)
    assert isinstance(plain, BatchSource) and plain.batches_per_epoch == 3
    firsts = [int(ids_matrix(b)[0, 0]) for b in plain]
    assert firsts == [0, 30, 60, 0, 30]  # remainder dropped, wraps to a new epoch
    shuffled = ArraySource(examples, schema, batch_size=30, num_batches=6, shuffle_seed=1)
    epoch0 = torch.cat([ids_matrix(shuffled[i])[:, 0] for i in range(3)])
    epoch1 = torch.cat([ids_matrix(shuffled[i])[:, 0] for i in range(3, 6)])
    assert len(set(epoch0.tolist())) == 90 and not torch.equal(epoch0, epoch1)
    again = ArraySource(examples, schema, batch_size=30, num_batches=6, shuffle_seed=1)
    assert torch.equal(ids_matrix(again[4]), ids_matrix(shuffled[4]))
    with pytest.raises(IndexError):
        plain[5]
    with pytest.raises(ValueError, match="do not fill one batch"):
        ArraySource(examples, schema, batch_size=101)
