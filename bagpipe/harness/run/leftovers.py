"""A run leaves nothing running behind it.

Several runs may share one process: the in-process launcher (fig7's) runs a sweep's jobs one
after another in the launching process, and a benchmark runs every system in its own. A thread or
role process that outlived its run would take CPU from the next run's trainers on these two cores,
and which system paid would depend on the sweep's order. So the runner takes a
:class:`RunningWork` snapshot before a system is set up and, after the system closed, refuses a
run that left any of its threads or child processes alive (:func:`refuse_leftovers`). The rule is
the same for every system and every launcher: one process per job (``launcher=local``) would
hide a leak, not excuse it.
"""

from __future__ import annotations

import multiprocessing
import threading
import time
from dataclasses import dataclass
from multiprocessing.process import BaseProcess

__all__ = ["LeftoverWorkError", "RunningWork", "refuse_leftovers"]

#: How long a thread or process the run started may take to end after ``close`` returned (a
#: daemon thread noticing its stop flag, a role process flushing its pipes).
GRACE_S = 5.0


class LeftoverWorkError(RuntimeError):
    """A system's ``close`` returned while threads or processes it started were still running."""


@dataclass(frozen=True)
class RunningWork:
    """The threads and ``multiprocessing`` children alive at one moment in this process."""

    threads: frozenset[threading.Thread]
    processes: frozenset[BaseProcess]

    @classmethod
    def now(cls) -> RunningWork:
        return cls(frozenset(threading.enumerate()), frozenset(multiprocessing.active_children()))

    def started_since(self, earlier: RunningWork) -> RunningWork:
        """What is alive now and was not alive at ``earlier``."""
        return RunningWork(self.threads - earlier.threads, self.processes - earlier.processes)


def refuse_leftovers(system_name: str, before: RunningWork, grace_s: float | None = None) -> None:
    """Wait up to ``grace_s`` (default :data:`GRACE_S`) for whatever started since ``before`` to
    end; raise :class:`LeftoverWorkError` naming what is still running."""
    grace_s = GRACE_S if grace_s is None else grace_s
    deadline = time.monotonic() + grace_s
    started = RunningWork.now().started_since(before)
    for thread in started.threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    for process in started.processes:
        process.join(max(0.0, deadline - time.monotonic()))
    alive = [f"thread {t.name!r}" for t in started.threads if t.is_alive()]
    alive += [f"process {p.name!r} (pid {p.pid})" for p in started.processes if p.is_alive()]
    if alive:
        raise LeftoverWorkError(
            f"system {system_name!r} left {', '.join(sorted(alive))} running {grace_s:g} s after "
            f"close(); a later run in this process would share the CPU with it"
        )
