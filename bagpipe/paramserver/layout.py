"""Where each embedding row lives on the parameter-server shards: one layout for every system.

**Row-wise, round-robin over the flat global row space.** All tables share one id space
(``DatasetSchema.table_offsets``); global row ``g`` lives on shard ``g % S`` at local index
``g // S``. Consecutive ids (a table's hot head, which Zipf-skewed data hammers) are dealt to all
shards, so load spreads without a hash::

    global id   0  1  2  3  4  5  6 ...      S = 2
    shard       0  1  0  1  0  1  0
    local idx   0  0  1  1  2  2  3
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["ShardLayout", "server_role"]


def server_role(shard: int) -> str:
    """The role name of shard ``shard`` (``server_<s>``)."""
    return f"server_{shard}"


@dataclass(frozen=True)
class ShardLayout:
    """Which shard stores each global row id (``id % num_shards``) and where (``id // num_shards``)."""

    num_shards: int

    def shard_of(self, ids: torch.Tensor) -> torch.Tensor:
        return ids % self.num_shards

    def local_index(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.div(ids, self.num_shards, rounding_mode="floor")

    def split(self, ids: torch.Tensor) -> list[torch.Tensor]:
        """Positions in ``ids`` of the ids of each shard: ``ids[split(ids)[s]]`` live on shard ``s``."""
        shards = self.shard_of(ids)
        order = torch.argsort(shards, stable=True)
        counts = torch.bincount(shards, minlength=self.num_shards)
        return list(torch.split(order, counts.tolist()))

    def shard_ids(self, shard: int, total_rows: int) -> torch.Tensor:
        """Global ids stored on ``shard``, in local-index order."""
        return torch.arange(shard, total_rows, self.num_shards)
