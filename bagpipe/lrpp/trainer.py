"""A Bagpipe trainer: the critical path of one iteration, and the cache rounds behind it.

One :class:`BagpipeTrainer` lives in each trainer process (``trainer_<k>``). It holds a replica of the
dense model and a :class:`~bagpipe.lrpp.cache.TrainerCache`, receives the oracle's plans
(:class:`~bagpipe.oracle.plan.StepPlan`, :class:`~bagpipe.oracle.plan.RoundPlan`) ahead of time, and
trains on slice ``k`` of every global batch.

Critical path of step ``n`` (``train_step``)::

    [wait round n/ci installed, if n starts a round]  FETCH_WAIT (0 when the prefetch kept up)
    gather rows of the slice from the cache           FORWARD
    forward, backward                                 FORWARD, BACKWARD
      DDP all-reduces the dense gradients as backward makes them; the last bucket also
      carries sync_now_n's row gradients (one collective, SUM)
    wait sync_later_{n-1} all-reduce (started at n-1) SYNC  (normally long done)
    SGD: cache rows (sync_now_n, own singletons_n, sync_later_{n-1}), dense   OPTIMIZER
    start all-reduce(sync_later_n), async             -> applied at step n+1

Background, one thread (``bagpipe-rounds``): round ``r`` starts when step ``(r-1)*ci`` starts and runs
evict -> write back own share -> (server-side read-after-write barrier) -> prefetch -> install.
It and its shard calls (their own pool) run below the training thread's CPU priority
(``bagpipe.core.runtime.run_in_background``, the rule for every system's background threads): on
the target they use the host's spare cores while the GPU computes. A fetch on the critical path
(``prefetch=False``) goes through a pool at the step's priority.
An error there (a peer died) stops the rounds; the next step that waits for a round raises it, so
the failure reaches the driver as the step's, and a replacement can salvage this trainer's rows.

**Ablations** (:class:`Design`; each one keeps training exact, only the cost moves). They re-read
the oracle's plans; the oracle plans the same stream whatever the knobs say:

* ``sync_later=False``: a step's ``sync_later`` rows join its ``sync_now`` all-reduce on the
  critical path (no collective left to overlap the next step); their update lands one step earlier,
  which no read sees, since step ``n+1`` does not use them;
* ``prefetch=False``: rounds only evict and write back; each step fetches the rows of its round's
  prefetch list that it is the first to use, on the critical path (``FETCH_WAIT``) right before it
  trains, after the round's read-after-write barrier like any fetch of that round. A later fetch
  reads the same value as the prefetch would have: no trainer holds a row of the list, and round
  ``r+1``'s evictions (running meanwhile) only take rows last used before step ``r*ci - 1``;
* ``partition=False``: pure logical replication: singleton rows become ``sync_later`` rows (held,
  fetched and updated by every trainer, all-reduced); every trainer fetches every prefetched row.
  The oracle still writes a former singleton back from its last user, which holds the final value
  like every replica does.

**A timing probe, not an ablation:** ``row_sync=False`` makes the trainers' synchronisation of
replicated rows free, as the embedding-free bound makes every embedding access free
(``bagpipe.training.embedding_free``): no row rides in DDP's last bucket and no sync-later
collective is issued, and no gradient is laid out on the plan's shared lists: each trainer applies
its own slice's gradients to the rows its slice used, in the step, as the bound's trainers do, so
replicas diverge and training is **not exact**. Everything else (the oracle's plans, the
cache, the rounds, the servers and their traffic) is unchanged, so Bagpipe's time over the bound
splits into what LRPP's row synchronisation costs (Bagpipe / this probe) and what the rest of the
implementation costs (this probe / the bound): ``suite=bound_split``.

**A second timing probe:** ``row_layout=False`` keeps row synchronisation whole (the same
collectives, the same sizes, every shared row updated on every trainer) but lays no gradient out
on the plan's shared lists (:func:`scatter_rows`): the collectives carry zeros
(:func:`no_layout`). Shared rows then never learn, so it is not exact either. Bagpipe / this probe
is what our layout code costs; this probe / the ``row_sync=False`` one is what the algorithm's
row synchronisation itself costs: its bytes, on the collective every system uses, and the update of
every replica.

**Devices.** The dense replica and the cache's rows live on the trainer's device (``spec.device``,
``bagpipe.core.device``); plans, ids and the cache's bookkeeping stay on the host, where the round
thread works. A step's id lists cross to the device once, charged as ``h2d``; rows leave it only
to be written back, logged or snapshotted. A round's prefetched rows are copied on the cache's
side stream, which the step's reads wait for by event (``bagpipe.core.rowstore``).

**Collectives and threads (gloo).** All collectives are issued by the training thread, in the same
order on every trainer, on the one trainer group: ``sync_now`` blocking, ``sync_later`` as an async
op whose handle is waited at the next step. gloo runs outstanding async ops of one group in issue
order, so no two threads ever issue collectives on one group. The round thread uses no collective:
its barrier lives in the embedding-server shards (``bagpipe.lrpp.server``), which is also where the
original put it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

import torch

from bagpipe.core import collectives, runtime
from bagpipe.core.collectives import FusedTail
from bagpipe.core.device import host_copy, move, trainer_device
from bagpipe.core.interface import TrainerSpec
from bagpipe.core.meter import LinkKind, Phase, StepRecord
from bagpipe.core.roles import Rendezvous, RoleRef
from bagpipe.lrpp.cache import CacheError, TrainerCache
from bagpipe.lrpp.updatelog import LogEntry
from bagpipe.lrpp.writebacklog import WriteBack, WritebackLog
from bagpipe.models import table_dim
from bagpipe.oracle.config import OracleConfig
from bagpipe.oracle.plan import RoundPlan, StepPlan
from bagpipe.paramserver import ShardLayout
from bagpipe.training.start import start_dense_model
from bagpipe.training.step import forward_backward, replicate_dense, sgd_dense_, unique_rows


@dataclass(frozen=True)
class Design:
    """Which of the paper's ideas a trainer uses (module docstring, *Ablations*); all on = the paper.

    ``row_sync=False`` and ``row_layout=False`` are the timing probes of the module docstring (not
    exact), not ideas.
    """

    sync_later: bool = True
    prefetch: bool = True
    partition: bool = True
    row_sync: bool = True
    row_layout: bool = True


def scatter_rows(target_ids: torch.Tensor, ids: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """``[len(target_ids), D]`` buffer with ``values[j]`` at ``ids[j]``'s position, zeros elsewhere.

    ``target_ids`` are sorted (the plan's lists); ids not in them are ignored. This is how a trainer
    lays out its local gradients on the global list of rows that the all-reduce sums, twice a
    step, so it selects by index (``index_select``/``index_copy_``: a third less CPU than masks).
    """
    out = values.new_zeros(target_ids.numel(), values.shape[1])
    if target_ids.numel() == 0 or ids.numel() == 0:
        return out
    pos = torch.searchsorted(target_ids, ids).clamp_(max=target_ids.numel() - 1)
    hit = torch.nonzero(target_ids.index_select(0, pos) == ids).flatten()
    out.index_copy_(0, pos.index_select(0, hit), values.index_select(0, hit))
    return out


def no_layout(target_ids: torch.Tensor, ids: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """The ``row_layout=False`` probe's :func:`scatter_rows`: the same buffer, all zeros, with no
    gradient laid out on it (module docstring: the layout's cost, measured by leaving it out)."""
    del ids  # nothing is laid out
    return values.new_zeros(target_ids.numel(), values.shape[1])


def _merged(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The sorted union of two disjoint sorted id lists."""
    return torch.sort(torch.cat([a, b])).values


def reclassify(plan: StepPlan, design: Design) -> StepPlan:
    """The oracle's step plan as an ablated trainer executes it (module docstring, *Ablations*).

    ``partition=False`` turns singletons into shared rows that the next step does not use
    (``sync_later``); ``sync_later=False`` then moves every ``sync_later`` row into ``sync_now``,
    as ``row_sync=False`` does (the probe updates every shared row in the step it is used).
    The union of the three lists, the batch's unique rows, never changes.
    """
    if not design.partition:
        plan = replace(
            plan,
            sync_later=_merged(plan.sync_later, plan.singleton),
            singleton=plan.singleton[:0],
            singleton_owner=plan.singleton_owner[:0],
        )
    if not (design.sync_later and design.row_sync):
        plan = replace(
            plan, sync_now=_merged(plan.sync_now, plan.sync_later), sync_later=plan.sync_later[:0]
        )
    return plan


class _Board:
    """Plans that arrived from the oracle, and waiting for one that has not arrived yet."""

    def __init__(self) -> None:
        self.steps: dict[int, StepPlan] = {}
        self.rounds: dict[int, RoundPlan] = {}
        self.cond = threading.Condition()
        self.closed = False

    def post(self, plans: list[StepPlan | RoundPlan]) -> None:
        with self.cond:
            for plan in plans:
                if isinstance(plan, StepPlan):
                    self.steps[plan.step] = plan
                else:
                    self.rounds[plan.round_index] = plan
            self.cond.notify_all()

    def take_step(self, step: int) -> StepPlan:
        with self.cond:
            self.cond.wait_for(lambda: step in self.steps or self.closed)
            if self.closed:
                raise RuntimeError("trainer closed while waiting for a step plan")
            return self.steps.pop(step)

    def take_round(self, round_index: int) -> RoundPlan | None:
        with self.cond:
            self.cond.wait_for(lambda: round_index in self.rounds or self.closed)
            return None if self.closed else self.rounds.pop(round_index)


class BagpipeTrainer:
    """Trainer ``index`` of ``oracle.num_trainers`` (a role object, built by ``Deployment.remote``).

    Args:
        index: ``k``, this trainer's rank in the group and the slice of each batch it trains.
        group: the trainers' rendezvous (``Deployment.new_group``).
        servers: the shards' refs, ``servers[s]`` being shard ``s``.
        spec: the run's settings, the same as every system's trainers get.
        oracle: the oracle's knobs: the cleanup interval paces the rounds, the capacity sizes the
            cache.
        design: which of the paper's ideas are on (the ablations).
        log_updates: reply to every step with its :class:`~bagpipe.lrpp.updatelog.LogEntry`
            (its singletons updated, the rows dropped), and keep the replicated rows a peer
            writes back until the round's write-backs are done, so the driver can rebuild a dead
            trainer's rows (``bagpipe.lrpp.updatelog`` says why that is enough); otherwise the
            entry is ``None``.
        log_writebacks: keep every row written back (``bagpipe.lrpp.writebacklog``), so the
            driver can rebuild a dead server shard's rows.
    """

    def __init__(
        self,
        index: int,
        group: Rendezvous,
        servers: list[RoleRef],
        spec: TrainerSpec,
        oracle: OracleConfig,
        design: Design,
        log_updates: bool = False,
        log_writebacks: bool = False,
    ) -> None:
        collectives.join_group(group, index, spec.device)
        self.index = index
        self.device = trainer_device(spec.device, index, group.world_size)
        self.spec = spec
        self.ci = oracle.ci
        self.design = design
        self.role = runtime.current().role
        self.servers = servers
        self.layout = ShardLayout(len(servers))
        self.offsets = spec.schema.table_offsets
        self.model = start_dense_model(
            spec.model, spec.schema, spec.seed, spec.resume_state, self.device
        )
        self.model.train()
        self.fuse = FusedTail()  # sync-now rows ride in the dense part's last DDP bucket
        self.ddp_model = replicate_dense(self.model, self.fuse)
        self._dense_bytes = sum(runtime.nbytes(p) for p in self.model.parameters())
        self.log_updates = log_updates
        self.cache = TrainerCache(
            oracle.capacity, table_dim(spec.model), journal=log_updates, device=self.device,
            meter=runtime.current().meter,
        )
        self.writebacks = WritebackLog() if log_writebacks else None
        self.recovery_paused = False  # the logs and agreements off (``pause_recovery_logs``)
        self._applied_step = -1  # the last step whose update this trainer applied
        self.board = _Board()
        self._pending_later: tuple[torch.Tensor, collectives.AllReduceHandle] | None = None
        # Round bookkeeping: rounds <= _allowed may start; rounds <= _installed are in the cache.
        self._round_cond = threading.Condition()
        self._allowed = 0
        self._installed = -1
        self._round_busy = threading.Lock()  # held from evict to install of one round
        # prefetch=False: per round, the rows of its prefetch list no step of it fetched yet
        self._deferred: dict[int, torch.Tensor] = {}
        self._round_error: BaseException | None = None  # raised by the next step that waits
        #: log_updates: per round not yet done everywhere, the fresh rows this trainer evicted
        #: that a peer writes back (``(ids, rows)``; guarded by ``_round_cond``).
        self._evicted_replicas: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._shard_pool = ThreadPoolExecutor(max_workers=len(servers), thread_name_prefix="shard")
        self._round_pool = ThreadPoolExecutor(max_workers=len(servers), thread_name_prefix="round",
                                              initializer=runtime.run_in_background)
        self._thread = runtime.start_thread(self._run_rounds, f"bagpipe-rounds-{index}",
                                            background=True)

    # ------------------------------------------------------------------ from the oracle / driver
    def receive_plans(self, plans: list[StepPlan | RoundPlan]) -> None:
        """Plans pushed by the oracle (the oracle's calls count them as the loader's DATA)."""
        self.board.post(plans)

    def train_step(
        self, step: int, dense: torch.Tensor, ids: torch.Tensor, labels: torch.Tensor
    ) -> tuple[float, StepRecord, LogEntry | None]:
        """One iteration on this trainer's slice ``(dense [b, D], ids [b, F], labels [b])``:
        its loss, its record, and (``log_updates``) its log entry."""
        meter = runtime.current().meter
        spec, design, ci = self.spec, self.design, self.ci
        if step % ci == 0:
            with meter.phase(Phase.FETCH_WAIT):
                self._wait_installed(step // ci)
            self._allow(step // ci + 1)  # round r+1's evictions and prefetch overlap round r
        with meter.phase(Phase.DATA):
            planned = self.board.take_step(step)
        if not design.prefetch:
            with meter.phase(Phase.FETCH_WAIT):
                self._fetch_on_demand(step, planned)
        plan = reclassify(planned, design)
        with meter.phase(Phase.FETCH_WAIT):  # getting the step's rows, as every system times it
            unique, inverse = unique_rows(ids + self.offsets)
            rows, hits, misses = self.cache.read_for_step(unique)  # on this trainer's device
            unique_here = move(unique, self.device, meter)
        meter.add_cache(hits, misses)

        lay_out = scatter_rows if design.row_layout else no_layout

        def sync_now_rows(row_grads: torch.Tensor) -> torch.Tensor:
            return lay_out(move(plan.sync_now, self.device, meter), unique_here, row_grads)

        fused = self.fuse if design.row_sync else None  # the probe keeps its own gradients
        grads = forward_backward(
            self.ddp_model, dense, rows, inverse, labels, spec.global_batch_size, meter,
            fuse=fused, extra=sync_now_rows,
        )
        now = fused.take().view(-1, self.cache.dim) if fused else None  # summed over trainers
        with meter.phase(Phase.SYNC):
            later_ids, later_sum = self._finish_pending_later()
        summed_bytes = runtime.nbytes(now) if now is not None else 0
        meter.count("allreduce_bytes_critical", float(summed_bytes + self._dense_bytes))
        with meter.phase(Phase.OPTIMIZER):
            mine = plan.singleton[plan.singleton_owner == self.index]
            if now is None:  # the probe: its slice's own gradients on the rows its slice used
                self.cache.apply_sgd(unique, grads.row_grads, spec.optim.embedding_lr)
            else:
                own = grads.row_grads.index_select(
                    0, move(torch.searchsorted(unique, mine), self.device, meter))
                updated = torch.cat([plan.sync_now, mine, later_ids])
                self.cache.apply_sgd(
                    updated, torch.cat([now, own, later_sum]), spec.optim.embedding_lr
                )
            sgd_dense_(self.model, spec.optim.dense_lr)
            self.cache.mark_stale(plan.singleton[plan.singleton_owner != self.index])
            self._applied_step = step
            entry = self._log_entry(mine)
        if design.sync_later and design.row_sync:  # on every trainer alike: collectives in step
            with meter.phase(Phase.SYNC):  # gathering and issuing it is sync work, as waiting is
                later_here = move(plan.sync_later, self.device, meter)
                later = lay_out(later_here, unique_here, grads.row_grads)
                self._pending_later = (plan.sync_later, collectives.allreduce_async(later))
            meter.count("allreduce_bytes_later", float(runtime.nbytes(later)))
        if self.index == 0:  # global-batch counts: once, so the sum over trainers is the count
            meter.count("rows_sync_now", float(plan.sync_now.numel()))
            meter.count("rows_sync_later", float(plan.sync_later.numel()))
        meter.count("rows_singleton", float(mine.numel()))
        return grads.loss, meter.end_step(), entry

    def snapshot(self) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """Apply the pending sync-later update, then ``(ids, rows, dense state)`` of fresh rows.

        Waits for a round in progress to finish (rows being written back are then on the servers).
        """
        ids, summed = self._finish_pending_later()
        self.cache.apply_sgd(ids, summed, self.spec.optim.embedding_lr)
        with self._round_busy:
            cached_ids, rows = self.cache.resident()
        dense = {k: host_copy(v) for k, v in self.model.state_dict().items()}
        return cached_ids, rows, dense

    def salvage(self) -> tuple[int, torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """A peer died: stop, and hand over what this trainer holds at the step boundary.

        Closes the trainer (the driver first releases the servers' barriers, so a round waiting
        on the dead peer's write-back ends), applies the pending sync-later update (raises if the
        dead peer's share of it never arrived), and returns ``(last step applied, ids, rows,
        dense state)`` of its fresh rows, as :meth:`snapshot` does, with the replicated rows it
        evicted in a round not yet done everywhere (``log_updates``: ``bagpipe.lrpp.updatelog``).
        """
        self.close()
        if self._thread.is_alive():
            raise RuntimeError(f"{self.role}: its round thread did not stop")
        ids, summed = self._finish_pending_later()
        self.cache.apply_sgd(ids, summed, self.spec.optim.embedding_lr)
        cached_ids, rows = self.cache.resident()
        if self._evicted_replicas:  # a dead peer may not have written these back
            kept = list(self._evicted_replicas.values())
            kept_ids = torch.cat([ids for ids, _ in kept])
            gone = ~torch.isin(kept_ids, cached_ids)  # refetched since: the cache's is newer
            cached_ids = torch.cat([kept_ids[gone], cached_ids])
            rows = torch.cat([torch.cat([r for _, r in kept])[gone], rows])
        dense = {k: host_copy(v) for k, v in self.model.state_dict().items()}
        return self._applied_step, cached_ids, rows, dense

    def pause_recovery_logs(self, paused: bool) -> None:
        """Stop or restart the update log, the write-back log and the agreement on each round,
        between steps (``bagpipe.core.recovery.PausableRecoveryLogs``: the fault bench's A/B)."""
        self.recovery_paused = paused

    def close(self) -> None:
        with self.board.cond:
            self.board.closed = True
            self.board.cond.notify_all()
        with self._round_cond:
            self._round_cond.notify_all()
        self._thread.join(timeout=5.0)
        # A round blocked on a server barrier (a peer failed) must not hold up the shutdown.
        for pool in (self._shard_pool, self._round_pool):
            pool.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------------ critical-path helpers
    def _log_entry(self, singletons: torch.Tensor) -> LogEntry | None:
        """This step's :class:`LogEntry` (``log_updates``): ``singletons``, those this trainer
        updated in the step, are the rows only it holds fresh. The CPU time spent building it is
        counted as ``recovery_log_cpu_s``: CPU seconds, not wall, so that waiting for a core on a
        shared host is not charged to the log (the fault bench states the log's own cost)."""
        if not self.log_updates or self.recovery_paused:
            return None
        started_s = time.thread_time()
        entry = LogEntry(self.cache.drain_dropped(), singletons, self.cache.gather(singletons))
        runtime.current().meter.count("recovery_log_cpu_s", time.thread_time() - started_s)
        return entry

    def _finish_pending_later(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._pending_later is None:
            no_rows = torch.empty(0, self.cache.dim, device=self.device)
            return torch.empty(0, dtype=torch.int64), no_rows
        ids, handle = self._pending_later
        self._pending_later = None
        return ids, handle.wait()[0]

    def _allow(self, round_index: int) -> None:
        with self._round_cond:
            self._allowed = max(self._allowed, round_index)
            self._round_cond.notify_all()

    def _round_may_start(self, round_index: int) -> Callable[[], bool]:
        return lambda: self._allowed >= round_index or self.board.closed

    def _wait_installed(self, round_index: int) -> None:
        """Wait until round ``round_index`` is in the cache; raise if it failed.

        With standbys (either log on), the trainers then agree on it
        (:func:`~bagpipe.core.collectives.any_failed`): a shard's death fails the rounds of only
        the trainers that still needed it, and one that went on alone would wait in the step's
        collectives for peers that left (until the RPC timeout: 300 s). So either every trainer
        raises here, or none does, and the step in flight applies nowhere
        (``Bagpipe._replace_role`` replaces the shard at that boundary, or the job rolls back).
        """
        with self._round_cond:
            self._round_cond.wait_for(
                lambda: self._installed >= round_index or self.board.closed
                or self._round_error is not None
            )
        failed = self._round_error is not None
        if (self.log_updates or self.writebacks is not None) and not self.recovery_paused:
            failed = collectives.any_failed(failed)
        if failed:
            raise RuntimeError(f"{self.role}: a cache round failed") from self._round_error
        with self._round_cond:  # every trainer's round is installed: its write-backs are done
            for done in [r for r in self._evicted_replicas if r <= round_index]:
                del self._evicted_replicas[done]

    # ------------------------------------------------------------------ background rounds
    def _run_rounds(self) -> None:
        round_index = 0
        while True:
            with self._round_cond:
                self._round_cond.wait_for(self._round_may_start(round_index))
            plan = self.board.take_round(round_index)
            if plan is None:
                return
            with self._round_busy:
                started_cpu_s = time.thread_time()  # CPU: on shared cores it is the steps' too
                try:
                    self._execute_round(plan)
                except Exception as exc:  # a peer died (or a bug): the next step that waits says so
                    with self._round_cond:
                        self._round_error = exc
                        self._round_cond.notify_all()
                    return
                runtime.current().meter.count("round_cpu_s", time.thread_time() - started_cpu_s)
            with self._round_cond:
                self._installed = round_index
                self._round_cond.notify_all()
            round_index += 1

    def _execute_round(self, plan: RoundPlan) -> None:
        meter = runtime.current().meter
        mine = plan.writeback_for(self.index)
        keep = self.log_updates and not self.recovery_paused
        if keep:  # the replicated rows a peer writes back: if it dies first, they are here
            replicas = self.cache.fresh(plan.evict[plan.writeback_owner != self.index])
        rows, dropped = self.cache.evict(plan.evict, writeback=mine)
        parts = self.layout.split(mine)
        list(self._round_pool.map(
            lambda s: self._write_back(s, plan.round_index, mine[parts[s]], rows[parts[s]]),
            range(len(self.servers)),
        ))
        self.cache.journal_dropped(dropped)  # only now may the log forget them: a server has them
        if keep:
            with self._round_cond:
                self._evicted_replicas[plan.round_index] = replicas
        meter.count("rows_written_back", float(mine.numel()))
        if self.index == 0:  # the round's evictions, once (every trainer drops the same list)
            meter.count("rows_evicted", float(plan.evict.numel()))
        fetch = plan.prefetch_for(self.index) if self.design.partition else plan.prefetch
        if not self.design.prefetch:  # the round's steps fetch these themselves (_fetch_on_demand)
            self._deferred[plan.round_index] = fetch
            return
        started_s = time.perf_counter()
        self._fetch_into_cache(plan.round_index, fetch, background=True)
        meter.count("rows_prefetched", float(fetch.numel()))
        meter.count("prefetch_s", time.perf_counter() - started_s)

    def _fetch_on_demand(self, step: int, plan: StepPlan) -> None:
        """``prefetch=False``: fetch the rows of the round's list that step ``step`` uses first.

        Every row of a round's list is used by some step of the round, so the list is used up when
        the next round starts; anything left is a plan the trainer did not follow.
        """
        round_index = step // self.ci
        leftover = self._deferred.pop(round_index - 1, None)
        if leftover is not None and leftover.numel():
            raise CacheError(
                f"round {round_index - 1} left rows {leftover[:5].tolist()} unfetched "
                f"(no step of the round used them)"
            )
        pending = self._deferred[round_index]
        used = torch.isin(pending, torch.cat([plan.sync_now, plan.sync_later, plan.singleton]))
        self._deferred[round_index] = pending[~used]
        self._fetch_into_cache(round_index, pending[used])
        runtime.current().meter.count("rows_fetched_on_demand", float(int(used.sum())))

    def _fetch_into_cache(
        self, round_index: int, ids: torch.Tensor, background: bool = False
    ) -> None:
        """Fetch ``ids`` from their shards (after round ``round_index``'s barrier) and install them
        (``background``: the round thread's prefetch, copied to the device off the step's stream)."""
        parts = self.layout.split(ids)
        fetched = torch.empty(ids.numel(), self.cache.dim)
        pool = self._round_pool if background else self._shard_pool
        shard_rows = pool.map(
            lambda s: self._fetch(s, round_index, ids[parts[s]]), range(len(self.servers))
        )
        for pos, got in zip(parts, shard_rows, strict=True):
            fetched[pos] = got
        self.cache.install(ids, fetched, background)

    def _write_back(self, shard: int, round_index: int, ids: torch.Tensor, rows: torch.Tensor) -> None:
        if self.writebacks is not None and not self.recovery_paused:  # before sending: the rows
            # are evicted here already
            self.writebacks.append(WriteBack(round_index, shard, ids, rows))
        self.servers[shard].rpc_sync(kind=LinkKind.EMB_PUSH).write_back(round_index, ids, rows)

    def _fetch(self, shard: int, round_index: int, ids: torch.Tensor) -> torch.Tensor:
        if ids.numel() == 0:
            return torch.empty(0, self.cache.dim)
        return self.servers[shard].rpc_sync(kind=LinkKind.EMB_PULL).fetch(round_index, ids)

    def state_devices(self) -> dict[str, str]:
        """Where the dense replica and the cache's rows live."""
        dense = next(self.model.parameters())
        return {"dense": str(dense.device), "cache": str(self.cache.store.device)}

    def stats(self) -> dict[str, Any]:
        return {"cache_rows": len(self.cache), "cache_slots": self.cache.num_slots}

    # ------------------------------------------------------------------ the write-back log
    def writeback_mark(self) -> int:
        """The write-back log's position now (``full_state`` asks before its snapshot)."""
        return self._writeback_log().mark()

    def trim_writebacks(self, mark: int) -> None:
        """The driver's base holds every write-back before ``mark``: drop them."""
        self._writeback_log().trim(mark)

    def writebacks_to(self, shard: int) -> list[WriteBack]:
        """The logged write-backs to ``shard`` (a dead one, being rebuilt)."""
        return self._writeback_log().to_shard(shard)

    def _writeback_log(self) -> WritebackLog:
        if self.writebacks is None:
            raise RuntimeError(f"{self.role}: built without log_writebacks")
        return self.writebacks
