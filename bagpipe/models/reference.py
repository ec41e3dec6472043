"""The whole model in one module: a torchrec ``EmbeddingBagCollection`` plus the dense part.

This is what evaluation runs for every system (load ``system.full_state()``, then score), so AUC
is computed by the same code whatever system trained the weights.
"""

from __future__ import annotations

import torch
from torch import nn

from bagpipe.core.batch import Batch, DatasetSchema
from bagpipe.core.interface import ModelConfig, ModelState
from bagpipe.models.factory import build_dense_model, initial_tables, table_dim


class ReferenceModel(nn.Module):
    """``EmbeddingBagCollection`` (sum pooling, one table per feature) + :class:`RecModel`.

    Args:
        cfg: the architecture.
        schema: tables and dense width.
        seed: initial tables and dense weights, as every system builds them.
        init_tables: ``False`` leaves the tables uninitialised (allocated, not filled), for a model
            that is about to :meth:`load_state` anyway (evaluation), which saves drawing every row.
    """

    def __init__(
        self, cfg: ModelConfig, schema: DatasetSchema, seed: int, *, init_tables: bool = True
    ) -> None:
        # torchrec is imported here, not at the top: the bare GPU check trains every system but
        # torchrec's without a reference model, on a machine without torchrec.
        from torchrec.modules.embedding_configs import PoolingType
        from torchrec.modules.embedding_modules import EmbeddingBagCollection

        super().__init__()
        self.cfg = cfg
        self.schema = schema
        configs = schema.embedding_configs(table_dim(cfg))
        for config in configs:
            config.pooling = PoolingType.SUM
        # Built on "meta" and then allocated: torchrec's own init of every row would be overwritten.
        ebc = EmbeddingBagCollection(tables=configs, device=torch.device("meta"))
        self.ebc = ebc.to_empty(device=torch.device("cpu"))
        self.dense = build_dense_model(cfg, schema, seed)
        if init_tables:
            self._load_tables(initial_tables(schema, table_dim(cfg), seed))

    def pooled(self, batch: Batch) -> torch.Tensor:
        """``[B, F, table_dim]`` pooled embeddings, features in schema order."""
        keyed = self.ebc(batch.sparse_features).to_dict()
        return torch.stack([keyed[name] for name in self.schema.feature_names], dim=1)

    def forward(self, batch: Batch) -> torch.Tensor:
        """Logits ``[B]``."""
        return self.dense(batch.dense_features, self.pooled(batch))

    def state(self) -> ModelState:
        tables = {
            name: bag.weight.detach().clone() for name, bag in self.ebc.embedding_bags.items()
        }
        dense = {key: value.detach().clone() for key, value in self.dense.state_dict().items()}
        return ModelState(tables=tables, dense=dense)

    def load_state(self, state: ModelState) -> None:
        """Copy ``state`` in; table names and shapes must match this model's."""
        self._load_tables(state.tables)
        self.dense.load_state_dict(state.dense)

    @torch.no_grad()
    def _load_tables(self, tables: dict[str, torch.Tensor]) -> None:
        bags = self.ebc.embedding_bags
        if set(tables) != set(bags):
            raise ValueError(
                f"state tables {sorted(tables)} do not match the model's {sorted(bags)}"
            )
        for name, bag in bags.items():
            if tables[name].shape != bag.weight.shape:
                raise ValueError(
                    f"table {name!r}: state shape {tuple(tables[name].shape)}, "
                    f"model shape {tuple(bag.weight.shape)}"
                )
            bag.weight.copy_(tables[name])
