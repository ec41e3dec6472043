"""What parameter-server systems share: ``S`` server shards, ``T`` trainers, one driver.

``sync_ps``, HET and FAE differ in what their shards and trainers do, not in how the driver starts
and drives them, nor in what a trainer holds besides its embedding path. This module holds that
part once, so a change to it (a readiness wait, a timeout, cleanup after a failed start) reaches
every such system. A system names its two role classes and adds what is its own::

    class SyncPS(ParameterServerSystem):
        name = "sync_ps"
        server_class = StepOrderedServer        # an EmbeddingServer
        trainer_class = SyncPSTrainer           # a ParameterServerTrainer

* **Processes.** Roles ``server_0..S-1`` then ``trainer_0..T-1`` in one
  :class:`~bagpipe.core.roles.Deployment`. Shard ``s`` is built with
  :class:`~bagpipe.paramserver.EmbeddingServer`'s arguments, so every system's rows
  start from the same seeded (or resumed) tables in the same layout. The trainers join one gloo
  group (``"trainers"``, for the dense all-reduce); trainer ``k`` is built as
  ``trainer_class(k, group, servers, spec, *trainer_args())``, ``spec`` being the run's
  :class:`~bagpipe.core.interface.TrainerSpec` (``ctx.trainer_spec()``). Setup
  returns once every constructor ran; if any part of it fails, the processes are ended.
* **Steps.** Trainer ``k`` trains on slice ``k`` of the global batch
  (:meth:`ParameterServerSystem._slices`); the step's loss is the sum of the slice losses and its
  record the trainers' records merged (:meth:`ParameterServerSystem._collect`), so the global batch
  is what one process would train on.
* **Waits.** Every wait on the roles is bounded by ``step_timeout_s``, so a wedged role fails the
  run instead of hanging it.
* **Trainers** are data-parallel: each holds an equal dense replica, started from the seeded (or
  resumed) weights; the driver reads the dense part from trainer 0.

* **Recovery** (``replaces_trainers``, ``replaces_servers``, ``standby_trainers``,
  ``standby_servers``; ``bagpipe.core.recovery``). A system whose trainers hold nothing but the
  dense replica (``sync_ps``) replaces a dead trainer in place when the deployment has a standby
  trainer process: the survivors' replicas are checked equal by hash, the shards drop what the
  step in flight pushed, the standby takes the dead role over, every trainer is rebuilt in its
  process from the survivors' replica (a new trainer group: gloo groups cannot change members),
  the replacement's replica is checked against the survivors' hash, and the step in flight is
  trained again. A system whose shards apply each step as one deterministic sum (``sync_ps``)
  rebuilds a dead shard in place when a standby server is left: its trainers log their pushes
  since the base (the rows of the last ``full_state``, i.e. the newest checkpoint, or of the
  start), and the standby is built from the base and replays them
  (``baselines.sync_ps.pushlog``); the surviving shards drop the step in flight's pushes and it is
  trained again. Nothing is rolled back and no finished step is redone. Where that cannot be
  proven safe (no standby of the dead role's kind left, a trainer finished the step in flight,
  the replicas differ), the failure goes on to the runner's whole-job restart, with the reason
  in ``RoleFailedError.fallback``.

Bagpipe's own system does not use this: it adds an oracle role, builds its trainers from one config
and waits for the oracle's planning report within each step.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, ClassVar, TypeVar

import torch
from torch.futures import Future

from bagpipe.core import collectives
from bagpipe.core.batch import Batch, split_batch
from bagpipe.core.collectives import FusedTail
from bagpipe.core.device import host_copy, trainer_device
from bagpipe.core.interface import (
    ModelState,
    ResumePoint,
    StepResult,
    System,
    TrainContext,
    TrainerSpec,
)
from bagpipe.core.recovery import (
    Recovery,
    replace_between_steps,
    replaced,
    replacement_refused,
    replacing,
    step_left_by_survivors,
    tensors_digest,
)
from bagpipe.core.roles import (
    Deployment,
    Rendezvous,
    RoleFailedError,
    RoleRef,
    trainer_state_devices,
)
from bagpipe.core.roles.deployment import standby_roles
from bagpipe.core.runtime import merge_trainer_records
from bagpipe.models import table_dim
from bagpipe.paramserver.layout import server_role
from bagpipe.paramserver.server import EmbeddingServer, gather_tables
from bagpipe.training.start import start_dense_model
from bagpipe.training.step import replicate_dense

__all__ = ["ParameterServerSystem", "ParameterServerTrainer"]

_T = TypeVar("_T")


class ParameterServerTrainer:
    """Trainer ``rank`` of a :class:`ParameterServerSystem`: what every such trainer holds.

    It joins the trainer group (the constructors of all T trainers meet there), keeps the shards'
    refs and role names, the run's settings, and a dense replica in training mode, wrapped in
    ``DistributedDataParallel`` (``ddp_model``: forward through it, and backward sums the dense
    gradients over the trainers). Subclasses add
    their embedding path (pulls and pushes, a cache, a hot-row replica) and ``train_step``.

    Args:
        rank: ``k``, this trainer's place in the group (and the slice of each batch it trains).
        group: the trainer group's rendezvous (``Deployment.new_group``).
        servers: the shards' refs, ``servers[s]`` being shard ``s``.
        spec: the run's settings (:class:`~bagpipe.core.interface.TrainerSpec`).
    """

    #: True for a trainer that sums row gradients with the dense ones (``self.fuse``).
    fuses_rows: ClassVar[bool] = False

    def __init__(
        self, rank: int, group: Rendezvous, servers: list[RoleRef], spec: TrainerSpec
    ) -> None:
        collectives.join_group(group, rank, spec.device)
        self.rank = rank
        self.device = trainer_device(spec.device, rank, group.world_size)
        self.servers = servers
        self.server_roles = [ref.role for ref in servers]
        self.schema = spec.schema
        self.optim = spec.optim
        self.global_batch_size = spec.global_batch_size
        self.model = start_dense_model(
            spec.model, spec.schema, spec.seed, spec.resume_state, self.device
        )
        self.model.train()
        #: Row gradients a subclass sums with the dense part in one collective (FAE's hot rows).
        self.fuse = FusedTail() if self.fuses_rows else None
        self.ddp_model = replicate_dense(self.model, self.fuse)

    def dense_state(self) -> dict[str, torch.Tensor]:
        """A host copy of the dense replica's weights (equal on every trainer after each step)."""
        return {key: host_copy(value) for key, value in self.model.state_dict().items()}

    def state_devices(self) -> dict[str, str]:
        """Where the dense replica and the embedding state (:meth:`embedding_state`) live."""
        parts = {"dense": next(self.model.parameters()), **self.embedding_state()}
        return {name: str(tensor.device) for name, tensor in parts.items()}

    def embedding_state(self) -> dict[str, torch.Tensor]:
        """The embedding rows this trainer holds, by name (a cache, a replica); none here."""
        return {}


class ParameterServerSystem(System):
    """A :class:`System` whose roles are ``S`` embedding-server shards and ``T`` trainers.

    Subclasses set :attr:`server_class` and :attr:`trainer_class` (and :meth:`_trainer_args` when
    their trainers take more), write ``train_step`` from :meth:`_slices` and :meth:`_collect`, and
    ``full_state`` from :meth:`_shard_states` and :meth:`_dense_state`. ``setup`` and ``close`` are
    shared.

    Args:
        num_trainers: ``T`` trainer processes (the global batch splits into T equal slices).
        num_servers: ``S`` embedding-server shards.
        step_timeout_s: how long the driver waits for one step (or any call on the roles).
    """

    server_class: ClassVar[type[EmbeddingServer]] = EmbeddingServer
    trainer_class: ClassVar[type[ParameterServerTrainer]]
    #: Call every trainer's ``close()`` before ending the processes (when no role has failed):
    #: for trainers that still send in the background (HET's pushes) and must drain first.
    close_trainers: ClassVar[bool] = False

    #: True for trainers that hold nothing but the dense replica: a dead one is replaced in place
    #: (module docstring, *Recovery*) when a standby trainer is left.
    replaces_trainers: ClassVar[bool] = False
    #: True for shards rebuilt in place from a base and the trainers' logged pushes (``sync_ps``'s
    #: step-ordered shards: module docstring, *Recovery*) when a standby server is left.
    replaces_servers: ClassVar[bool] = False
    #: The fewest shards the system runs with: 0 for one whose trainers hold every row themselves
    #: (``embedding_free``, the bound with embedding traffic free).
    min_servers: ClassVar[int] = 1

    def __init__(
        self, num_trainers: int, num_servers: int, step_timeout_s: float, standby_trainers: int = 0,
        standby_servers: int = 0,
    ) -> None:
        if (num_trainers < 1 or num_servers < self.min_servers or standby_trainers < 0
                or standby_servers < 0):
            raise ValueError(
                f"{self.name}: num_trainers must be >= 1, num_servers >= {self.min_servers} and "
                f"standby_trainers and standby_servers >= 0, got {num_trainers}, {num_servers}, "
                f"{standby_trainers}, {standby_servers}"
            )
        if standby_servers and not self.replaces_servers:
            raise ValueError(f"system.standby_servers: {self.name} cannot rebuild a shard in place")
        self.num_trainers = num_trainers
        self.num_servers = num_servers
        self.step_timeout_s = step_timeout_s
        self.standby_trainers = standby_trainers
        self.standby_servers = standby_servers
        self._recoveries: list[Recovery] = []
        self._logs_paused = False  # ever (a system's ``pause_recovery_logs``): no replace since
        self._next_step = 0  # the step boundary the roles are at (``full_state`` is taken there)
        #: What a dead shard is rebuilt from: the shards' rows at a step boundary (the last
        #: ``full_state``'s), or ``None`` for the rows they were started from.
        self._base: ModelState | None = None
        self._groups = 0  # trainer groups made so far (each needs its own rendezvous)
        self._ctx: TrainContext | None = None
        self._deployment: Deployment | None = None
        self._servers: list[RoleRef] = []
        self._trainers: list[RoleRef] = []

    def setup(self, ctx: TrainContext) -> None:
        """Start the shards and the trainers (see the module docstring); wait until all are built.

        A resume point (``ctx.resume``) is refused unless the system declares ``supports_resume``.
        """
        if ctx.global_batch_size % self.num_trainers:
            raise ValueError(
                f"{self.name}: global_batch_size {ctx.global_batch_size} does not split into "
                f"{self.num_trainers} trainers"
            )
        if ctx.resume is not None and not self.supports_resume:
            raise ValueError(f"{self.name} cannot resume from a checkpoint (supports_resume)")
        spec = ctx.trainer_spec()
        resume = spec.resume_state
        dim = table_dim(ctx.model)
        servers = [server_role(s) for s in range(self.num_servers)]
        trainers = [f"trainer_{k}" for k in range(self.num_trainers)]
        deployment = Deployment(
            [*servers, *trainers], network=ctx.network,
            standbys=[*standby_roles("trainer", self.standby_trainers),
                      *standby_roles("server", self.standby_servers)],
        )
        self._next_step = ctx.resume.step if ctx.resume is not None else 0
        self._base = resume
        try:
            self._servers = [
                deployment.remote(
                    role, self.server_class, s, self.num_servers, ctx.schema, dim, ctx.seed, resume
                )
                for s, role in enumerate(servers)
            ]
            group = self._new_group(deployment)
            self._trainers = [
                deployment.remote(
                    role, self.trainer_class, k, group, self._servers, spec, *self._trainer_args()
                )
                for k, role in enumerate(trainers)
            ]
            deployment.wait(
                [ref.ready for ref in [*self._servers, *self._trainers] if ref.ready is not None],
                self.step_timeout_s,
            )
        except BaseException:
            self._servers, self._trainers = [], []
            deployment.close()
            raise
        self._deployment, self._ctx = deployment, ctx

    def _new_group(self, deployment: Deployment) -> Rendezvous:
        self._groups += 1
        return deployment.new_group(f"trainers_{self._groups}", self.num_trainers)

    def _trainer_args(self) -> tuple[Any, ...]:
        """The trainers' constructor arguments after the :class:`TrainerSpec` (none by default)."""
        return ()

    def _slices(self, batch: Batch) -> list[tuple[RoleRef, Batch]]:
        """``(trainer k, slice k of batch)`` for every trainer, in rank order."""
        self._require_setup()
        return list(zip(self._trainers, split_batch(batch, self.num_trainers), strict=True))

    def _collect(self, futures: list[Future]) -> StepResult:
        """The step's result from the trainers' ``(loss, record)`` futures (in rank order)."""
        results = self._wait(futures)
        record = merge_trainer_records([record for _, record in results])
        return StepResult(loss=sum(loss for loss, _ in results), record=record)

    def _train_replacing(self, step: int, issue: Callable[[], list[Future]]) -> StepResult:
        """Step ``step``'s result from ``issue()`` (one call per trainer, in rank order); a role
        that dies on the way is replaced in place and the step trained again (module docstring,
        *Recovery*), or the failure is raised with its ``fallback`` reason."""
        futures = issue()
        try:
            result = self._collect(futures)
        except RoleFailedError as failure:
            detected_at_s = time.perf_counter()
            self._replace(failure, step, futures)
            result = self._collect(issue())
            self._recoveries.append(replaced(failure, step, detected_at_s))
        self._next_step = step + 1
        return result

    def _between_steps(self, call: Callable[[], _T]) -> _T:
        """``call()`` (a gather between steps, e.g. ``full_state``), replacing a role whose death
        it meets as in a step with nothing in flight (``replace_between_steps``)."""
        return replace_between_steps(call, lambda failure, step: self._replace(failure, step, []),
                                     self._next_step, self._recoveries)

    def _replace(
        self, failure: RoleFailedError, step: int, futures: list[Future]
    ) -> list[RoleFailedError]:
        """Replace ``failure.role`` in place at the boundary before ``step`` and return
        ``[failure]``, or raise ``failure`` with the reason it cannot be (``fallback``): the job
        then restarts from the checkpoint. (Every step calls every shard and trainer, so a death
        is met in the next step, one at a time.)"""
        _, deployment = self._require_setup()
        trainers = [t.role for t in self._trainers]
        replaceable = [*(trainers if self.replaces_trainers else []),
                       *([s.role for s in self._servers] if self.replaces_servers else [])]
        failure.fallback = (
            replacement_refused([failure.role], replaceable, deployment.standbys,
                                self._logs_paused)
            if replaceable
            else f"{self.name}: its roles hold state no other has"
        )
        if failure.fallback:
            raise failure
        with replacing([failure.role]):
            deployment.take_over(failure.role)  # its failure is handled from here
            if failure.role in trainers:
                dense, failure.fallback = self._survivors_state(failure.role, futures)
                if dense is not None:
                    self._replace_trainer(failure.role, step, dense)
            else:
                failure.fallback = self._replace_server(failure.role, step, futures)
        if failure.fallback:
            raise failure
        return [failure]

    def _survivors_state(
        self, dead: str, futures: list[Future]
    ) -> tuple[dict[str, torch.Tensor] | None, str]:
        """The dense replica every surviving trainer holds at the step boundary, or why the fast
        path does not apply (``(None, reason)``)."""
        roles = [ref.role for ref in self._trainers]
        why = step_left_by_survivors(roles, futures, {dead}, self.step_timeout_s)
        if why:
            return None, why
        survivors = [ref for ref in self._trainers if ref.role != dead]
        dense = self._wait([ref.rpc_async().dense_state() for ref in survivors])
        if len({tensors_digest(d) for d in dense}) != 1:
            return None, "the surviving trainers' dense replicas differ"
        return dense[0], ""

    def _replace_trainer(self, dead: str, step: int, dense: dict[str, torch.Tensor]) -> None:
        """Every trainer is rebuilt (in its process; the standby's for ``dead``) from the
        survivors' replica ``dense``, in a new group, and checked against its hash."""
        ctx, deployment = self._require_setup()
        self._wait([server.rpc_async().discard_pushes_from(step) for server in self._servers])
        survivors = [ref.role for ref in self._trainers if ref.role != dead]
        self._wait([deployment.rpc_async(role, collectives.leave_group) for role in survivors])
        group = self._new_group(deployment)
        resume = ResumePoint(step, ModelState(tables={}, dense=dense))
        spec = replace(ctx.trainer_spec(), resume=resume)
        self._trainers = [
            deployment.rebuild(ref, self.trainer_class, k, group, self._servers, spec,
                               *self._trainer_args())
            for k, ref in enumerate(self._trainers)
        ]
        self._wait([ref.ready for ref in self._trainers if ref.ready is not None])
        rebuilt = self._wait([ref.rpc_async().dense_state() for ref in self._trainers])
        if {tensors_digest(d) for d in rebuilt} != {tensors_digest(dense)}:
            raise RuntimeError(f"{self.name}: a rebuilt trainer's dense replica differs")
        if self.standby_servers:  # the rebuilt trainers logged nothing yet: the base moves here
            self._new_base(step, gather_tables(self._shard_states(), ctx.schema))

    def _replace_server(self, dead: str, step: int, futures: list[Future]) -> str:
        """Rebuild shard ``dead`` (in the standby that took it over) at the boundary before
        ``step``: built from the base, then every trainer's logged pushes since replayed
        (``baselines.sync_ps.pushlog`` says why that is exact); ``""``, or why it cannot be.

        The trainers must all have left the step in flight with an error (none applied it to its
        dense replica, so the replicas are still equal: checked by hash), and the surviving shards
        forget that step's pushes, so it is trained again from its start.
        """
        ctx, deployment = self._require_setup()
        why = step_left_by_survivors(
            [t.role for t in self._trainers], futures, {dead}, self.step_timeout_s
        )
        if why:
            return why
        dense = self._wait([ref.rpc_async().dense_state() for ref in self._trainers])
        if len({tensors_digest(d) for d in dense}) != 1:
            return "the trainers' dense replicas differ"
        shard = [ref.role for ref in self._servers].index(dead)
        self._wait([s.rpc_async().discard_pushes_from(step) for s in self._servers
                    if s.role != dead])
        pushes = self._wait([t.rpc_async().pushes_to(shard, step) for t in self._trainers])
        self._servers[shard] = deployment.rebuild(
            self._servers[shard], self.server_class, shard, self.num_servers, ctx.schema,
            table_dim(ctx.model), ctx.seed, self._base,
        )
        self._wait([ref.ready for ref in self._servers[shard:shard + 1] if ref.ready is not None])
        self._wait(self._servers[shard].rpc_async().replay(pushes, step))
        return ""

    def _new_base(self, step: int, tables: dict[str, torch.Tensor]) -> None:
        """Rebuild dead shards from ``tables`` (the rows at boundary ``step``) from now on; the
        trainers forget the pushes before it (``baselines.sync_ps.pushlog``)."""
        self._base = ModelState(tables=tables, dense={})
        self._wait([t.rpc_async().drop_pushes_before(step) for t in self._trainers])

    def recoveries(self) -> list[Recovery]:
        return list(self._recoveries)

    def state_devices(self) -> dict[str, str]:
        return trainer_state_devices(self.name, self._deployment, self._trainers)

    def _wait(self, futures: Future | list[Future]) -> Any:
        """The value(s) of calls on the roles, within ``step_timeout_s`` (``Deployment.wait``)."""
        _, deployment = self._require_setup()
        return deployment.wait(futures, self.step_timeout_s)

    def _dense_state(self) -> dict[str, torch.Tensor]:
        """The dense part's weights (every trainer holds the same replica; trainer 0's)."""
        return self._wait(self._trainers[0].rpc_async().dense_state())

    def _shard_states(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Every shard's ``(global ids, rows)`` (``EmbeddingServer.state``), in shard order."""
        return self._wait([server.rpc_async().state() for server in self._servers])

    def close(self) -> None:
        deployment, self._deployment = self._deployment, None
        if deployment is None:
            return
        try:
            if self.close_trainers and self._trainers and deployment.failure is None:
                deployment.wait([t.rpc_async().close() for t in self._trainers], self.step_timeout_s)
        finally:
            self._servers, self._trainers = [], []
            deployment.close()

    def _require_setup(self) -> tuple[TrainContext, Deployment]:
        if self._ctx is None or self._deployment is None:
            raise RuntimeError(f"{self.name} used before setup(ctx) or after close()")
        return self._ctx, self._deployment

