"""Trainer slices of a batch without dense features can be sent to another process."""

from __future__ import annotations

import torch

from bagpipe.core.batch import batch_from_arrays, split_batch


def test_slices_without_dense_features_own_their_empty_tensor() -> None:
    # FAE's re-packed batches are concatenations: a [B, 0] tensor with strides (1, 1), so row k of
    # a view sits at storage offset k of an empty storage, which RPC's unpickler refused (Avazu).
    dense = torch.cat([torch.zeros(3, 0), torch.zeros(5, 0)])
    batch = batch_from_arrays(dense, torch.arange(16).view(8, 2), torch.ones(8), ("a", "b"))
    for part in split_batch(batch, 2):
        assert part.dense_features.shape == (4, 0)
        assert part.dense_features.storage_offset() == 0
    with_dense = batch_from_arrays(torch.rand(8, 3), torch.arange(16).view(8, 2), torch.ones(8),
                                   ("a", "b"))
    second = split_batch(with_dense, 2)[1].dense_features
    assert second.data_ptr() == with_dense.dense_features[4:].data_ptr()  # still a view
