"""Tiny role classes for the Deployment tests (module level, so spawned role processes can import them)."""

from __future__ import annotations

import ctypes
import json
import os
import resource
import socket
import sys
import threading
import time
import traceback

import torch

from bagpipe.core import collectives, runtime
from bagpipe.core.meter import LinkKind
from bagpipe.core.net import netns
from bagpipe.core.roles import Deployment, Rendezvous, RoleRef


def allocation_refaults(megabytes: int, times: int = 16, settled: int = 4) -> int:
    """In a new thread (as a step runs in an RPC thread), allocate, fill and free a ``megabytes``
    tensor ``times`` times: the most minor page faults one of the last ``settled`` took (0 where
    the allocator reuses what was freed, once its heap has grown to fit)."""
    faults: list[int] = []

    def allocate() -> None:
        for _ in range(times):
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            filled = torch.ones(megabytes * 2**20 // 4)
            del filled
            faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)

    worker = threading.Thread(target=allocate)
    worker.start()
    worker.join()
    return max(faults[-settled:])


class _MallInfo2(ctypes.Structure):
    """glibc's ``struct mallinfo2`` (2.33+)."""

    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def blocks_mapped_alone(megabytes: int) -> int:
    """In a new thread (as a step runs in an RPC thread), how many more blocks ``malloc`` has
    mapped on their own while a ``megabytes`` tensor is held than before (glibc's
    ``mallinfo2().hblks``): 0 under the allocator's rule, which keeps such a block in the heap,
    1 without it."""
    mallinfo2 = ctypes.CDLL(None).mallinfo2
    mallinfo2.restype = _MallInfo2
    mapped: list[int] = []

    def allocate() -> None:
        before = int(mallinfo2().hblks)
        held = torch.ones(megabytes * 2**20 // 4)
        mapped.append(int(mallinfo2().hblks) - before)
        del held

    worker = threading.Thread(target=allocate)
    worker.start()
    worker.join()
    return mapped[0]


class Accumulator:
    """Holds a tensor; adds to it; reports where it runs."""

    def __init__(self, start: float) -> None:
        self.total = torch.tensor([start])

    def add(self, value: float) -> torch.Tensor:
        self.total += value
        return self.total.clone()

    def where(self) -> tuple[str, int, int]:
        return runtime.current().role, os.getpid(), torch.get_num_threads()

    def gil_switch_interval_s(self) -> float:
        return sys.getswitchinterval()

    def blocks_mapped_alone(self, megabytes: int) -> int:
        """Blocks mapped on their own while a ``megabytes`` tensor is held
        (:func:`blocks_mapped_alone`)."""
        return blocks_mapped_alone(megabytes)

    def add_on_peer(self, peer: RoleRef, value: float) -> torch.Tensor:
        return peer.rpc_sync().add(value)

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def spin(self, seconds: float) -> None:
        """Keep a core busy for ``seconds`` of wall time."""
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass

    def fail(self) -> None:
        raise ValueError("accumulator refused")

    def fail_in_background(self) -> None:
        def crash() -> None:
            raise ZeroDivisionError("background thread crashed")

        runtime.start_thread(crash, "crash")


class _Wide(torch.nn.Module):
    """A dense part of ``elems`` weights: one logit from the dense features and pooled rows."""

    def __init__(self, elems: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(elems))

    def forward(self, dense: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        return dense @ self.weight + pooled.sum(dim=(1, 2))


class GroupMember:
    """Joins a gloo group and all-reduces on request (for the collectives tests)."""

    def __init__(self, spec: Rendezvous, rank: int) -> None:
        collectives.join_group(spec, rank)
        self.rank = rank

    def allreduce(self, tensors: list[torch.Tensor]) -> tuple[list[torch.Tensor], dict, float]:
        """The summed tensors, the bytes this member charged, and the seconds it was held."""
        start = time.perf_counter()
        out = collectives.allreduce(tensors)
        held_s = time.perf_counter() - start
        return out, runtime.current().meter.end_step().bytes_sent, held_s

    def train_wide_slice(self, elems: int) -> dict[str, float]:
        """One forward and backward of a DDP replica with ``elems`` parameters (a single bucket);
        the phase times it charged, their CPU as ``"cpu_<phase>"``, and the step's wall time as
        ``"wall"``."""
        from bagpipe.training.step import forward_backward, replicate_dense

        torch.manual_seed(0)
        replica = replicate_dense(_Wide(elems))
        rows = torch.randn(4, 2)
        inverse = torch.arange(4).view(2, 2)
        start = time.perf_counter()
        forward_backward(replica, torch.randn(2, elems), rows, inverse, torch.ones(2), 2,
                         runtime.current().meter)
        wall = time.perf_counter() - start
        record = runtime.current().meter.end_step()
        return {**record.phase_s, **{f"cpu_{k}": v for k, v in record.phase_cpu_s.items()},
                "wall": wall}

    def allreduce_async(self, tensor: torch.Tensor) -> tuple[torch.Tensor, float, float]:
        """The summed tensor, seconds to start the all-reduce, seconds until it completed."""
        start = time.perf_counter()
        handle = collectives.allreduce_async([tensor])
        started_s = time.perf_counter() - start
        (summed,) = handle.wait()
        return summed, started_s, time.perf_counter() - start


def serve_from_env(env: dict[str, str], roles: list[str]) -> None:
    """A launcher-started rank: set the launcher's variables, then join as a role (never returns)."""
    os.environ.update(env)
    Deployment.from_env(roles)


class Sink:
    """A server-side role that takes what it is sent (for the NIC tests)."""

    def absorb(self, payload: torch.Tensor) -> int:
        return payload.numel()

    def where(self) -> tuple[str, str]:
        return runtime.current().role, os.readlink("/proc/self/ns/net")


class Sharer:
    """A trainer that all-reduces with its group, and can push to a sink at the same time."""

    def __init__(self, spec: Rendezvous, rank: int) -> None:
        collectives.join_group(spec, rank)

    def allreduce_while_pushing(
        self, elems: int, sink: RoleRef | None, push_elems: int
    ) -> float:
        """Seconds to all-reduce ``elems`` floats while (if ``sink``) ``push_elems`` go to it."""
        start = time.perf_counter()
        pushed = (
            sink.rpc_async(kind=LinkKind.EMB_PUSH).absorb(torch.zeros(push_elems))
            if sink is not None else None
        )
        collectives.allreduce(torch.zeros(elems))
        if pushed is not None:
            pushed.wait()
        return time.perf_counter() - start

    def where(self) -> tuple[str, str]:
        return runtime.current().role, os.readlink("/proc/self/ns/net")


class HostedTrainer:
    """A trainer on an emulated host of a launched world (``test_multihost``): says where it
    lives, all-reduces with its group and pushes tensors to a peer trainer."""

    def __init__(self, spec: Rendezvous, rank: int) -> None:
        collectives.join_group(spec, rank)

    def where(self) -> tuple[str, str]:
        """This process's network namespace, and the address its packets to the driver leave
        from (a UDP ``connect`` sends nothing: it only asks the kernel for the route)."""
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])))
            address = probe.getsockname()[0]
        return os.readlink("/proc/self/ns/net"), address

    def allreduce(self, elems: int) -> float:
        """Sum of the all-reduced vector of ``elems`` ones (``elems`` x the group's size)."""
        return float(collectives.allreduce(torch.ones(elems))[0].sum())

    def push(self, peer: RoleRef, elems: int) -> int:
        """Send ``elems`` floats to ``peer`` (role to role, the driver only asks); what it took."""
        return int(peer.rpc_sync().absorb(torch.ones(elems)))

    def absorb(self, payload: torch.Tensor) -> int:
        return payload.numel()


def launched_rank(
    view: netns.HostView, env: dict[str, str], roles: list[str], elems: int, report: str
) -> None:
    """One rank of a launch across emulated hosts, as a launcher starts it on its node.

    It moves onto its host before it opens a socket and takes its rank and addresses from the
    launcher's variables. Ranks >= 1 serve a role and exit; rank 0 drives the trainers (their
    hosts, an all-reduce, a push from one to the other) and writes what it saw to ``report``, or
    the traceback that stopped it.
    """
    netns.enter(view)
    for var in ("TP_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"):  # the test process's, not the launcher's
        os.environ.pop(var, None)
    os.environ.update(env)
    deployment = Deployment.from_env(roles)
    try:
        with deployment:
            spec = deployment.new_group("trainers", world_size=len(roles))
            trainers = [deployment.remote(r, HostedTrainer, spec, k) for k, r in enumerate(roles)]
            seen = {
                "driver_netns": os.readlink("/proc/self/ns/net"),
                "where": deployment.wait([t.rpc_async().where() for t in trainers], timeout_s=60),
                "allreduce": deployment.wait(
                    [t.rpc_async().allreduce(elems) for t in trainers], timeout_s=60
                ),
                "pushed": deployment.wait(
                    trainers[0].rpc_async().push(trainers[1], elems), timeout_s=60
                ),
            }
    except BaseException:
        seen = {"error": traceback.format_exc()}
    with open(report, "w") as handle:
        json.dump(seen, handle)
