"""``het``: the HET plugin (driver side). Roles: ``S`` versioned server shards, ``T`` trainers.

The driver sends every trainer its slice of the global batch, and (mode ``asp`` with prefetch)
the ids of its slice of the *next* batch, read from the runner's random-access source (wrapping
around at its end, as the runner does), so the trainer can pull them while it computes. Those ids
are not charged as data traffic: the trainer is charged for its batch when it trains on it. Waiting for all T trainers every step is the only
synchronisation besides the dense all-reduce (and, in mode ``bsp``, the barrier between pushes
and pulls).
"""

from __future__ import annotations

from typing import Any

import torch

from bagpipe.core.batch import Batch, global_ids, split_batch
from bagpipe.core.cluster import Cluster
from bagpipe.core.embedding_server import gather_rows, split_tables
from bagpipe.core.roleref import RoleRef
from bagpipe.core.runtime import merge_trainer_records
from bagpipe.core.system import ModelState, StepResult, System, TrainContext
from bagpipe.models import table_dim
from baselines.het.roles import HetServerShard, HetSettings, HetTrainer

__all__ = ["HET"]


class HET(System):
    """Per-worker embedding cache with bounded staleness over a parameter server (HET, VLDB'22).

    Args:
        num_trainers: ``T`` worker processes (data parallel; dense all-reduce every step).
        num_servers: ``S`` embedding-server shards.
        bound: staleness bound ``s`` for reads and writes (HET's default 100; its CTR scripts 3).
        policy: ``lru``, ``lfu`` or ``lfuopt``.
        cache_fraction: cache lines per table as a share of its rows (HET: 10%).
        cache_rows_per_table: absolute lines per table instead (overrides the fraction).
        mode: ``asp`` (HET's default) or ``bsp`` (push, barrier, pull every step).
        prefetch: pull the next batch while computing (mode ``asp``).
        step_timeout_s: how long the driver waits for one step before failing the run.
    """

    name = "het"

    def __init__(
        self,
        num_trainers: int = 2,
        num_servers: int = 1,
        bound: int = 100,
        policy: str = "lfuopt",
        cache_fraction: float = 0.1,
        cache_rows_per_table: int | None = None,
        mode: str = "asp",
        prefetch: bool = True,
        step_timeout_s: float = 300.0,
    ) -> None:
        if num_trainers < 1 or num_servers < 1:
            raise ValueError(
                f"het: num_trainers and num_servers must be >= 1, got {num_trainers}, {num_servers}"
            )
        self.num_trainers, self.num_servers = num_trainers, num_servers
        self.settings = HetSettings(
            bound, policy, cache_fraction, cache_rows_per_table, mode, prefetch
        )
        self.step_timeout_s = step_timeout_s
        self._ctx: TrainContext | None = None
        self._cluster: Cluster | None = None
        self._servers: list[RoleRef] = []
        self._trainers: list[RoleRef] = []

    def setup(self, ctx: TrainContext) -> None:
        if ctx.global_batch_size % self.num_trainers:
            raise ValueError(
                f"het: global_batch_size {ctx.global_batch_size} does not split into "
                f"{self.num_trainers} trainers"
            )
        dim = table_dim(ctx.model)
        servers = [f"server_{s}" for s in range(self.num_servers)]
        trainers = [f"trainer_{k}" for k in range(self.num_trainers)]
        cluster = Cluster([*servers, *trainers], link=ctx.link)
        self._cluster = cluster
        try:
            self._servers = [
                cluster.remote(role, HetServerShard, s, self.num_servers, ctx.schema, dim, ctx.seed)
                for s, role in enumerate(servers)
            ]
            group = cluster.new_group("trainers", self.num_trainers)
            self._trainers = [
                cluster.remote(
                    role,
                    HetTrainer,
                    k,
                    group,
                    self._servers,
                    ctx.schema,
                    ctx.model,
                    dim,
                    ctx.optim,
                    ctx.global_batch_size,
                    ctx.seed,
                    self.settings,
                )
                for k, role in enumerate(trainers)
            ]
            cluster.wait([t.rpc_async().cache_stats() for t in self._trainers], self.step_timeout_s)
        except BaseException:
            self._cluster = None
            cluster.close()
            raise
        self._ctx = ctx

    def train_step(self, step: int, batch: Batch) -> StepResult:
        ctx, cluster = self._require_setup()
        slices = split_batch(batch, self.num_trainers)
        next_ids: list[torch.Tensor | None] = [None] * self.num_trainers
        if self.settings.mode == "asp" and self.settings.prefetch:
            upcoming = ctx.source[(step + 1) % len(ctx.source)]  # the runner wraps around too
            next_ids = [global_ids(s, ctx.schema) for s in split_batch(upcoming, self.num_trainers)]
        futures = [
            trainer.rpc_async().train_step(
                part.dense_features, global_ids(part, ctx.schema), part.labels, upcoming
            )
            for trainer, part, upcoming in zip(self._trainers, slices, next_ids, strict=True)
        ]
        results = cluster.wait(futures, self.step_timeout_s)
        record = merge_trainer_records([record for _, record in results])
        return StepResult(loss=sum(loss for loss, _ in results), record=record)

    def full_state(self) -> ModelState:
        """Server rows plus every trainer's unpushed deltas: the model as training left it."""
        ctx, cluster = self._require_setup()
        unpushed = cluster.wait(
            [t.rpc_async().unpushed() for t in self._trainers], self.step_timeout_s
        )
        shards = cluster.wait([s.rpc_async().rows() for s in self._servers], self.step_timeout_s)
        rows = gather_rows(shards, ctx.schema.total_rows)
        for keys, deltas in unpushed:
            rows.index_add_(0, keys, deltas)
        dense = cluster.wait(self._trainers[0].rpc_async().dense_state(), self.step_timeout_s)
        return ModelState(tables=split_tables(rows, ctx.schema), dense=dense)

    def stats(self) -> dict[str, Any]:
        """Cache counters summed over trainers, miss rate, and the servers' staleness histogram."""
        _, cluster = self._require_setup()
        per_trainer = cluster.wait(
            [t.rpc_async().cache_stats() for t in self._trainers], self.step_timeout_s
        )
        totals = {key: sum(s[key] for s in per_trainer) for key in per_trainer[0]}
        hists = cluster.wait(
            [s.rpc_async().staleness_hist() for s in self._servers], self.step_timeout_s
        )
        staleness = torch.stack(hists).sum(0)
        return {
            **{f"het_{key}": value for key, value in totals.items()},
            "het_miss_rate": totals["misses"] / totals["lookups"] if totals["lookups"] else None,
            "het_staleness_hist": staleness.tolist(),
            "het_bound": self.settings.bound,
            "het_policy": self.settings.policy,
            "het_mode": self.settings.mode,
        }

    def close(self) -> None:
        if self._cluster is None:
            return
        cluster, self._cluster = self._cluster, None
        try:
            if self._trainers and cluster.failure is None:
                cluster.wait([t.rpc_async().close() for t in self._trainers], self.step_timeout_s)
        finally:
            self._trainers, self._servers = [], []
            cluster.close()

    def _require_setup(self) -> tuple[TrainContext, Cluster]:
        if self._ctx is None or self._cluster is None:
            raise RuntimeError("het used before setup(ctx) or after close()")
        return self._ctx, self._cluster
