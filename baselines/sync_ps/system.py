"""``sync_ps``: synchronous parameter-server training with no cache and no prefetch.

The paper's "no cache / no prefetch" ablation done correctly: the original's lookahead-1 baseline
never wrote embedding updates back to the server (bagpipe.md §4.6). Here every step pulls the rows
its batch needs from S embedding-server shards, trains, and pushes the row gradients back; the step
ends only once every shard acknowledged every trainer's push, so the next pull sees all updates.
Training is therefore exactly synchronous SGD (equal to ``local`` to fp tolerance), and every byte
of embedding traffic sits on the critical path: the upper bound caching systems are measured from.
The shards sum each step's pushes in trainer-rank order (``server.py``), so a run is bit-reproducible
and one recovered from a checkpoint ends bit-identical to an uninterrupted one.

Processes: ``server_0..S-1`` (:class:`~baselines.sync_ps.server.StepOrderedServer`) and
``trainer_0..T-1`` (:class:`~baselines.sync_ps.trainer.SyncPSTrainer`, one gloo group for the dense
all-reduce); the driver (this object) sends each trainer its slice of the global batch.
"""

from __future__ import annotations

from typing import Any

from bagpipe.core.batch import Batch, ids_matrix, split_batch
from bagpipe.core.cluster import Cluster
from bagpipe.core.embedding_server import gather_tables, server_role
from bagpipe.core.roleref import RoleRef
from bagpipe.core.runtime import merge_trainer_records
from bagpipe.core.system import ModelState, StepResult, System, TrainContext
from bagpipe.models import table_dim
from baselines.sync_ps.server import StepOrderedServer
from baselines.sync_ps.trainer import SyncPSTrainer


class SyncPS(System):
    """Synchronous PS baseline (see the module docstring).

    Args:
        num_trainers: ``T`` trainer processes (the global batch splits into T equal slices).
        num_servers: ``S`` embedding-server shards.
        step_timeout_s: how long one step (or a state gather) may take before the run fails.
    """

    name = "sync_ps"
    supports_resume = True

    def __init__(self, num_trainers: int = 2, num_servers: int = 2, step_timeout_s: float = 600.0):
        if num_trainers < 1 or num_servers < 1:
            raise ValueError(
                f"sync_ps: num_trainers ({num_trainers}) and num_servers ({num_servers}) must be >= 1"
            )
        self.num_trainers = num_trainers
        self.num_servers = num_servers
        self.step_timeout_s = step_timeout_s
        self._ctx: TrainContext | None = None
        self._cluster: Cluster | None = None
        self._servers: list[RoleRef] = []
        self._trainers: list[RoleRef] = []

    def setup(self, ctx: TrainContext) -> None:
        if ctx.global_batch_size % self.num_trainers:
            raise ValueError(
                f"sync_ps: global_batch_size {ctx.global_batch_size} does not split into "
                f"{self.num_trainers} trainers"
            )
        resume = ctx.resume.state if ctx.resume else None
        servers = [server_role(s) for s in range(self.num_servers)]
        trainers = [f"trainer_{k}" for k in range(self.num_trainers)]
        cluster = Cluster([*servers, *trainers], link=ctx.link)
        try:
            dim = table_dim(ctx.model)
            self._servers = [
                cluster.remote(
                    role, StepOrderedServer, s, self.num_servers, ctx.schema, dim, ctx.seed, resume
                )
                for s, role in enumerate(servers)
            ]
            group = cluster.new_group("trainers", self.num_trainers)
            self._trainers = [
                cluster.remote(
                    role,
                    SyncPSTrainer,
                    k,
                    group,
                    self._servers,
                    ctx.schema,
                    ctx.model,
                    ctx.optim,
                    ctx.global_batch_size,
                    ctx.seed,
                    resume,
                )
                for k, role in enumerate(trainers)
            ]
            cluster.wait(
                [ref.ready for ref in [*self._servers, *self._trainers] if ref.ready is not None],
                self.step_timeout_s,
            )
        except BaseException:
            cluster.close()
            raise
        self._cluster, self._ctx = cluster, ctx

    def train_step(self, step: int, batch: Batch) -> StepResult:
        _, cluster = self._require_setup()
        futures = [
            trainer.rpc_async().train_step(step, part.dense_features, ids_matrix(part), part.labels)
            for trainer, part in zip(
                self._trainers, split_batch(batch, self.num_trainers), strict=True
            )
        ]
        results = cluster.wait(futures, self.step_timeout_s)
        record = merge_trainer_records([record for _, record in results])
        return StepResult(loss=sum(loss for loss, _ in results), record=record)

    def full_state(self) -> ModelState:
        ctx, cluster = self._require_setup()
        shards = cluster.wait([s.rpc_async().state() for s in self._servers], self.step_timeout_s)
        dense = cluster.wait(self._trainers[0].rpc_async().dense_state(), self.step_timeout_s)
        return ModelState(tables=gather_tables(shards, ctx.schema), dense=dense)

    def stats(self) -> dict[str, Any]:
        return {"num_trainers": self.num_trainers, "num_servers": self.num_servers}

    def close(self) -> None:
        cluster, self._cluster = self._cluster, None
        self._servers, self._trainers = [], []
        if cluster is not None:
            cluster.close()

    def _require_setup(self) -> tuple[TrainContext, Cluster]:
        if self._ctx is None or self._cluster is None:
            raise RuntimeError("sync_ps used before setup(ctx)")
        return self._ctx, self._cluster
