"""CPU time of role processes: what each role cost, including work the target runs elsewhere.

Time dilation slows the emulated network, not the CPU. Work that the target cluster does on hosts of
its own (embedding servers, Bagpipe's oracle) shares these cores with the trainers here and is not
slowed, so a benchmark reports it apart: CPU seconds per iteration by role, read from the kernel's
per-process accounting (``/proc/<pid>/stat``: user + system time of every thread).
"""

from __future__ import annotations

import os
import weakref
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bagpipe.core.roles.deployment import Deployment

__all__ = ["forget", "process_cpu_s", "register", "roles_cpu_s"]

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
