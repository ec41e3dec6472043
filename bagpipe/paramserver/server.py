"""Parameter-server shards of the embedding tables: the authoritative rows, plain SGD.

Every shard starts from the same seeded tables as every other system
(``bagpipe.training.start.start_table``, or a checkpoint's when resuming), in the layout of
:class:`~bagpipe.paramserver.layout.ShardLayout`.

A shard never counts or delays its traffic: its callers tag their calls with a Meter column and
the wire (``bagpipe.core.net.wire``) does both, for the requests and for the replies.

Extension point: systems with extra server-side semantics (a write-back barrier, per-row versions,
step-ordered sums) subclass :class:`EmbeddingServer` and add methods, reusing ``local_index``,
``rows`` and the lock.
"""

from __future__ import annotations

import threading

import torch

from bagpipe.core.batch import DatasetSchema
from bagpipe.core.interface import ModelState
from bagpipe.paramserver.layout import ShardLayout
from bagpipe.training.start import start_table

__all__ = ["EmbeddingServer", "gather_rows", "gather_tables", "split_tables"]


class EmbeddingServer:
    """Shard ``shard`` of ``num_shards`` of every table: the authoritative rows, plain SGD.

    Args:
        shard: this shard's index ``s``.
        num_shards: ``S``.
        schema: dataset schema (its table sizes define the global row space).
        table_dim: row width (``bagpipe.models.table_dim(cfg)``).
        seed: model seed; rows start as the seeded tables every system starts from.
        resume: a checkpoint's model to start from instead.

    Methods that read or change rows hold one lock: gradients pushed by several trainers for the
    same row at once are all applied (summed), never lost.
    """

    def __init__(
        self,
        shard: int,
        num_shards: int,
        schema: DatasetSchema,
        table_dim: int,
        seed: int,
        resume: ModelState | None = None,
    ) -> None:
        if not 0 <= shard < num_shards:
            raise ValueError(f"shard {shard} outside 0..{num_shards - 1}")
        self.shard = shard
        self.layout = ShardLayout(num_shards)
        self.total_rows = schema.total_rows
        parts = []
        for index, offset in enumerate(schema.table_offsets.tolist()):
            table = start_table(schema, index, table_dim, seed, resume)
            first = (shard - offset) % num_shards  # first row of this table whose global id is ours
            parts.append(table[first::num_shards])
        self.rows = torch.cat(parts).contiguous()
        self.lock = threading.Lock()

    def local_index(self, ids: torch.Tensor) -> torch.Tensor:
        """Local rows of global ``ids``; raises if an id is not stored on this shard."""
        if ids.numel() and bool((self.layout.shard_of(ids) != self.shard).any()):
            raise ValueError(f"server_{self.shard}: asked for ids stored on other shards")
        return self.layout.local_index(ids)

    def fetch_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows of global ``ids`` (``[len(ids), dim]``)."""
        local = self.local_index(ids)
        with self.lock:
            return self.rows.index_select(0, local)

    def apply_gradients(self, ids: torch.Tensor, grads: torch.Tensor, lr: float) -> None:
        """Plain SGD ``w[ids] -= lr * grads``; gradients of repeated ids are summed."""
        local = self.local_index(ids)
        with self.lock:
            self.rows.index_add_(0, local, grads, alpha=-lr)

    def write_rows(self, ids: torch.Tensor, values: torch.Tensor) -> None:
        """Overwrite rows of global ``ids`` (unique) with ``values``."""
        local = self.local_index(ids)
        with self.lock:
            self.rows.index_copy_(0, local, values.to(self.rows.dtype))

    def state(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(global ids, rows)`` of this shard, for materialising the full tables."""
        with self.lock:
            return self.layout.shard_ids(self.shard, self.total_rows), self.rows.clone()


def gather_rows(shards: list[tuple[torch.Tensor, torch.Tensor]], total_rows: int) -> torch.Tensor:
    """The flat ``[total_rows, D]`` global row space from every shard's ``(global ids, rows)``."""
    dim = shards[0][1].shape[1]
    rows = torch.empty(total_rows, dim, dtype=shards[0][1].dtype)
    for ids, shard_rows in shards:
        rows[ids] = shard_rows
    return rows


def split_tables(rows: torch.Tensor, schema: DatasetSchema) -> dict[str, torch.Tensor]:
    """Per-table views of the flat global row space (``ModelState.tables``)."""
    parts = torch.split(rows, list(schema.table_sizes))
    return dict(zip(schema.table_names, parts, strict=True))


def gather_tables(
    shards: list[tuple[torch.Tensor, torch.Tensor]], schema: DatasetSchema
) -> dict[str, torch.Tensor]:
    """Per-table tensors from every shard's :meth:`EmbeddingServer.state`."""
    return split_tables(gather_rows(shards, schema.total_rows), schema)
