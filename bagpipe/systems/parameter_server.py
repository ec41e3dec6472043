"""The driver side that parameter-server systems share: ``S`` server shards, ``T`` trainers.

``sync_ps``, HET and FAE differ in what their shards and trainers do, not in how the driver starts
and drives them. :class:`ParameterServerSystem` holds that common part once, so a change to it (a
readiness wait, a timeout, cleanup after a failed start) reaches every such system:

* **Processes.** Roles ``server_0..S-1`` then ``trainer_0..T-1`` in one
  :class:`~bagpipe.core.cluster.Cluster`. The shards are
  :class:`~bagpipe.core.embedding_server.EmbeddingServer` (or a subclass), each built with that
  class's arguments, so every system's rows start from the same seeded (or resumed) tables in
  the same layout. The trainers join one gloo group (``"trainers"``, for the dense all-reduce)
  and trainer ``k`` is built as ``trainer_cls(k, group, servers, *args)``, ``servers`` being the
  shards' refs. Setup returns once every constructor ran; if any part of it fails, the processes
  are ended.
* **Steps.** Trainer ``k`` trains on slice ``k`` of the global batch (:meth:`_slices`); the step's
  loss is the sum of the slice losses and its record the trainers' records merged
  (:meth:`_collect`), so the global batch is what one process would train on.
* **Waits.** Every wait on the roles is bounded by ``step_timeout_s``, so a wedged role fails the
  run instead of hanging it.

Bagpipe's own system does not use this: it adds an oracle role, builds its trainers from one config
and waits for the oracle's planning report within each step.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch.futures import Future

from bagpipe.core.batch import Batch, split_batch
from bagpipe.core.cluster import Cluster
from bagpipe.core.embedding_server import EmbeddingServer, server_role
from bagpipe.core.roleref import RoleRef
from bagpipe.core.runtime import merge_trainer_records
from bagpipe.core.system import ModelState, StepResult, System, TrainContext
from bagpipe.models import table_dim

__all__ = ["ParameterServerSystem"]


class ParameterServerSystem(System):
    """A :class:`System` whose roles are ``S`` embedding-server shards and ``T`` trainers.

    Subclasses call :meth:`_start_roles` from ``setup`` with their role classes and arguments, and
    use :meth:`_slices` / :meth:`_collect` in ``train_step``; ``close`` is shared.

    Args:
        num_trainers: ``T`` trainer processes (the global batch splits into T equal slices).
        num_servers: ``S`` embedding-server shards.
        step_timeout_s: how long the driver waits for one step (or any call on the roles).
    """

    #: Call every trainer's ``close()`` before ending the processes (when no role has failed):
    #: for trainers that still send in the background (HET's pushes) and must drain first.
    close_trainers: ClassVar[bool] = False

    def __init__(self, num_trainers: int, num_servers: int, step_timeout_s: float) -> None:
        if num_trainers < 1 or num_servers < 1:
            raise ValueError(
                f"{self.name}: num_trainers and num_servers must be >= 1, "
                f"got {num_trainers}, {num_servers}"
            )
        self.num_trainers = num_trainers
        self.num_servers = num_servers
        self.step_timeout_s = step_timeout_s
        self._ctx: TrainContext | None = None
        self._cluster: Cluster | None = None
        self._servers: list[RoleRef] = []
        self._trainers: list[RoleRef] = []

    def _start_roles(
        self,
        ctx: TrainContext,
        server_cls: type[EmbeddingServer],
        trainer_cls: type,
        trainer_args: tuple[Any, ...],
        resume: ModelState | None = None,
    ) -> None:
        """Start the shards and the trainers (see the module docstring); wait until all are built.

        Args:
            ctx: the run's context (schema, model, seed, link, global batch size).
            server_cls: the shards' class, built as ``server_cls(s, S, schema, table_dim, seed,
                resume)`` (:class:`EmbeddingServer`'s signature).
            trainer_cls: the trainers' class, built as ``trainer_cls(k, group, servers,
                *trainer_args)``.
            trainer_args: the rest of the trainers' arguments.
            resume: a checkpoint's model the shards start from (systems that resume).
        """
        if ctx.global_batch_size % self.num_trainers:
            raise ValueError(
                f"{self.name}: global_batch_size {ctx.global_batch_size} does not split into "
                f"{self.num_trainers} trainers"
            )
        servers = [server_role(s) for s in range(self.num_servers)]
        trainers = [f"trainer_{k}" for k in range(self.num_trainers)]
        dim = table_dim(ctx.model)
        cluster = Cluster([*servers, *trainers], link=ctx.link)
        try:
            self._servers = [
                cluster.remote(
                    role, server_cls, s, self.num_servers, ctx.schema, dim, ctx.seed, resume
                )
                for s, role in enumerate(servers)
            ]
            group = cluster.new_group("trainers", self.num_trainers)
            self._trainers = [
                cluster.remote(role, trainer_cls, k, group, self._servers, *trainer_args)
                for k, role in enumerate(trainers)
            ]
            cluster.wait(
                [ref.ready for ref in [*self._servers, *self._trainers] if ref.ready is not None],
                self.step_timeout_s,
            )
        except BaseException:
            self._servers, self._trainers = [], []
            cluster.close()
            raise
        self._cluster, self._ctx = cluster, ctx

    def _slices(self, batch: Batch) -> list[tuple[RoleRef, Batch]]:
        """``(trainer k, slice k of batch)`` for every trainer, in rank order."""
        self._require_setup()
        return list(zip(self._trainers, split_batch(batch, self.num_trainers), strict=True))

    def _collect(self, futures: list[Future]) -> StepResult:
        """The step's result from the trainers' ``(loss, record)`` futures (in rank order)."""
        results = self._wait(futures)
        record = merge_trainer_records([record for _, record in results])
        return StepResult(loss=sum(loss for loss, _ in results), record=record)

    def _wait(self, futures: Future | list[Future]) -> Any:
        """The value(s) of calls on the roles, within ``step_timeout_s`` (``Cluster.wait``)."""
        _, cluster = self._require_setup()
        return cluster.wait(futures, self.step_timeout_s)

    def _dense_state(self) -> dict[str, torch.Tensor]:
        """The dense part's weights (every trainer holds the same replica; trainer 0's)."""
        return self._wait(self._trainers[0].rpc_async().dense_state())

    def _shard_states(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Every shard's ``(global ids, rows)`` (``EmbeddingServer.state``), in shard order."""
        return self._wait([server.rpc_async().state() for server in self._servers])

    def close(self) -> None:
        cluster, self._cluster = self._cluster, None
        if cluster is None:
            return
        try:
            if self.close_trainers and self._trainers and cluster.failure is None:
                cluster.wait([t.rpc_async().close() for t in self._trainers], self.step_timeout_s)
        finally:
            self._servers, self._trainers = [], []
            cluster.close()

    def _require_setup(self) -> tuple[TrainContext, Cluster]:
        if self._ctx is None or self._cluster is None:
            raise RuntimeError(f"{self.name} used before setup(ctx) or after close()")
        return self._ctx, self._cluster
