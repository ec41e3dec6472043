"""``sync_ps``: synchronous parameter-server training with no cache and no prefetch.

The paper's "no cache / no prefetch" ablation done correctly: the original's lookahead-1 baseline
never wrote embedding updates back to the server (bagpipe.md §4.6). Here every step pulls the rows
its batch needs from S embedding-server shards, trains, and pushes the row gradients back; the step
ends only once every shard acknowledged every trainer's push, so the next pull sees all updates.
Training is therefore exactly synchronous SGD (equal to ``local`` to fp tolerance), and every byte
of embedding traffic sits on the critical path: the upper bound caching systems are measured from.
The shards sum each step's pushes in trainer-rank order (``server.py``), so a run is bit-reproducible
and one recovered from a checkpoint ends bit-identical to an uninterrupted one.

Its trainers hold nothing but the dense replica, so with ``standby_trainers`` a dead trainer is
replaced in place and the step in flight trained again, no step redone; with ``standby_servers``
a dead shard is rebuilt in place from the newest checkpoint's rows and the pushes the trainers
logged since (``pushlog``), again with no step redone (``bagpipe.paramserver.system``,
*Recovery*). With either standby the trainers agree, after each step's pull and after its acks,
that every one of them succeeded (``SyncPSTrainer``), so a shard that dies inside a step fails
that step on every trainer, and it is trained again.

Processes: ``server_0..S-1`` (:class:`~baselines.sync_ps.server.StepOrderedServer`) and
``trainer_0..T-1`` (:class:`~baselines.sync_ps.trainer.SyncPSTrainer`, one gloo group for the dense
all-reduce); the driver (this object, a :class:`~bagpipe.paramserver.ParameterServerSystem`)
sends each trainer its slice of the global batch.
"""

from __future__ import annotations

from typing import Any

from torch.futures import Future

from bagpipe.core.batch import Batch, ids_matrix
from bagpipe.core.interface import ModelState, StepResult
from bagpipe.core.meter import LinkKind
from bagpipe.paramserver import ParameterServerSystem, gather_tables
from baselines.sync_ps.server import StepOrderedServer
from baselines.sync_ps.trainer import SyncPSTrainer


class SyncPS(ParameterServerSystem):
    """Synchronous PS baseline (see the module docstring).

    Args:
        num_trainers: ``T`` trainer processes (the global batch splits into T equal slices).
        num_servers: ``S`` embedding-server shards.
        step_timeout_s: how long one step (or a state gather) may take before the run fails.
        standby_trainers: idle trainer processes that replace dead trainers in place.
        standby_servers: idle server processes that replace dead shards in place (the trainers
            then log their pushes: ``pushlog``).
    """

    name = "sync_ps"
    supports_resume = True
    replaces_trainers = True
    replaces_servers = True
    server_class = StepOrderedServer
    trainer_class = SyncPSTrainer

    def __init__(
        self, num_trainers: int = 2, num_servers: int = 2, step_timeout_s: float = 600.0,
        standby_trainers: int = 0, standby_servers: int = 0,
    ):
        super().__init__(num_trainers, num_servers, step_timeout_s, standby_trainers,
                         standby_servers)

    def _trainer_args(self) -> tuple[Any, ...]:
        # log_pushes: only a shard rebuild needs the log; agree: any replacement needs every
        # trainer to leave a failed step (``SyncPSTrainer``)
        return bool(self.standby_servers), bool(self.standby_servers or self.standby_trainers)

    def train_step(self, step: int, batch: Batch) -> StepResult:
        def issue() -> list[Future]:
            return [
                trainer.rpc_async(kind=LinkKind.DATA).train_step(
                    step, part.dense_features, ids_matrix(part), part.labels
                )
                for trainer, part in self._slices(batch)
            ]

        return self._train_replacing(step, issue)

    def pause_recovery_logs(self, paused: bool) -> None:
        """Every trainer's push log and agreements off or on, between steps
        (:class:`~bagpipe.core.recovery.PausableRecoveryLogs`: the fault bench's A/B)."""
        self._wait([trainer.rpc_async().pause_recovery_logs(paused) for trainer in self._trainers])
        self._logs_paused = self._logs_paused or paused

    def full_state(self) -> ModelState:
        return self._between_steps(self._gather_state)

    def _gather_state(self) -> ModelState:
        ctx, _ = self._require_setup()
        tables = gather_tables(self._shard_states(), ctx.schema)
        if self.standby_servers:  # a dead shard is rebuilt from these rows from now on
            self._new_base(self._next_step, tables)
        return ModelState(tables=tables, dense=self._dense_state())

    def stats(self) -> dict[str, Any]:
        return {"num_trainers": self.num_trainers, "num_servers": self.num_servers}
