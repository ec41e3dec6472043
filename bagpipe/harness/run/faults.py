"""Fault injection for tests and benchmarks: kill a role process of a running system.

:class:`KillRoles` is a runner callback. After the step it is told, it sends ``SIGKILL`` to the
local process of the named role (``trainer_0``, ``server_1``, ``oracle``...), found among this
driver's children by the name :class:`~bagpipe.core.roles.Deployment` gives them
(``bagpipe-<role>``). The system then fails the next wait with ``RoleFailedError``, exactly as
after a real crash, and :func:`~bagpipe.harness.run.recovery.run_with_recovery` takes over.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time

__all__ = ["KillRoles", "role_process_pid"]


def role_process_pid(role: str) -> int:
    """Pid of this process's child running ``role``; raises if there is not exactly one."""
    found = [p for p in multiprocessing.active_children() if p.name == f"bagpipe-{role}"]
    if len(found) != 1:
        alive = sorted(p.name for p in multiprocessing.active_children())
        raise LookupError(f"no single local process for role {role!r}; children: {alive}")
    pid = found[0].pid
    assert pid is not None
    return pid


class KillRoles:
    """Runner callback: SIGKILL ``kills[step]``'s process ``after_s`` after ``step`` (each once).

    ``after_s`` places a kill where the step's background work is done: a Bagpipe trainer's
    sync-later all-reduce runs on after its step returns, and a kill before its share arrived
    rightly takes the rollback path, which a test of the replace path must not depend on.
    ``killed`` lists ``(role, perf_counter time of the kill)`` in order.
    """

    def __init__(self, kills: dict[int, str], after_s: float = 0.0) -> None:
        self.pending = dict(kills)
        self.after_s = after_s
        self.killed: list[tuple[str, float]] = []

    def on_step(self, step: int, metrics: dict[str, float]) -> None:
        role = self.pending.pop(step, None)
        if role is None:
            return
        time.sleep(self.after_s)
        os.kill(role_process_pid(role), signal.SIGKILL)
        self.killed.append((role, time.perf_counter()))
