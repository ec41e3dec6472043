"""Step-ordered embedding-server shards for ``sync_ps``: bit-reproducible sums of the trainers' pushes.

A plain :class:`~bagpipe.paramserver.EmbeddingServer` applies each trainer's push as it
arrives, so a row both trainers touched gets ``(w - lr*g0) - lr*g1`` or ``(w - lr*g1) - lr*g0``
depending on the race: equal only to fp tolerance, and a run recovered from a checkpoint could not
match an uninterrupted one bit for bit. Here a shard buffers step ``s``'s pushes (tagged with the
step and the trainer's rank) and applies them once, as ``w - lr * (g_0 + g_1 + ...)`` summed in rank
order, before it serves any read of a later step (``fetch_rows_at(s + 1, ...)``) or its state.

Why buffering until the next read is enough: the driver starts step ``s + 1`` only after every
trainer's step-``s`` pushes were acknowledged (buffered), so the first read of step ``s + 1`` finds
all of them; and a fast trainer's step-``s + 1`` push, which may arrive before a slow trainer's
step-``s + 1`` read, stays buffered under its own step. The shard never needs to know how many
pushes a step has (a trainer whose slice has no row on a shard sends it nothing), and the wire
carries exactly the tensors a plain push does: the step and rank are RPC arguments, not payload.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import torch
from torch.futures import Future

from bagpipe.core import runtime
from bagpipe.core.meter import LinkKind
from bagpipe.core.roles import RoleRef
from bagpipe.paramserver import EmbeddingServer, ShardedTables
from baselines.sync_ps.pushlog import LoggedPush, PushLog

__all__ = ["StepOrderedServer", "StepOrderedTables"]


class StepOrderedServer(EmbeddingServer):
    """An :class:`EmbeddingServer` whose SGD updates are per-step sums in trainer-rank order."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """Arguments as :class:`EmbeddingServer`'s (shard, num_shards, schema, dim, seed, resume)."""
        super().__init__(*args, **kwargs)
        # step -> rank -> (local rows, gradients, lr); guarded by ``_pending_lock``.
        self._pending: dict[int, dict[int, tuple[torch.Tensor, torch.Tensor, float]]] = {}
        self._pending_lock = threading.Lock()
        self._applied_before = -1  # every step below this one is applied; later pushes are bugs

    def push_at(
        self, step: int, rank: int, ids: torch.Tensor, grads: torch.Tensor, lr: float
    ) -> None:
        """Buffer trainer ``rank``'s gradients of ``ids`` (unique) for step ``step``."""
        local = self.local_index(ids)
        with self._pending_lock:
            if step < self._applied_before:
                raise ValueError(
                    f"server_{self.shard}: trainer {rank}'s push for step {step} arrived after "
                    f"step {step} was applied"
                )
            pushes = self._pending.setdefault(step, {})
            if rank in pushes:
                raise ValueError(f"server_{self.shard}: trainer {rank} pushed step {step} twice")
            pushes[rank] = (local, grads, lr)

    def discard_pushes_from(self, step: int) -> None:
        """Forget every buffered push of step ``step`` on: a trainer died in it, and the step is
        trained again from its start (``bagpipe.paramserver.system``, *Recovery*)."""
        with self._pending_lock:
            if step < self._applied_before - 1:
                raise ValueError(f"server_{self.shard}: step {step} is applied already")
            for late in [s for s in self._pending if s >= step]:
                del self._pending[late]

    def fetch_rows_at(self, step: int, ids: torch.Tensor) -> torch.Tensor:
        """Rows of global ``ids`` as step ``step`` must see them: every earlier step applied."""
        self._apply_before(step)
        return self.fetch_rows(ids)

    def state(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(global ids, rows)`` with every buffered step applied (the driver asks between steps)."""
        self._apply_before(None)
        return super().state()

    def replay(self, pushes_by_rank: list[list[LoggedPush]], step: int) -> None:
        """Rebuild this shard's rows at the boundary before ``step`` from its base (the rows it
        was built from) and every trainer's logged pushes since (``pushes_by_rank[rank]``,
        ``pushlog``): each step applied as it was the first time, summed in rank order."""
        for rank, pushes in enumerate(pushes_by_rank):
            for push in pushes:
                self.push_at(push.step, rank, push.ids, push.grads, push.lr)
        self._apply_before(step)

    def _apply_before(self, step: int | None) -> None:
        """Apply, in step order, every buffered step before ``step`` (all of them for ``None``)."""
        with self._pending_lock:
            due = sorted(s for s in self._pending if step is None or s < step)
            for done in due:
                self._apply(self._pending.pop(done))
            if due:
                self._applied_before = max(self._applied_before, due[-1] + 1)
            if step is not None:
                self._applied_before = max(self._applied_before, step)

    def _apply(self, pushes: dict[int, tuple[torch.Tensor, torch.Tensor, float]]) -> None:
        """``w[rows] -= lr * sum_rank g_rank``, the sum taken in rank order (deterministic)."""
        ranks = sorted(pushes)
        lrs = {pushes[rank][2] for rank in ranks}
        if len(lrs) != 1:
            raise ValueError(f"server_{self.shard}: trainers pushed one step with lrs {lrs}")
        locals_ = torch.cat([pushes[rank][0] for rank in ranks])
        rows, inverse = torch.unique(locals_, return_inverse=True)
        total = torch.zeros(rows.numel(), self.rows.shape[1], dtype=self.rows.dtype)
        for rank, positions in zip(
            ranks, torch.split(inverse, [pushes[r][0].numel() for r in ranks]), strict=True
        ):
            total.index_add_(0, positions, pushes[rank][1])  # one rank's rows are unique
        with self.lock:
            self.rows.index_add_(0, rows, total, alpha=-lrs.pop())


class StepOrderedTables(ShardedTables):
    """The trainer-side client of :class:`StepOrderedServer` shards (pulls and pushes carry the step).

    The calls carry the same tensors as :class:`ShardedTables`'s ``pull``/``push_gradients``
    (the step and rank are plain arguments), so they cost and count the same.
    """

    def __init__(self, servers: list[RoleRef], rank: int, log: PushLog | None = None) -> None:
        super().__init__(servers)
        self.rank = rank
        self.log = log  # every push, for rebuilding a dead shard (``pushlog``)

    def pull_at(self, step: int, ids: torch.Tensor) -> torch.Tensor:
        """Rows of global ``ids`` for step ``step`` (``[len(ids), dim]``), counted as EMB_PULL."""
        split = self._split(ids)
        futures = [
            self.servers[s].rpc_async(kind=LinkKind.EMB_PULL).fetch_rows_at(step, ids[pos])
            for s, pos in split
        ]
        return self._scatter(ids, split, torch.futures.wait_all(futures))

    def push_at(self, step: int, ids: torch.Tensor, grads: torch.Tensor, lr: float) -> Future:
        """Send step ``step``'s gradients of ``ids`` to their shards; completes on every ack."""
        acks, logging_s = [], 0.0
        for s, pos in self._split(ids):
            push = LoggedPush(step, ids[pos], grads[pos], lr)
            if self.log is not None:
                started_s = time.thread_time()
                self.log.append(s, push)
                logging_s += time.thread_time() - started_s
            acks.append(self.servers[s].rpc_async(kind=LinkKind.EMB_PUSH).push_at(
                step, self.rank, push.ids, push.grads, lr))
        if self.log is not None:  # the same counter as Bagpipe's log (the fault bench reads it)
            runtime.current().meter.count("recovery_log_cpu_s", logging_s)
        return torch.futures.collect_all(acks)
