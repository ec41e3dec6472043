"""What every model shares: the dense-part interface and the seeded initial state (its config,
:class:`~bagpipe.core.interface.ModelConfig`, lives in the core, beside the other run settings).

A model is split in two (as torchrec splits ``SparseArch`` from the rest of ``DLRM``):

* the **sparse part**: embedding storage and lookup, supplied by each *system* its own way (one
  process, parameter servers, a cache, shards); it yields pooled embeddings ``[B, F, D]``;
* the **dense part** (:class:`RecModel`): everything after the lookup, shared code used identically
  by every system: ``logits = dense_part(dense_features [B, num_dense], pooled [B, F, D])``.

Initial weights are a pure function of the seed, so every system (and every process of a system)
starts from the same tables and the same dense weights.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
from torch import nn

from bagpipe.core.batch import DatasetSchema
from bagpipe.core.interface import ModelConfig


class RecModel(nn.Module, ABC):
    """The dense part of a recommendation model: pooled embeddings and dense features to logits."""

    def __init__(self, config: ModelConfig, schema: DatasetSchema) -> None:
        super().__init__()
        self.config = config
        self.schema = schema

    @abstractmethod
    def forward(self, dense: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        """``dense [B, num_dense]``, ``pooled [B, F, table_dim]`` -> logits ``[B]``."""
