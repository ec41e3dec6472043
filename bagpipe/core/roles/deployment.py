"""Role processes for multi-process systems: spawn, remote objects, collectives rendezvous, failure.

A :class:`Deployment` is a set of named role processes (``trainer_0``, ``server_1``, ``oracle``, ...)
joined with the current process (the **driver**, RPC name ``"driver"``, rank 0) in one
``torch.distributed.rpc`` world (TensorPipe). Every process gets a :mod:`bagpipe.core.runtime`
(role name, Meter, its end of the wire) and ``torch.set_num_threads(threads_per_role)``, so a few
roles share a small machine without oversubscribing it.

**The network** (``network=NetworkConfig(...)``, ``bagpipe.core.net``): the deployment places every
role on its host of the topology and builds the back-end for them: with ``netns`` each host is a
network namespace with shaped NICs and every role process lives in its host's namespace, talking
to the others over real TCP between host addresses; with ``model`` the roles share one NIC model;
with ``real`` nothing is emulated. The driver is not a host: it reaches the roles on an unshaped
control path.

Use it like this (the driver is usually a ``System``'s ``setup``/``train_step``)::

    from bagpipe.core.roles import Deployment

    with Deployment(["server_0", "trainer_0", "trainer_1"], network=ctx.network) as deployment:
        servers = [deployment.remote(f"server_{s}", EmbeddingServer, s, 2, ...) for s in range(2)]
        group = deployment.new_group("trainers", world_size=2)       # gloo rendezvous, see below
        trainers = [deployment.remote(f"trainer_{k}", MyTrainer, k, group, servers) for k in range(2)]
        futures = [t.rpc_async().train_step(step, batch) for t in trainers]
        results = deployment.wait(futures, timeout_s=60)              # raises RoleFailedError on a death

Rules of the road:

* **Role objects** are built in their process by :meth:`Deployment.remote`, which returns a
  :class:`~bagpipe.core.roles.RoleRef` (RRef-like call syntax; torch RRefs are not used because
  they break when one driver process runs a second Deployment). The class must be importable (module
  level). Roles call each other through the refs they are given as constructor or method
  arguments: ``server.rpc_async().fetch_rows(ids)`` returns a Future, ``rpc_sync()`` the value.
* **Always wait through the deployment** (:meth:`Deployment.wait`), never with a bare ``fut.wait()`` on
  the driver: it raises :class:`RoleFailedError` naming the role within ~0.1 s when a role process
  dies (even by SIGKILL) or reports a failure, instead of hanging. Exceptions raised *inside* a
  role method travel back through the future as usual (their message names the worker).
* **Background threads** in a role must be started with :func:`bagpipe.core.runtime.start_thread`
  (or report with :func:`~bagpipe.core.runtime.report_failure`), so their exceptions fail the run.
* **Collectives**: :meth:`Deployment.new_group` returns a picklable :class:`Rendezvous`; pass it to the
  role objects that form the group, which call ``bagpipe.core.collectives.join_group(spec, rank)``
  (gloo). The rendezvous store lives in the driver, so this works across machines too. A process
  may join only one group (it becomes its default process group): e.g. the trainers' group.
* **Shutdown** (:meth:`close`, or leaving the ``with`` block): when every role is alive, each is
  asked to stop, all processes leave the RPC world together (``spawn.leave_rpc_world``: nothing
  is printed about the connections that close) and the roles exit on their own. After a failure
  the driver leaves alone and ends the roles. Any role process still running is then terminated,
  then killed, with a warning when a healthy role had to be ended. Nothing is left running. Close
  only when no call is in flight (wait for your futures first); a later Deployment in the same
  driver process works (refs of a closed Deployment are dead).

**Standbys** (``standbys=standby_roles("trainer", 1)``): idle role processes spawned with the others,
in hosts of their own. When a role's process dies, :meth:`Deployment.take_over` makes a standby of
its kind serve it (``bagpipe.core.roles.aliases``): every ref to the role reaches the standby, which
speaks as the role, and :meth:`Deployment.rebuild` builds the replacement object there under the
dead object's id. A TensorPipe world cannot add members, so this is how a role is replaced without
restarting the others; the dead process is never called again.

Deployment launchers (SLURM via submitit, ``torchrun``): start ``1 + len(roles)`` processes with
``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` set, all running the same program,
which calls :meth:`Deployment.from_env` first thing::

    deployment = Deployment.from_env(["server_0", "trainer_0", "trainer_1"])   # ranks 1.. serve, exit
    system.setup(...)  # rank 0 only gets here: it is the driver

Rank ``r >= 1`` serves as ``roles[r - 1]`` until the driver closes the deployment, then exits the
process; rank 0 returns the driver's Deployment. Liveness there is checked by heartbeat
RPCs (there are no local child processes to watch), and addresses, ranks and the rendezvous come
from the environment, as on real nodes. The back-end is usually ``real`` there: the network is.

Across hosts, ``MASTER_ADDR`` is rank 0's address as the other hosts reach it (never
``127.0.0.1``), and the hosts reach each other on any port: beside ``MASTER_PORT``, TensorPipe
listens on OS-chosen ports, and so do the groups' and the departure's stores on rank 0. Each process talks on the interface the
launcher names (``TP_SOCKET_IFNAME``, ``GLOO_SOCKET_IFNAME``), else on the one its route to
``MASTER_ADDR`` leaves from, so its peers reach it at that interface's address; nothing assumes
the loopback or the host's name. ``tests/core/test_multihost.py`` launches a world with every rank
on an emulated host of its own (``netns``), as a launcher would on separate nodes.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.rpc as rpc
from torch.futures import Future

from bagpipe.core import runtime
from bagpipe.core.net.fairshare import SharedNics
from bagpipe.core.net.netns import HostView, NamespaceHosts, Switch, netns_available
from bagpipe.core.net.report import NetworkReport
from bagpipe.core.net.topology import host_of
from bagpipe.core.net.wire import NetworkConfig
from bagpipe.core.roles import cpu, rendezvous, spawn
from bagpipe.core.roles.aliases import clear_aliases, set_alias, take_over_here, worker_of
from bagpipe.core.roles.failures import RoleFailedError, describe_exit
from bagpipe.core.roles.quiet import departure_notices_dropped
from bagpipe.core.roles.rendezvous import Rendezvous
from bagpipe.core.roles.roleref import RoleRef, construct
from bagpipe.core.roles.watch import POLL_S, Monitor
from bagpipe.core.runtime import DRIVER

__all__ = [
    "Deployment", "last_network_report", "role_kind", "standby_roles", "startup_times_s",
]

_STOP_S = 10.0  # roles asked to stop have this long to leave before they are terminated
# How long a call broken by a peer (a reset connection) waits for that peer's death to be seen, so
# the failure names the dead role: on a loaded two-core host 1 s was sometimes too short.
_DEATH_VISIBLE_S = 5.0
_DEPARTURE = "departure"  # the store every process of the world leaves the RPC world through
_PING_S = 10.0  # how long a live role may take to say its pid (``dead_besides``)


class Deployment:
    """The driver's handle on a set of role processes in one RPC world (see the module docstring).

    Args:
        roles: role names, one process each (ranks 1..N in this order). Must be unique and not
            ``"driver"``.
        network: the run's network (back-end, topology, dilation); default: nothing emulated.
        threads_per_role: ``torch.set_num_threads`` in each role process.
        num_worker_threads: TensorPipe threads serving incoming RPCs per process. A role method
            that blocks (waiting on a barrier, a collective) holds one, so keep headroom.
        rpc_timeout_s: default timeout of every RPC.
        standbys: idle role processes that can take over a dead role of their kind
            (:func:`standby_roles`; module docstring, *Standbys*); only for roles spawned here.
    """

    def __init__(
        self,
        roles: Sequence[str],
        network: NetworkConfig | None = None,
        threads_per_role: int = 1,
        num_worker_threads: int = 16,
        rpc_timeout_s: float = 300.0,
        *,
        standbys: Sequence[str] = (),
        _attach_env: bool = False,
    ) -> None:
        self.roles = tuple(roles)
        self._standbys = list(standbys)
        self._processes = (*self.roles, *self._standbys)  # every process spawned, in rank order
        if len(set(self._processes)) != len(self._processes) or DRIVER in self._processes:
            raise ValueError(
                f"deployment roles must be unique and not {DRIVER!r}: {self._processes}"
            )
        if self._standbys and _attach_env:
            raise ValueError("standbys are spawned by the driver; a launched world has none")
        self.network = network or NetworkConfig()
        self._hosts: NamespaceHosts | None = None
        self._options = spawn.WorldOptions(
            self.network, threads_per_role, num_worker_threads, rpc_timeout_s,
            nics=self._shared_nics() if not _attach_env else None,
        )
        self._closed = False
        self._rpc_up = False
        self._stores: dict[str, dist.TCPStore] = {}
        self._children = spawn.LocalRoles()
        self._host = os.environ["MASTER_ADDR"] if _attach_env else rendezvous.LOCALHOST
        # where roles spawned here report failures; roles attached from a launcher have none
        self._error_dir = None if _attach_env else Path(tempfile.mkdtemp(prefix="bagpipe-roles-"))
        self._monitor = Monitor(self._processes, self._children.exit_codes, self._error_dir)
        if _attach_env:
            self._attach_driver()
        else:
            started_s = time.perf_counter()
            self._spawn()
            _STARTUPS_S.append(time.perf_counter() - started_s)
            cpu.register(self)

    # ----------------------------------------------------------------------------- start-up
    @classmethod
    def from_env(
        cls, roles: Sequence[str], network: NetworkConfig | None = None, **kwargs: Any
    ) -> Deployment:
        """Join a world started by SLURM/submitit/torchrun (``RANK``, ``WORLD_SIZE``, ``MASTER_*``).

        Rank 0 returns the driver's Deployment. Rank ``r >= 1`` serves as ``roles[r-1]`` until the
        driver closes the deployment, then exits the process: it never returns. Every rank talks on
        the interface the launcher names, else on the one that reaches ``MASTER_ADDR``
        (``spawn.use_interface_towards``).
        """
        try:
            rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
            init_method = _env_init_method()
        except KeyError as missing:
            raise RuntimeError(
                f"Deployment.from_env: environment variable {missing} is not set"
            ) from None
        if world_size != len(roles) + 1:
            raise ValueError(
                f"Deployment.from_env: WORLD_SIZE={world_size} but {len(roles)} roles + the driver"
            )
        spawn.use_interface_towards(os.environ["MASTER_ADDR"])
        if rank == 0:
            return cls(roles, network, _attach_env=True, **kwargs)
        args = spawn.RoleArgs(
            role=roles[rank - 1],
            rank=rank,
            world_size=world_size,
            init_method=init_method,
            options=spawn.WorldOptions(network or NetworkConfig(), **kwargs),
            error_dir=None,
            parent_pid=None,
        )
        spawn.serve_role(args)
        raise AssertionError("serve_role returns only by exiting the process")

    def _shared_nics(self) -> SharedNics | None:
        """The ``model`` back-end's NICs, shared with the roles as they are spawned."""
        if self.network.backend != "model":
            return None
        return SharedNics(self.network.emulated.hosts(self._processes), spawn.role_context())

    def _role_args(self, role: str, rank: int, init_method: str) -> spawn.RoleArgs:
        return spawn.RoleArgs(
            role=role,
            rank=rank,
            world_size=len(self._processes) + 1,
            init_method=init_method,
            options=self._options,
            error_dir=str(self._error_dir) if self._error_dir else None,
            parent_pid=os.getpid(),
            host=self._host_view(role),
            ifname=self._ifname(role),
        )

    def _host_view(self, role: str) -> HostView | None:
        """The host a locally spawned role enters (``netns`` back-end only)."""
        if self._hosts is None or role == DRIVER:
            return None
        return self._hosts.view(host_of(role, self.network.emulated.servers))

    def _ifname(self, role: str) -> str | None:
        """The interface a process talks on: its host's NIC, the loopback, or the launcher's."""
        if self._error_dir is None:  # attached from a launcher: its environment decides
            return None
        if role == DRIVER:
            return _driver_address()[1]
        return self._hosts.host_ifname if self._hosts is not None else "lo"

    def _spawn(self) -> None:
        try:
            self._host, driver_ifname = _driver_address()
            spawn.use_interface(driver_ifname)
            if self.network.backend == "netns":
                self._hosts = NamespaceHosts(self.network.emulated.hosts(self._processes))
                self._hosts.start()
            init_method = f"tcp://{self._host}:{spawn.free_port(self._host)}"

            def start_roles() -> None:
                self._children.start(
                    [
                        self._role_args(role, rank, init_method)
                        for rank, role in enumerate(self._processes, start=1)
                    ]
                )
                self._monitor.start(heartbeats=False)

            self._init_driver_rpc(self._role_args(DRIVER, 0, init_method), start_roles)
        except BaseException:
            self.close()
            raise

    def _attach_driver(self) -> None:
        self._init_driver_rpc(self._role_args(DRIVER, 0, _env_init_method()))
        self._monitor.start(heartbeats=True)  # no local children to poll

    def _init_driver_rpc(
        self, args: spawn.RoleArgs, start_roles: Callable[[], None] | None = None
    ) -> None:
        """``init_rpc`` in a helper thread, so a role dying during start-up fails fast, no hang.

        ``start_roles`` runs once that thread has begun: the driver's rendezvous store takes its
        port before the roles take seconds to start, so another process on the machine has no
        time to take the free port it was given (``EADDRINUSE``).
        """
        torch.set_num_threads(max(1, torch.get_num_threads()))
        runtime.init(DRIVER, self.network, self._error_dir)
        spawn.reset_rpc_bookkeeping()
        clear_aliases()
        outcome: list[BaseException | None] = []

        def join() -> None:
            try:
                spawn.join_rpc_world(args)
                outcome.append(None)
            except BaseException as exc:
                outcome.append(exc)

        thread = threading.Thread(target=join, name="bagpipe-init-rpc", daemon=True)
        thread.start()
        if start_roles is not None:
            start_roles()
        while thread.is_alive():
            thread.join(POLL_S)
            self._monitor.raise_if_failed()
        if outcome and outcome[0] is not None:
            raise outcome[0]
        self._rpc_up = True

    @property
    def failure(self) -> RoleFailedError | None:
        """The first role failure seen so far, if any."""
        return self._monitor.failure

    # ----------------------------------------------------------------------------- calls
    def remote(self, role: str, cls: type, *args: Any, **kwargs: Any) -> RoleRef:
        """Start building ``cls(*args, **kwargs)`` in ``role``'s process; return its handle.

        Returns at once (constructors that wait for each other, like group members, may be
        started one after another); ``deployment.wait(ref.ready)`` waits for the constructor, and
        calls through the ref wait for it on their own.
        """
        self._check_role(role)
        self._monitor.raise_if_failed()
        return construct(role, DRIVER, cls, args, kwargs)

    def rebuild(self, ref: RoleRef, cls: type, *args: Any, **kwargs: Any) -> RoleRef:
        """As :meth:`remote`, building ``cls(*args, **kwargs)`` under ``ref``'s object id in the
        process that serves ``ref.role`` now (after :meth:`take_over`, the standby), so that every
        ref to the old object reaches the new one."""
        self._check_role(ref.role)
        self._monitor.raise_if_failed()
        return construct(ref.role, DRIVER, cls, args, kwargs, object_id=ref.object_id)

    def rpc_async(self, role: str, fn: Any, *args: Any, **kwargs: Any) -> Future:
        """Run module-level function ``fn(*args, **kwargs)`` in ``role``'s process."""
        self._check_role(role)
        self._monitor.raise_if_failed()
        return rpc.rpc_async(worker_of(role), fn, args=args, kwargs=kwargs)

    def wait(self, futures: Future | Iterable[Future], timeout_s: float | None = None) -> Any:
        """Wait for one future (return its value) or several (return their values, in order).

        Raises:
            RoleFailedError: a role died or reported a failure before the futures completed.
            TimeoutError: ``timeout_s`` passed first.
        """
        single = isinstance(futures, torch._C.Future)
        pending: list[Future] = (
            [futures] if single else list(futures)  # type: ignore[list-item,arg-type]
        )
        done = threading.Event()
        if pending:
            torch.futures.collect_all(pending).add_done_callback(lambda _: done.set())
        else:
            done.set()
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not done.wait(POLL_S):
            self._monitor.raise_if_failed()
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"deployment.wait: {timeout_s} s passed")
        values = []
        for future in pending:
            try:
                values.append(future.wait())
            except Exception as exc:
                # A peer's death often surfaces first as a broken pipe: prefer naming the role.
                failure = self._monitor.failure_within(_DEATH_VISIBLE_S)
                if failure is not None:
                    raise failure from exc
                raise
        return values[0] if single else values

    def _check_role(self, role: str) -> None:
        if role not in self.roles:
            raise KeyError(f"no role {role!r} in this deployment; roles: {self.roles}")
        if self._closed:
            raise RuntimeError("deployment is closed")

    # ----------------------------------------------------------------------------- standbys
    @property
    def standbys(self) -> tuple[str, ...]:
        """The standbys not yet used."""
        return tuple(self._standbys)

    def dead_besides(self, role: str) -> list[RoleFailedError]:
        """The failures of the other roles that are dead now, which a replacement of ``role``
        takes over with it (a system that meets a death only at its next call to the role can
        meet two at once).

        Every other role is asked for its pid: one whose call fails is dead once its exit code
        shows (a role SIGKILLed a moment ago may not be reaped yet, so its exit code alone could
        miss it). A role that answers is alive; if it dies later, the replacement meets that.
        """
        others = [r for r in self.roles if r != role]
        pings = [rpc.rpc_async(worker_of(r), os.getpid, timeout=_PING_S) for r in others]
        unanswered = []
        for other, ping in zip(others, pings, strict=True):
            try:
                ping.wait()
            except Exception:
                unanswered.append(other)
        deadline = time.monotonic() + _DEATH_VISIBLE_S
        codes = self._children.exit_codes()
        while any(codes.get(r) is None for r in unanswered) and time.monotonic() < deadline:
            time.sleep(POLL_S)
            codes = self._children.exit_codes()
        return [RoleFailedError(r, describe_exit(code)) for r in unanswered
                if (code := codes.get(r)) is not None]

    def take_over(self, *roles: str) -> list[str]:
        """A standby of each of ``roles``' kinds serves it from now on; returns the standbys'
        names, in order.

        The ``roles``' processes must be dead. Every live process (this one too) routes calls to
        each role to its standby, the standby speaks as the role, and the role's failure is
        forgotten, so a later failure (the replacement's too, under the role's name) is reported.
        Roles that died together are taken over in one call: each is retired before any live
        process is told, so that no call of this one meets another of them dead. Build the
        replacement objects with :meth:`rebuild`.

        Raises:
            LookupError: no standby of a role's kind is left.
            ValueError: a role's process is alive, or was not spawned here.
        """
        for role in roles:
            self._check_role(role)
            if self._children.exit_codes().get(role, None) is None:
                raise ValueError(f"take_over({role!r}): its process is alive or not spawned here")
        standbys = []
        for role in roles:
            kind = role_kind(role)
            standby = next((s for s in self._standbys if role_kind(s) == f"{kind}_standby"), None)
            if standby is None:
                raise LookupError(f"no standby left for {role!r} (standbys: {self._standbys})")
            self._standbys.remove(standby)
            self._children.retire(role, standby)
            if self._error_dir is not None:  # before forget: no later poll may read it
                runtime.error_report_path(self._error_dir, role).unlink(missing_ok=True)
            self._monitor.forget(role)
            set_alias(role, standby)
            standbys.append(standby)
        pairs = list(zip(roles, standbys, strict=True))
        others = [worker_of(r) for r in self.roles if r not in roles] + self._standbys
        self.wait(
            [rpc.rpc_async(w, set_alias, args=pair) for w in others for pair in pairs]
            + [rpc.rpc_async(standby, take_over_here, args=(role, standby))
               for role, standby in pairs]
            + [rpc.rpc_async(standby, set_alias, args=pair)
               for _, standby in pairs for pair in pairs if pair[1] != standby],
            self._options.rpc_timeout_s,
        )
        return standbys

    # ----------------------------------------------------------------------------- groups
    def new_group(self, name: str, world_size: int) -> Rendezvous:
        """A rendezvous for a gloo group of ``world_size`` members (see ``collectives.join_group``).

        The TCP store is hosted here, on the driver, on an OS-chosen port, for the deployment's life.
        """
        if name in self._stores:
            raise ValueError(f"group {name!r} already exists")
        store, spec = rendezvous.host(name, self._host, world_size, self._options.rpc_timeout_s)
        self._stores[name] = store
        return spec

    # ----------------------------------------------------------------------------- shutdown
    def pid(self, role: str) -> int:
        """Process id of a locally spawned role (tests use it to inject failures)."""
        return self._children.pids()[role]

    def pids(self) -> dict[str, int]:
        return self._children.pids()

    def network_report(self) -> NetworkReport:
        """What crossed every host's NIC so far: the roles' ledgers, and under ``netns`` the
        kernel's counters (``bagpipe.core.net.report``)."""
        ledgers = dict(
            zip(
                self.roles,
                self.wait(
                    [rpc.rpc_async(worker_of(role), spawn.role_ledger) for role in self.roles],
                    _STOP_S,
                ),
                strict=True,
            )
        )
        servers = self.network.emulated.servers
        return NetworkReport.build(
            self.network.backend,
            ledgers,
            {role: host_of(role, servers) for role in self.roles},
            self._hosts.counters() if self._hosts is not None else None,
        )

    def close(self) -> None:
        """Stop every role and end its process; then leave the RPC world (see ``serve_role``).

        A healthy deployment first records its :meth:`network_report` (:func:`last_network_report`).
        """
        global _LAST_REPORT
        if self._closed:
            return
        self._closed = True
        cpu.forget(self)
        healthy = self.failure is None
        if healthy and self._rpc_up:
            with contextlib.suppress(Exception):
                _LAST_REPORT = self.network_report()
        self._monitor.stop()
        if self._rpc_up:
            self._rpc_up = False
            if healthy:
                self._leave_together()
            else:
                with contextlib.suppress(Exception):
                    rpc.shutdown(graceful=False)
        ended = self._children.end()
        if self._hosts is not None:
            self._hosts.close()
        if healthy and ended:
            warnings.warn(f"roles {', '.join(ended)} did not exit after the deployment closed; "
                          "they were terminated", RuntimeWarning, stacklevel=2)
        self._monitor.join()
        self._stores.clear()
        if self._error_dir is not None:
            shutil.rmtree(self._error_dir, ignore_errors=True)

    def _leave_together(self) -> None:
        """Ask every role to stop, leave the RPC world with all of them (``spawn.leave_rpc_world``),
        and give local roles time to exit on their own.

        The driver's window on its stderr opens first, and each role's opens before it answers the
        stop request: by the time anyone closes a connection, every process's window is open.
        """
        store, departure = rendezvous.host(
            _DEPARTURE, self._host, len(self.roles) + len(self._standbys) + 1,
            self._options.rpc_timeout_s,
        )
        self._stores[_DEPARTURE] = store  # kept until the roles are gone: they wait on it
        with departure_notices_dropped():
            workers = [*(worker_of(role) for role in self.roles), *self._standbys]
            stops = [rpc.rpc_async(w, spawn.request_stop, args=(departure,), timeout=_STOP_S)
                     for w in workers]
            try:
                torch.futures.wait_all(stops)
                spawn.leave_rpc_world(departure, _STOP_S, store)
            except Exception:  # a role did not answer or arrive: leave alone, end the roles below
                with contextlib.suppress(Exception):
                    rpc.shutdown(graceful=False)
                return
        self._children.join(wait_s=_STOP_S)

    def __enter__(self) -> Deployment:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


_LAST_REPORT: NetworkReport | None = None
_STARTUPS_S: list[float] = []  # how long each deployment this process spawned took to start


def trainer_state_devices(
    system: str, deployment: Deployment | None, trainers: Sequence[RoleRef]
) -> dict[str, str]:
    """Trainer 0's ``state_devices()``: what every system with trainer roles answers to
    ``System.state_devices``; before ``setup`` there is no trainer to ask."""
    if deployment is None or not trainers:
        raise RuntimeError(f"{system}: state_devices() before setup(ctx)")
    devices: dict[str, str] = deployment.wait(trainers[0].rpc_async().state_devices())
    return devices


def standby_roles(kind: str, count: int) -> list[str]:
    """Names of ``count`` standbys for roles of ``kind`` (``trainer``: ``trainer_standby_0``...).

    Each lives on a host of its own, with the NIC of ``kind``'s hosts
    (``bagpipe.core.net.topology``: hosts are named for their kind).
    """
    return [f"{kind}_standby_{i}" for i in range(count)]


def role_kind(role: str) -> str:
    """``trainer`` for ``trainer_3``, ``trainer_standby`` for ``trainer_standby_0``."""
    return role.rsplit("_", 1)[0]


def _driver_address() -> tuple[str, str]:
    """The driver's address and interface for every deployment of this process.

    TensorPipe reads the interface it listens on once per process, so it cannot follow one
    deployment's network: where namespaces can be built, the driver always listens on its port of
    the process's switch (roles on the loopback reach that address too); elsewhere on the
    loopback.
    """
    if netns_available() is None:
        switch = Switch.of_this_process()
        return switch.driver_address, switch.driver_ifname
    return rendezvous.LOCALHOST, "lo"


def startup_times_s() -> list[float]:
    """How long each deployment this process spawned took, from spawning its role processes to
    the RPC world joined (the process start-up a standby saves), oldest first."""
    return list(_STARTUPS_S)


def last_network_report() -> NetworkReport | None:
    """The network report of the last deployment this process closed healthily, taken once."""
    global _LAST_REPORT
    report, _LAST_REPORT = _LAST_REPORT, None
    return report


def _env_init_method() -> str:
    """The world's store as a launcher announces it (``MASTER_ADDR``, ``MASTER_PORT``)."""
    return f"tcp://{os.environ['MASTER_ADDR']}:{int(os.environ['MASTER_PORT'])}"
