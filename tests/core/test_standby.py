"""Standby roles: a dead role's place is taken by a pre-spawned standby, in the same RPC world.

The refs every process held keep working (the replacement is built under the dead object's id, and
calls follow the alias table), the standby speaks as the role it replaced, the next failure is
reported under that role's name, and nothing is left running when the deployment closes.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from bagpipe.core.roles import Deployment, RoleFailedError
from bagpipe.core.roles.deployment import role_kind, standby_roles

from .roles import Accumulator
from .test_deployment import _alive


def _kill_and_wait_seen(deployment: Deployment, role: str) -> None:
    os.kill(deployment.pid(role), signal.SIGKILL)
    deadline = time.monotonic() + 10
    while deployment.failure is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert deployment.failure is not None and deployment.failure.role == role


def test_a_standby_takes_over_a_dead_role_and_old_refs_reach_the_replacement() -> None:
    deployment = Deployment(["server_0", "trainer_0"], standbys=standby_roles("server", 1))
    pids = dict(deployment.pids())
    try:
        server = deployment.remote("server_0", Accumulator, 5.0)
        trainer = deployment.remote("trainer_0", Accumulator, 0.0)
        assert deployment.wait(trainer.rpc_async().add_on_peer(server, 1.0), 30).item() == 6.0
        _kill_and_wait_seen(deployment, "server_0")
        with pytest.raises(RoleFailedError, match="server_0 died"):
            deployment.wait(server.rpc_async().add(1.0), 30)

        assert deployment.take_over("server_0") == ["server_standby_0"]
        assert deployment.failure is None
        assert deployment.standbys == ()
        replacement = deployment.rebuild(server, Accumulator, 100.0)
        deployment.wait(replacement.ready, 30)
        # the trainer's old ref and the driver's old ref both reach the new object
        assert deployment.wait(trainer.rpc_async().add_on_peer(server, 1.0), 30).item() == 101.0
        role, pid, _ = deployment.wait(server.rpc_async().where(), 30)
        assert (role, pid) == ("server_0", pids["server_standby_0"])
        assert deployment.pid("server_0") == pids["server_standby_0"]

        _kill_and_wait_seen(deployment, "server_0")  # the replacement's death is server_0's
        with pytest.raises(LookupError, match="no standby left"):
            deployment.take_over("server_0")
    finally:
        deployment.close()
    assert not any(_alive(pid) for pid in pids.values())


def test_a_standby_serves_only_its_kind_and_only_dead_roles() -> None:
    with Deployment(["trainer_0", "server_0"], standbys=standby_roles("trainer", 1)) as deployment:
        with pytest.raises(ValueError, match="alive"):
            deployment.take_over("trainer_0")
        _kill_and_wait_seen(deployment, "server_0")
        with pytest.raises(LookupError, match="no standby left for 'server_0'"):
            deployment.take_over("server_0")


def test_role_kinds() -> None:
    assert role_kind("trainer_3") == "trainer"
    assert role_kind("server_standby_1") == "server_standby"
    assert standby_roles("trainer", 2) == ["trainer_standby_0", "trainer_standby_1"]
