"""Bagpipe's oracle as a role process: plans the training stream and pushes plans to the trainers.

The oracle runs on a machine of its own in the paper; here it is the ``oracle`` role of a
:class:`~bagpipe.core.roles.Deployment`. It plans over the batches the runner will train (epoch
after epoch, from a resumed step on: :class:`~bagpipe.training.start.TrainingStream`) with the
importable :class:`~bagpipe.oracle.OracleCacher`, and pushes every trainer its step and round plans.
Plans cross the oracle's NIC to every trainer (the wire delays them) and the trainers count them as
the loader's ``data``.

**Planned ahead.** A plan depends on the id stream alone, never on training, so the oracle plans
and pushes as far ahead of training as a bound on the plans in flight allows
(:data:`PLANS_IN_FLIGHT_BYTES`: plans pushed for steps not yet started; a plan within the
lookahead of training always goes out, so training never waits for one), and the system's setup
waits until it got that far (:meth:`OracleRole.planned_ahead`). On the target cluster the oracle's
CPU is a host of its own; here it would share two cores with the trainers and slow their forward
and backward, a cost the target does not have. Planned ahead, a run short enough to fit the bound
(every suite here) is planned before its first step, and a longer one keeps the oracle that far
ahead, planning only as training frees room.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import asdict

import torch

from bagpipe.core import runtime
from bagpipe.core.batch import DatasetSchema
from bagpipe.core.meter import LinkKind
from bagpipe.core.roles import RoleRef
from bagpipe.oracle.cacher import OracleCacher
from bagpipe.oracle.config import OracleConfig
from bagpipe.oracle.plan import RoundPlan, StepPlan
from bagpipe.training.start import TrainingStream

__all__ = ["PLANS_IN_FLIGHT_BYTES", "OracleRole"]

Plan = StepPlan | RoundPlan

#: How many bytes of plans (their id tensors) may be pushed for steps that have not started yet:
#: what every trainer holds at most in plans waiting, whatever the stream's length.
PLANS_IN_FLIGHT_BYTES = 64 * 2**20


def _first_step(plan: Plan) -> int:
    return plan.step if isinstance(plan, StepPlan) else plan.first_step


def _plan_bytes(plan: Plan) -> int:
    """The bytes of a plan's id tensors: what it costs a trainer to hold it."""
    return runtime.nbytes(*(v for v in vars(plan).values() if isinstance(v, torch.Tensor)))


class OracleRole:
    """The oracle cacher's process: plans the stream, pushes plans ahead within a byte bound.

    The driver reports progress with :meth:`advance` at the start of every round. A plan for a
    step at most ``window_steps`` past it always goes out (so training never waits for a plan the
    bound holds back); one further ahead goes out while the plans pushed for steps not yet
    started stay within ``in_flight_bytes``.
    """

    def __init__(
        self, source: TrainingStream, schema: DatasetSchema, config: OracleConfig,
        trainers: list[RoleRef], window_steps: int,
        in_flight_bytes: int = PLANS_IN_FLIGHT_BYTES,
    ) -> None:
        self.source = source
        self.schema = schema
        self.config = config
        self.trainers = trainers
        self.window_steps = window_steps
        self.in_flight_bytes = in_flight_bytes
        self._progress = -1
        self._planning_s = 0.0
        self._cond = threading.Condition()
        self._closed = False
        self._in_flight: deque[tuple[int, int]] = deque()  # (first step, bytes) of pushed plans
        self._held: tuple[int, int] | None = None  # (first step, bytes) of a plan waiting for room
        self._done = False  # every plan of the stream is pushed
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None  # a push failed (a trainer died): see advance
        self.planner = OracleCacher(schema, config)

    def start(self) -> None:
        self._thread = runtime.start_thread(self._run, "bagpipe-oracle")

    def planned_ahead(self) -> int:
        """Wait until the oracle has pushed as far ahead as the bound allows (or the whole
        stream); return how many bytes of plans are in flight. Raises if planning failed."""
        with self._cond:
            self._cond.wait_for(lambda: self._done or self._error is not None or self._closed
                                or (self._held is not None and not self._has_room(*self._held)()))
            if self._error is not None:
                raise RuntimeError("the oracle stopped planning") from self._error
            return sum(nbytes for _, nbytes in self._in_flight)

    def advance(self, step: int) -> float:
        """Training reached ``step``; return the planning time spent since the previous call.

        Raises the error that stopped the planning thread, if one did (a trainer it pushed plans
        to died): the step fails with it, and the driver recovers.
        """
        if self._error is not None:
            raise RuntimeError("the oracle stopped planning") from self._error
        with self._cond:
            self._progress = max(self._progress, step)
            while self._in_flight and self._in_flight[0][0] <= self._progress:
                self._in_flight.popleft()  # its step started: the trainers took it
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
        try:
            for plan in planner.plan(self.source.global_ids(), flush=False):
                due, nbytes = _first_step(plan), _plan_bytes(plan)
                with self._cond:
                    spent_s = planner.stats.planning_time_s
                    self._planning_s += spent_s - reported_s
                    reported_s = spent_s
                    self._held = (due, nbytes)
                    self._cond.notify_all()
                    self._cond.wait_for(self._has_room(due, nbytes))
                    self._held = None
                    if self._closed:
                        return
                try:
                    self._push([plan])
                except Exception as exc:  # a trainer died: the next advance says so
                    self._error = exc
                    return
                with self._cond:
                    self._in_flight.append((due, nbytes))
        finally:  # a planning error itself fails the role (``runtime.start_thread``)
            with self._cond:
                self._done = True
                self._cond.notify_all()

    def _has_room(self, due: int, nbytes: int) -> Callable[[], bool]:
        """A plan for step ``due`` of ``nbytes`` may go out once training is within the window of
        it, or the plans in flight leave room for it (or the oracle is closing)."""
        return lambda: (self._closed or due <= self._progress + self.window_steps
                        or sum(n for _, n in self._in_flight) + nbytes <= self.in_flight_bytes)

    def _push(self, plans: list[Plan]) -> None:
        futures = [t.rpc_async(kind=LinkKind.DATA).receive_plans(plans) for t in self.trainers]
        for future in futures:
            future.wait()
