"""``bagpipe``: the Bagpipe system (SOSP'23) as a ``System`` plugin, with its disaggregated roles.

Processes (one :class:`~bagpipe.core.roles.Deployment`; the same code runs on one machine or many)::

    driver      the runner's process: splits each global batch, triggers the step on every trainer
    oracle      OracleRole: plans over the batches the runner will train (epoch after epoch), and
                pushes every trainer its step and round plans ahead of time (at most ``lookahead``
                steps ahead of training)
    server_s    BagpipeServerShard, s < S: rows ``id % S == s``, per-round read-after-write barrier
    trainer_k   BagpipeTrainer, k < T: dense replica + LRPP cache; slice k of every global batch

Knobs: ``num_trainers``, ``num_servers``, ``lookahead`` (L), ``cache_capacity`` (rows, ``None`` =
unbounded: rows leave only when their lease expires) or ``cache_budget`` (the same capacity as a
share of the dataset's rows, the rule every caching system's budget follows:
``bagpipe.core.interface.cache_budget_rows``), ``cleanup_fraction`` (cleanup interval
``ci = max(1, int(cleanup_fraction * L))``).

Ablations (bagpipe.md §4.5/§5.3 E7; all ``True`` = the paper's design, each keeps training exact):
``sync_later`` (``False``: every row a step synchronises is all-reduced on its critical path),
``prefetch`` (``False``: no background prefetch, a step's missing rows are fetched on its critical
path), ``partition`` (``False``: no physical partitioning, singleton rows are shared rows, held by
every trainer and all-reduced). See ``bagpipe.lrpp.trainer``.

Per-iteration record (``StepResult.record``): bytes/rows summed over trainers, phase times of
trainer 0, cache hits/misses summed over trainers (a miss = the first read of a row since a prefetch
installed it), counters ``rows_sync_now``/``rows_sync_later`` (rows of the global batch all-reduced on
/ off the critical path), ``rows_singleton`` (rows never all-reduced), ``rows_prefetched``,
``rows_written_back`` (summed over trainers), ``planning_s`` (oracle time spent planning since the
previous step), ``rows_fetched_on_demand`` (``prefetch=False``), ``allreduce_bytes_critical`` /
``allreduce_bytes_later`` (all-reduce payload on / off the critical path, summed over trainers) and
``prefetch_s`` (background prefetch time, summed over trainers).
"""

from __future__ import annotations

from dataclasses import asdict, replace
from typing import Any

from bagpipe.core import runtime
from bagpipe.core.batch import Batch, ids_matrix, split_batch
from bagpipe.core.interface import (
    ModelState,
    StepResult,
    System,
    TrainContext,
    cache_budget_rows,
)
from bagpipe.core.meter import LinkKind, StepRecord
from bagpipe.core.roles import Deployment, RoleRef
from bagpipe.lrpp.oracle_role import OracleRole
from bagpipe.lrpp.server import BagpipeServerShard
from bagpipe.lrpp.trainer import BagpipeTrainer, Design
from bagpipe.models import table_dim
from bagpipe.oracle.config import DEFAULT_CLEANUP_FRACTION, OracleConfig, cleanup_interval_for
from bagpipe.paramserver import gather_rows, server_role, split_tables
from bagpipe.training.start import TrainingStream


class Bagpipe(System):
    """Bagpipe: oracle cacher + LRPP trainer caches + sharded embedding servers."""

    name = "bagpipe"
    supports_resume = True

    def __init__(
        self,
        num_trainers: int = 2,
        num_servers: int = 2,
        lookahead: int = 200,
        cache_capacity: int | None = None,
        cache_budget: float | None = None,
        cleanup_fraction: float = DEFAULT_CLEANUP_FRACTION,
        sync_later: bool = True,
        prefetch: bool = True,
        partition: bool = True,
    ) -> None:
        if num_trainers < 1 or num_servers < 1:
            raise ValueError(
                f"system.num_trainers={num_trainers} and system.num_servers={num_servers} must be >= 1"
            )
        self.num_trainers = num_trainers
        self.num_servers = num_servers
        if cache_capacity is not None and cache_budget is not None:
            raise ValueError(
                "system.cache_capacity (rows) and system.cache_budget (share of the rows): give one"
            )
        self.cache_budget = cache_budget
        self.design = Design(sync_later=sync_later, prefetch=prefetch, partition=partition)
        self.oracle_config = OracleConfig(
            num_trainers=num_trainers,
            lookahead=lookahead,
            cleanup_interval=cleanup_interval_for(lookahead, cleanup_fraction),
            capacity=cache_capacity,
        )
        self._ctx: TrainContext | None = None
        self._deployment: Deployment | None = None
        self._servers: list[RoleRef] = []
        self._trainers: list[RoleRef] = []
        self._oracle: RoleRef | None = None
        self._totals = StepRecord()
        self._step_offset = 0  # the global step this run started (resumed) at

    def setup(self, ctx: TrainContext) -> None:
        if ctx.global_batch_size % self.num_trainers:
            raise ValueError(
                f"global_batch_size={ctx.global_batch_size} does not split into "
                f"system.num_trainers={self.num_trainers} equal slices"
            )
        self._ctx = ctx
        if self.cache_budget is not None:
            self.oracle_config = replace(
                self.oracle_config, capacity=cache_budget_rows(ctx.schema, self.cache_budget)
            )
        # Resuming: roles start from the checkpoint's weights with empty caches, and the oracle
        # plans the stream from the resumed step on, which the roles number from 0.
        spec = ctx.trainer_spec()
        self._step_offset = ctx.resume.step if ctx.resume else 0
        end = ctx.num_steps if ctx.num_steps is not None else len(ctx.source)
        source = TrainingStream(ctx.source, self._step_offset, end)
        servers = [server_role(s) for s in range(self.num_servers)]
        trainers = [f"trainer_{k}" for k in range(self.num_trainers)]
        deployment = Deployment(["oracle", *servers, *trainers], network=ctx.network)
        self._deployment = deployment
        try:
            dim = table_dim(ctx.model)
            self._servers = [
                deployment.remote(role, BagpipeServerShard, s, self.num_servers, ctx.schema, dim,
                                  ctx.seed, spec.resume_state, num_trainers=self.num_trainers)
                for s, role in enumerate(servers)
            ]
            group = deployment.new_group("trainers", world_size=self.num_trainers)
            self._trainers = [
                deployment.remote(role, BagpipeTrainer, k, group, self._servers, spec,
                                  self.oracle_config, self.design)
                for k, role in enumerate(trainers)
            ]
            self._oracle = deployment.remote(
                "oracle", OracleRole, source, ctx.schema, self.oracle_config, self._trainers,
                self.oracle_config.lookahead,
            )
            deployment.wait([r.rpc_async().stats() for r in self._trainers])
            deployment.wait([self._oracle.rpc_async().start()])
        except BaseException:
            self.close()
            raise

    def train_step(self, step: int, batch: Batch) -> StepResult:
        deployment, oracle = self._require_setup()
        step -= self._step_offset  # the roles number steps from where this run (re)started
        planning = oracle.rpc_async().advance(step)
        futures = [
            trainer.rpc_async(kind=LinkKind.DATA).train_step(
                step, part.dense_features, ids_matrix(part), part.labels
            )
            for trainer, part in zip(self._trainers, split_batch(batch, self.num_trainers), strict=True)
        ]
        *results, planning_s = deployment.wait([*futures, planning])
        record = runtime.merge_trainer_records([r for _, r in results])
        record.counters["planning_s"] = planning_s
        self._totals = self._totals + record
        return StepResult(loss=float(sum(loss for loss, _ in results)), record=record)

    def full_state(self) -> ModelState:
        deployment, _ = self._require_setup()
        assert self._ctx is not None
        snapshots = deployment.wait([t.rpc_async().snapshot() for t in self._trainers])
        shards = deployment.wait([s.rpc_async().state() for s in self._servers])
        rows = gather_rows(shards, self._ctx.schema.total_rows)
        for ids, cached, _ in snapshots:  # cached rows are newer than the servers' copies
            rows[ids] = cached
        return ModelState(tables=split_tables(rows, self._ctx.schema), dense=snapshots[0][2])

    def stats(self) -> dict[str, Any]:
        totals = self._totals
        out: dict[str, Any] = {f"total_{k}": v for k, v in totals.flat().items()}
        if self._deployment is not None and self._oracle is not None:
            out.update(self._deployment.wait([self._oracle.rpc_async().stats()])[0])
        out["cleanup_interval"] = self.oracle_config.ci
        out["cache_capacity_rows"] = self.oracle_config.capacity or 0
        out["lookahead"] = self.oracle_config.lookahead
        out.update({k: float(v) for k, v in asdict(self.design).items()})
        return out

    def close(self) -> None:
        if self._deployment is None:
            return
        deployment, self._deployment = self._deployment, None
        try:
            if deployment.failure is None:
                roles = [*self._trainers, *([self._oracle] if self._oracle else [])]
                deployment.wait([r.rpc_async().close() for r in roles], timeout_s=30)
        finally:
            deployment.close()

    def _require_setup(self) -> tuple[Deployment, RoleRef]:
        if self._deployment is None or self._oracle is None:
            raise RuntimeError("Bagpipe used before setup(ctx) or after close()")
        return self._deployment, self._oracle

