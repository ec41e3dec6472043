"""A Bagpipe trainer: the critical path of one iteration, and the cache rounds behind it.

One :class:`BagpipeTrainer` lives in each trainer process (``trainer_<k>``). It holds a replica of the
dense model and a :class:`~bagpipe.cache.TrainerCache`, receives the oracle's plans
(:class:`~bagpipe.oracle.plan.StepPlan`, :class:`~bagpipe.oracle.plan.RoundPlan`) ahead of time, and
trains on slice ``k`` of every global batch.

Critical path of step ``n`` (``train_step``)::

    [wait round n/ci installed, if n starts a round]  FETCH_WAIT (0 when the prefetch kept up)
    gather rows of the slice from the cache           FORWARD
    forward, backward                                 FORWARD, BACKWARD
    all-reduce(sync_now_n grads ++ dense grads)       SYNC  (one collective, SUM)
    wait sync_later_{n-1} all-reduce (started at n-1) SYNC  (normally long done)
    SGD: cache rows (sync_now_n, own singletons_n, sync_later_{n-1}), dense   OPTIMIZER
    start all-reduce(sync_later_n), async             -> applied at step n+1

Background, one thread (``bagpipe-rounds``): round ``r`` starts when step ``(r-1)*ci`` starts and runs
evict -> write back own share -> (server-side read-after-write barrier) -> prefetch -> install.

**Collectives and threads (gloo).** All collectives are issued by the training thread, in the same
order on every trainer, on the one trainer group: ``sync_now`` blocking, ``sync_later`` as an async
op whose handle is waited at the next step. gloo runs outstanding async ops of one group in issue
order, so no two threads ever issue collectives on one group. The round thread uses no collective:
its barrier lives in the embedding-server shards (``bagpipe.server``), which is also where the
original put it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from bagpipe.cache import TrainerCache
from bagpipe.core import collectives, runtime
from bagpipe.core.batch import DatasetSchema
from bagpipe.core.cluster import GroupSpec
from bagpipe.core.meter import LinkKind, Phase, StepRecord
from bagpipe.core.roleref import RoleRef
from bagpipe.core.system import OptimConfig
from bagpipe.models import ModelConfig, build_dense_model, table_dim
from bagpipe.oracle.plan import RoundPlan, StepPlan
from bagpipe.server import ShardLayout
from bagpipe.systems.common import forward_backward, sgd_dense_, unique_rows


@dataclass(frozen=True)
class TrainerConfig:
    """What every trainer is built with (picklable, sent by the driver)."""

    num_trainers: int
    schema: DatasetSchema
    model: ModelConfig
    optim: OptimConfig
    global_batch_size: int
    seed: int
    cleanup_interval: int
    cache_capacity: int | None
    #: The dense weights to start from when resuming from a checkpoint (else the seeded ones).
    dense_state: dict[str, torch.Tensor] | None = None


def scatter_rows(target_ids: torch.Tensor, ids: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """``[len(target_ids), D]`` buffer with ``values[j]`` at ``ids[j]``'s position, zeros elsewhere.

    ``target_ids`` are sorted (the plan's lists); ids not in them are ignored. This is how a trainer
    lays out its local gradients on the global list of rows that the all-reduce sums.
    """
    out = values.new_zeros(target_ids.numel(), values.shape[1])
    if target_ids.numel() == 0 or ids.numel() == 0:
        return out
    pos = torch.searchsorted(target_ids, ids).clamp_(max=target_ids.numel() - 1)
    hit = target_ids[pos] == ids
    out[pos[hit]] = values[hit]
    return out


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
    """Trainer ``index`` of ``cfg.num_trainers`` (a role object, built by ``Cluster.remote``)."""

    def __init__(
        self, index: int, cfg: TrainerConfig, group: GroupSpec, servers: list[RoleRef],
    ) -> None:
        collectives.join_group(group, index)
        self.index = index
        self.cfg = cfg
        self.role = runtime.current().role
        self.servers = servers
        self.layout = ShardLayout(len(servers))
        self.offsets = cfg.schema.table_offsets
        self.model = build_dense_model(cfg.model, cfg.schema, cfg.seed)
        if cfg.dense_state is not None:
            self.model.load_state_dict(cfg.dense_state)
        self.model.train()
        self.cache = TrainerCache(cfg.cache_capacity, table_dim(cfg.model))
        self.board = _Board()
        self._pending_later: tuple[torch.Tensor, collectives.AllReduceHandle] | None = None
        # Round bookkeeping: rounds <= _allowed may start; rounds <= _installed are in the cache.
        self._round_cond = threading.Condition()
        self._allowed = 0
        self._installed = -1
        self._round_busy = threading.Lock()  # held from evict to install of one round
        self._shard_pool = ThreadPoolExecutor(max_workers=len(servers), thread_name_prefix="shard")
        self._thread = runtime.start_thread(self._run_rounds, f"bagpipe-rounds-{index}")

    # ------------------------------------------------------------------ from the oracle / driver
    def receive_plans(self, plans: list[StepPlan | RoundPlan]) -> None:
        """Plans pushed by the oracle (charged here, on receipt, as the loader's DATA traffic)."""
        tensors = [t for plan in plans for t in vars(plan).values() if isinstance(t, torch.Tensor)]
        if tensors:
            runtime.charge(LinkKind.DATA, *tensors)
        self.board.post(plans)

    def train_step(
        self, step: int, dense: torch.Tensor, ids: torch.Tensor, labels: torch.Tensor
    ) -> tuple[float, StepRecord]:
        """One iteration on this trainer's slice ``(dense [b, D], ids [b, F], labels [b])``."""
        meter = runtime.current().meter
        ci = self.cfg.cleanup_interval
        runtime.charge(LinkKind.DATA, dense, ids, labels)
        if step % ci == 0:
            with meter.phase(Phase.FETCH_WAIT):
                self._wait_installed(step // ci)
            self._allow(step // ci + 1)  # round r+1's evictions and prefetch overlap round r
        with meter.phase(Phase.DATA):
            plan = self.board.take_step(step)
        with meter.phase(Phase.FORWARD):
            unique, inverse = unique_rows(ids + self.offsets)
            rows, hits, misses = self.cache.read_for_step(unique)
        meter.add_cache(hits, misses)
        grads = forward_backward(
            self.model, dense, rows, inverse, labels, self.cfg.global_batch_size, meter
        )
        with meter.phase(Phase.SYNC):
            now = scatter_rows(plan.sync_now, unique, grads.row_grads)
            dense_grads = [self._grad_of(p) for p in self.model.parameters()]
            collectives.allreduce([now, *dense_grads])
            later_ids, later_sum = self._finish_pending_later()
        with meter.phase(Phase.OPTIMIZER):
            mine = plan.singleton[plan.singleton_owner == self.index]
            own = grads.row_grads[torch.searchsorted(unique, mine)]
            self.cache.apply_sgd(
                torch.cat([plan.sync_now, mine, later_ids]),
                torch.cat([now, own, later_sum]),
                self.cfg.optim.embedding_lr,
            )
            sgd_dense_(self.model, self.cfg.optim.dense_lr)
            self.cache.mark_stale(plan.singleton[plan.singleton_owner != self.index])
        later = scatter_rows(plan.sync_later, unique, grads.row_grads)
        self._pending_later = (plan.sync_later, collectives.allreduce_async(later))
        if self.index == 0:  # global-batch counts: once, so the sum over trainers is the count
            meter.count("rows_sync_now", float(plan.sync_now.numel()))
            meter.count("rows_sync_later", float(plan.sync_later.numel()))
        meter.count("rows_singleton", float(mine.numel()))
        return grads.loss, meter.end_step()

    def snapshot(self) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """Apply the pending sync-later update, then ``(ids, rows, dense state)`` of fresh rows.

        Waits for a round in progress to finish (rows being written back are then on the servers).
        """
        ids, summed = self._finish_pending_later()
        self.cache.apply_sgd(ids, summed, self.cfg.optim.embedding_lr)
        with self._round_busy:
            cached_ids, rows = self.cache.resident()
        dense = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        return cached_ids, rows, dense

    def close(self) -> None:
        with self.board.cond:
            self.board.closed = True
            self.board.cond.notify_all()
        with self._round_cond:
            self._round_cond.notify_all()
        self._thread.join(timeout=5.0)
        # A round blocked on a server barrier (a peer failed) must not hold up the shutdown.
        self._shard_pool.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------------ critical-path helpers
    @staticmethod
    def _grad_of(param: torch.nn.Parameter) -> torch.Tensor:
        if param.grad is None:
            param.grad = torch.zeros_like(param)
        return param.grad

    def _finish_pending_later(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._pending_later is None:
            return torch.empty(0, dtype=torch.int64), torch.empty(0, self.cache.dim)
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
        with self._round_cond:
            self._round_cond.wait_for(lambda: self._installed >= round_index or self.board.closed)

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
                self._execute_round(plan)
            with self._round_cond:
                self._installed = round_index
                self._round_cond.notify_all()
            round_index += 1

    def _execute_round(self, plan: RoundPlan) -> None:
        meter = runtime.current().meter
        mine = plan.writeback_for(self.index)
        rows = self.cache.evict(plan.evict, writeback=mine)
        parts = self.layout.split(mine)
        list(self._shard_pool.map(
            lambda s: self._write_back(s, plan.round_index, mine[parts[s]], rows[parts[s]]),
            range(len(self.servers)),
        ))
        meter.count("rows_written_back", float(mine.numel()))
        fetch = plan.prefetch_for(self.index)
        parts = self.layout.split(fetch)
        fetched = torch.empty(fetch.numel(), self.cache.dim)
        shard_rows = self._shard_pool.map(
            lambda s: self._fetch(s, plan.round_index, fetch[parts[s]]), range(len(self.servers))
        )
        for pos, got in zip(parts, shard_rows, strict=True):
            fetched[pos] = got
        self.cache.install(fetch, fetched)
        meter.count("rows_prefetched", float(fetch.numel()))

    def _write_back(self, shard: int, round_index: int, ids: torch.Tensor, rows: torch.Tensor) -> None:
        server = f"server_{shard}"
        runtime.transfer(server, LinkKind.EMB_PUSH, ids, rows, rows=ids.numel())
        self.servers[shard].rpc_sync().write_back(round_index, ids, rows)

    def _fetch(self, shard: int, round_index: int, ids: torch.Tensor) -> torch.Tensor:
        if ids.numel() == 0:
            return torch.empty(0, self.cache.dim)
        server = f"server_{shard}"
        runtime.transfer(server, LinkKind.EMB_PULL, ids)
        rows = self.servers[shard].rpc_sync().fetch(round_index, ids, self.role)
        runtime.charge(LinkKind.EMB_PULL, rows, rows=ids.numel())
        return rows

    def stats(self) -> dict[str, Any]:
        return {"cache_rows": len(self.cache), "cache_slots": self.cache.num_slots}
