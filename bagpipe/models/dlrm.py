"""DLRM (Naumov et al. 2019): bottom MLP, dot interaction, top MLP."""

from __future__ import annotations

import torch

from bagpipe.core.batch import DatasetSchema
from bagpipe.core.interface import ModelConfig
from bagpipe.core.torchrec_api import InteractionArch
from bagpipe.models.base import RecModel
from bagpipe.models.layers import mlp, require


class DLRM(RecModel):
    """DLRM's dense part.

    * bottom MLP (ReLU after every layer) maps ``dense [B, num_dense]`` to ``x [B, D]``;
    * torchrec's ``InteractionArch``: pairwise dots among the ``F + 1`` vectors ``[x, e_1 .. e_F]``
      without self-interaction, ``C(F+1, 2)`` values, concatenated after ``x``;
    * top MLP (last layer linear) maps ``[B, D + C(F+1, 2)]`` to one logit.

    For the paper's Kaggle model: ``D = 48``, ``F = 26``, top input ``48 + 351 = 399``.
    """

    def __init__(self, config: ModelConfig, schema: DatasetSchema) -> None:
        super().__init__(config, schema)
        dim = config.embedding_dim
        require(config.bottom_mlp[-1:] == (dim,), "bottom_mlp", f"must end in embedding_dim={dim}")
        require(config.top_mlp[-1:] == (1,), "top_mlp", "must end in 1 (one logit)")
        num_features = schema.num_tables
        self.bottom = mlp(schema.num_dense, config.bottom_mlp, activate_last=True)
        self.interaction = InteractionArch(num_sparse_features=num_features)
        pairs = (num_features + 1) * num_features // 2
        self.top = mlp(dim + pairs, config.top_mlp, activate_last=False, dropout=config.dropout)

    def forward(self, dense: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        x = self.bottom(dense)
        return self.top(self.interaction(x, pooled)).squeeze(-1)
