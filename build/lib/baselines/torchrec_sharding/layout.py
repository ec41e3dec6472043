"""Where a TorchRec plan puts each table, and what each rank stores.

:func:`table_layouts` reads each table's shards (rank, row and column offsets, sizes) out of a
TorchRec module plan; :func:`rank_load` sums the rows and bytes every rank holds. The bytes the
plan makes TorchRec exchange are not computed here: the trainers count what TorchRec's collectives
really send (``bagpipe.core.collectives.wire_torch_collectives``).
"""

from __future__ import annotations

from dataclasses import dataclass

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
