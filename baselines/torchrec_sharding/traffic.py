"""Bytes that TorchRec's model-parallel exchanges move, computed exactly from the plan and the batch.

DMP's collectives run inside TorchRec; rather than hooking them, each trainer computes what *it
sends* to every other rank in one step from the plan (who holds which rows/columns) and its own
slice of the batch. Notation, per table ``t`` of width ``D``, this rank ``r``, local batch ``B``
(every rank has ``B`` examples), ids of ``s_id`` bytes (int64: 8) and lengths of ``s_len`` bytes
(int32: 4), ``s_f = 4`` (fp32 activations)::

    table_wise / column_wise   (each shard k, owner o_k, width D_k; CW = one TW table per shard)
      input  ids+lengths  r -> o_k  (o_k != r):  B * (s_id + s_len)
      output pooled fwd   o_k -> p  (p != o_k):  B * D_k * s_f       (sent by r when r == o_k)
      output grads bwd    r -> o_k  (o_k != r):  B * D_k * s_f
    row_wise                  (row blocks on ranks o_k; n_k = ids of r's slice that fall in block k)
      input  ids+lengths  r -> o_k  (o_k != r):  n_k * s_id + B * s_len  (bucketised lengths: B per block)
      output reduce-scatter r -> p  (p != r):    B * D * s_f             (r holds a block)
      output all-gather bwd r -> o_k (o_k != r): B * D * s_f
    data_parallel: no all-to-all; the table's gradient joins the dense all-reduce
                   (counted as ``allreduce`` bytes by the trainer, not here).

Bytes a rank sends to itself never cross a link and are not counted. Excluded: the tiny split-size
exchanges TorchRec runs before each ids all-to-all (``F`` ints per peer). The one-hot datasets make
``lengths`` all ones, but the formulas hold for any KJT.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torchrec.distributed.types import EmbeddingModuleShardingPlan, ShardingType

FLOAT_BYTES = 4


@dataclass(frozen=True)
class Shard:
    """One piece of a table on one rank: rows ``[row_offset, +rows)``, cols ``[col_offset, +cols)``."""

    rank: int
    row_offset: int
    rows: int
    col_offset: int
    cols: int

    @property
    def nbytes(self) -> int:
        return self.rows * self.cols * FLOAT_BYTES


@dataclass(frozen=True)
class TableLayout:
    """Where one table lives under a plan (data-parallel: one full replica per rank)."""

    name: str
    feature_index: int
    sharding_type: str
    rows: int
    dim: int
    shards: tuple[Shard, ...]


@dataclass
class Exchange:
    """One collective round of a step: bytes this rank sends to each other rank."""

    name: str
    bytes_to: dict[int, int] = field(default_factory=dict)

    def add(self, dst: int, nbytes: int) -> None:
        self.bytes_to[dst] = self.bytes_to.get(dst, 0) + nbytes

    @property
    def total_bytes(self) -> int:
        return sum(self.bytes_to.values())


def table_layouts(
    plan: EmbeddingModuleShardingPlan,
    table_shapes: dict[str, tuple[int, int]],
    table_order: tuple[str, ...],
    world: int,
) -> list[TableLayout]:
    """Read each table's shards (rank, offsets, sizes) out of a TorchRec module plan."""
    layouts = []
    for index, name in enumerate(table_order):
        sharding = plan[name]
        rows, dim = table_shapes[name]
        if sharding.sharding_type == ShardingType.DATA_PARALLEL.value:
            shards = tuple(Shard(rank, 0, rows, 0, dim) for rank in range(world))
        else:
            spec = sharding.sharding_spec
            assert spec is not None, f"table {name}: sharded without a sharding spec"
            shards = tuple(
                Shard(
                    rank=meta.placement.rank(),
                    row_offset=meta.shard_offsets[0],
                    rows=meta.shard_sizes[0],
                    col_offset=meta.shard_offsets[1],
                    cols=meta.shard_sizes[1],
                )
                for meta in spec.shards  # type: ignore[attr-defined]
            )
        layouts.append(TableLayout(name, index, sharding.sharding_type, rows, dim, shards))
    return layouts


def step_exchanges(
    layouts: list[TableLayout],
    rank: int,
    world: int,
    ids: torch.Tensor,
    id_bytes: int,
    length_bytes: int,
) -> list[Exchange]:
    """This rank's sends in one training step, one :class:`Exchange` per sharding type and stage.

    ``ids`` is this rank's ``[B, F]`` id matrix (column ``f`` = feature of table ``f``).
    """
    batch = ids.shape[0]
    peers = [peer for peer in range(world) if peer != rank]
    rounds: dict[str, Exchange] = {}

    def exchange(kind: str, stage: str) -> Exchange:
        key = f"{kind}:{stage}"
        return rounds.setdefault(key, Exchange(key))

    for table in layouts:
        kind = table.sharding_type
        if kind in (ShardingType.TABLE_WISE.value, ShardingType.COLUMN_WISE.value):
            for shard in table.shards:
                if shard.rank != rank:
                    exchange(kind, "input").add(shard.rank, batch * (id_bytes + length_bytes))
                    exchange(kind, "grad").add(shard.rank, batch * shard.cols * FLOAT_BYTES)
                else:
                    for peer in peers:
                        exchange(kind, "output").add(peer, batch * shard.cols * FLOAT_BYTES)
        elif kind == ShardingType.ROW_WISE.value:
            column = ids[:, table.feature_index]
            holds_block = any(shard.rank == rank for shard in table.shards)
            for shard in table.shards:
                if shard.rank == rank:
                    continue
                in_block = (column >= shard.row_offset) & (column < shard.row_offset + shard.rows)
                exchange(kind, "input").add(
                    shard.rank, int(in_block.sum()) * id_bytes + batch * length_bytes
                )
                exchange(kind, "grad").add(shard.rank, batch * table.dim * FLOAT_BYTES)
            if holds_block:
                for peer in peers:
                    exchange(kind, "output").add(peer, batch * table.dim * FLOAT_BYTES)
        elif kind != ShardingType.DATA_PARALLEL.value:
            raise ValueError(f"table {table.name}: no traffic model for sharding type {kind!r}")
    return list(rounds.values())


def rank_load(layouts: list[TableLayout], world: int) -> dict[str, list[int]]:
    """Rows and bytes of embedding storage held by each rank (replicas count on every rank).

    A column-wise shard counts all its rows although it holds only some columns: ``bytes`` is the
    measure of load that compares across sharding types.
    """
    rows = [0] * world
    nbytes = [0] * world
    for table in layouts:
        for shard in table.shards:
            rows[shard.rank] += shard.rows
            nbytes[shard.rank] += shard.nbytes
    return {"rows": rows, "bytes": nbytes}
