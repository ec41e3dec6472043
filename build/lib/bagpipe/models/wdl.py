"""Wide & Deep (Cheng et al. 2016), in the shape Bagpipe's W&D trainer used."""

from __future__ import annotations

import torch

from bagpipe.core.batch import DatasetSchema
from bagpipe.core.interface import ModelConfig
from bagpipe.models.base import RecModel
from bagpipe.models.layers import mlp, require


class WideDeep(RecModel):
    """Wide & Deep's dense part.

    * deep tower: ``bottom_mlp`` over the dense features (ReLU between layers, none at the end);
    * head: ``top_mlp`` (the paper: a single ``Linear(F*D + 256 -> 1)``, the "wide" part) over
      ``[flattened embeddings [B, F*D] || deep output]``.

    The original prototype built the flattened embeddings with
    ``cat(ly, 1).transpose(0, 1).reshape(-1, F*D)``, which mixes values of different samples
    (bagpipe.md §6 item 11). Here each sample's ``F`` vectors are flattened on their own, so a
    sample's logit depends only on that sample.
    """

    def __init__(self, config: ModelConfig, schema: DatasetSchema) -> None:
        super().__init__(config, schema)
        require(config.top_mlp[-1:] == (1,), "top_mlp", "must end in 1 (one logit)")
        self.deep = mlp(schema.num_dense, config.bottom_mlp, activate_last=False)
        width = schema.num_tables * config.embedding_dim + config.bottom_mlp[-1]
        self.head = mlp(width, config.top_mlp, activate_last=False, dropout=config.dropout)

    def forward(self, dense: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        flat = pooled.reshape(pooled.shape[0], -1)  # per sample: [B, F, D] -> [B, F*D]
        return self.head(torch.cat((flat, self.deep(dense)), dim=1)).squeeze(-1)
