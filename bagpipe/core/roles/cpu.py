"""CPU time of role processes: what each role cost, including work the target runs elsewhere.

Time dilation slows the emulated network, not the CPU. Work that the target cluster does on hosts of
its own (embedding servers, Bagpipe's oracle) shares these cores with the trainers here and is not
slowed, so a benchmark reports it apart: CPU seconds per iteration by role, read from the kernel's
per-process accounting (``/proc/<pid>/stat``: user + system time of every thread).

With 2 cores the roles cannot each have a core: a helper's CPU is taken from the trainers. So a
run reports, per iteration (:class:`CpuTally`), what a trainer used, what every other role used
together, and what the driver process used (which trains ``local`` itself): the profile that tells
CPU contention from a slow step.
"""

from __future__ import annotations

import os
import statistics
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bagpipe.core.roles.deployment import Deployment

__all__ = ["CpuTally", "forget", "process_cpu_s", "register", "roles_cpu_s"]

_TICKS_PER_S = os.sysconf("SC_CLK_TCK")
_UTIME_FIELD, _STIME_FIELD = 11, 12  # of the fields after the ``(comm)`` name, zero-based
_OPEN: weakref.WeakSet[Deployment] = weakref.WeakSet()


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds the process ``pid`` has used so far (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return 0.0
    return (int(fields[_UTIME_FIELD]) + int(fields[_STIME_FIELD])) / _TICKS_PER_S


def register(deployment: Deployment) -> None:
    """Count ``deployment``'s locally spawned roles in :func:`roles_cpu_s` while it lives."""
    _OPEN.add(deployment)


def forget(deployment: Deployment) -> None:
    """``deployment`` closed: its roles are no longer counted."""
    _OPEN.discard(deployment)


def roles_cpu_s() -> dict[str, float]:
    """CPU seconds so far of every role process spawned by this process's open deployments, by
    role name: read before and after a window, the difference is what each role spent in it."""
    return {role: process_cpu_s(pid)
            for deployment in list(_OPEN) for role, pid in deployment.pids().items()}


class CpuTally:
    """CPU seconds spent inside chosen windows (a run's timed steps), by kind of process.

    ``with tally.window(): system.train_step(...)`` adds what every role process of this process's
    open deployments and this (driver) process used during the call. Work a role does between
    windows (a round thread busy while the driver evaluates) is not counted.
    """

    def __init__(self) -> None:
        self.windows = 0
        self._roles_s: dict[str, float] = {}
        self._driver_s = 0.0

    @contextmanager
    def window(self) -> Iterator[None]:
        roles_before, driver_before = roles_cpu_s(), time.process_time()
        try:
            yield
        finally:
            self._driver_s += time.process_time() - driver_before
            for role, spent in roles_cpu_s().items():
                self._roles_s[role] = (self._roles_s.get(role, 0.0) + spent
                                       - roles_before.get(role, 0.0))
            self.windows += 1

    def per_window(self) -> dict[str, float]:
        """``trainer_cpu_s`` (a trainer role's, the mean over trainers), ``helpers_cpu_s`` (every
        other role's together: servers, the oracle, standbys) and ``driver_cpu_s``, per window
        (NaN before any window; 0 where there is no role of that kind)."""
        if self.windows == 0:
            return dict.fromkeys(("trainer_cpu_s", "helpers_cpu_s", "driver_cpu_s"), float("nan"))
        from bagpipe.core.roles.deployment import role_kind  # deployment imports this module

        trainers = [s for role, s in self._roles_s.items() if role_kind(role) == "trainer"]
        helpers = sum(s for role, s in self._roles_s.items() if role_kind(role) != "trainer")
        return {
            "trainer_cpu_s": (statistics.fmean(trainers) if trainers else 0.0) / self.windows,
            "helpers_cpu_s": helpers / self.windows,
            "driver_cpu_s": self._driver_s / self.windows,
        }
