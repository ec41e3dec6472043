"""The ``sync_ps`` trainer role: pull every row a slice needs, train, push, all-reduce, repeat."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch

from bagpipe.core import collectives, runtime
from bagpipe.core.interface import TrainerSpec
from bagpipe.core.meter import Phase, StepRecord
from bagpipe.core.roles import Rendezvous, RoleRef
from bagpipe.models import table_dim
from bagpipe.paramserver import ParameterServerTrainer, wait_acks
from bagpipe.training.step import forward_backward, sgd_dense_, unique_rows
from baselines.sync_ps.pushlog import LoggedPush, PushLog
from baselines.sync_ps.server import StepOrderedTables

_T = TypeVar("_T")


class SyncPSTrainer(ParameterServerTrainer):
    """Trainer ``rank`` of ``sync_ps``: a dense replica; embeddings live only on the servers.

    One step (everything on the critical path, nothing overlapped, nothing cached)::

        pull unique rows of the slice   (FETCH_WAIT: request + reply to the shards)
        forward / backward              (FORWARD, BACKWARD: DDP sums the dense gradients)
        push row gradients to shards    (SYNC: the shards sum them over trainers, in rank order)
        wait for every push ack         (SYNC: the next pull must see every trainer's update)
        SGD on the dense replica        (OPTIMIZER)

    With standbys (``agree``), the trainers agree after the acks that every one of them pulled
    and pushed (:func:`~bagpipe.core.collectives.any_failed`, 4 bytes). A shard that dies in the
    middle of a step fails the calls of only the trainers that reach it late; without the
    agreement, one whose pushes were acknowledged would apply the step that the others train
    again. With it, every trainer leaves the step in flight with an error, and the shard is
    rebuilt at that boundary (``bagpipe.paramserver.system``, *Recovery*). A trainer whose pull
    failed goes on to that agreement through the step's collectives, training on zero rows and
    pushing nothing: leaving at once would leave its peers waiting in the dense all-reduce, and
    agreeing on the pull too would cost every step a second collective. No trainer applies
    anything before the agreement, and the shards drop the pushes of a step trained again.
    """

    def __init__(
        self, rank: int, group: Rendezvous, servers: list[RoleRef], spec: TrainerSpec,
        log_pushes: bool = False, agree: bool = False,
    ) -> None:
        """``log_pushes``: keep every push (``pushlog``), so that a dead shard can be rebuilt;
        ``agree``: agree on the shards' calls of each step (class docstring)."""
        super().__init__(rank, group, servers, spec)
        self._push_log = PushLog(len(servers)) if log_pushes else None
        self.tables = StepOrderedTables(servers, rank, self._push_log)
        self.offsets = spec.schema.table_offsets
        self.dim = table_dim(spec.model)
        self.agree = agree
        self.recovery_paused = False  # the log and agreements off (``pause_recovery_logs``)

    def train_step(
        self, step: int, dense: torch.Tensor, ids: torch.Tensor, labels: torch.Tensor
    ) -> tuple[float, StepRecord]:
        """Train on this trainer's slice of global batch ``step`` (``ids [B/T, F]`` per-table ids).

        Returns its loss and record. ``step`` tags the pull and the push, so the shards apply
        each step's gradients as one sum in rank order (``server.py``).
        """
        meter = runtime.current().meter
        with meter.phase(Phase.FETCH_WAIT):
            unique_ids, inverse = unique_rows(ids + self.offsets)
            rows, failed = self._attempt(lambda: self.tables.pull_at(step, unique_ids))
        if rows is None:  # the pull failed: the step's collectives still run (class docstring)
            rows = torch.zeros(unique_ids.numel(), self.dim)
        grads = forward_backward(
            self.ddp_model, dense, rows, inverse, labels, self.global_batch_size, meter
        )
        with meter.phase(Phase.SYNC):
            if failed is None:
                _, failed = self._attempt(lambda: wait_acks(
                    self.tables.push_at(step, unique_ids, grads.row_grads, self.optim.embedding_lr)
                ))
            if self._agreeing() and collectives.any_failed(failed is not None):
                raise RuntimeError(f"trainer_{self.rank}: a trainer's pull or push of step {step} "
                                   f"failed") from failed
        with meter.phase(Phase.OPTIMIZER):
            sgd_dense_(self.model, self.optim.dense_lr)
        meter.count("unique_rows", float(unique_ids.numel()))
        return grads.loss, meter.end_step()

    def _agreeing(self) -> bool:
        return self.agree and not self.recovery_paused

    def _attempt(self, call: Callable[[], _T]) -> tuple[_T | None, Exception | None]:
        """``call()``'s value; agreeing, a failure is returned for the agreement instead of
        raised, so that this trainer's peers hear of it."""
        if not self._agreeing():
            return call(), None
        try:
            return call(), None
        except Exception as exc:  # a shard died
            return None, exc

    def pushes_to(self, shard: int, step: int) -> list[LoggedPush]:
        """This trainer's pushes to ``shard`` of the finished steps before ``step``; the step in
        flight's pushes (to any shard) are forgotten, since it is trained again from its start."""
        log = self._log()
        log.drop_from(step)
        return log.before(shard, step)

    def drop_pushes_before(self, step: int) -> None:
        """The driver took a new base at ``step`` (``pushlog``): the earlier pushes are not needed."""
        self._log().drop_before(step)

    def pause_recovery_logs(self, paused: bool) -> None:
        """Stop or restart the push log and the agreements, between steps
        (``bagpipe.core.recovery.PausableRecoveryLogs``: the fault bench's A/B)."""
        self.recovery_paused = paused
        self.tables.log = None if paused else self._push_log

    def _log(self) -> PushLog:
        if self._push_log is None:
            raise RuntimeError(f"trainer_{self.rank}: built without log_pushes")
        return self._push_log
