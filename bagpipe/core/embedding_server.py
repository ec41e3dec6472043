"""Parameter-server shards of the embedding tables, and the trainer-side client that talks to them.

**Layout: row-wise, round-robin over the flat global row space.** All tables share one id space
(``DatasetSchema.table_offsets``); global row ``g`` lives on shard ``g % S`` at local index
``g // S``. Consecutive ids (a table's hot head, which Zipf-skewed data hammers) are dealt to all
shards, so load spreads without a hash::

    global id   0  1  2  3  4  5  6 ...      S = 2
    shard       0  1  0  1  0  1  0
    local idx   0  0  1  1  2  2  3

Every shard starts from the same seeded tables as every other system
(``bagpipe.systems.start.start_table``, or a checkpoint's when resuming).

**Traffic convention** (``bagpipe.core.runtime``): the sender sleeps on its link, the trainer counts.
A pull is a request (the ids, trainer -> shard) and a reply (the rows, shard -> trainer): the trainer
sleeps for the request, the shard for the reply, and the trainer charges both as
``LinkKind.EMB_PULL``. A push (ids + gradients or rows, trainer -> shard) is slept for and charged
by the trainer as ``LinkKind.EMB_PUSH``. Requests to different shards travel on different links,
in parallel.

Extension points: systems with extra server-side semantics (a write-back barrier, per-row versions)
subclass :class:`EmbeddingServer` and add methods, reusing ``local_index``/``rows`` and the lock;
their trainer-side client subclasses :class:`ShardedTables` and uses ``_split``/``_scatter``.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch
from torch.futures import Future

from bagpipe.core import runtime
from bagpipe.core.batch import DatasetSchema
from bagpipe.core.meter import LinkKind
from bagpipe.core.roleref import RoleRef
from bagpipe.core.system import ModelState

__all__ = ["EmbeddingServer", "RowSharding", "ShardedTables", "server_role"]


def server_role(shard: int) -> str:
    """The role name of shard ``shard`` (``server_<s>``)."""
    return f"server_{shard}"


@dataclass(frozen=True)
class RowSharding:
    """Which shard stores each global row id (``id % num_shards``) and where (``id // num_shards``)."""

    num_shards: int

    def shard_of(self, ids: torch.Tensor) -> torch.Tensor:
        return ids % self.num_shards

    def local_index(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.div(ids, self.num_shards, rounding_mode="floor")

    def split(self, ids: torch.Tensor) -> list[torch.Tensor]:
        """Positions in ``ids`` of the ids of each shard: ``ids[split(ids)[s]]`` live on shard ``s``."""
        order = torch.argsort(self.shard_of(ids), stable=True)
        counts = torch.bincount(self.shard_of(ids), minlength=self.num_shards)
        return list(torch.split(order, counts.tolist()))

    def shard_ids(self, shard: int, total_rows: int) -> torch.Tensor:
        """Global ids stored on ``shard``, in local-index order."""
        return torch.arange(shard, total_rows, self.num_shards)


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
        from bagpipe.systems.start import start_table  # systems layer; keeps core importable alone

        if not 0 <= shard < num_shards:
            raise ValueError(f"shard {shard} outside 0..{num_shards - 1}")
        self.shard = shard
        self.sharding = RowSharding(num_shards)
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
        if ids.numel() and bool((self.sharding.shard_of(ids) != self.shard).any()):
            raise ValueError(f"server_{self.shard}: asked for ids stored on other shards")
        return self.sharding.local_index(ids)

    def fetch_rows(self, ids: torch.Tensor, dst: str) -> torch.Tensor:
        """Rows of global ``ids`` (``[len(ids), dim]``), after the link delay toward ``dst``."""
        local = self.local_index(ids)
        with self.lock:
            rows = self.rows[local]
        runtime.delay(dst, rows)
        return rows

    def apply_gradients(self, ids: torch.Tensor, grads: torch.Tensor, lr: float) -> None:
        """Plain SGD ``w[ids] -= lr * grads``; gradients of repeated ids are summed."""
        local = self.local_index(ids)
        with self.lock:
            self.rows.index_add_(0, local, grads, alpha=-lr)

    def write_rows(self, ids: torch.Tensor, values: torch.Tensor) -> None:
        """Overwrite rows of global ``ids`` (unique) with ``values``."""
        local = self.local_index(ids)
        with self.lock:
            self.rows[local] = values

    def state(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(global ids, rows)`` of this shard, for materialising the full tables."""
        with self.lock:
            return self.sharding.shard_ids(self.shard, self.total_rows), self.rows.clone()


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


class ShardedTables:
    """A trainer's client for a set of :class:`EmbeddingServer` shards (vectorised, one RPC each).

    Args:
        servers: refs of the shards, ``servers[s]`` being shard ``s`` (role ``server_<s>``).
        caller: this process's role name (where pulled rows are sent).
    """

    def __init__(self, servers: list[RoleRef], caller: str) -> None:
        self.servers = servers
        self.roles = [ref.role for ref in servers]
        self.sharding = RowSharding(len(servers))
        self.caller = caller

    def _split(self, ids: torch.Tensor) -> list[tuple[int, torch.Tensor]]:
        """``(shard, positions in ids)`` for every shard that stores some of ``ids``."""
        return [(s, pos) for s, pos in enumerate(self.sharding.split(ids)) if pos.numel()]

    def _send(self, kind: LinkKind, parts: list[tuple[int, list[torch.Tensor]]], rows: int) -> None:
        """Charge and sleep for requests to several shards, on their links in parallel."""
        runtime.charge(kind, *[t for _, tensors in parts for t in tensors], rows=rows)
        runtime.delay_parallel([(self.roles[s], tensors) for s, tensors in parts])

    def pull(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows of global ``ids`` (``[len(ids), dim]``, in ``ids`` order), charged as EMB_PULL."""
        split = self._split(ids)
        requests = [(s, [ids[pos]]) for s, pos in split]
        self._send(LinkKind.EMB_PULL, requests, rows=0)
        futures = [
            self.servers[s].rpc_async().fetch_rows(part[0], self.caller) for s, part in requests
        ]
        replies = torch.futures.wait_all(futures)
        runtime.charge(LinkKind.EMB_PULL, *replies, rows=int(ids.numel()))
        return self._scatter(ids, split, replies)

    @staticmethod
    def _scatter(
        ids: torch.Tensor, split: list[tuple[int, torch.Tensor]], replies: list[torch.Tensor]
    ) -> torch.Tensor:
        """Put each shard's reply rows back at their positions in ``ids``."""
        if not replies:
            return torch.empty(0, 0)
        out = torch.empty(ids.numel(), replies[0].shape[1], dtype=replies[0].dtype)
        for (_, pos), rows in zip(split, replies, strict=True):
            out[pos] = rows
        return out

    def push_gradients(self, ids: torch.Tensor, grads: torch.Tensor, lr: float) -> Future:
        """Send gradients of ``ids`` to their shards (SGD there); the Future completes on all acks."""
        parts = [(s, [ids[pos], grads[pos]]) for s, pos in self._split(ids)]
        self._send(LinkKind.EMB_PUSH, parts, rows=int(ids.numel()))
        return torch.futures.collect_all(
            [self.servers[s].rpc_async().apply_gradients(i, g, lr) for s, (i, g) in parts]
        )

    def push_rows(self, ids: torch.Tensor, values: torch.Tensor) -> Future:
        """Overwrite rows of ``ids`` on their shards; the Future completes on all acks."""
        parts = [(s, [ids[pos], values[pos]]) for s, pos in self._split(ids)]
        self._send(LinkKind.EMB_PUSH, parts, rows=int(ids.numel()))
        return torch.futures.collect_all(
            [self.servers[s].rpc_async().write_rows(i, v) for s, (i, v) in parts]
        )
