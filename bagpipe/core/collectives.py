"""All-reduce among the trainers, with the link model's delay and the Meter's byte count.

The trainers of a system form one gloo group, created through a rendezvous the driver hosts::

    # driver
    spec = deployment.new_group("trainers", world_size=T)
    trainers = [deployment.remote(f"trainer_{k}", Trainer, k, spec, ...) for k in range(T)]
    # Trainer.__init__ (in each trainer process)
    collectives.join_group(spec, rank=k)
    # every step
    collectives.allreduce([p.grad for p in dense.parameters()])       # SUM, in place
    handle = collectives.allreduce_async(later_grads)                  # background sync
    ...
    handle.wait()                                                      # delay + result

The group becomes the process's default ``torch.distributed`` process group, so one process joins
exactly one group (a trainer's). Every call flattens its tensors into one buffer (one collective, one
latency), charges the payload once as ``LinkKind.ALLREDUCE`` in the caller's Meter, and holds the
caller for the ring all-reduce time of that payload (``Network.allreduce``) on its ring link; an
async call spends that time in a helper thread, so it overlaps the caller's work.
"""

from __future__ import annotations

import threading
from datetime import timedelta

import torch
import torch.distributed as dist

from bagpipe.core import runtime
from bagpipe.core.meter import LinkKind
from bagpipe.core.roles import Rendezvous

__all__ = ["AllReduceHandle", "allreduce", "allreduce_async", "group_size", "join_group"]

_JOIN_TIMEOUT = timedelta(minutes=5)


def join_group(spec: Rendezvous, rank: int) -> None:
    """Join the gloo group described by ``spec`` as ``rank`` (blocks until all members joined)."""
    if dist.is_initialized():
        raise RuntimeError(
            f"{runtime.current().role} already belongs to a process group; a role joins one group "
            f"(asked to join {spec.name!r})"
        )
    if not 0 <= rank < spec.world_size:
        raise ValueError(f"rank {rank} outside group {spec.name!r} of size {spec.world_size}")
    store = dist.TCPStore(spec.host, spec.port, is_master=False, timeout=_JOIN_TIMEOUT)
    dist.init_process_group(
        "gloo",
        store=dist.PrefixStore(spec.name, store),
        rank=rank,
        world_size=spec.world_size,
        timeout=_JOIN_TIMEOUT,
    )


def group_size() -> int:
    return dist.get_world_size()


def _as_list(tensors: torch.Tensor | list[torch.Tensor]) -> list[torch.Tensor]:
    out = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)
    dtypes = {t.dtype for t in out}
    if len(dtypes) > 1:
        raise TypeError(
            f"allreduce: tensors of one call must share a dtype, got {sorted(map(str, dtypes))}"
        )
    return out


def _flatten(tensors: list[torch.Tensor]) -> torch.Tensor:
    if not tensors:
        return torch.empty(0)
    return torch.cat([t.detach().reshape(-1) for t in tensors])


def _unflatten_into(flat: torch.Tensor, tensors: list[torch.Tensor]) -> None:
    offset = 0
    with torch.no_grad():
        for t in tensors:
            t.copy_(flat[offset : offset + t.numel()].view_as(t))
            offset += t.numel()


class AllReduceHandle:
    """An all-reduce in flight; ``wait()`` blocks until both the data and the emulated delay are done."""

    def __init__(self, tensors: list[torch.Tensor], kind: LinkKind | str) -> None:
        self._tensors = tensors
        self._flat = _flatten(tensors)
        world = dist.get_world_size()
        if world > 1:  # a group of one moves nothing
            runtime.charge(kind, self._flat)
        self._work = dist.all_reduce(self._flat, op=dist.ReduceOp.SUM, async_op=True)
        size = runtime.nbytes(self._flat)
        network = runtime.current().network
        self._delay = threading.Thread(
            target=network.allreduce, args=(size, world), name="allreduce-delay", daemon=True
        )
        self._delay.start()

    def wait(self) -> list[torch.Tensor]:
        """Finish the all-reduce: the input tensors now hold the SUM over the group; return them."""
        self._work.wait()
        self._delay.join()
        _unflatten_into(self._flat, self._tensors)
        return self._tensors


def allreduce_async(
    tensors: torch.Tensor | list[torch.Tensor], kind: LinkKind | str = LinkKind.ALLREDUCE
) -> AllReduceHandle:
    """Start a SUM all-reduce of ``tensors`` (in place on ``wait()``); charge it now."""
    return AllReduceHandle(_as_list(tensors), kind)


def allreduce(
    tensors: torch.Tensor | list[torch.Tensor], kind: LinkKind | str = LinkKind.ALLREDUCE
) -> list[torch.Tensor]:
    """SUM all-reduce of ``tensors`` over the group, in place; returns them as a list."""
    tensors = _as_list(tensors)
    flat = _flatten(tensors)
    if dist.get_world_size() > 1:  # a group of one moves nothing
        runtime.charge(kind, flat)
    work = dist.all_reduce(flat, op=dist.ReduceOp.SUM, async_op=True)
    runtime.current().network.allreduce(runtime.nbytes(flat), dist.get_world_size())
    work.wait()
    _unflatten_into(flat, tensors)
    return tensors
