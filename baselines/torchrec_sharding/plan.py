"""Sharding plans for the one ``EmbeddingBagCollection``: manual, or from TorchRec's planner.

Both paths end in a TorchRec ``EmbeddingModuleShardingPlan`` (table name -> ``ParameterSharding``)
that ``DistributedModelParallel`` executes; nothing here shards anything itself.

* **Manual** (``planner=False``): ``construct_module_sharding_plan`` with TorchRec's helpers
  (``table_wise`` round-robin over ranks, ``row_wise`` over every rank, ``column_wise`` over up to
  ``world`` ranks with at least ``min_partition`` columns per shard, ``data_parallel``).
* **Planner** (``sharding="auto"``, or ``planner=True``): ``EmbeddingShardingPlanner`` on a CPU
  (or CUDA) ``Topology``; a named sharding type becomes a ``ParameterConstraints`` on every table.

TorchRec 1.9.2's stock sharder offers row-wise only on CUDA and only the ``fused`` kernel for
non-data-parallel tables on CPU (``baselines.md`` §3.2). :class:`FlexibleEBCSharder` lifts both
limits; gloo has had the reduce-scatter row-wise needs since torch 2.x, so those plans train.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch.distributed as dist
from torch import nn
from torchrec.distributed.embedding_types import EmbeddingComputeKernel
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints
from torchrec.distributed.planner.storage_reservations import FixedPercentageStorageReservation
from torchrec.distributed.planner.types import KernelConfig, TopologyFactory, TrainerConfig
from torchrec.distributed.sharding_plan import (
    column_wise,
    construct_module_sharding_plan,
    data_parallel,
    row_wise,
    table_wise,
)
from torchrec.distributed.types import (
    EmbeddingModuleShardingPlan,
    ParameterSharding,
    ShardingPlan,
    ShardingType,
)
from torchrec.modules.embedding_modules import EmbeddingBagCollection

SHARDING_TYPES = ("auto", "table_wise", "row_wise", "column_wise", "data_parallel")
KERNELS = ("auto", "fused", "dense")
FUSED_COLUMN_MULTIPLE = 4  # TorchRec 1.9.2 BatchedFusedEmbeddingBag: every shard's cols % 4 == 0


@dataclass(frozen=True)
class ShardingKnobs:
    """How the tables are split; the ``torchrec`` system's knobs that reach TorchRec.

    Args:
        sharding: ``auto`` (the planner decides) or one TorchRec sharding type for every table.
        kernel: embedding compute kernel of sharded tables (``fused``: FBGEMM TBE with SGD applied
            inside backward; ``dense``: autograd weights stepped by the dense optimizer; ``auto``:
            ``fused`` where FBGEMM accepts the table width, else ``dense`` — see
            :meth:`for_table_dim`). Data-parallel tables always use ``dense`` (TorchRec's rule).
        planner: plan a named ``sharding`` with the planner (as a constraint) instead of by hand.
        min_partition: smallest column-wise shard width (planner constraint and manual CW split).
    """

    sharding: str = "auto"
    kernel: str = "fused"
    planner: bool = False
    min_partition: int | None = None

    def __post_init__(self) -> None:
        if self.sharding not in SHARDING_TYPES:
            raise ValueError(f"system.sharding: {self.sharding!r} is not one of {SHARDING_TYPES}")
        if self.kernel not in KERNELS:
            raise ValueError(f"system.kernel: {self.kernel!r} is not one of {KERNELS}")
        if self.min_partition is not None and self.min_partition < 1:
            raise ValueError(f"system.min_partition must be >= 1, got {self.min_partition}")

    @property
    def column_block(self) -> int:
        """Shard widths must be multiples of this: FBGEMM's fused kernel asserts ``cols % 4 == 0``."""
        return FUSED_COLUMN_MULTIPLE if self.kernel == "fused" else 1

    def for_table_dim(self, dim: int) -> ShardingKnobs:
        """Resolve ``kernel=auto``: the fused kernel unless the width rules it out (DeepFM's D+1).

        A sweep over models (suite fig7) then runs TorchRec's fastest kernel wherever it can,
        without a per-model override; ``stats()`` reports the kernel actually used.
        """
        if self.kernel != "auto":
            return self
        if dim % FUSED_COLUMN_MULTIPLE == 0 or self.sharding == "data_parallel":
            return replace(self, kernel="fused")
        if self.uses_planner:
            # On CPU TorchRec's planner proposes sharded tables only with the fused kernel, and DMP
            # rejects its plans once the dense kernel is forced; a manual table-wise plan is valid.
            return replace(self, sharding="table_wise", kernel="dense", planner=False)
        return replace(self, kernel="dense")

    def check_table_dim(self, dim: int, world: int) -> None:
        """Fail before spawning anything when TorchRec would reject the tables' width."""
        sharded = self.sharding != "data_parallel"
        if self.kernel == "fused" and sharded and dim % FUSED_COLUMN_MULTIPLE:
            raise ValueError(
                f"system.kernel=fused: FBGEMM's fused kernel needs table widths divisible by "
                f"{FUSED_COLUMN_MULTIPLE}, but the model's tables are {dim} wide (DeepFM adds "
                f"one column to embedding_dim); use system.kernel=dense"
            )
        if self.sharding == "column_wise" and not self.planner:
            column_split(dim, world, self.min_partition, self.column_block)

    @property
    def uses_planner(self) -> bool:
        return self.planner or self.sharding == "auto"


class FlexibleEBCSharder(EmbeddingBagCollectionSharder):
    """The stock EBC sharder, with row-wise and a chosen kernel allowed on every device.

    ``sharding_types`` adds ``row_wise`` on CPU; ``compute_kernels`` offers ``kernel`` for sharded
    tables and ``dense`` for data-parallel ones, so the planner and DMP agree with the knobs.
    """

    def __init__(self, kernel: str) -> None:
        super().__init__()
        self.kernel = kernel

    def sharding_types(self, compute_device_type: str) -> list[str]:
        return [
            ShardingType.DATA_PARALLEL.value,
            ShardingType.TABLE_WISE.value,
            ShardingType.COLUMN_WISE.value,
            ShardingType.ROW_WISE.value,
        ]

    def compute_kernels(self, sharding_type: str, compute_device_type: str) -> list[str]:
        if sharding_type == ShardingType.DATA_PARALLEL.value:
            return [EmbeddingComputeKernel.DENSE.value]
        return [self.kernel]


def column_split(dim: int, world: int, min_partition: int | None, block: int = 1) -> list[int]:
    """Widths of a column-wise table: up to ``world`` near-equal shards, each a multiple of
    ``block`` columns and at least ``min_partition`` wide (one shard when no split fits)."""
    if dim % block:
        raise ValueError(
            f"column_wise: a table {dim} wide does not split into shards of multiples of {block}"
        )
    units = dim // block
    min_units = -(-(min_partition or 1) // block)
    shards = max(1, min(world, units // min_units))
    base, extra = divmod(units, shards)
    return [(base + (1 if k < extra else 0)) * block for k in range(shards)]


def manual_plan(
    ebc: EmbeddingBagCollection,
    knobs: ShardingKnobs,
    world: int,
    sharder: FlexibleEBCSharder,
    device_type: str,
) -> EmbeddingModuleShardingPlan:
    """The same sharding type for every table, placed deterministically (see module docstring)."""
    generators = {}
    for index, config in enumerate(ebc.embedding_bag_configs()):
        if knobs.sharding == "table_wise":
            generators[config.name] = table_wise(rank=index % world, compute_kernel=knobs.kernel)
        elif knobs.sharding == "row_wise":
            generators[config.name] = row_wise(compute_kernel=knobs.kernel)
        elif knobs.sharding == "column_wise":
            widths = column_split(
                config.embedding_dim, world, knobs.min_partition, knobs.column_block
            )
            ranks = [(index + k) % world for k in range(len(widths))]
            generators[config.name] = column_wise(
                ranks=ranks, size_per_rank=widths, compute_kernel=knobs.kernel
            )
        elif knobs.sharding == "data_parallel":
            generators[config.name] = data_parallel()
        else:
            raise ValueError(f"manual plan for sharding {knobs.sharding!r} does not exist")
    return construct_module_sharding_plan(
        ebc,
        generators,
        sharder=sharder,
        local_size=world,
        world_size=world,
        device_type=device_type,
    )


#: Share of each device's memory the planner keeps free (TorchRec's default heuristic margin).
_RESERVED_SHARE = 0.15


def planner_plan(
    model: nn.Module,
    module_path: str,
    knobs: ShardingKnobs,
    world: int,
    sharder: FlexibleEBCSharder,
    device_type: str,
    local_batch_size: int,
    group: dist.ProcessGroup,
) -> EmbeddingModuleShardingPlan:
    """Rank 0 runs TorchRec's planner and broadcasts the plan (``collective_plan``)."""
    ebc = model.get_submodule(module_path)
    assert isinstance(ebc, EmbeddingBagCollection)
    constraints = {}
    for config in ebc.embedding_bag_configs():
        constraints[config.name] = ParameterConstraints(
            sharding_types=None if knobs.sharding == "auto" else [knobs.sharding],
            compute_kernels=None,
            min_partition=knobs.min_partition,
        )
    # The factory and a fixed reservation are what TorchRec asks for; its deprecated defaults (a
    # directly built Topology, the heuristic reservation) warn on every run.
    planner = EmbeddingShardingPlanner(
        topology=TopologyFactory.create_topology(
            TrainerConfig(world_size=world, local_world_size=world),
            kernel_config=KernelConfig(compute_device=device_type),
        ),
        batch_size=local_batch_size,
        constraints=constraints,
        storage_reservation=FixedPercentageStorageReservation(_RESERVED_SHARE),
    )
    plan: ShardingPlan = planner.collective_plan(model, [sharder], group)
    module_plan = plan.get_plan_for_module(module_path)
    assert isinstance(module_plan, EmbeddingModuleShardingPlan), module_path
    return module_plan


def describe_plan(plan: EmbeddingModuleShardingPlan) -> dict[str, str]:
    """``table -> "row_wise/fused ranks=[0, 1]"``: the plan as strings, for ``stats()`` and logs."""
    out = {}
    for table, sharding in plan.items():
        assert isinstance(sharding, ParameterSharding)
        ranks = sharding.ranks if sharding.ranks is not None else []
        out[table] = f"{sharding.sharding_type}/{sharding.compute_kernel} ranks={list(ranks)}"
    return out
