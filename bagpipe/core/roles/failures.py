"""Which role failed, and why: exit codes and error reports made into one :class:`RoleFailedError`.

A role fails in one of two ways the driver can see: its process ends (an exception that left the
role, ``os._exit``, a signal such as SIGKILL), or a role still running writes an error report (a
background thread's traceback, :func:`bagpipe.core.runtime.report_failure`). One failure often
causes others: a role killed outright breaks its peers' calls to it, and they report those broken
calls. :func:`attribute` names the cause, not the casualties:

* **deaths come first**: a dead role is blamed before any living one;
* **a report beats an exit code**: a role that reported before it died is blamed with its own
  traceback, which says more than "died (exit code 1)";
* **the death-grace rule**: a living role's report counts only once it is ``DEATH_GRACE_S`` old
  with no role dead, because a SIGKILLed role's sockets close (and its peers report their broken
  calls) a few ms before the killed process is reaped and its exit code is visible.
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Mapping
from pathlib import Path

from bagpipe.core import runtime

__all__ = ["DEATH_GRACE_S", "RoleFailedError", "attribute", "describe_exit"]

DEATH_GRACE_S = 0.5


class RoleFailedError(RuntimeError):
    """A role process died or reported a failure; the message names the role and says why."""

    def __init__(self, role: str, reason: str) -> None:
        super().__init__(f"{role} {reason}")
        self.role = role
        #: Set by a system that could not replace the role in place: why it fell back to a
        #: whole-job restart (``bagpipe.core.recovery``); empty when it never tried.
        self.fallback = ""


def describe_exit(code: int) -> str:
    """``died (exit code -9, SIGKILL)``: a process's exit code, with the signal that ended it."""
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"died (exit code {code}, {signal.Signals(-code).name})"
    return f"died (exit code {code})"


def attribute(
    exit_codes: Mapping[str, int | None], error_dir: Path | None
) -> RoleFailedError | None:
    """The failure to report now, if any, by the rules of the module docstring.

    Args:
        exit_codes: each local role's exit code, ``None`` while it runs.
        error_dir: where the roles write their error reports (``None``: they report nowhere).
    """
    dead = [role for role, code in exit_codes.items() if code is not None]
    for role in [*dead, *(r for r in exit_codes if r not in dead)]:
        report = runtime.error_report_path(error_dir, role) if error_dir is not None else None
        if report is not None and report.exists():
            if role not in dead and time.time() - report.stat().st_mtime < DEATH_GRACE_S:
                continue  # a death that caused it may not be visible yet
            return RoleFailedError(role, f"failed:\n{report.read_text()}")
        code = exit_codes[role]
        if code is not None:
            return RoleFailedError(role, describe_exit(code))
    return None
