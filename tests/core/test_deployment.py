"""Deployment: role processes start, serve role objects, fail loudly and leave nothing behind."""

from __future__ import annotations

import math
import os
import signal
import sys
import time

import pytest
import torch
import torch.multiprocessing as mp

from bagpipe.core.roles import Deployment, RoleFailedError
from bagpipe.core.roles.cpu import CpuTally, roles_cpu_s
from bagpipe.core.roles.spawn import HELPER_NICE, free_port
from bagpipe.core.runtime import GIL_SWITCH_INTERVAL_S

from .roles import Accumulator, serve_from_env


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purpose; read its state.
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_roles_serve_objects_call_each_other_and_exit_cleanly() -> None:
    with Deployment(["alpha", "beta"], threads_per_role=1) as deployment:
        pids = deployment.pids()
        a = deployment.remote("alpha", Accumulator, 1.0)
        b = deployment.remote("beta", Accumulator, 10.0)
        where = deployment.wait([a.rpc_async().where(), b.rpc_async().where()], timeout_s=30)
        assert [(role, threads) for role, _, threads in where] == [("alpha", 1), ("beta", 1)]
        assert {pid for _, pid, _ in where} == set(pids.values())
        # alpha calls beta through the RRef it was given.
        total = deployment.wait(a.rpc_async().add_on_peer(b, 5.0), timeout_s=30)
        assert torch.equal(total, torch.tensor([15.0]))
        with pytest.raises(Exception, match="accumulator refused"):
            deployment.wait(a.rpc_async().fail(), timeout_s=30)
        # An error inside a call is not a role failure: the deployment keeps serving.
        assert deployment.wait(a.rpc_async().add(1.0), timeout_s=30).item() == 2.0
    assert not any(_alive(pid) for pid in pids.values())


def test_killed_role_fails_the_wait_promptly_and_close_leaves_no_process() -> None:
    deployment = Deployment(["trainer_0", "server_1"])
    try:
        pids = deployment.pids()
        trainer = deployment.remote("trainer_0", Accumulator, 0.0)
        deployment.remote("server_1", Accumulator, 0.0)
        long_call = trainer.rpc_async().sleep(60.0)
        os.kill(pids["server_1"], signal.SIGKILL)
        start = time.monotonic()
        with pytest.raises(RoleFailedError, match=r"server_1 died \(exit code -9, SIGKILL\)"):
            deployment.wait(long_call, timeout_s=60)
        assert time.monotonic() - start < 10
    finally:
        deployment.close()
    assert not any(_alive(pid) for pid in pids.values())


def test_background_thread_failure_is_reported_with_its_traceback() -> None:
    with Deployment(["worker"]) as deployment:
        pid = deployment.pid("worker")
        worker = deployment.remote("worker", Accumulator, 0.0)
        with pytest.raises(RoleFailedError, match=r"worker failed(.|\n)*ZeroDivisionError"):
            deployment.wait(worker.rpc_async().fail_in_background(), timeout_s=30)
            deployment.wait(worker.rpc_async().sleep(30.0), timeout_s=60)
    assert not _alive(pid)


def test_a_death_just_after_a_peers_report_is_named_as_the_cause() -> None:
    # A SIGKILLed role's sockets close a few ms before it is reaped, so its peers' reports of
    # broken calls can come first; a report is held back briefly for the death that caused it.
    deployment = Deployment(["trainer_0", "server_1"])
    try:
        trainer = deployment.remote("trainer_0", Accumulator, 0.0)
        deployment.remote("server_1", Accumulator, 0.0)
        deployment.wait(trainer.rpc_async().fail_in_background(), timeout_s=30)
        time.sleep(0.2)  # the report is written and seen by the monitor's polls
        os.kill(deployment.pid("server_1"), signal.SIGKILL)
        with pytest.raises(RoleFailedError, match=r"server_1 died \(exit code -9, SIGKILL\)"):
            deployment.wait(trainer.rpc_async().sleep(60.0), timeout_s=60)
    finally:
        deployment.close()


def test_roles_must_be_unique() -> None:
    with pytest.raises(ValueError, match="unique"):
        Deployment(["a", "a"])


def test_ranks_started_by_a_launcher_serve_roles_until_the_driver_closes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": "2"}
    rank_1 = mp.get_context("spawn").Process(
        target=serve_from_env, args=({**env, "RANK": "1"}, ["worker"]), daemon=True
    )
    rank_1.start()
    try:
        for key, value in {**env, "RANK": "0"}.items():
            monkeypatch.setenv(key, value)
        with Deployment.from_env(["worker"]) as deployment:
            worker = deployment.remote("worker", Accumulator, 2.0)
            role, pid, _ = deployment.wait(worker.rpc_async().where(), timeout_s=60)
            assert (role, pid) == ("worker", rank_1.pid)
        rank_1.join(20)
        assert rank_1.exitcode == 0
    finally:
        if rank_1.is_alive():
            rank_1.kill()
            rank_1.join()


def test_each_roles_cpu_is_counted_and_helpers_run_below_the_trainers_priority() -> None:
    """A helper's CPU is its own (what dilation does not slow, reported apart), and every role but
    a trainer runs ``HELPER_NICE`` below the trainers, whichever system spawned it."""
    with Deployment(["trainer_0", "server_0"]) as deployment:
        pids = deployment.pids()
        server = deployment.remote("server_0", Accumulator, 0.0)
        deployment.remote("trainer_0", Accumulator, 0.0)
        before = roles_cpu_s()
        deployment.wait(server.rpc_async().spin(0.5), timeout_s=30)
        spent = {role: roles_cpu_s()[role] - before[role] for role in pids}
        assert spent["server_0"] >= 0.3 and spent["trainer_0"] < 0.1, spent
        priority = {role: os.getpriority(os.PRIO_PROCESS, pid) for role, pid in pids.items()}
        assert priority["server_0"] == priority["trainer_0"] + HELPER_NICE
    assert not set(pids) & set(roles_cpu_s())  # a closed deployment's roles are not counted


def test_a_cpu_tally_counts_only_its_windows_by_kind_of_role() -> None:
    """Per window: a trainer's CPU (the mean over trainers), every other role's together, and
    the driver's; what a role spends outside the windows is not counted."""
    tally = CpuTally()
    assert all(math.isnan(v) for v in tally.per_window().values())
    with Deployment(["trainer_0", "trainer_1", "server_0"]) as deployment:
        server = deployment.remote("server_0", Accumulator, 0.0)
        trainer = deployment.remote("trainer_0", Accumulator, 0.0)
        deployment.remote("trainer_1", Accumulator, 0.0)
        deployment.wait(server.rpc_async().spin(0.4), timeout_s=30)  # before: not counted
        with tally.window():
            deployment.wait(server.rpc_async().spin(0.6), timeout_s=30)
            deployment.wait(trainer.rpc_async().spin(0.4), timeout_s=30)
        with tally.window():
            pass
    spent = tally.per_window()
    assert tally.windows == 2
    assert 0.2 <= spent["helpers_cpu_s"] < 0.45, spent  # 0.6 s over 2 windows
    assert 0.06 <= spent["trainer_cpu_s"] < 0.2, spent  # (0.4 + 0) / 2 trainers / 2 windows
    assert 0 <= spent["driver_cpu_s"] < spent["helpers_cpu_s"], spent


def test_every_process_hands_the_gil_over_by_one_rule() -> None:
    """Trainers, helpers and the driver all run under ``GIL_SWITCH_INTERVAL_S``, not Python's
    5 ms: no system's threads are timed under another rule."""
    with Deployment(["trainer_0", "server_0"]) as deployment:
        refs = [deployment.remote(role, Accumulator, 0.0) for role in ("trainer_0", "server_0")]
        intervals = [deployment.wait(ref.rpc_async().gil_switch_interval_s(), timeout_s=30)
                     for ref in refs]
        assert sys.getswitchinterval() == pytest.approx(GIL_SWITCH_INTERVAL_S)  # the driver's
    assert intervals == pytest.approx([GIL_SWITCH_INTERVAL_S] * 2)
