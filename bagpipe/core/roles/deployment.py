"""Role processes for multi-process systems: spawn, remote objects, collectives rendezvous, failure.

A :class:`Deployment` is a set of named role processes (``trainer_0``, ``server_1``, ``oracle``, ...)
joined with the current process (the **driver**, RPC name ``"driver"``, rank 0) in one
``torch.distributed.rpc`` world (TensorPipe). Every process gets a :mod:`bagpipe.core.runtime`
(role name, Meter, emulated network) and ``torch.set_num_threads(threads_per_role)``, so a few roles
share a small machine without oversubscribing it.

Use it like this (the driver is usually a ``System``'s ``setup``/``train_step``)::

    from bagpipe.core.roles import Deployment

    with Deployment(["server_0", "server_1", "trainer_0", "trainer_1"], link=ctx.link) as deployment:
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
  asked to stop and leaves the RPC world; then the driver leaves, and any role process still
  running is terminated, then killed. Nothing is left running, even after a failure. Close only
  when no call is in flight (wait for your futures first); a later Deployment in the same driver
  process works (refs of a closed Deployment are dead).

Deployment launchers (SLURM via submitit, ``torchrun``): start ``1 + len(roles)`` processes with
``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` set, all running the same program,
which calls :meth:`Deployment.from_env` first thing::

    deployment = Deployment.from_env(["server_0", "trainer_0", "trainer_1"])   # ranks 1.. serve, exit
    system.setup(...)  # rank 0 only gets here: it is the driver

Rank ``r >= 1`` serves as ``roles[r - 1]`` until the driver closes the deployment, then exits the
process; rank 0 returns the driver's Deployment. Liveness there is checked by heartbeat
RPCs (there are no local child processes to watch) and the link model is usually off
(``LinkConfig(enabled=False)``): the network is real.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.rpc as rpc
import torch.multiprocessing as mp
from torch.futures import Future

from bagpipe.core import runtime
from bagpipe.core.link import LinkConfig
from bagpipe.core.roles.roleref import RoleRef, construct
from bagpipe.core.runtime import DRIVER

__all__ = ["DRIVER", "Deployment", "Rendezvous", "RoleFailedError", "RoleRef", "serve_role"]

_LOCALHOST = "127.0.0.1"
_POLL_S = 0.05
# A living role's error report waits this long for a death that may have caused it: a SIGKILLed
# role's sockets close (and its peers report their broken calls) a few ms before it is reaped.
_DEATH_GRACE_S = 0.5
_HEARTBEAT_S = 1.0
_JOIN_S = 10.0


class RoleFailedError(RuntimeError):
    """A role process died or reported a failure; the message names the role and says why."""

    def __init__(self, role: str, reason: str) -> None:
        super().__init__(f"{role} {reason}")
        self.role = role


@dataclass(frozen=True)
class Rendezvous:
    """Where the members of one gloo group meet: a TCP store hosted by the driver."""

    name: str
    host: str
    port: int
    world_size: int


@dataclass(frozen=True)
class _RoleArgs:
    """Everything a role process needs to join the RPC world (picklable, sent at spawn)."""

    role: str
    rank: int
    world_size: int
    init_method: str
    link: LinkConfig
    threads_per_role: int
    num_worker_threads: int
    rpc_timeout_s: float
    error_dir: str | None
    parent_pid: int | None


def _rpc_options(args: _RoleArgs) -> rpc.TensorPipeRpcBackendOptions:
    return rpc.TensorPipeRpcBackendOptions(
        num_worker_threads=args.num_worker_threads,
        rpc_timeout=args.rpc_timeout_s,
        init_method=args.init_method,
    )


def _watch_parent(parent_pid: int) -> None:
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


def serve_role(args: _RoleArgs) -> None:
    """Body of a role process: join the RPC world, serve calls until the driver shuts down.

    A failure while starting is written to the error directory, so the driver reports it.
    """
    if args.parent_pid is not None:
        os.environ.setdefault("TP_SOCKET_IFNAME", "lo")
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        threading.Thread(target=_watch_parent, args=(args.parent_pid,), daemon=True).start()
    torch.set_num_threads(args.threads_per_role)
    error_dir = Path(args.error_dir) if args.error_dir else None
    runtime.init(args.role, args.link, error_dir)
    try:
        rpc.init_rpc(
            args.role,
            backend=rpc.BackendType.TENSORPIPE,  # type: ignore[attr-defined]
            rank=args.rank,
            world_size=args.world_size,
            rpc_backend_options=_rpc_options(args),
        )
    except BaseException as exc:
        runtime.report_failure(exc)
        raise
    _STOP.wait()
    time.sleep(_POLL_S)  # let the reply to the stop request leave before the agent goes down
    # A local shutdown: the driver only asks once every call it made has completed, and torch's
    # graceful shutdown (a store barrier plus RRef bookkeeping) hangs when a driver process runs a
    # second Deployment. Exit without interpreter teardown, which can block on native RPC threads.
    rpc.shutdown(graceful=False)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


_STOP = threading.Event()


def _request_stop() -> None:
    """Called by the driver's ``close``: let this role's main thread leave the RPC world."""
    _STOP.set()


def _reset_rpc_bookkeeping() -> None:
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


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((_LOCALHOST, 0))
        return int(sock.getsockname()[1])


def _describe_exit(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"died (exit code {code}, {signal.Signals(-code).name})"
    return f"died (exit code {code})"


class Deployment:
    """The driver's handle on a set of role processes in one RPC world (see the module docstring).

    Args:
        roles: role names, one process each (ranks 1..N in this order). Must be unique and not
            ``"driver"``.
        link: the emulated network every process sends on (``runtime.current().network``).
        threads_per_role: ``torch.set_num_threads`` in each role process.
        num_worker_threads: TensorPipe threads serving incoming RPCs per process. A role method
            that blocks (waiting on a barrier, a collective) holds one, so keep headroom.
        rpc_timeout_s: default timeout of every RPC.
    """

    def __init__(
        self,
        roles: Sequence[str],
        link: LinkConfig | None = None,
        threads_per_role: int = 1,
        num_worker_threads: int = 16,
        rpc_timeout_s: float = 300.0,
        *,
        _attach_env: bool = False,
    ) -> None:
        self.roles = tuple(roles)
        if len(set(self.roles)) != len(self.roles) or DRIVER in self.roles:
            raise ValueError(f"deployment roles must be unique and not {DRIVER!r}: {self.roles}")
        self.link = link or LinkConfig()
        self._threads_per_role = threads_per_role
        self._num_worker_threads = num_worker_threads
        self._rpc_timeout_s = rpc_timeout_s
        self._procs: dict[str, Any] = {}
        self._failure: RoleFailedError | None = None
        self._failure_lock = threading.Lock()
        self._stopping = threading.Event()
        self._closed = False
        self._stores: dict[str, dist.TCPStore] = {}
        self._error_dir: Path | None = None
        self._monitor: threading.Thread | None = None
        self._rpc_up = False
        if _attach_env:
            self._host = os.environ["MASTER_ADDR"]
            self._attach_driver()
        else:
            self._host = _LOCALHOST
            self._spawn()

    # ----------------------------------------------------------------------------- start-up
    @classmethod
    def from_env(
        cls, roles: Sequence[str], link: LinkConfig | None = None, **kwargs: Any
    ) -> Deployment:
        """Join a world started by SLURM/submitit/torchrun (``RANK``, ``WORLD_SIZE``, ``MASTER_*``).

        Rank 0 returns the driver's Deployment. Rank ``r >= 1`` serves as ``roles[r-1]`` until the
        driver closes the deployment, then exits the process: it never returns.
        """
        try:
            rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
            addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
        except KeyError as missing:
            raise RuntimeError(
                f"Deployment.from_env: environment variable {missing} is not set"
            ) from None
        if world_size != len(roles) + 1:
            raise ValueError(
                f"Deployment.from_env: WORLD_SIZE={world_size} but {len(roles)} roles + the driver"
            )
        if rank == 0:
            return cls(roles, link, _attach_env=True, **kwargs)
        serve_role(
            _RoleArgs(
                role=roles[rank - 1],
                rank=rank,
                world_size=world_size,
                init_method=f"tcp://{addr}:{port}",
                link=link or LinkConfig(),
                threads_per_role=kwargs.get("threads_per_role", 1),
                num_worker_threads=kwargs.get("num_worker_threads", 16),
                rpc_timeout_s=kwargs.get("rpc_timeout_s", 300.0),
                error_dir=None,
                parent_pid=None,
            )
        )
        raise AssertionError("serve_role returns only by exiting the process")

    def _role_args(self, role: str, rank: int, init_method: str) -> _RoleArgs:
        return _RoleArgs(
            role=role,
            rank=rank,
            world_size=len(self.roles) + 1,
            init_method=init_method,
            link=self.link,
            threads_per_role=self._threads_per_role,
            num_worker_threads=self._num_worker_threads,
            rpc_timeout_s=self._rpc_timeout_s,
            error_dir=str(self._error_dir) if self._error_dir else None,
            parent_pid=os.getpid(),
        )

    def _spawn(self) -> None:
        os.environ.setdefault("TP_SOCKET_IFNAME", "lo")
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        self._error_dir = Path(tempfile.mkdtemp(prefix="bagpipe-roles-"))
        init_method = f"tcp://{_LOCALHOST}:{_free_port()}"
        ctx = _role_process_context()
        try:
            for rank, role in enumerate(self.roles, start=1):
                proc = ctx.Process(
                    target=serve_role,
                    args=(self._role_args(role, rank, init_method),),
                    name=f"bagpipe-{role}",
                    daemon=True,
                )
                proc.start()
                self._procs[role] = proc
            self._start_monitor()
            driver = self._role_args(DRIVER, 0, init_method)
            self._init_driver_rpc(driver)
        except BaseException:
            self.close()
            raise

    def _attach_driver(self) -> None:
        addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
        args = self._role_args(DRIVER, 0, f"tcp://{addr}:{port}")
        self._init_driver_rpc(args)
        self._start_monitor()

    def _init_driver_rpc(self, args: _RoleArgs) -> None:
        """``init_rpc`` in a helper thread, so a role dying during start-up fails fast, no hang."""
        torch.set_num_threads(max(1, torch.get_num_threads()))
        runtime.init(DRIVER, self.link, self._error_dir)
        _reset_rpc_bookkeeping()
        outcome: list[BaseException | None] = []

        def join() -> None:
            try:
                rpc.init_rpc(
                    DRIVER,
                    backend=rpc.BackendType.TENSORPIPE,  # type: ignore[attr-defined]
                    rank=0,
                    world_size=args.world_size,
                    rpc_backend_options=_rpc_options(args),
                )
                outcome.append(None)
            except BaseException as exc:
                outcome.append(exc)

        thread = threading.Thread(target=join, name="bagpipe-init-rpc", daemon=True)
        thread.start()
        while thread.is_alive():
            thread.join(_POLL_S)
            self._raise_if_failed()
        if outcome and outcome[0] is not None:
            raise outcome[0]
        self._rpc_up = True

    # ----------------------------------------------------------------------------- liveness
    def _start_monitor(self) -> None:
        self._monitor = threading.Thread(target=self._watch, name="bagpipe-monitor", daemon=True)
        self._monitor.start()

    def _watch(self) -> None:
        last_heartbeat = time.monotonic()
        while not self._stopping.wait(_POLL_S):
            self._poll_children()
            if (
                not self._procs
                and self._rpc_up
                and time.monotonic() - last_heartbeat > _HEARTBEAT_S
            ):
                last_heartbeat = time.monotonic()
                self._heartbeat()

    def _record_failure(self, failure: RoleFailedError) -> None:
        with self._failure_lock:
            if self._failure is None and not self._stopping.is_set():
                self._failure = failure

    def _poll_children(self) -> None:
        """Note the first role that died or wrote an error report (traceback appended).

        Deaths come first: a role killed outright takes its peers down with it (their calls to it
        break and they write error reports), so the dead role is the cause to name. A living
        role's report counts once it is ``_DEATH_GRACE_S`` old with no role dead.
        """
        dead = [role for role, proc in self._procs.items() if proc.exitcode is not None]
        for role in [*dead, *(r for r in self._procs if r not in dead)]:
            report = self._error_dir / f"{role}.err" if self._error_dir else None
            if report is not None and report.exists():  # its own traceback says most
                if role not in dead and time.time() - report.stat().st_mtime < _DEATH_GRACE_S:
                    continue  # a death that caused it may not be visible yet
                self._record_failure(RoleFailedError(role, f"failed:\n{report.read_text()}"))
            elif role in dead:
                exitcode = self._procs[role].exitcode
                assert exitcode is not None
                self._record_failure(RoleFailedError(role, _describe_exit(exitcode)))

    def _heartbeat(self) -> None:
        for role in self.roles:
            try:
                rpc.rpc_sync(role, os.getpid, timeout=10 * _HEARTBEAT_S)
            except Exception as exc:
                self._record_failure(RoleFailedError(role, f"is unreachable: {exc}"))

    def _raise_if_failed(self) -> None:
        self._poll_children()
        if self._failure is not None:
            raise self._failure

    @property
    def failure(self) -> RoleFailedError | None:
        """The first role failure seen so far, if any."""
        self._poll_children()
        return self._failure

    # ----------------------------------------------------------------------------- calls
    def remote(self, role: str, cls: type, *args: Any, **kwargs: Any) -> RoleRef:
        """Start building ``cls(*args, **kwargs)`` in ``role``'s process; return its handle.

        Returns at once (constructors that wait for each other, like group members, may be
        started one after another); ``deployment.wait(ref.ready)`` waits for the constructor, and
        calls through the ref wait for it on their own.
        """
        self._check_role(role)
        self._raise_if_failed()
        return construct(role, DRIVER, cls, args, kwargs)

    def rpc_async(self, role: str, fn: Any, *args: Any, **kwargs: Any) -> Future:
        """Run module-level function ``fn(*args, **kwargs)`` in ``role``'s process."""
        self._check_role(role)
        self._raise_if_failed()
        return rpc.rpc_async(role, fn, args=args, kwargs=kwargs)

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
        while not done.wait(_POLL_S):
            self._raise_if_failed()
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"deployment.wait: {timeout_s} s passed")
        values = []
        for future in pending:
            try:
                values.append(future.wait())
            except Exception as exc:
                # A peer's death often surfaces first as a broken pipe: prefer naming the role.
                failure = self._failure_within(1.0)
                if failure is not None:
                    raise failure from exc
                raise
        return values[0] if single else values

    def _failure_within(self, grace_s: float) -> RoleFailedError | None:
        deadline = time.monotonic() + grace_s
        while self.failure is None and self._procs and time.monotonic() < deadline:
            time.sleep(_POLL_S)
        return self.failure

    def _check_role(self, role: str) -> None:
        if role not in self.roles:
            raise KeyError(f"no role {role!r} in this deployment; roles: {self.roles}")
        if self._closed:
            raise RuntimeError("deployment is closed")

    # ----------------------------------------------------------------------------- groups
    def new_group(self, name: str, world_size: int) -> Rendezvous:
        """A rendezvous for a gloo group of ``world_size`` members (see ``collectives.join_group``).

        The TCP store is hosted here, on the driver, on an OS-chosen port, for the deployment's life.
        """
        if name in self._stores:
            raise ValueError(f"group {name!r} already exists")
        store = dist.TCPStore(
            "0.0.0.0" if self._host != _LOCALHOST else _LOCALHOST,
            0,
            is_master=True,
            wait_for_workers=False,
            timeout=timedelta(seconds=self._rpc_timeout_s),
        )
        self._stores[name] = store
        return Rendezvous(name=name, host=self._host, port=store.port, world_size=world_size)

    # ----------------------------------------------------------------------------- shutdown
    def pid(self, role: str) -> int:
        """Process id of a locally spawned role (tests use it to inject failures)."""
        return int(self._procs[role].pid)

    def pids(self) -> dict[str, int]:
        return {role: int(proc.pid) for role, proc in self._procs.items()}

    def close(self) -> None:
        """Stop every role and end its process; then leave the RPC world (see ``serve_role``)."""
        if self._closed:
            return
        self._closed = True
        healthy = self.failure is None
        self._stopping.set()
        if self._rpc_up:
            self._rpc_up = False
            if healthy:
                stops = [rpc.rpc_async(role, _request_stop, timeout=_JOIN_S) for role in self.roles]
                for stop in stops:
                    with contextlib.suppress(Exception):
                        stop.wait()
                self._join_children(wait_s=_JOIN_S)
            with contextlib.suppress(Exception):
                rpc.shutdown(graceful=False)
        self._end_children()
        if self._monitor is not None:
            self._monitor.join()
        self._stores.clear()
        if self._error_dir is not None:
            shutil.rmtree(self._error_dir, ignore_errors=True)

    def _join_children(self, wait_s: float) -> None:
        deadline = time.monotonic() + wait_s
        for proc in self._procs.values():
            proc.join(max(0.0, deadline - time.monotonic()))

    def _end_children(self) -> None:
        for proc in self._procs.values():
            if proc.is_alive():
                proc.terminate()
        for proc in self._procs.values():
            proc.join(2.0)
            if proc.is_alive():
                proc.kill()
                proc.join()

    def __enter__(self) -> Deployment:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


#: Modules every role process needs; the fork server imports them once, then forks each role.
_PRELOADED_MODULES = ["torch", "torchrec", "bagpipe.core.roles", "bagpipe.models"]


def _role_process_context() -> Any:
    """A ``forkserver`` context whose server has already imported torch and torchrec.

    Spawning a role from scratch costs a full ``import torch, torchrec`` (~4 s of CPU each); five
    roles on two cores took 10-20 s to start. The fork server pays that once per driver process and
    forks every later role from the warm image. It forks before any thread, RPC agent or process
    group exists, so the usual hazards of forking a torch process do not apply.
    """
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(_PRELOADED_MODULES)
    return ctx
