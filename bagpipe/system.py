"""``bagpipe``: the Bagpipe system (SOSP'23) as a ``System`` plugin, with its disaggregated roles.

Processes (one :class:`~bagpipe.core.cluster.Cluster`; the same code runs on one machine or many)::

    driver      the runner's process: splits each global batch, triggers the step on every trainer
    oracle      OracleRole: plans over the batches the runner will train (epoch after epoch), and
                pushes every trainer its step and round plans ahead of time (at most ``lookahead``
                steps ahead of training)
    server_s    BagpipeServerShard, s < S: rows ``id % S == s``, per-round read-after-write barrier
    trainer_k   BagpipeTrainer, k < T: dense replica + LRPP cache; slice k of every global batch

Knobs: ``num_trainers``, ``num_servers``, ``lookahead`` (L), ``cache_capacity`` (rows, ``None`` =
unbounded: rows leave only when their lease expires), ``cleanup_fraction`` (cleanup interval
``ci = max(1, int(cleanup_fraction * L))``).

Ablations (bagpipe.md §4.5/§5.3 E7; all ``True`` = the paper's design, each keeps training exact):
``sync_later`` (``False``: every row a step synchronises is all-reduced on its critical path),
``prefetch`` (``False``: no background prefetch, a step's missing rows are fetched on its critical
path), ``partition`` (``False``: no physical partitioning, singleton rows are shared rows, held by
every trainer and all-reduced). See ``bagpipe.trainer``.

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

import threading
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import torch

from bagpipe.core import runtime
from bagpipe.core.batch import Batch, DatasetSchema, ids_matrix, split_batch
from bagpipe.core.cluster import Cluster
from bagpipe.core.meter import StepRecord
from bagpipe.core.roleref import RoleRef
from bagpipe.core.system import ModelState, StepResult, System, TrainContext
from bagpipe.models import table_dim
from bagpipe.oracle.cacher import OracleCacher
from bagpipe.oracle.config import OracleConfig
from bagpipe.oracle.plan import RoundPlan, StepPlan
from bagpipe.server import BagpipeServerShard
from bagpipe.systems.start import TrainingStream
from bagpipe.trainer import BagpipeTrainer, Design, TrainerConfig

Plan = StepPlan | RoundPlan


def _first_step(plan: Plan) -> int:
    return plan.step if isinstance(plan, StepPlan) else plan.first_step


class OracleRole:
    """The oracle cacher's process: plans the stream, pushes plans at most ``window`` steps ahead.

    The driver reports progress with :meth:`advance` every step; a plan whose first step is more
    than ``window`` steps past it waits, so plans in flight stay bounded whatever the stream length.
    """

    def __init__(
        self, source: TrainingStream, schema: DatasetSchema, config: OracleConfig,
        trainers: list[RoleRef], window_steps: int,
    ) -> None:
        self.source = source
        self.schema = schema
        self.config = config
        self.trainers = trainers
        self.window_steps = window_steps
        self._progress = -1
        self._planning_s = 0.0
        self._cond = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None
        self.planner = OracleCacher(
            schema, config.num_trainers, config.lookahead, config.ci, config.capacity
        )

    def start(self) -> None:
        self._thread = runtime.start_thread(self._run, "bagpipe-oracle")

    def advance(self, step: int) -> float:
        """Training reached ``step``; return the planning time spent since the previous call."""
        with self._cond:
            self._progress = max(self._progress, step)
            self._cond.notify_all()
            spent, self._planning_s = self._planning_s, 0.0
        return spent

    def stats(self) -> dict[str, float]:
        """The planner's totals so far (rows planned, evictions, planning time)."""
        return {f"oracle_{k}": float(v) for k, v in asdict(self.planner.stats).items()}

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=5.0)

    def _run(self) -> None:
        planner = self.planner
        reported_s = 0.0
        for plan in planner.plan(self.source, flush=False):
            with self._cond:
                spent_s = planner.stats.planning_time_s
                self._planning_s += spent_s - reported_s
                reported_s = spent_s
                due = _first_step(plan)
                self._cond.wait_for(self._may_push(due))
                if self._closed:
                    return
            self._push([plan])

    def _may_push(self, due: int) -> Callable[[], bool]:
        """Plans for step ``due`` go out once training is within the window of it (or closing)."""
        return lambda: self._closed or due <= self._progress + self.window_steps

    def _push(self, plans: list[Plan]) -> None:
        tensors = [t for plan in plans for t in vars(plan).values() if isinstance(t, torch.Tensor)]
        futures = []
        for k, trainer in enumerate(self.trainers):
            runtime.delay(f"trainer_{k}", *tensors)
            futures.append(trainer.rpc_async().receive_plans(plans))
        for future in futures:
            future.wait()


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
        cleanup_fraction: float = 0.25,
        sync_later: bool = True,
        prefetch: bool = True,
        partition: bool = True,
    ) -> None:
        if num_trainers < 1 or num_servers < 1:
            raise ValueError(
                f"system.num_trainers={num_trainers} and system.num_servers={num_servers} must be >= 1"
            )
        if not 0 < cleanup_fraction <= 0.5:
            raise ValueError(f"system.cleanup_fraction={cleanup_fraction} must be in (0, 0.5]")
        self.num_trainers = num_trainers
        self.num_servers = num_servers
        self.design = Design(sync_later=sync_later, prefetch=prefetch, partition=partition)
        self.oracle_config = OracleConfig(
            num_trainers=num_trainers,
            lookahead=lookahead,
            cleanup_interval=max(1, int(cleanup_fraction * lookahead)),
            capacity=cache_capacity,
        )
        self._ctx: TrainContext | None = None
        self._cluster: Cluster | None = None
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
        # Resuming: roles start from the checkpoint's weights with empty caches, and the oracle
        # plans the stream from the resumed step on, which the roles number from 0.
        resume = ctx.resume.state if ctx.resume else None
        self._step_offset = ctx.resume.step if ctx.resume else 0
        end = ctx.num_steps if ctx.num_steps is not None else len(ctx.source)
        source = TrainingStream(ctx.source, self._step_offset, end)
        servers = [f"server_{s}" for s in range(self.num_servers)]
        trainers = [f"trainer_{k}" for k in range(self.num_trainers)]
        cluster = Cluster(["oracle", *servers, *trainers], link=ctx.link)
        self._cluster = cluster
        try:
            dim = table_dim(ctx.model)
            self._servers = [
                cluster.remote(role, BagpipeServerShard, s, self.num_servers, ctx.schema, dim,
                               ctx.seed, self.num_trainers, resume)
                for s, role in enumerate(servers)
            ]
            group = cluster.new_group("trainers", world_size=self.num_trainers)
            cfg = TrainerConfig(
                num_trainers=self.num_trainers,
                schema=ctx.schema,
                model=ctx.model,
                optim=ctx.optim,
                global_batch_size=ctx.global_batch_size,
                seed=ctx.seed,
                cleanup_interval=self.oracle_config.ci,
                cache_capacity=self.oracle_config.capacity,
                dense_state=resume.dense if resume else None,
                design=self.design,
            )
            self._trainers = [
                cluster.remote(role, BagpipeTrainer, k, cfg, group, self._servers)
                for k, role in enumerate(trainers)
            ]
            self._oracle = cluster.remote(
                "oracle", OracleRole, source, ctx.schema, self.oracle_config, self._trainers,
                self.oracle_config.lookahead,
            )
            cluster.wait([r.rpc_async().stats() for r in self._trainers])
            cluster.wait([self._oracle.rpc_async().start()])
        except BaseException:
            self.close()
            raise

    def train_step(self, step: int, batch: Batch) -> StepResult:
        cluster, oracle = self._require_setup()
        step -= self._step_offset  # the roles number steps from where this run (re)started
        planning = oracle.rpc_async().advance(step)
        futures = [
            trainer.rpc_async().train_step(step, part.dense_features, ids_matrix(part), part.labels)
            for trainer, part in zip(self._trainers, split_batch(batch, self.num_trainers), strict=True)
        ]
        *results, planning_s = cluster.wait([*futures, planning])
        record = runtime.merge_trainer_records([r for _, r in results])
        record.counters["planning_s"] = planning_s
        self._totals = self._totals + record
        return StepResult(loss=float(sum(loss for loss, _ in results)), record=record)

    def full_state(self) -> ModelState:
        cluster, _ = self._require_setup()
        assert self._ctx is not None
        schema = self._ctx.schema
        snapshots = cluster.wait([t.rpc_async().snapshot() for t in self._trainers])
        shards = cluster.wait([s.rpc_async().shard_rows() for s in self._servers])
        flat = torch.empty(schema.total_rows, table_dim(self._ctx.model))
        for ids, rows in shards:
            flat[ids] = rows
        for ids, rows, _ in snapshots:  # cached rows are newer than the servers' copies
            flat[ids] = rows
        parts = torch.split(flat, list(schema.table_sizes))
        tables = {name: part.clone() for name, part in zip(schema.table_names, parts, strict=True)}
        return ModelState(tables=tables, dense=snapshots[0][2])

    def stats(self) -> dict[str, Any]:
        totals = self._totals
        out: dict[str, Any] = {f"total_{k}": v for k, v in totals.flat().items()}
        if self._cluster is not None and self._oracle is not None:
            out.update(self._cluster.wait([self._oracle.rpc_async().stats()])[0])
        out["cleanup_interval"] = self.oracle_config.ci
        out["lookahead"] = self.oracle_config.lookahead
        out.update({k: float(v) for k, v in asdict(self.design).items()})
        return out

    def close(self) -> None:
        if self._cluster is None:
            return
        cluster, self._cluster = self._cluster, None
        try:
            if cluster.failure is None:
                roles = [*self._trainers, *([self._oracle] if self._oracle else [])]
                cluster.wait([r.rpc_async().close() for r in roles], timeout_s=30)
        finally:
            cluster.close()

    def _require_setup(self) -> tuple[Cluster, RoleRef]:
        if self._cluster is None or self._oracle is None:
            raise RuntimeError("Bagpipe used before setup(ctx) or after close()")
        return self._cluster, self._oracle

