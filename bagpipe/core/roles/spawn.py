"""How a role process starts, serves in the RPC world, and leaves it.

Every process of a world (the driver and each role) joins one ``torch.distributed.rpc`` world over
TensorPipe with the same :class:`WorldOptions`, after installing its
:mod:`bagpipe.core.runtime`. A role then serves calls until the driver asks it to stop
(:func:`request_stop`), leaves the world together with every other process
(:func:`leave_rpc_world`) and exits its process (:func:`serve_role`).

Roles on this machine are :class:`LocalRoles`, forked by a ``forkserver`` that imported torch and
torchrec once; roles started by a launcher call
:func:`serve_role` in their own process (``Deployment.from_env``). A driver process may run one
world after another: :func:`reset_rpc_bookkeeping` lets it join the next one.
"""

from __future__ import annotations

import fcntl
import os
import queue
import socket
import struct
import sys
import threading
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.rpc as rpc
import torch.multiprocessing as mp

from bagpipe.core import runtime
from bagpipe.core.allocator import keep_freed_memory_in_children
from bagpipe.core.net import netns
from bagpipe.core.net.fairshare import SharedNics
from bagpipe.core.net.wire import Ledger, NetworkConfig
from bagpipe.core.roles.quiet import DepartureNoticeFilter
from bagpipe.core.roles.rendezvous import LOCALHOST, Rendezvous, meet
from bagpipe.core.roles.watch import watch_parent

__all__ = [
    "LOCALHOST",
    "LocalRoles",
    "RoleArgs",
    "WorldOptions",
    "free_port",
    "interface_towards",
    "join_rpc_world",
    "leave_rpc_world",
    "request_stop",
    "reset_rpc_bookkeeping",
    "role_context",
    "serve_role",
    "use_interface",
    "use_interface_towards",
]

_END_S = 2.0  # a terminated role has this long to exit before it is killed
_SIOCGIFADDR = 0x8915  # ioctl: an interface's (primary) IPv4 address
_IFNAME_VARS = ("TP_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")

# torch's own ``init_rpc`` hands its gloo backend to ``all_gather_object``, which warns that a
# backend is not a process group: torch's usage, not ours, and harmless, so that warning alone is
# silenced (in the driver and, inherited through the fork server, in every role).
warnings.filterwarnings(
    "ignore",
    message=r"You are using a Backend <class 'torch\.distributed\.distributed_c10d\.ProcessGroupGloo'>",
    category=UserWarning,
)


@dataclass(frozen=True)
class WorldOptions:
    """How every process of one world runs (the ``Deployment`` arguments of the same names).

    ``nics`` is the ``model`` back-end's shared NIC state (``None`` for the other back-ends).
    """

    network: NetworkConfig = field(default_factory=NetworkConfig)
    threads_per_role: int = 1
    num_worker_threads: int = 16
    rpc_timeout_s: float = 300.0
    nics: SharedNics | None = None


@dataclass(frozen=True)
class RoleArgs:
    """Everything a process needs to join the RPC world (picklable, sent to a role at spawn)."""

    role: str
    rank: int
    world_size: int
    init_method: str
    options: WorldOptions
    error_dir: str | None
    parent_pid: int | None  # the driver's, for roles spawned here (``watch_parent``)
    #: The ``netns`` host to live on, entered first (``None``: stay where the process is).
    host: netns.HostView | None = None
    #: The interface TensorPipe and gloo use (``None``: as the launcher's environment says).
    ifname: str | None = None


def use_interface(ifname: str) -> None:
    """Make TensorPipe and gloo in this process listen and connect on ``ifname`` only."""
    os.environ["TP_SOCKET_IFNAME"] = ifname
    os.environ["GLOO_SOCKET_IFNAME"] = ifname


def interface_towards(address: str) -> str:
    """The name of this host's interface that packets to ``address`` (an address or a host name)
    leave from; the one holding ``address`` when it is this host's own.

    A UDP ``connect`` sends nothing: it only asks the kernel for the route and its source address.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((address, 9))
        source = probe.getsockname()[0]
        for _, name in socket.if_nameindex():
            request = struct.pack("256s", name.encode()[:15])
            try:
                reply = fcntl.ioctl(probe.fileno(), _SIOCGIFADDR, request)
            except OSError:  # no IPv4 address on this interface
                continue
            if socket.inet_ntoa(reply[20:24]) == source:
                return name
    raise OSError(f"no interface of this host has {source}, the route's source towards {address}")


def use_interface_towards(address: str) -> None:
    """Talk on the interface that reaches ``address`` (the world's rendezvous), unless the launcher
    named one (``TP_SOCKET_IFNAME``, ``GLOO_SOCKET_IFNAME``: each one set is kept).

    Left to themselves TensorPipe and gloo take the address this host's *name* resolves to, which
    on a host with several NICs (or an emulated host, whose name table does not know the machine's
    name) may be an interface the other hosts cannot reach, or the loopback.
    """
    missing = [var for var in _IFNAME_VARS if not os.environ.get(var)]
    if missing:
        ifname = interface_towards(address)
        for var in missing:
            os.environ[var] = ifname


def join_rpc_world(args: RoleArgs) -> None:
    """``init_rpc`` as ``args.role``: blocks until every process of the world has joined.

    TensorPipe is held to its TCP transport and its plain channel: left alone it picks shared
    memory or cross-process memory reads between local processes, which bypass the network (and
    its emulation) entirely.
    """
    rpc.init_rpc(
        args.role,
        backend=rpc.BackendType.TENSORPIPE,  # type: ignore[attr-defined]
        rank=args.rank,
        world_size=args.world_size,
        rpc_backend_options=rpc.TensorPipeRpcBackendOptions(
            num_worker_threads=args.options.num_worker_threads,
            rpc_timeout=args.options.rpc_timeout_s,
            init_method=args.init_method,
            _transports=["uv"],
            _channels=["basic"],
        ),
    )


#: How much lower a helper role's CPU priority is than a trainer's (``yield_cpu_to_trainers``).
HELPER_NICE = runtime.BACKGROUND_NICE


def yield_cpu_to_trainers(role: str) -> None:
    """Give every role but a trainer a lower CPU priority (``nice``), in every system alike.

    On the target cluster the embedding servers and Bagpipe's oracle run on hosts of their own,
    so their work never takes a core from a trainer. One machine cannot reserve cores (two cores,
    four or five processes), but it can let a helper run only on what the trainers leave: a
    helper that the trainers wait for still runs at once (they are not using the cores then),
    while background work (planning, applying pushes) no longer slows the trainers' forward and
    backward. The rule is applied here, where every locally spawned role starts, so no system
    can opt out of it; ``bagpipe.bench.fairness`` checks the result.
    """
    if not role.startswith("trainer_"):
        os.nice(HELPER_NICE)


def serve_role(args: RoleArgs) -> None:
    """Body of a role process: join the RPC world, serve calls until the driver shuts down.

    A role of the ``netns`` back-end enters its host's namespace first, before it starts a thread
    or opens a socket, so everything it does lives there. A failure while starting is written to
    the error directory, so the driver reports it.
    """
    if args.host is not None:
        netns.enter(args.host)
    if args.ifname is not None:
        use_interface(args.ifname)
    if args.parent_pid is not None:
        threading.Thread(target=watch_parent, args=(args.parent_pid,), daemon=True).start()
    torch.set_num_threads(args.options.threads_per_role)
    if args.parent_pid is not None:
        yield_cpu_to_trainers(args.role)
    error_dir = Path(args.error_dir) if args.error_dir else None
    runtime.init(args.role, args.options.network, error_dir, args.options.nics)
    try:
        join_rpc_world(args)
    except BaseException as exc:
        runtime.report_failure(exc)
        raise
    departure, notices = _DEPARTURES.get()
    code = 0
    try:
        leave_rpc_world(departure, args.options.rpc_timeout_s)
    except Exception as exc:  # the driver gave up on leaving together and ends this process
        print(f"[{args.role}] could not leave the RPC world with the others: {exc}", file=sys.stderr)
        code = 1
    finally:
        notices.stop()
    # Exit without interpreter teardown, which can block on native RPC and gloo threads.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


#: The departure the driver announced (``request_stop``) with this role's open notice filter,
#: awaited by the role's main thread.
_DEPARTURES: queue.Queue[tuple[Rendezvous, DepartureNoticeFilter]] = queue.Queue(maxsize=1)


def role_ledger() -> Ledger:
    """This role's NIC ledger (the driver gathers every role's before it stops them)."""
    return runtime.current().wire.ledger


def request_stop(departure: Rendezvous) -> None:
    """Called by the driver's ``close``: this role's main thread leaves the world at ``departure``.

    The role's stderr filter (``quiet``) opens here, before the driver hears back, so it is open
    before any process of the world can close a connection.
    """
    notices = DepartureNoticeFilter()
    notices.start()
    _DEPARTURES.put_nowait((departure, notices))


def leave_rpc_world(
    departure: Rendezvous, timeout_s: float, store: dist.Store | None = None
) -> None:
    """Leave the RPC world once every process of it has arrived at ``departure``.

    A process arrives only with no call in flight (a role once it answered the stop request, the
    driver once it has every answer) and with its departure-notice filter open (``quiet``), so a
    connection that closes from then on is this departure and nothing else. The driver hosts the
    store and passes it as ``store``. torch's graceful ``rpc.shutdown`` is not used: its barriers
    hang when a driver process runs a second Deployment (``quiet`` says why).
    """
    meet(departure, "departure", timeout_s, store)
    rpc.shutdown(graceful=False)


def reset_rpc_bookkeeping() -> None:
    """Reset torch RPC's per-process counters so this process can join a fresh RPC world.

    ``init_rpc`` namespaces its store keys with a per-process counter (``rpc_prefix_<n>``) and its
    internal all-gathers with per-process sequence numbers. A driver that already ran a Deployment
    would be ahead of its freshly spawned role processes (which start at 0) and both sides would
    wait for each other's keys forever; every Deployment uses a new store, so starting over is safe.
    """
    rpc._init_counter = 0  # type: ignore[attr-defined]
    with rpc.api._all_gather_dict_lock:
        rpc.api._all_gather_sequence_id.clear()
        rpc.api._all_gather_sequence_id_to_states.clear()


def free_port(address: str = LOCALHOST) -> int:
    """A TCP port of ``address`` that was free a moment ago (for a local world's store)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((address, 0))
        return int(sock.getsockname()[1])


class LocalRoles:
    """The role processes spawned on this machine, by role name: start, observe, end."""

    def __init__(self) -> None:
        self._procs: dict[str, Any] = {}
        self._retired: list[Any] = []  # dead processes whose roles standbys took over

    def start(self, roles: Sequence[RoleArgs]) -> None:
        """Fork one process per role, named ``bagpipe-<role>`` (fault injection finds it by name).

        Each started process is kept at once, so a failure midway still ends the earlier ones.
        """
        ctx = role_context()
        for args in roles:
            proc = ctx.Process(
                target=serve_role, args=(args,), name=f"bagpipe-{args.role}", daemon=True
            )
            proc.start()
            self._procs[args.role] = proc

    def retire(self, role: str, standby: str) -> None:
        """``standby``'s process serves ``role`` from now on (fault injection finds it under
        ``role``'s name); ``role``'s dead process is only kept to be ended."""
        procs = dict(self._procs)  # a new dict: the monitor thread may be reading the old one
        self._retired.append(procs.pop(role))
        proc = procs.pop(standby)
        proc.name = f"bagpipe-{role}"
        procs[role] = proc
        self._procs = procs

    def pids(self) -> dict[str, int]:
        return {role: int(proc.pid) for role, proc in self._procs.items()}

    def exit_codes(self) -> dict[str, int | None]:
        """Each role's exit code, ``None`` while it runs."""
        return {role: proc.exitcode for role, proc in self._procs.items()}

    def join(self, wait_s: float) -> None:
        """Wait up to ``wait_s`` in all for the processes to exit on their own."""
        deadline = time.monotonic() + wait_s
        for proc in self._all():
            proc.join(max(0.0, deadline - time.monotonic()))

    def end(self) -> list[str]:
        """Terminate every process still running, then kill those that do not exit; return the
        roles that had to be ended this way (retired processes, already dead, are only reaped)."""
        running = [role for role, proc in self._procs.items() if proc.is_alive()]
        for proc in self._all():
            if proc.is_alive():
                proc.terminate()
        for proc in self._all():
            proc.join(_END_S)
            if proc.is_alive():
                proc.kill()
                proc.join()
        return running

    def _all(self) -> list[Any]:
        return [*self._procs.values(), *self._retired]


#: Modules every role process needs; the fork server imports them once, then forks each role.
#: ``torchrec_api`` brings torchrec where it is installed.
_PRELOADED_MODULES = ["torch", "bagpipe.core.torchrec_api", "bagpipe.core.roles", "bagpipe.models"]


def role_context() -> Any:
    """A ``forkserver`` context whose server has already imported torch and torchrec.

    Spawning a role from scratch costs a full ``import torch, torchrec`` (~4 s of CPU each); five
    roles on two cores took 10-20 s to start. The fork server pays that once per driver process and
    forks every later role from the warm image. It forks before any thread, RPC agent or process
    group exists, so the usual hazards of forking a torch process do not apply.
    """
    # A process that asked CUDA for its device count cannot hand CUDA to a child it forks; the
    # NVML-based check answers without touching CUDA, so whatever the preloaded modules ask,
    # every role forked from the server may still use its GPU.
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    keep_freed_memory_in_children()  # the server's image, and so every role's, under the rule
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(_PRELOADED_MODULES)
    return ctx
