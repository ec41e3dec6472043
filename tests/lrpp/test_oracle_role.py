"""The oracle plans ahead of training: as far as its bound on plans in flight allows, before the
first step, and further only as training frees room (``bagpipe.lrpp.oracle_role``)."""

from __future__ import annotations

import pytest
import torch

from bagpipe.core import runtime
from bagpipe.core.batch import ids_matrix
from bagpipe.lrpp.oracle_role import OracleRole, _plan_bytes
from bagpipe.oracle.config import OracleConfig
from bagpipe.oracle.plan import StepPlan
from bagpipe.training.start import TrainingStream
from tests.conftest import TINY_SCHEMA, TinySource

STEPS = 12


class _IdsSource(TinySource):
    def ids(self, index: int) -> torch.Tensor:
        return ids_matrix(self[index])


class _Trainer:
    """A trainer's end of the oracle's pushes: keeps every plan it is sent."""

    def __init__(self) -> None:
        self.plans: list[object] = []

    def rpc_async(self, kind: object = None) -> _Trainer:
        return self

    def receive_plans(self, plans: list[object]) -> _Trainer:
        self.plans += plans
        return self

    def wait(self) -> None:
        return None

    def steps(self) -> list[int]:
        return [p.step for p in self.plans if isinstance(p, StepPlan)]


def _oracle(in_flight_bytes: int) -> tuple[OracleRole, _Trainer]:
    runtime.init("oracle")
    stream = TrainingStream(_IdsSource(TINY_SCHEMA, 8, STEPS, seed=0), 0, STEPS)
    trainer = _Trainer()
    oracle = OracleRole(stream, TINY_SCHEMA, OracleConfig(2, 4, 2), [trainer],  # type: ignore[list-item]
                        window_steps=1, in_flight_bytes=in_flight_bytes)
    oracle.start()
    return oracle, trainer


def test_a_run_that_fits_the_bound_is_planned_before_its_first_step() -> None:
    oracle, trainer = _oracle(in_flight_bytes=2**30)
    try:
        oracle.planned_ahead()
        assert trainer.steps() == list(range(STEPS))
    finally:
        oracle.close()


def test_a_longer_run_is_planned_as_far_as_the_bound_and_then_as_training_frees_room() -> None:
    probe, probe_trainer = _oracle(in_flight_bytes=2**30)
    probe.planned_ahead()
    probe.close()
    bound = 3 * max(_plan_bytes(p) for p in probe_trainer.plans)  # a few plans' worth
    oracle, trainer = _oracle(in_flight_bytes=bound)
    try:
        assert 0 < oracle.planned_ahead() <= bound
        first = trainer.steps()
        assert first and len(first) < STEPS  # held by the bound
        for step in range(STEPS):
            oracle.advance(step)
            in_flight = oracle.planned_ahead()
            assert max(trainer.steps()) >= min(step + 1, STEPS - 1)  # the window always goes out
            assert in_flight <= bound or max(trainer.steps()) <= step + 1
        assert trainer.steps() == list(range(STEPS))
    finally:
        oracle.close()


def test_a_step_reads_the_oracles_replies_that_arrived_and_never_waits_for_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The driver's step start takes the planning time of the replies already in; one still on
    its way (the oracle runs below the trainers' priority) is read at a later step."""
    from bagpipe.lrpp.system import Bagpipe

    class Arrived:
        def wait(self, futures: list[torch.futures.Future]) -> list[float]:
            assert all(f.done() for f in futures)  # it is never asked to wait
            return [f.value() for f in futures]

    system = Bagpipe(num_trainers=2)
    monkeypatch.setattr(system, "_require_setup", lambda: (Arrived(), None))
    late: torch.futures.Future[float] = torch.futures.Future()
    early: torch.futures.Future[float] = torch.futures.Future()
    early.set_result(0.25)
    system._progress_reports = [late, early]
    assert system._arrived_planning_s() == 0.25
    assert system._progress_reports == [late]
    assert system._arrived_planning_s() == 0.0  # still on its way
    late.set_result(0.5)
    assert system._arrived_planning_s() == 0.5 and system._progress_reports == []
