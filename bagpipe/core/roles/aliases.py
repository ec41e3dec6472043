"""Which process serves a role: the indirection that lets a standby take over a dead role.

A role's name (``trainer_1``) is what every :class:`~bagpipe.core.roles.RoleRef` holds and what the
wire books traffic under; the process that serves it is normally the one spawned under that name.
When that process dies, a pre-spawned standby process (``trainer_standby_0``) can take the role
over (:meth:`~bagpipe.core.roles.Deployment.take_over`): every live process of the world then maps
the role to the standby here, and the standby speaks as the role from then on
(:func:`bagpipe.core.runtime.assume_role`). Refs made before the death keep working unchanged: the
replacement object is built under the dead object's id, so the same ``(role, object id)`` finds it.

The table is per process and starts empty in every world (a TensorPipe world cannot add members,
so a dead process's name is simply never called again)::

    set_alias("trainer_1", "trainer_standby_0")   # in every live process
    worker_of("trainer_1")  # -> "trainer_standby_0": where RPCs to trainer_1 now go
"""

from __future__ import annotations

import threading

from bagpipe.core import runtime

__all__ = ["clear_aliases", "set_alias", "take_over_here", "worker_of"]

_ALIASES: dict[str, str] = {}
_LOCK = threading.Lock()


def worker_of(role: str) -> str:
    """The RPC worker (process name) that serves ``role`` now."""
    return _ALIASES.get(role, role)


def set_alias(role: str, worker: str) -> None:
    """From now on, calls to ``role`` from this process go to process ``worker``."""
    with _LOCK:
        _ALIASES[role] = worker


def clear_aliases() -> None:
    """Forget every alias (a driver joining a fresh world)."""
    with _LOCK:
        _ALIASES.clear()


def take_over_here(role: str, worker: str) -> None:
    """Run in the standby ``worker``: it serves ``role`` from now on, and speaks as it."""
    set_alias(role, worker)
    runtime.assume_role(role)
