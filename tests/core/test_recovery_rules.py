"""The rules that send a death down the ``replace`` path or back to the checkpoint, and say why.

Every fallback reason is in the run record, so a wrong one misleads the reader of a result; and a
wrong "replaceable" would start a replacement that cannot be exact. Several roles can be found
dead at once (Bagpipe meets a shard's death only when a round next calls it), so the rules are
checked for groups too.
"""

from __future__ import annotations

import pytest
from torch.futures import Future

from bagpipe.core.recovery import (
    LOGS_PAUSED,
    replacement_refused,
    replacing,
    step_left_by_survivors,
)
from bagpipe.core.roles import RoleFailedError

TRAINERS = ["trainer_0", "trainer_1"]
SERVERS = ["server_0", "server_1"]


@pytest.mark.parametrize(("dead", "standbys", "paused", "why"), [
    (["trainer_1"], ["trainer_standby_0"], False, ""),
    (["server_0", "server_1"], ["server_standby_0", "server_standby_1"], False, ""),
    (["trainer_1"], ["server_standby_0"], False, "no standby trainer left"),
    (["server_0", "server_1"], ["server_standby_0", "trainer_standby_0"], False,
     "2 servers died together: fewer standbys left"),
    (["oracle"], ["trainer_standby_0"], False,
     "oracle is not a server or trainer: its state is rebuilt from the checkpoint"),
    (["server_1", "oracle"], ["server_standby_0"], False,
     "oracle is not a server or trainer: its state is rebuilt from the checkpoint"),
    (["trainer_0"], ["trainer_standby_0"], True, LOGS_PAUSED),
])
def test_which_deaths_are_replaced_in_place_and_why_not(
    dead: list[str], standbys: list[str], paused: bool, why: str
) -> None:
    assert replacement_refused(dead, [*TRAINERS, *SERVERS], standbys, paused) == why


def test_a_system_that_replaces_nothing_says_so() -> None:
    assert replacement_refused(["trainer_0"], [], ["trainer_standby_0"]) == (
        "trainer_0: no role is replaced in place here")


def _done(value: object = None, error: Exception | None = None) -> Future:
    future: Future = Future()
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(value)
    return future


def test_the_step_in_flight_must_have_failed_on_every_survivor() -> None:
    roles = ["trainer_0", "trainer_1", "trainer_2"]
    failed = _done(error=RuntimeError("peer left"))
    # the dead roles' own calls do not count, however they ended
    assert step_left_by_survivors(roles, [failed, _done(1.0), _done(2.0)],
                                  {"trainer_1", "trainer_2"}, 1.0) == ""
    assert step_left_by_survivors(roles, [failed, _done(1.0), failed], {"trainer_2"}, 1.0) == (
        "trainer_1 finished the step in flight: it cannot be undone")
    assert step_left_by_survivors(roles, [failed, Future(), failed], {"trainer_0"}, 0.05) == (
        "trainer_1 did not leave the step in flight")
    assert step_left_by_survivors(roles, [], {"trainer_0"}, 1.0) == ""  # nothing was in flight


def test_a_death_met_during_a_replacement_says_so_and_keeps_a_reason_it_had() -> None:
    with pytest.raises(RoleFailedError) as met, replacing(["server_0", "server_1"]):
        raise RoleFailedError("trainer_1", "died (exit code -9, SIGKILL)")
    assert met.value.fallback == "trainer_1 died while server_0 and server_1 was replaced"
    already = RoleFailedError("oracle", "died (exit code 1)")
    already.fallback = "its own reason"
    with pytest.raises(RoleFailedError) as met, replacing(["server_0"]):
        raise already
    assert met.value.fallback == "its own reason"
