"""Recoveries from role failures: which path each took, and what it cost.

Two paths bring a run past a dead role:

* ``replace`` (the fast path, inside the system): a standby process takes the dead role over
  (:meth:`~bagpipe.core.roles.Deployment.take_over`), the replacement is built from the state the
  surviving roles hold at the step in flight, and that step is trained again from its start.
  No finished step is redone; no surviving role is rolled back.
* ``rollback`` (the whole-job restart, ``bagpipe.harness.run.recovery``): every role is ended, a
  fresh job resumes from the newest checkpoint and redoes the steps since.

A system tries ``replace`` where it can prove the survivors' state is that of the step boundary
(:class:`~bagpipe.core.roles.RoleFailedError` carries its reason in ``fallback`` when it could
not), and every recovery is recorded as one :class:`Recovery` in the run record.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol, TypeVar, runtime_checkable

import torch
from torch.futures import Future

from bagpipe.core.roles.deployment import role_kind
from bagpipe.core.roles.failures import RoleFailedError

__all__ = [
    "LOGS_PAUSED", "REPLACE", "ROLLBACK", "PausableRecoveryLogs", "Recovery", "ended_within",
    "replace_between_steps", "replaced", "replacement_refused", "replacing",
    "step_left_by_survivors", "tensors_digest", "update_digest",
]

_T = TypeVar("_T")

REPLACE = "replace"
ROLLBACK = "rollback"
#: The fallback of every failure after :meth:`PausableRecoveryLogs.pause_recovery_logs`.
LOGS_PAUSED = "the recovery logs were paused (the fault bench's A/B): they miss steps since"


@runtime_checkable
class PausableRecoveryLogs(Protocol):
    """A system whose ``replace`` path costs steady-state work that can be switched off.

    The work is the logs a replacement is built from and the trainers' agreement on each step
    (Bagpipe's update and write-back logs, ``sync_ps``'s push logs). Its cost, a few percent of
    an iteration, is smaller than this machine's drift between two runs, so the fault bench
    measures it within one run: it pauses and resumes the work between steps, in alternating
    windows, and compares their iteration times. A log that was paused misses what happened
    meanwhile, so every later failure takes the ``rollback`` path (:data:`LOGS_PAUSED`).
    """

    def pause_recovery_logs(self, paused: bool) -> None:
        """Stop (``True``) or restart the logs and agreements, between steps."""
        ...


@dataclass(frozen=True)
class Recovery:
    """One role failure and how the run got past it.

    ``failed_step`` is the step in flight when the failure was seen; ``resumed_step`` the first
    step trained after it (``failed_step`` on the ``replace`` path, the checkpoint's step on
    ``rollback``). ``detected_at_s`` (the failure reached the driver) and ``trained_at_s`` (the
    first step after it completed; ``nan`` if none did) are ``time.perf_counter()`` readings, so a
    fault injector can measure from its kill. ``fallback`` says why a ``rollback`` was taken.
    """

    role: str
    reason: str
    failed_step: int
    resumed_step: int
    detected_at_s: float
    trained_at_s: float
    path: str = ROLLBACK
    fallback: str = ""

    @property
    def recovery_s(self) -> float:
        return self.trained_at_s - self.detected_at_s

    @property
    def steps_redone(self) -> int:
        return self.failed_step - self.resumed_step

    def as_record(self) -> dict[str, object]:
        """Plain values for a run record (``steps_redone`` and ``recovery_s`` included)."""
        return {**asdict(self), "steps_redone": self.steps_redone, "recovery_s": self.recovery_s}


def replaced(failure: RoleFailedError, step: int, detected_at_s: float) -> Recovery:
    """The record of a ``replace`` recovery of ``failure``'s role whose boundary is before
    ``step``, which was trained (or is trained next) with no step redone."""
    return Recovery(
        role=failure.role, reason=str(failure).splitlines()[0], failed_step=step, resumed_step=step,
        detected_at_s=detected_at_s, trained_at_s=time.perf_counter(), path=REPLACE,
    )


def tensors_digest(tensors: dict[str, torch.Tensor]) -> str:
    """sha256 over named tensors (names, dtypes, shapes, bytes), in name order: equal digests mean
    bit-identical tensors (the dense replicas a replacement is checked against)."""
    digest = hashlib.sha256()
    update_digest(digest, tensors)
    return digest.hexdigest()


def update_digest(digest: Any, tensors: dict[str, torch.Tensor], prefix: str = "") -> None:
    """Feed named tensors (names, dtypes, shapes, bytes) to a ``hashlib`` digest, in name order."""
    for name in sorted(tensors):
        tensor = tensors[name].detach().contiguous().cpu()
        digest.update(f"{prefix}{name}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())


def ended_within(futures: Sequence[Future], timeout_s: float) -> bool:
    """Wait until every one of ``futures`` has ended (in a value or an error), at most
    ``timeout_s``; whether they all did."""
    deadline = time.monotonic() + timeout_s
    while not all(f.done() for f in futures):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def step_left_by_survivors(
    roles: Sequence[str], futures: Sequence[Future], dead: Collection[str], timeout_s: float
) -> str:
    """Wait until every survivor's call for the step in flight (``futures[i]`` is ``roles[i]``'s;
    the survivors are the roles not in ``dead``) has ended; ``""`` when each ended in an error
    (the step applied nowhere) or none was made (no step in flight: the death was seen between
    steps), else why not."""
    if not futures:
        return ""
    survivors = [(r, f) for r, f in zip(roles, futures, strict=True) if r not in dead]
    ended_within([f for _, f in survivors], timeout_s)
    for role, future in survivors:
        if not future.done():
            return f"{role} did not leave the step in flight"
        try:
            future.wait()
        except Exception:
            continue
        return f"{role} finished the step in flight: it cannot be undone"
    return ""


def replace_between_steps(
    call: Callable[[], _T],
    replace: Callable[[RoleFailedError, int], Sequence[RoleFailedError]],
    step: int,
    recoveries: list[Recovery],
) -> _T:
    """``call()``, a gather between steps (``full_state``): a role whose death it meets is
    replaced in place at the boundary before ``step`` (``replace(failure, step)``, which raises
    the failure when it cannot be, and returns the failures it handled: ``failure``'s and those
    of any role found dead with it), each recovery recorded, and ``call`` made again."""
    try:
        return call()
    except RoleFailedError as failure:
        detected_at_s = time.perf_counter()
        for handled in replace(failure, step):
            recoveries.append(replaced(handled, step, detected_at_s))
        return call()


def replacement_refused(
    dead: Sequence[str], replaceable: Sequence[str], standbys_left: Sequence[str],
    logs_paused: bool = False,
) -> str:
    """Why the ``dead`` roles cannot take the ``replace`` path, before anything is asked of the
    survivors; ``""`` when they can. ``replaceable`` are the roles the system knows how to
    rebuild in place, ``standbys_left`` the deployment's unused standbys
    (``Deployment.standbys``), ``logs_paused`` whether its recovery logs were ever paused
    (:class:`PausableRecoveryLogs`)."""
    kinds = sorted({role_kind(role) for role in replaceable})
    for role in dead:
        if role not in replaceable:
            return (f"{role} is not a {' or '.join(kinds)}: its state is rebuilt from the "
                    "checkpoint" if kinds else f"{role}: no role is replaced in place here")
    for kind in sorted({role_kind(role) for role in dead}):
        needed = sum(role_kind(role) == kind for role in dead)
        if needed > sum(role_kind(standby) == f"{kind}_standby" for standby in standbys_left):
            return (f"no standby {kind} left" if needed == 1
                    else f"{needed} {kind}s died together: fewer standbys left")
    return LOGS_PAUSED if logs_paused else ""


@contextlib.contextmanager
def replacing(dead: Sequence[str]) -> Iterator[None]:
    """Around the work of replacing ``dead``: a role that answered before and dies meanwhile
    fails the replacement, and the job rolls back with that said (its failure's ``fallback``)."""
    try:
        yield
    except RoleFailedError as later:
        replaced_roles = " and ".join(dead)
        later.fallback = later.fallback or f"{later.role} died while {replaced_roles} was replaced"
        raise
