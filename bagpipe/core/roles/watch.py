"""Liveness, both ways: the driver notices a failed role within ~0.1 s, a role ends with its driver.

The driver's :class:`Monitor` is a thread that checks every ``POLL_S``:

* roles spawned on this machine: the children's exit codes and the error reports they write,
  turned into the one failure to report by :func:`bagpipe.core.roles.failures.attribute`;
* a world attached from a launcher's environment (no local children to poll): a heartbeat RPC to
  every role each ``HEARTBEAT_S``; a role that does not answer is reported unreachable.

The driver's waits call :meth:`Monitor.raise_if_failed` between polls of their own, so a failure
ends them at once, not at the monitor's next round. The first failure is kept; failures seen once
the monitor is stopped (roles ending as the driver asked) are not failures. Nor is one read before
the last :meth:`Monitor.forget`: a poll that read a role's death before a standby took it over,
and records it only after, would report a death already handled (the standby is alive under the
role's name).

A role spawned here runs :func:`watch_parent` in a thread: if the driver vanishes (SIGKILLed, so it
never closes its Deployment), the role ends too, and no orphan is left running.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import torch.distributed.rpc as rpc

from bagpipe.core.roles.aliases import worker_of
from bagpipe.core.roles.failures import RoleFailedError, attribute

__all__ = ["HEARTBEAT_S", "POLL_S", "Monitor", "watch_parent"]

POLL_S = 0.05
HEARTBEAT_S = 1.0


class Monitor:
    """The driver's watch over its roles; see the module docstring.

    Args:
        roles: every role of the world (the heartbeat calls each).
        exit_codes: the local children's exit codes by role (``None`` while running); empty when
            the roles were not spawned here.
        error_dir: where local roles write error reports, if anywhere.
    """

    def __init__(
        self,
        roles: Sequence[str],
        exit_codes: Callable[[], Mapping[str, int | None]],
        error_dir: Path | None,
    ) -> None:
        self._roles = tuple(roles)
        self._exit_codes = exit_codes
        self._error_dir = error_dir
        self._failure: RoleFailedError | None = None
        self._forgotten = 0  # how many times forget() ran: a poll from before it is stale
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, *, heartbeats: bool) -> None:
        """Watch from a thread of its own; ``heartbeats`` once the RPC world is up (attached)."""
        self._thread = threading.Thread(
            target=self._watch, args=(heartbeats,), name="bagpipe-monitor", daemon=True
        )
        self._thread.start()

    @property
    def failure(self) -> RoleFailedError | None:
        """The first role failure seen so far, if any (polls the children first)."""
        self._poll_children()
        return self._failure

    def raise_if_failed(self) -> None:
        failure = self.failure
        if failure is not None:
            raise failure

    def failure_within(self, grace_s: float) -> RoleFailedError | None:
        """The failure seen within ``grace_s`` (no wait without local roles to poll).

        A call broken by a peer's death often fails a few ms before the death is visible.
        """
        deadline = time.monotonic() + grace_s
        while self.failure is None and self._exit_codes() and time.monotonic() < deadline:
            time.sleep(POLL_S)
        return self.failure

    def forget(self, role: str) -> None:
        """``role``'s failure is handled (a standby took the role over): clear it, so that the
        next failure is reported."""
        with self._lock:
            self._forgotten += 1
            if self._failure is not None and self._failure.role == role:
                self._failure = None

    def stop(self) -> None:
        """From now on nothing is a failure: the roles are being ended on purpose."""
        self._stopping.set()

    def join(self) -> None:
        """Wait for the monitor thread to leave (after :meth:`stop`)."""
        if self._thread is not None:
            self._thread.join()

    def _watch(self, heartbeats: bool) -> None:
        last_heartbeat = time.monotonic()
        while not self._stopping.wait(POLL_S):
            self._poll_children()
            if heartbeats and time.monotonic() - last_heartbeat > HEARTBEAT_S:
                last_heartbeat = time.monotonic()
                self._heartbeat()

    def _poll_children(self) -> None:
        if self._failure is not None or self._stopping.is_set():
            return  # only the first failure counts
        forgotten = self._forgotten
        failure = attribute(self._exit_codes(), self._error_dir)
        if failure is not None:
            self._record(failure, forgotten)

    def _heartbeat(self) -> None:
        forgotten = self._forgotten
        for role in self._roles:
            try:
                rpc.rpc_sync(worker_of(role), os.getpid, timeout=10 * HEARTBEAT_S)
            except Exception as exc:
                self._record(RoleFailedError(role, f"is unreachable: {exc}"), forgotten)

    def _record(self, failure: RoleFailedError, forgotten: int) -> None:
        """Keep ``failure``, seen by a poll that began after ``forgotten`` forgets, unless a
        failure is kept already, the monitor is stopping, or a forget came since (stale)."""
        with self._lock:
            stale = forgotten != self._forgotten
            if self._failure is None and not self._stopping.is_set() and not stale:
                self._failure = failure


def watch_parent(parent_pid: int) -> None:
    """End this role if the driver vanished (e.g. SIGKILLed), so no orphan is left running.

    Roles are forked by a fork server, not by the driver, so the driver is watched by pid rather
    than as this process's parent.
    """
    while _pid_alive(parent_pid):
        time.sleep(0.5)
    os._exit(1)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True
