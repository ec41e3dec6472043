"""DCN v2 (Wang et al. 2021), low-rank variant, as in torchrec's ``DLRM_DCN``."""

from __future__ import annotations

import torch

from bagpipe.core.batch import DatasetSchema
from bagpipe.core.interface import ModelConfig
from bagpipe.core.torchrec_api import LowRankCrossNet
from bagpipe.models.base import RecModel
from bagpipe.models.layers import mlp, require


class DCN(RecModel):
    """DCN v2's dense part.

    * bottom MLP (ReLU after every layer) maps the dense features to ``x [B, D]``;
    * torchrec's ``LowRankCrossNet`` (``cross_layers`` layers of rank ``cross_rank``) over
      ``x0 = [x || e_1 .. e_F]`` of width ``(F+1)*D``:
      ``x_{l+1} = x0 * (W_l (V_l x_l) + b_l) + x_l``;
    * over-arch ``top_mlp`` to one logit.
    """

    def __init__(self, config: ModelConfig, schema: DatasetSchema) -> None:
        super().__init__(config, schema)
        dim = config.embedding_dim
        require(config.bottom_mlp[-1:] == (dim,), "bottom_mlp", f"must end in embedding_dim={dim}")
        require(config.top_mlp[-1:] == (1,), "top_mlp", "must end in 1 (one logit)")
        require(config.cross_layers >= 1, "cross_layers", "must be >= 1")
        require(config.cross_rank >= 1, "cross_rank", "must be >= 1")
        width = (schema.num_tables + 1) * dim
        self.bottom = mlp(schema.num_dense, config.bottom_mlp, activate_last=True)
        self.cross = LowRankCrossNet(
            width, num_layers=config.cross_layers, low_rank=config.cross_rank
        )
        self.over = mlp(width, config.top_mlp, activate_last=False, dropout=config.dropout)

    def forward(self, dense: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        x0 = torch.cat((self.bottom(dense), pooled.flatten(1)), dim=1)
        return self.over(self.cross(x0)).squeeze(-1)
