"""``RoleRef``: a picklable handle on an object living in a role process, called through RPC.

Why not torch's ``RRef``: torch binds every RRef to the *first* RPC agent its process ever had (a
C++ singleton), so a driver that runs a second Deployment (a test suite, a benchmark comparing systems)
sends RRef calls to the roles of the first one. A ``RoleRef`` is just ``(role, object_id, class)``:
the object sits in a per-process table in its role's process and every call is a plain
``rpc_async(role, ...)``. The call syntax is RRef's::

    server = deployment.remote("server_0", EmbeddingServer, ...)     # -> RoleRef
    fut = server.rpc_async().fetch_rows(ids)                       # Future
    rows = server.rpc_sync().fetch_rows(ids)                       # value
    trainer = deployment.remote("trainer_0", Trainer, servers=[server])   # refs travel as arguments

Objects live until their process ends (roles live as long as the Deployment). A method decorated with
``@torch.distributed.rpc.functions.async_execution`` returns a ``Future`` and is served without
holding an RPC thread while it waits, as with RRefs.
"""

from __future__ import annotations

import itertools
import threading
from typing import Any

import torch.distributed.rpc as rpc
from torch.futures import Future

__all__ = ["RoleRef", "construct"]

_CONSTRUCT_TIMEOUT_S = 300.0


class _Slot:
    """The owner-side place of one object: filled once its constructor ran (or failed)."""

    def __init__(self) -> None:
        self.ready = threading.Event()
        self.value: Any = None
        self.error: BaseException | None = None


_TABLE: dict[str, _Slot] = {}
_TABLE_LOCK = threading.Lock()
_IDS = itertools.count()


def _slot(object_id: str) -> _Slot:
    with _TABLE_LOCK:
        return _TABLE.setdefault(object_id, _Slot())


def _construct(object_id: str, cls: type, args: tuple, kwargs: dict) -> None:
    slot = _slot(object_id)
    try:
        slot.value = cls(*args, **kwargs)
    except BaseException as exc:
        slot.error = exc
        raise
    finally:
        slot.ready.set()


def _lookup(object_id: str) -> Any:
    """The object, once built; a call that arrives before its constructor finished waits for it."""
    slot = _slot(object_id)
    if not slot.ready.wait(_CONSTRUCT_TIMEOUT_S):
        raise TimeoutError(
            f"object {object_id} was not constructed within {_CONSTRUCT_TIMEOUT_S} s"
        )
    if slot.error is not None:
        raise RuntimeError(f"object {object_id} failed to construct: {slot.error!r}")
    return slot.value


def _call(object_id: str, method: str, args: tuple, kwargs: dict) -> Any:
    return getattr(_lookup(object_id), method)(*args, **kwargs)


@rpc.functions.async_execution
def _call_async(object_id: str, method: str, args: tuple, kwargs: dict) -> Future:
    return getattr(_lookup(object_id), method)(*args, **kwargs)


def construct(role: str, creator: str, cls: type, args: tuple, kwargs: dict) -> RoleRef:
    """Start building ``cls(*args, **kwargs)`` in ``role``; return its ref (``.ready`` = the future)."""
    object_id = f"{creator}/{next(_IDS)}/{cls.__qualname__}"
    ref = RoleRef(role, object_id, cls)
    ref.ready = rpc.rpc_async(role, _construct, args=(object_id, cls, args, kwargs))
    return ref


class RoleRef:
    """Handle on ``cls`` instance ``object_id`` in process ``role`` (see the module docstring)."""

    def __init__(self, role: str, object_id: str, cls: type) -> None:
        self.role = role
        self.object_id = object_id
        self.cls = cls
        #: Future of the constructor, on the process that called ``construct`` only.
        self.ready: Future | None = None

    def __reduce__(self) -> tuple:
        return (RoleRef, (self.role, self.object_id, self.cls))

    def __repr__(self) -> str:
        return f"RoleRef({self.role!r}, {self.object_id!r})"

    def rpc_async(self, timeout: float = rpc.constants.UNSET_RPC_TIMEOUT) -> _Proxy:
        """``ref.rpc_async().method(*args)`` -> ``Future`` of the method's result."""
        return _Proxy(self, timeout, sync=False)

    def rpc_sync(self, timeout: float = rpc.constants.UNSET_RPC_TIMEOUT) -> _Proxy:
        """``ref.rpc_sync().method(*args)`` -> the method's result (blocks)."""
        return _Proxy(self, timeout, sync=True)


class _Proxy:
    def __init__(self, ref: RoleRef, timeout: float, sync: bool) -> None:
        self._ref = ref
        self._timeout = timeout
        self._sync = sync

    def __getattr__(self, method: str) -> Any:
        ref, timeout = self._ref, self._timeout
        target = getattr(ref.cls, method, None)
        if target is None:
            raise AttributeError(f"{ref.cls.__qualname__} has no method {method!r}")
        fn = _call_async if hasattr(target, "_wrapped_async_rpc_function") else _call

        def invoke(*args: Any, **kwargs: Any) -> Any:
            call = rpc.rpc_sync if self._sync else rpc.rpc_async
            return call(ref.role, fn, args=(ref.object_id, method, args, kwargs), timeout=timeout)

        return invoke
