"""What every model shares: its config, the dense-part interface, and the seeded initial state.

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
from dataclasses import dataclass, field

import torch
from torch import nn

from bagpipe.core.batch import DatasetSchema


@dataclass(frozen=True)
class ModelConfig:
    """Which model, and its architecture. ``name`` is one of ``dlrm``, ``wdl``, ``deepfm``, ``dcn``.

    Sizes of the MLPs are lists of layer widths *after* the input layer (the input width follows from
    the dataset and ``embedding_dim``). Defaults are small, CPU-sized; the paper's architectures are
    given by :func:`paper_config`.
    """

    name: str = "dlrm"
    embedding_dim: int = 16
    # On the dense features: DLRM/DeepFM/DCN's bottom MLP (must end in embedding_dim), W&D's deep
    # tower (any width).
    bottom_mlp: tuple[int, ...] = (64, 16)
    # To the logit (must end in 1): DLRM's top MLP, W&D's head over [embeddings || deep tower],
    # DeepFM's deep MLP over the fields, DCN's over-arch.
    top_mlp: tuple[int, ...] = (64, 32, 1)
    # DCN's low-rank cross net:
    cross_layers: int = 2
    cross_rank: int = 8
    dropout: float = 0.0
    extra: dict[str, float] = field(default_factory=dict)


class RecModel(nn.Module, ABC):
    """The dense part of a recommendation model: pooled embeddings and dense features to logits."""

    def __init__(self, config: ModelConfig, schema: DatasetSchema) -> None:
        super().__init__()
        self.config = config
        self.schema = schema

    @abstractmethod
    def forward(self, dense: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        """``dense [B, num_dense]``, ``pooled [B, F, table_dim]`` -> logits ``[B]``."""
