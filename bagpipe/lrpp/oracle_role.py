"""Bagpipe's oracle as a role process: plans the training stream and pushes plans to the trainers.

The oracle runs on a machine of its own in the paper; here it is the ``oracle`` role of a
:class:`~bagpipe.core.roles.Deployment`. It plans over the batches the runner will train (epoch
after epoch, from a resumed step on: :class:`~bagpipe.training.start.TrainingStream`) with the
importable :class:`~bagpipe.oracle.OracleCacher`, and pushes every trainer its step and round plans
at most ``window_steps`` ahead of training, so plans in flight stay bounded whatever the stream's
length. Plans cross the oracle's NIC to every trainer (the wire delays them) and the trainers
count them as the loader's ``data``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import asdict

from bagpipe.core import runtime
from bagpipe.core.batch import DatasetSchema
from bagpipe.core.meter import LinkKind
from bagpipe.core.roles import RoleRef
from bagpipe.oracle.cacher import OracleCacher
from bagpipe.oracle.config import OracleConfig
from bagpipe.oracle.plan import RoundPlan, StepPlan
from bagpipe.training.start import TrainingStream

__all__ = ["OracleRole"]

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
        self._error: BaseException | None = None  # a push failed (a trainer died): see advance
        self.planner = OracleCacher(schema, config)

    def start(self) -> None:
        self._thread = runtime.start_thread(self._run, "bagpipe-oracle")

    def advance(self, step: int) -> float:
        """Training reached ``step``; return the planning time spent since the previous call.

        Raises the error that stopped the planning thread, if one did (a trainer it pushed plans
        to died): the step fails with it, and the driver recovers.
        """
        if self._error is not None:
            raise RuntimeError("the oracle stopped planning") from self._error
        with self._cond:
            self._progress = max(self._progress, step)
            self._cond.notify_all()
            spent, self._planning_s = self._planning_s, 0.0
        return spent

    def stats(self) -> dict[str, float]:
        """The planner's totals so far (rows planned, evictions, planning time)."""
        return {f"oracle_{k}": float(v) for k, v in asdict(self.planner.stats).items()}

    def close(self) -> bool:
        """Stop planning; whether the planning thread has ended (it may be finishing a push)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        return self._thread is None or not self._thread.is_alive()

    def _run(self) -> None:
        planner = self.planner
        reported_s = 0.0
        for plan in planner.plan(self.source.global_ids(), flush=False):
            with self._cond:
                spent_s = planner.stats.planning_time_s
                self._planning_s += spent_s - reported_s
                reported_s = spent_s
                due = _first_step(plan)
                self._cond.wait_for(self._may_push(due))
                if self._closed:
                    return
            try:
                self._push([plan])
            except Exception as exc:  # a trainer died: the next advance says so
                self._error = exc
                return

    def _may_push(self, due: int) -> Callable[[], bool]:
        """Plans for step ``due`` go out once training is within the window of it (or closing)."""
        return lambda: self._closed or due <= self._progress + self.window_steps

    def _push(self, plans: list[Plan]) -> None:
        futures = [t.rpc_async(kind=LinkKind.DATA).receive_plans(plans) for t in self.trainers]
        for future in futures:
            future.wait()
