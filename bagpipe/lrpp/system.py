"""``bagpipe``: the Bagpipe system (SOSP'23) as a ``System`` plugin, with its disaggregated roles.

Processes (one :class:`~bagpipe.core.roles.Deployment`; the same code runs on one machine or many)::

    driver      the runner's process: splits each global batch, triggers the step on every trainer
    oracle      OracleRole: plans over the batches the runner will train (epoch after epoch), and
                pushes every trainer its step and round plans ahead of time, as far ahead as a
                bound on plans in flight allows; setup waits until it got there
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
every trainer and all-reduced). See ``bagpipe.lrpp.trainer``. ``row_sync=False`` is a timing probe,
not an ablation and not exact: the trainers' synchronisation of replicated rows is made free, as the
embedding-free bound makes embedding traffic free (``suite=bound_split``). ``row_layout=False`` is
the second probe there: the same collectives carrying zeros, no gradient laid out on the shared rows
(what the layout code costs). Both refuse standbys, whose replacements must prove a run exact.

Recovery: ``standby_trainers`` (default 0) pre-spawns idle trainer processes; with one, a dead
trainer is replaced in place, no step redone (:meth:`Bagpipe._replace_role`), and every trainer
logs the rows only it holds to the driver for that (``bagpipe.lrpp.updatelog``).
``standby_servers`` does the same for a dead server shard, whose rows are rebuilt from the newest
checkpoint's model and the rows the trainers wrote back since, which they log on their side
(``bagpipe.lrpp.writebacklog``).
Any other failure, or one the replacement cannot prove exact, restarts the job from the checkpoint
(``bagpipe.core.recovery``).

Per-iteration record (``StepResult.record``): bytes/rows summed over trainers, phase times of
trainer 0, cache hits/misses summed over trainers (a miss = the first read of a row since a prefetch
installed it), counters ``rows_sync_now``/``rows_sync_later`` (rows of the global batch all-reduced on
/ off the critical path), ``rows_singleton`` (rows never all-reduced), ``rows_prefetched``,
``rows_written_back`` (summed over trainers), ``rows_evicted`` (the rounds' evictions, once), ``planning_s`` (oracle time spent planning,
in the oracle's replies that arrived by the step's start), ``rows_fetched_on_demand`` (``prefetch=False``), ``allreduce_bytes_critical`` /
``allreduce_bytes_later`` (all-reduce payload on / off the critical path, summed over trainers) and
``prefetch_s`` (background prefetch time, summed over trainers) and ``round_cpu_s`` (the round
threads' CPU seconds, summed over trainers: the design's background work, on the trainers' cores).
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from dataclasses import asdict, replace
from typing import Any

import torch
from torch.futures import Future

from bagpipe.core import collectives, runtime
from bagpipe.core.batch import Batch, ids_matrix, split_batch
from bagpipe.core.interface import (
    ModelState,
    ResumePoint,
    StepResult,
    System,
    TrainContext,
    cache_budget_rows,
)
from bagpipe.core.meter import LinkKind, StepRecord
from bagpipe.core.recovery import (
    Recovery,
    ended_within,
    replace_between_steps,
    replaced,
    replacement_refused,
    replacing,
    step_left_by_survivors,
    tensors_digest,
)
from bagpipe.core.roles import Deployment, RoleFailedError, RoleRef, trainer_state_devices
from bagpipe.core.roles.deployment import standby_roles
from bagpipe.lrpp.oracle_role import OracleRole
from bagpipe.lrpp.server import BagpipeServerShard
from bagpipe.lrpp.trainer import BagpipeTrainer, Design
from bagpipe.lrpp.updatelog import FOLD_MIN_ROWS, UpdateLogs
from bagpipe.lrpp.writebacklog import replay_write_backs
from bagpipe.models import table_dim
from bagpipe.oracle.config import DEFAULT_CLEANUP_FRACTION, OracleConfig, cleanup_interval_for
from bagpipe.paramserver import EmbeddingServer, gather_rows, server_role, split_tables
from bagpipe.training.start import TrainingStream

_RECOVERY_S = 60.0  # how long each wait of a replacement may take

class Bagpipe(System):
    """Bagpipe: oracle cacher + LRPP trainer caches + sharded embedding servers."""

    name = "bagpipe"
    supports_resume = True
    trainer_class = BagpipeTrainer  # built in each trainer process (a test may subclass it)
    log_fold_min_rows = FOLD_MIN_ROWS  # ``UpdateLogs``' (a short test lowers it to fold at all)

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
        row_sync: bool = True,
        row_layout: bool = True,
        standby_trainers: int = 0,
        standby_servers: int = 0,
    ) -> None:
        if num_trainers < 1 or num_servers < 1 or min(standby_trainers, standby_servers) < 0:
            raise ValueError(
                f"system.num_trainers={num_trainers} and system.num_servers={num_servers} must be "
                f">= 1, system.standby_trainers={standby_trainers} and "
                f"system.standby_servers={standby_servers} >= 0"
            )
        self.num_trainers = num_trainers
        self.num_servers = num_servers
        self.standby_trainers = standby_trainers
        self.standby_servers = standby_servers
        if cache_capacity is not None and cache_budget is not None:
            raise ValueError(
                "system.cache_capacity (rows) and system.cache_budget (share of the rows): give one"
            )
        self.cache_budget = cache_budget
        probe = [f"system.{knob}=false" for knob, on in
                 (("row_sync", row_sync), ("row_layout", row_layout)) if not on]
        if probe and standby_trainers + standby_servers:
            raise ValueError(
                f"{probe[0]} (a timing probe, not exact) cannot recover by replacement: "
                "set system.standby_trainers and system.standby_servers to 0"
            )
        if len(probe) == 2:
            raise ValueError("system.row_layout=false needs system.row_sync=true: without row "
                             "synchronisation no gradient is laid out to leave out")
        self.design = Design(sync_later=sync_later, prefetch=prefetch, partition=partition,
                             row_sync=row_sync, row_layout=row_layout)
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
        self._step_offset = 0  # the global step this run started (resumed, or was rebuilt) at
        self._next_step = 0  # the global step the roles are before (``full_state`` is taken there)
        self._logs: UpdateLogs | None = None  # with standby_trainers (``updatelog``)
        #: With standby_servers, the model a dead shard is rebuilt from (``writebacklog``): the
        #: last ``full_state``'s, or the one the roles were started from (``None``: seeded).
        self._base: ModelState | None = None
        self._recoveries: list[Recovery] = []
        self._groups = 0  # trainer groups made so far (each needs its own rendezvous)
        self._progress_reports: list[Future] = []  # the oracle's replies to advances not read yet
        self._abandoned = False  # a replacement began (a standby took over) but was refused
        self._logs_paused = False  # ever (``pause_recovery_logs``): no replace since

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
        servers = [server_role(s) for s in range(self.num_servers)]
        trainers = [f"trainer_{k}" for k in range(self.num_trainers)]
        self._deployment = Deployment(
            ["oracle", *servers, *trainers], network=ctx.network,
            standbys=[*standby_roles("trainer", self.standby_trainers),
                      *standby_roles("server", self.standby_servers)],
        )
        try:
            self._start_roles(ctx.resume)
        except BaseException:
            self.close()
            raise

    def _start_roles(self, resume: ResumePoint | None) -> None:
        """Build the shards, trainers and oracle from ``resume`` (the seeded weights for ``None``);
        when they exist already (a trainer was replaced), rebuild each in place, under its id.

        Resuming: roles start from ``resume``'s weights with empty caches, and the oracle plans
        the stream from the resumed step on, which the roles number from 0.
        """
        deployment, ctx = self._deployment, self._ctx
        assert deployment is not None and ctx is not None
        spec = replace(ctx.trainer_spec(), resume=resume)
        self._step_offset = resume.step if resume else 0
        self._next_step = self._step_offset
        end = ctx.num_steps if ctx.num_steps is not None else len(ctx.source)
        source = TrainingStream(ctx.source, self._step_offset, end)
        dim = table_dim(ctx.model)
        if self.standby_trainers:
            self._logs = UpdateLogs(self.num_trainers, dim, self.log_fold_min_rows)
        self._base = resume.state if resume else None

        def build(role: str, old: list[RoleRef], index: int, cls: type, *args: Any,
                  **kwargs: Any) -> RoleRef:
            if old:
                return deployment.rebuild(old[index], cls, *args, **kwargs)
            return deployment.remote(role, cls, *args, **kwargs)

        def built(refs: list[RoleRef]) -> list[RoleRef]:
            deployment.wait([ref.ready for ref in refs if ref.ready is not None], _RECOVERY_S)
            return refs

        # Each kind is built before the next is handed its refs (a rebuilt object is reached
        # only once built: ``construct``).
        self._servers = built([
            build(server_role(s), self._servers, s, BagpipeServerShard, s, self.num_servers,
                  ctx.schema, dim, ctx.seed, spec.resume_state, num_trainers=self.num_trainers)
            for s in range(self.num_servers)
        ])
        self._groups += 1
        group = deployment.new_group(f"trainers_{self._groups}", world_size=self.num_trainers)
        self._trainers = built([
            build(f"trainer_{k}", self._trainers, k, self.trainer_class, k, group, self._servers,
                  spec, self.oracle_config, self.design, log_updates=bool(self.standby_trainers),
                  log_writebacks=bool(self.standby_servers))
            for k in range(self.num_trainers)
        ])
        (self._oracle,) = built([build(
            "oracle", [self._oracle] if self._oracle else [], 0, OracleRole, source, ctx.schema,
            self.oracle_config, self._trainers, self.oracle_config.lookahead,
        )])
        deployment.wait([r.rpc_async().stats() for r in self._trainers])
        deployment.wait([self._oracle.rpc_async().start()])
        deployment.wait([self._oracle.rpc_async().planned_ahead()])  # before the first step

    def train_step(self, step: int, batch: Batch) -> StepResult:
        deployment, _ = self._require_setup()
        parts = split_batch(batch, self.num_trainers)
        planning_s, futures, recording_s = 0.0, [], 0.0
        try:  # a death is seen in any of these waits (the oracle's report is one)
            planning_s = self._arrived_planning_s()
            futures = self._issue(step, parts)
            if self._logs is not None:  # fold the entries kept, while the trainers work
                recording_s = self._logs.compact()
            results = deployment.wait(futures)
        except RoleFailedError as failure:
            detected_at_s = time.perf_counter()
            handled, finished = self._replace_role(failure, step, futures)
            if finished is None:  # the step applied nowhere: trained again by the rebuilt roles
                results, resumed = deployment.wait(self._issue(step, parts)), step
            else:  # every trainer finished it; the roles were rebuilt from the model after it
                results, resumed = finished, step + 1
            self._recoveries += [replaced(f, resumed, detected_at_s) for f in handled]
            if finished is not None:  # the rebuilt roles' logs start after it
                results = [(loss, record, None) for loss, record, _ in results]
        if self._logs is not None:
            self._logs.append([entry for _, _, entry in results])
        record = runtime.merge_trainer_records([r for _, r, _ in results])
        record.counters["planning_s"] = planning_s
        if self._logs is not None:  # the driver's CPU share of the update log (trainers count theirs)
            record.counters["recovery_log_record_cpu_s"] = recording_s
        self._totals = self._totals + record
        self._next_step = step + 1
        return StepResult(loss=float(sum(loss for loss, _, _ in results)), record=record)

    def _issue(self, step: int, parts: list[Batch]) -> list[Future]:
        """Start step ``step`` on every trainer (slice ``k`` to trainer ``k``), then, if it starts
        a round, tell the oracle: the trainers' futures.

        The trainers go first: their plans for the step were pushed ahead, so the step needs
        nothing from this call, and telling the oracle (only to free room for plans further
        ahead) must not delay the last trainer's start. Once a round is enough: the oracle always
        pushes the plans within the lookahead of the progress it knows (``OracleRole``), which
        covers the round after the current one while ``2 ci - 1 <= lookahead`` (the default
        cleanup fraction makes ``ci`` a quarter of it); with a longer interval, and only once the
        plans in flight fill their byte bound, that round's plan goes out when the round before it
        starts, which the round thread then waits for. The oracle's reply (its planning time) is
        read once it has arrived (:meth:`_arrived_planning_s`): on the target cluster the oracle is
        a host of its own, and a step must not wait for it to be scheduled on these shared cores.
        """
        _, oracle = self._require_setup()
        step -= self._step_offset  # the roles number steps from where this run (re)started
        started = [
            trainer.rpc_async(kind=LinkKind.DATA).train_step(
                step, part.dense_features, ids_matrix(part), part.labels
            ) for trainer, part in zip(self._trainers, parts, strict=True)
        ]
        if step % self.oracle_config.ci == 0:
            self._progress_reports.append(oracle.rpc_async().advance(step))
        return started

    def _arrived_planning_s(self) -> float:
        """The oracle's planning time in the replies to earlier advances that have arrived (0
        where none has), never waiting for one on its way: the oracle runs below the trainers'
        priority here, and waiting for its reply every step put about 1 ms on the step's critical
        path (the fairness bench's ``other_driver_rpc`` row). An oracle that stopped planning (a
        trainer it pushed to died) raises here, at the first step after its reply arrived."""
        arrived: list[Future] = []
        pending: list[Future] = []
        for report in self._progress_reports:
            (arrived if report.done() else pending).append(report)
        self._progress_reports = pending
        if not arrived:
            return 0.0
        deployment, _ = self._require_setup()
        return float(sum(deployment.wait(arrived)))

    # ------------------------------------------------------------------ recovery
    def _replace_role(
        self, failure: RoleFailedError, step: int, futures: list[Future]
    ) -> tuple[list[RoleFailedError], list[Any] | None]:
        """Replace a dead trainer or server shard in place, with any other role found dead with
        it, or raise ``failure`` with the reason it cannot be (``fallback``): the job then
        restarts from the checkpoint.

        The model at a step boundary is rebuilt from what survives (:meth:`_state_before`), a
        standby takes each dead role over, and every shard, trainer and the oracle are rebuilt in
        place from that model, the oracle planning from the boundary on. The boundary is before
        ``step`` when the step applied nowhere or was not issued (``futures`` empty: the death
        was seen first), and is trained again; or after it when every trainer finished it (a
        shard died while no trainer needed it): then its results are returned, else ``None``.
        Two roles can be found dead at once, since a shard's death is met only when a round next
        calls it. Returns the failures handled (``failure``'s first) and those results.
        """
        deployment, _ = self._require_setup()
        handled = [failure, *deployment.dead_besides(failure.role)]
        dead = [f.role for f in handled]
        trainers = [t.role for t in self._trainers]
        servers = [s.role for s in self._servers] if self.standby_servers else []
        failure.fallback = replacement_refused(
            dead, [*trainers, *servers], deployment.standbys, self._logs_paused
        ) or _cannot_rebuild_together(dead, trainers)
        if failure.fallback:
            raise failure
        self._abandoned = True  # until the roles are rebuilt: close() then ends them at once
        with replacing(dead):
            deployment.take_over(*dead)  # their failures are handled from here
            finished = None
            if not set(dead) & set(trainers) and futures:  # fetches waiting on dead shards end
                self._release_servers(dead)
                finished = _finished_everywhere(futures)
            boundary = step if finished is None else step + 1
            state, failure.fallback = self._state_before(
                boundary, dead, futures if futures and finished is None else None
            )
        if state is None:
            raise failure
        survivors = [role for role in trainers if role not in dead]
        deployment.wait([deployment.rpc_async(r, collectives.leave_group) for r in survivors])
        self._progress_reports = []  # the old oracle's; the rebuilt one starts at the boundary
        self._start_roles(ResumePoint(boundary, state))
        self._abandoned = False
        return handled, finished

    def _state_before(
        self, step: int, dead: list[str], futures: list[Future] | None
    ) -> tuple[ModelState | None, str]:
        """The model at the boundary before ``step`` from what survives, or why it cannot be had.

        The survivors' dense replica (equal by hash), and the rows as the live shards hold them
        (a dead shard's rebuilt from the base and the trainers' write-backs: ``writebacklog``),
        overwritten by a dead trainer's update log (``updatelog``), overwritten by the survivors'
        fresh cached rows (their pending sync-later update applied) and the replicated rows they
        evicted in a round not yet done everywhere. ``futures``: the trainers'
        calls for ``step``, each of which must have failed (``None``: none is in flight).
        """
        deployment, oracle = self._require_setup()
        assert self._ctx is not None
        survivors = [t for t in self._trainers if t.role not in dead]
        self._release_servers(dead)
        deployment.wait([t.rpc_async().close() for t in survivors], _RECOVERY_S)
        if futures is not None:
            why = step_left_by_survivors(
                [t.role for t in self._trainers], futures, dead, _RECOVERY_S
            )
            if why:
                return None, why
        try:
            salvaged = deployment.wait([t.rpc_async().salvage() for t in survivors], _RECOVERY_S)
        except RoleFailedError:
            raise
        except Exception as exc:  # a peer's share of the pending update never came
            return None, f"a survivor could not hand over its rows: {str(exc).splitlines()[0]}"
        if any(applied >= step - self._step_offset for applied, *_ in salvaged):
            return None, "a survivor applied the step in flight"
        if len({tensors_digest(dense) for *_, dense in salvaged}) != 1:
            return None, "the surviving trainers' dense replicas differ"
        if not deployment.wait(oracle.rpc_async().close(), _RECOVERY_S):
            return None, "the oracle did not stop pushing plans"
        rows = self._server_rows(dead)
        for k, trainer in enumerate(self._trainers):
            if trainer.role in dead:
                assert self._logs is not None  # a dead trainer is replaced only with its log
                self._logs.overlay(k, rows)
        for _, ids, cached, _ in salvaged:
            rows[ids] = cached
        return ModelState(split_tables(rows, self._ctx.schema), dense=salvaged[0][3]), ""

    def _release_servers(self, dead: Collection[str]) -> None:
        """End every fetch waiting on a round's barrier on the live shards (a peer is dead)."""
        deployment, _ = self._require_setup()
        live = [s for s in self._servers if s.role not in dead]
        deployment.wait([s.rpc_async().release() for s in live], _RECOVERY_S)

    def _server_rows(self, dead: Collection[str]) -> torch.Tensor:
        """The flat row space as the shards hold it; each dead shard's rebuilt as the base's rows
        of the shard overwritten by the trainers' write-backs to it in round order
        (``bagpipe.lrpp.writebacklog``)."""
        deployment, _ = self._require_setup()
        ctx = self._ctx
        assert ctx is not None
        live = [s for s in self._servers if s.role not in dead]
        shards = deployment.wait([s.rpc_async().state() for s in live], _RECOVERY_S)
        lost = [k for k, s in enumerate(self._servers) if s.role in dead]
        bases = [EmbeddingServer(k, self.num_servers, ctx.schema, table_dim(ctx.model), ctx.seed,
                                 self._base).state() for k in lost]
        rows = gather_rows([*shards, *bases], ctx.schema.total_rows)
        for shard in lost:
            written = deployment.wait(
                [t.rpc_async().writebacks_to(shard) for t in self._trainers], _RECOVERY_S
            )
            replay_write_backs(rows, [entry for entries in written for entry in entries])
        return rows

    def pause_recovery_logs(self, paused: bool) -> None:
        """Every trainer's logs and agreement off or on, between steps
        (:class:`~bagpipe.core.recovery.PausableRecoveryLogs`: the fault bench's A/B)."""
        deployment, _ = self._require_setup()
        deployment.wait([t.rpc_async().pause_recovery_logs(paused) for t in self._trainers])
        self._logs_paused = self._logs_paused or paused

    def recoveries(self) -> list[Recovery]:
        return list(self._recoveries)

    def full_state(self) -> ModelState:
        return replace_between_steps(
            self._gather_state, lambda failure, step: self._replace_role(failure, step, [])[0],
            self._next_step, self._recoveries,
        )

    def _gather_state(self) -> ModelState:
        deployment, _ = self._require_setup()
        assert self._ctx is not None
        # With standby servers: the write-backs logged before the snapshots are in this model.
        marks = deployment.wait([t.rpc_async().writeback_mark() for t in self._trainers]
                                if self.standby_servers else [])
        snapshots = deployment.wait([t.rpc_async().snapshot() for t in self._trainers])
        shards = deployment.wait([s.rpc_async().state() for s in self._servers])
        rows = gather_rows(shards, self._ctx.schema.total_rows)
        for ids, cached, _ in snapshots:  # cached rows are newer than the servers' copies
            rows[ids] = cached
        state = ModelState(tables=split_tables(rows, self._ctx.schema), dense=snapshots[0][2])
        if self.standby_servers:  # a dead shard is rebuilt from this model from now on
            self._base = state
            deployment.wait([t.rpc_async().trim_writebacks(mark)
                             for t, mark in zip(self._trainers, marks, strict=True)])
        return state

    def state_devices(self) -> dict[str, str]:
        return trainer_state_devices(self.name, self._deployment, self._trainers)

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
        reports, self._progress_reports = self._progress_reports, []
        try:
            if deployment.failure is None and not self._abandoned:
                if reports:  # their replies must not meet a closed connection
                    deployment.wait(reports, timeout_s=30)
                roles = [*self._trainers, *([self._oracle] if self._oracle else [])]
                deployment.wait([r.rpc_async().close() for r in roles], timeout_s=30)
        finally:
            deployment.close()

    def _require_setup(self) -> tuple[Deployment, RoleRef]:
        if self._deployment is None or self._oracle is None:
            raise RuntimeError("Bagpipe used before setup(ctx) or after close()")
        return self._deployment, self._oracle


def _cannot_rebuild_together(dead: Sequence[str], trainers: Sequence[str]) -> str:
    """Why roles that died together cannot all be rebuilt in place, or ``""``. Shards can: each
    is rebuilt from the base and the trainers' write-back logs. A trainer with any other role
    cannot: a dead shard's rows need the write-backs the trainer logged, and two trainers' update
    logs may both hold a row, with nothing to say which value is the newer."""
    if len(dead) > 1 and set(dead) & set(trainers):
        return f"{' and '.join(dead)} died together: a dead trainer's logs are part of the others'"
    return ""


def _finished_everywhere(futures: list[Future]) -> list[Any] | None:
    """Every trainer's result of the step in flight if each finished it, else ``None`` (one
    failed, or one is still running after ``_RECOVERY_S``)."""
    if not ended_within(futures, _RECOVERY_S):
        return None
    try:
        return [f.wait() for f in futures]
    except Exception:
        return None
