"""``RoleRef``: a picklable handle on an object living in a role process, called through RPC.

Why not torch's ``RRef``: torch binds every RRef to the *first* RPC agent its process ever had (a
C++ singleton), so a driver that runs a second Deployment (a test suite, a benchmark comparing systems)
sends RRef calls to the roles of the first one. A ``RoleRef`` is just ``(role, object_id, class)``:
the object sits in a per-process table in its role's process and every call is a plain
``rpc_async(role, ...)``. The call syntax is RRef's::

    server = deployment.remote("server_0", EmbeddingServer, ...)           # -> RoleRef
    fut = server.rpc_async(kind=LinkKind.EMB_PULL).fetch_rows(ids)         # Future
    rows = server.rpc_sync(kind=LinkKind.EMB_PULL).fetch_rows(ids)         # value
    trainer = deployment.remote("trainer_0", Trainer, servers=[server])    # refs travel as arguments

**Every call goes through the wire** (``bagpipe.core.net.wire``) on both ends: the caller's side
counts and delays the request, the callee's side counts the request on arrival and counts and
delays the reply. ``kind`` names the Meter column the call's tensors land in (``control`` when
not given), so a system never counts or delays by hand, and cannot skip it.

**A role's process can change.** A ref names a role, not a process: every call goes to the process
that serves the role now (:func:`bagpipe.core.roles.aliases.worker_of`), so when a standby takes a
dead role over and rebuilds its object under the same id (``construct(..., object_id=...)``), the
refs every process already holds reach the replacement.

Objects live until their process ends (roles live as long as the Deployment). A method decorated with
``@torch.distributed.rpc.functions.async_execution`` returns a ``Future`` and is served without
holding an RPC thread while it waits, as with RRefs.
"""

from __future__ import annotations

import itertools
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch.distributed.rpc as rpc
from torch.futures import Future

from bagpipe.core import runtime
from bagpipe.core.meter import LinkKind
from bagpipe.core.roles.aliases import worker_of

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


def _construct(object_id: str, cls: type, args: tuple, kwargs: dict, rebuild: bool = False) -> None:
    slot = _slot(object_id)
    if rebuild and slot.ready.is_set():  # a fresh slot: later calls never reach the old object
        with _TABLE_LOCK:
            _TABLE[object_id] = fresh = _Slot()
        if hasattr(slot.value, "close"):
            slot.value.close()
        slot = fresh
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


def _call(object_id: str, method: str, args: tuple, kwargs: dict, caller: str, kind: str) -> Any:
    """The callee's side of a call: book the request, run the method, send the reply."""
    wire = runtime.current().wire
    wire.incoming(caller, kind, args, kwargs)
    result = getattr(_lookup(object_id), method)(*args, **kwargs)
    wire.reply(caller, kind, result)
    return result


@rpc.functions.async_execution
def _call_async(
    object_id: str, method: str, args: tuple, kwargs: dict, caller: str, kind: str
) -> Future:
    """As :func:`_call`, for methods that return a ``Future`` (served without holding a thread)."""
    wire = runtime.current().wire
    wire.incoming(caller, kind, args, kwargs)

    def reply(done: Future) -> Any:
        result = done.value()
        wire.reply(caller, kind, result)
        return result

    return getattr(_lookup(object_id), method)(*args, **kwargs).then(reply)


def construct(
    role: str, creator: str, cls: type, args: tuple, kwargs: dict, object_id: str | None = None
) -> RoleRef:
    """Start building ``cls(*args, **kwargs)`` in ``role``; return its ref (``.ready`` = the future).

    ``object_id`` rebuilds an object under an existing id (a dead role's, in the standby that took
    it over, or a survivor's, rebuilt in place), so refs to the old object reach the new one; the
    old object, if this process holds it, is closed first (``close()``, when it has one). A call
    that arrives before the rebuild reaches the old object: wait for ``.ready`` before calling.
    By default the id is new.
    """
    rebuild = object_id is not None
    object_id = object_id or f"{creator}/{next(_IDS)}/{cls.__qualname__}"
    ref = RoleRef(role, object_id, cls)
    ref.ready = rpc.rpc_async(
        worker_of(role), _construct, args=(object_id, cls, args, kwargs, rebuild)
    )
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

    def rpc_async(
        self, timeout: float = rpc.constants.UNSET_RPC_TIMEOUT, kind: str = LinkKind.CONTROL
    ) -> _Proxy:
        """``ref.rpc_async(kind=...).method(*args)`` -> ``Future`` of the method's result.

        ``kind`` is the Meter column the call's tensors are counted in (both directions).
        """
        return _Proxy(self, timeout, kind, sync=False)

    def rpc_sync(
        self, timeout: float = rpc.constants.UNSET_RPC_TIMEOUT, kind: str = LinkKind.CONTROL
    ) -> _Proxy:
        """``ref.rpc_sync(kind=...).method(*args)`` -> the method's result (blocks)."""
        return _Proxy(self, timeout, kind, sync=True)


class _Proxy:
    """Turns ``proxy.method(*args)`` into a call through the wire (``bagpipe.core.net.wire``)."""

    def __init__(self, ref: RoleRef, timeout: float, kind: str, sync: bool) -> None:
        self._ref = ref
        self._timeout = timeout
        self._kind = str(kind)
        self._sync = sync

    def __getattr__(self, method: str) -> Any:
        ref = self._ref
        target = getattr(ref.cls, method, None)
        if target is None:
            raise AttributeError(f"{ref.cls.__qualname__} has no method {method!r}")
        fn = _call_async if hasattr(target, "_wrapped_async_rpc_function") else _call

        def invoke(*args: Any, **kwargs: Any) -> Any:
            wire = runtime.current().wire
            envelope = (ref.object_id, method, args, kwargs, wire.role, self._kind)
            nbytes = wire.outgoing(ref.role, self._kind, args, kwargs)
            if self._sync:
                wire.hold(ref.role, nbytes)
                result = rpc.rpc_sync(
                    worker_of(ref.role), fn, args=envelope, timeout=self._timeout
                )
                wire.replied(ref.role, self._kind, result)
                return result
            return _send_async(ref.role, fn, envelope, self._timeout, self._kind, nbytes)

        return invoke


def _send_async(
    role: str, fn: Any, envelope: tuple, timeout: float, kind: str, nbytes: int
) -> Future:
    """Send a counted call without holding the caller: its network time runs on a sender thread
    (so two calls in flight share the NIC as concurrent flows), and the reply is booked on arrival."""
    wire = runtime.current().wire

    def booked(done: Future) -> Any:
        result = done.value()
        wire.replied(role, kind, result)
        return result

    def send() -> Future:
        return rpc.rpc_async(worker_of(role), fn, args=envelope, timeout=timeout).then(booked)

    if not wire.delays(role):
        return send()
    result: Future = Future()

    def forward(sent: Future) -> None:
        try:
            result.set_result(sent.value())
        except Exception as exc:
            result.set_exception(exc)

    def start() -> None:
        try:
            wire.hold(role, nbytes)
            send().add_done_callback(forward)
        except Exception as exc:
            result.set_exception(exc)

    _senders().submit(start)
    return result


_SENDERS: ThreadPoolExecutor | None = None
_SENDERS_LOCK = threading.Lock()


def _senders() -> ThreadPoolExecutor:
    """This process's sender threads (created on first use; a forked role gets its own)."""
    global _SENDERS
    with _SENDERS_LOCK:
        if _SENDERS is None:
            _SENDERS = ThreadPoolExecutor(max_workers=16, thread_name_prefix="wire-send")
        return _SENDERS
