"""DeepFM (Guo et al. 2017) with its first-order weights stored inside the embedding tables."""

from __future__ import annotations

import torch

from bagpipe.core.batch import DatasetSchema
from bagpipe.core.interface import ModelConfig
from bagpipe.models.base import RecModel
from bagpipe.models.layers import mlp, require


class DeepFM(RecModel):
    """DeepFM's dense part; its tables have ``embedding_dim + 1`` columns.

    Column ``D`` of every embedding row is that row's **first-order weight** ``w``; columns
    ``0..D-1`` are its factor vector ``v``. The original prototype kept ``w`` in a separate dense
    ``nn.Embedding(sum of table sizes, 1)`` replicated and all-reduced by DDP every iteration
    (bagpipe.md §6 item 12: ≈135 MB per step for Kaggle, outside Bagpipe's cache). Storing it as an
    extra column makes it an ordinary sparse parameter that every system fetches, caches and
    updates with the row, and the math is unchanged.

    ``logit = sum_f w_f + FM(fields) + deep(fields)`` where

    * ``fields [B, F+1, D]`` = the bottom MLP's image of the dense features (one extra field, as
      DLRM treats dense features) followed by the ``F`` factor vectors;
    * ``FM = 1/2 * sum_d ((sum_i v_id)^2 - sum_i v_id^2)``, all pairwise dot products;
    * ``deep`` = ``top_mlp`` over the flattened fields (its last bias is the logit's bias).

    The dense features reach the logit only through their field. A first-order term over the raw
    dense features (log counts, up to about 20) moved the logit so far at each SGD step that the
    evaluation logloss swung between 0.51 and 0.85 from one evaluation to the next (fig7's recipe,
    three seeds), worse than the base rate at the end of some runs, while the AUC rose steadily.

    The paper's MLP also had BatchNorm; it is left out because batch statistics computed on each
    trainer's slice differ from those of the global batch, which would break the "T trainers ==
    one process" equivalence every system is tested for.
    """

    def __init__(self, config: ModelConfig, schema: DatasetSchema) -> None:
        super().__init__(config, schema)
        dim = config.embedding_dim
        require(config.bottom_mlp[-1:] == (dim,), "bottom_mlp", f"must end in embedding_dim={dim}")
        require(config.top_mlp[-1:] == (1,), "top_mlp", "must end in 1 (one logit)")
        self.bottom = mlp(schema.num_dense, config.bottom_mlp, activate_last=True)
        width = (schema.num_tables + 1) * dim
        self.deep = mlp(width, config.top_mlp, activate_last=False, dropout=config.dropout)

    def forward(self, dense: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        dim = self.config.embedding_dim
        factors, first_order = pooled[..., :dim], pooled[..., dim]
        fields = torch.cat((self.bottom(dense).unsqueeze(1), factors), dim=1)
        fm = 0.5 * (fields.sum(dim=1).square() - fields.square().sum(dim=1)).sum(dim=1)
        deep = self.deep(fields.flatten(1)).squeeze(-1)
        return first_order.sum(dim=1) + fm + deep
