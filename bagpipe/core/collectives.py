"""Collectives among the trainers, each handed to the wire: counted once, delayed by one rule.

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
exactly one group (a trainer's); its members are the roles ``trainer_<rank>``. Every all-reduce
flattens its tensors into one buffer (one collective, one set of latencies), counts the payload
once in the caller's Meter, and tells the wire what a ring all-reduce puts on this trainer's NIC:
``2 (T-1)/T`` of the payload to its ring successor and as much from its predecessor, in
``2 (T-1)`` messages (``bagpipe.core.net.wire``; under ``netns`` gloo's bytes really cross the
shaped NICs, under ``model`` they are a fair-shared flow). An async call pays its emulated time
on this process's collective lane, one call after another as gloo runs them, overlapping the
caller's work.

:func:`ddp_hook` is the same for ``DistributedDataParallel``: a comm hook that all-reduces each
gradient bucket through the wire (summing, as ``bagpipe.training.step`` wants, unless asked to
average as TorchRec's DDP does). :class:`FusedTail` is that hook for a system that all-reduces more
than its dense replica on the critical path (Bagpipe's sync-now rows, FAE's hot rows): the extra
gradients, made during backward, ride in DDP's last bucket, one collective for both. :func:`wire_torch_collectives` routes the collectives a library
calls by itself (TorchRec's all-to-alls, all-gathers and reduce-scatters) through the wire.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future as PyFuture
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.futures import Future

from bagpipe.core import runtime
from bagpipe.core.device import collective_backend, move, trainer_device
from bagpipe.core.meter import LinkKind
from bagpipe.core.roles import Rendezvous

__all__ = [
    "AllReduceHandle",
    "FusedTail",
    "allreduce",
    "allreduce_async",
    "any_failed",
    "ddp_hook",
    "group_size",
    "join_group",
    "leave_group",
    "ring_charge",
    "wire_torch_collectives",
]

_JOIN_TIMEOUT = timedelta(minutes=5)


def join_group(spec: Rendezvous, rank: int, device: str = "cpu") -> None:
    """Join the group described by ``spec`` as ``rank`` (blocks until all members joined).

    gloo, unless the members compute on GPUs of their own (``device``), where device tensors go
    over NCCL (``bagpipe.core.device.collective_backend``). A member on a GPU makes it its
    current device first, so that NCCL and every allocation without a device land there.
    """
    if dist.is_initialized():
        raise RuntimeError(
            f"{runtime.current().role} already belongs to a process group; a role joins one group "
            f"(asked to join {spec.name!r})"
        )
    if not 0 <= rank < spec.world_size:
        raise ValueError(f"rank {rank} outside group {spec.name!r} of size {spec.world_size}")
    if device != "cpu":
        torch.cuda.set_device(trainer_device(device, rank, spec.world_size))
    store = dist.TCPStore(spec.host, spec.port, is_master=False, timeout=_JOIN_TIMEOUT)
    dist.init_process_group(
        collective_backend(device, spec.world_size),
        store=dist.PrefixStore(spec.name, store),
        rank=rank,
        world_size=spec.world_size,
        timeout=_JOIN_TIMEOUT,
    )


def leave_group() -> None:
    """Leave this process's group, if any: its members changed (a dead one was replaced, or the
    job restarts in place), and gloo groups cannot change members. Join the new one with
    :func:`join_group`."""
    if dist.is_initialized():
        dist.destroy_process_group()


def group_size() -> int:
    return dist.get_world_size()


def ring_charge(nbytes: int, kind: str = LinkKind.ALLREDUCE) -> Callable[[], None]:
    """Count a SUM all-reduce of an ``nbytes`` buffer on this trainer (ring algorithm) now, and
    return what holds the caller for its emulated time (nothing in a group of one)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    if world <= 1:
        return lambda: None
    wire = runtime.current().wire
    wire_bytes = 2 * (world - 1) * nbytes // world
    sends = {f"trainer_{(rank + 1) % world}": wire_bytes}
    wire.collective(kind, payload_bytes=nbytes, sends=sends, receives=wire_bytes)
    return lambda: wire.hold_collective(sends, messages=2 * (world - 1))


def _as_list(tensors: torch.Tensor | list[torch.Tensor]) -> list[torch.Tensor]:
    out = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)
    dtypes = {t.dtype for t in out}
    if len(dtypes) > 1:
        raise TypeError(
            f"allreduce: tensors of one call must share a dtype, got {sorted(map(str, dtypes))}"
        )
    return out


def _flatten(tensors: list[torch.Tensor]) -> torch.Tensor:
    """One flat tensor holding ``tensors``: a view of the only one when it is contiguous (the
    collective then sums it in place, with no copy in and out), else a concatenated copy."""
    if not tensors:
        return torch.empty(0)
    if len(tensors) == 1 and tensors[0].is_contiguous():
        return tensors[0].detach().view(-1)
    return torch.cat([t.detach().reshape(-1) for t in tensors])


def _unflatten_into(flat: torch.Tensor, tensors: list[torch.Tensor]) -> None:
    """Copy the summed ``flat`` back into ``tensors`` (nothing to do where it is their view)."""
    if len(tensors) == 1 and flat.data_ptr() == tensors[0].data_ptr():
        return
    offset = 0
    with torch.no_grad():
        for t in tensors:
            t.copy_(flat[offset : offset + t.numel()].view_as(t))
            offset += t.numel()


class AllReduceHandle:
    """An all-reduce in flight; ``wait()`` blocks until both the data and its emulated time are in.

    The real collective is issued at once, on the calling thread, so every trainer issues its
    collectives in the same order; its emulated time runs on the collective lane.
    """

    def __init__(self, tensors: list[torch.Tensor], kind: str) -> None:
        self._tensors = tensors
        self._flat = _flatten(tensors)
        self._work = dist.all_reduce(self._flat, op=dist.ReduceOp.SUM, async_op=True)
        hold = ring_charge(runtime.nbytes(self._flat), kind)
        self._charged: PyFuture[None] = _lane().submit(hold)

    def wait(self) -> list[torch.Tensor]:
        """Finish the all-reduce: the input tensors now hold the SUM over the group; return them."""
        self._work.wait()
        self._charged.result()
        _unflatten_into(self._flat, self._tensors)
        return self._tensors


def allreduce_async(
    tensors: torch.Tensor | list[torch.Tensor], kind: str = LinkKind.ALLREDUCE
) -> AllReduceHandle:
    """Start a SUM all-reduce of ``tensors`` (in place on ``wait()``); counted now."""
    return AllReduceHandle(_as_list(tensors), str(kind))


def allreduce(
    tensors: torch.Tensor | list[torch.Tensor], kind: str = LinkKind.ALLREDUCE
) -> list[torch.Tensor]:
    """SUM all-reduce of ``tensors`` over the group, in place; returns them as a list."""
    tensors = _as_list(tensors)
    flat = _flatten(tensors)
    ring_charge(runtime.nbytes(flat), str(kind))()
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    _unflatten_into(flat, tensors)
    return tensors


def any_failed(failed: bool) -> bool:
    """Whether any trainer of the group says ``failed``: a 4-byte all-reduce every member calls.

    A trainer whose call to a dead role failed must not leave the step alone while its peers,
    whose calls succeeded, go on into the step's next collective: they would wait there for it
    until the group's timeout. Agreeing first makes every trainer raise, or none, so the step in
    flight applies nowhere and the dead role can be replaced at that boundary
    (``bagpipe.core.recovery``). Its wall time is counted as ``recovery_agree_s`` (the fault
    bench states it: waiting here for a slower peer is part of it).
    """
    started_s = time.perf_counter()
    (count,) = allreduce(torch.tensor([float(failed)]), kind=LinkKind.CONTROL)
    runtime.current().meter.count("recovery_agree_s", time.perf_counter() - started_s)
    return bool(count.item() > 0)


def ddp_hook(
    kind: str = LinkKind.ALLREDUCE, average: bool = False
) -> Callable[[Any, dist.GradBucket], Future]:
    """A ``DistributedDataParallel`` comm hook: all-reduce each bucket over the group via the wire.

    It sums by default: the systems here sum the slices' gradients of the global mean loss
    (``bagpipe.training.step``), where DDP's own hook averages; ``average=True`` keeps DDP's mean
    (TorchRec, whose gradient scaling is built on it). The bucket's emulated time runs on the
    collective lane and its future completes once both the gloo all-reduce and that time are done,
    so DDP's overlap of buckets with the rest of backward is kept.
    """

    # No annotations: DDP compares them with its own classes, and these would be strings here.
    def hook(_state, bucket):  # type: ignore[no-untyped-def]
        buffer = bucket.buffer()
        reduced = dist.all_reduce(buffer, op=dist.ReduceOp.SUM, async_op=True).get_future()
        hold = ring_charge(runtime.nbytes(buffer), str(kind))
        done: Future = Future()

        def finish() -> None:
            try:
                hold()
                result = reduced.wait()[0]
                done.set_result(result.div_(dist.get_world_size()) if average else result)
            except Exception as exc:
                done.set_exception(exc)

        _lane().submit(finish)
        return done

    return hook


class FusedTail:
    """A DDP comm hook whose last bucket also carries extra gradients made during backward.

    Each step, :meth:`expect` registers the extra tensor's maker on a gradient of the step (the
    fetched rows'); the last bucket's all-reduce waits until both its bucket and that gradient
    exist, whichever comes first in backward, and sums both in one collective. After backward,
    :meth:`take` returns the summed extra tensor. Buckets before the last are summed as
    :func:`ddp_hook` does. DDP launches buckets in order and the last one last, so every trainer
    issues the same collectives in the same order.

    Example (a trainer's step)::

        tail = FusedTail()                                     # once
        model = DistributedDataParallel(dense_model)
        model.register_comm_hook(None, tail.hook)
        ...
        tail.expect(leaf_rows, lambda grad: scatter_rows(sync_now, unique, grad))
        loss.backward()
        summed_rows = tail.take()
    """

    def __init__(self, kind: str = LinkKind.ALLREDUCE) -> None:
        self.kind = str(kind)
        self._plain = ddp_hook(self.kind)
        self._lock = threading.Lock()
        self._extra: torch.Tensor | None = None
        self._make: Callable[[torch.Tensor], torch.Tensor] | None = None
        self._bucket: tuple[torch.Tensor, Future] | None = None
        self._summed: torch.Tensor | None = None

    def expect(self, grad_of: torch.Tensor, make: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """This step's extra tensor is ``make(gradient of grad_of)`` (``grad_of`` requires grad)."""
        with self._lock:
            self._make, self._extra, self._summed = make, None, None
        grad_of.register_hook(self._on_grad)

    def take(self) -> torch.Tensor:
        """The extra tensor summed over the group (after backward; empty if none was expected)."""
        with self._lock:
            summed, self._summed = self._summed, None
        return summed if summed is not None else torch.empty(0)

    # No annotations: DDP compares them with its own classes, and these would be strings here.
    def hook(self, state, bucket):  # type: ignore[no-untyped-def]
        if not bucket.is_last():
            return self._plain(state, bucket)
        done: Future = Future()
        with self._lock:
            self._bucket = (bucket.buffer(), done)
            ready = self._make is None or self._extra is not None
        if ready:
            self._launch()
        return done

    def _on_grad(self, grad: torch.Tensor) -> None:
        with self._lock:
            assert self._make is not None
            self._extra = self._make(grad).reshape(-1)
            ready = self._bucket is not None
        if ready:
            self._launch()

    def _launch(self) -> None:
        """One SUM all-reduce of the last bucket and the extra tensor, through the wire."""
        with self._lock:
            assert self._bucket is not None
            (buffer, done), self._bucket = self._bucket, None
            extra = self._extra if self._extra is not None else buffer.new_empty(0)
            self._make = self._extra = None
        extra = move(extra, buffer.device, runtime.current().meter)
        flat = torch.cat([buffer, extra.to(buffer.dtype)])
        work = dist.all_reduce(flat, op=dist.ReduceOp.SUM, async_op=True).get_future()
        hold = ring_charge(runtime.nbytes(flat), self.kind)

        def finish() -> None:
            try:
                hold()
                summed = work.wait()[0]
                buffer.copy_(summed[: buffer.numel()])
                with self._lock:
                    self._summed = summed[buffer.numel():]
                done.set_result(buffer)
            except Exception as exc:
                done.set_exception(exc)

        _lane().submit(finish)


def _chunk_bytes(tensor: torch.Tensor, splits: list[int] | None, world: int) -> list[int]:
    """Bytes of each rank's part of ``tensor`` split along dim 0 (``splits`` rows, or equal)."""
    total = tensor.numel() * tensor.element_size()
    if tensor.dim() == 0 or tensor.shape[0] == 0:
        return [0] * world
    row = total // tensor.shape[0]
    rows = splits if splits is not None else [tensor.shape[0] // world] * world
    return [row * int(n) for n in rows]


def _exchange(
    run: Callable[[], Any], sent: list[int], received: list[int], messages: int,
    group: Any, async_op: bool,
) -> Any:
    """Count an exchange in which this rank sends ``sent[j]`` bytes to rank ``j`` and receives
    ``received[j]`` from it, run it (``run()``), and hold for it; return what ``run`` returned.

    gloo runs an all-to-all one peer at a time, sending then receiving (measured on the netns
    back-end: two ranks exchanging 2 MB each take twice the time of one full-duplex transfer),
    so its receives are held after its sends; other back-ends overlap them. An async call's hold
    runs on the exchange lanes, two at once as gloo's two worker threads run two ops, and its work
    completes once both the real exchange and the hold are done.
    """
    rank = dist.get_rank()
    sends = {f"trainer_{j}": n for j, n in enumerate(sent) if j != rank and n}
    receives = {f"trainer_{j}": n for j, n in enumerate(received) if j != rank and n}
    wire = runtime.current().wire
    wire.collective(
        LinkKind.ALLTOALL,
        payload_bytes=sum(sends.values()),
        sends=sends,
        receives=sum(receives.values()),
    )
    serial = dist.get_backend(group) == "gloo"

    def hold() -> None:
        wire.hold_collective(sends, messages, then_receives=receives if serial else None)

    if not async_op:
        hold()
        return run()
    work = run()
    held: Future = Future()

    def hold_then_finish() -> None:
        try:
            hold()
            held.set_result(None)
        except Exception as exc:
            held.set_exception(exc)

    _exchange_lanes().submit(hold_then_finish)
    both = torch.futures.collect_all([work.get_future(), held]).then(lambda _: None)
    return torch._C._distributed_c10d._create_work_from_future(both)


def _all_to_all_single(
    output: torch.Tensor, input: torch.Tensor, output_split_sizes: list[int] | None = None,
    input_split_sizes: list[int] | None = None, group: Any = None, async_op: bool = False,
) -> Any:
    world = dist.get_world_size(group)
    return _exchange(
        lambda: _ORIGINAL["all_to_all_single"](
            output, input, output_split_sizes, input_split_sizes, group=group, async_op=async_op
        ),
        _chunk_bytes(input, input_split_sizes, world),
        _chunk_bytes(output, output_split_sizes, world),
        messages=1, group=group, async_op=async_op,
    )


def _all_to_all(output_list: list[torch.Tensor], input_list: list[torch.Tensor],
                group: Any = None, async_op: bool = False) -> Any:
    return _exchange(
        lambda: _ORIGINAL["all_to_all"](output_list, input_list, group=group, async_op=async_op),
        [runtime.nbytes(t) for t in input_list], [runtime.nbytes(t) for t in output_list],
        messages=1, group=group, async_op=async_op,
    )


def _ring_exchange(nbytes_out: int, world: int) -> None:
    """An all-gather or reduce-scatter over a ring: ``nbytes_out`` to the successor, as much in."""
    if world <= 1:
        return
    sends = {f"trainer_{(dist.get_rank() + 1) % world}": nbytes_out}
    wire = runtime.current().wire
    wire.collective(LinkKind.ALLTOALL, payload_bytes=nbytes_out, sends=sends, receives=nbytes_out)
    wire.hold_collective(sends, messages=world - 1)


def _all_gather_into_tensor(output: torch.Tensor, input: torch.Tensor, *args: Any,
                            **kwargs: Any) -> Any:
    world = dist.get_world_size(kwargs.get("group"))
    _ring_exchange((world - 1) * runtime.nbytes(input), world)
    return _ORIGINAL["all_gather_into_tensor"](output, input, *args, **kwargs)


def _all_gather(tensor_list: list[torch.Tensor], tensor: torch.Tensor, *args: Any,
                **kwargs: Any) -> Any:
    world = len(tensor_list)
    _ring_exchange((world - 1) * runtime.nbytes(tensor), world)
    return _ORIGINAL["all_gather"](tensor_list, tensor, *args, **kwargs)


def _reduce_scatter_tensor(output: torch.Tensor, input: torch.Tensor, *args: Any,
                           **kwargs: Any) -> Any:
    group = kwargs.get("group")
    world = dist.get_world_size(group)
    # gloo has no reduce-scatter of its own: it all-reduces the whole input (measured on the
    # netns back-end: the kernel sees an all-reduce's bytes), where NCCL sends (T-1)/T of it.
    share = 2 * (world - 1) if dist.get_backend(group) == "gloo" else world - 1
    _ring_exchange(share * runtime.nbytes(input) // world, world)
    return _ORIGINAL["reduce_scatter_tensor"](output, input, *args, **kwargs)


_WIRED = {
    "all_to_all_single": _all_to_all_single,
    "all_to_all": _all_to_all,
    "all_gather_into_tensor": _all_gather_into_tensor,
    "all_gather": _all_gather,
    "reduce_scatter_tensor": _reduce_scatter_tensor,
}
_ORIGINAL: dict[str, Callable[..., Any]] = {}


def wire_torch_collectives() -> None:
    """Route the collectives a library issues itself through the wire, in this process.

    TorchRec's sharded modules call ``torch.distributed``'s all-to-all, all-gather and
    reduce-scatter directly; replacing those functions (the ones its ``comm_ops`` look up on the
    module at call time) counts the bytes each rank really sends to each peer, as ``alltoall``,
    and delays the caller for them before the real collective runs. All-reduce is not replaced:
    DDP's runs in C++ and is wired by :func:`ddp_hook`, this module's own by :func:`ring_charge`.
    """
    for name, wired in _WIRED.items():
        if name not in _ORIGINAL:
            _ORIGINAL[name] = getattr(dist, name)
            setattr(dist, name, wired)


_LANE: ThreadPoolExecutor | None = None
_EXCHANGE_LANES: ThreadPoolExecutor | None = None
_LANE_LOCK = threading.Lock()


def _lane() -> ThreadPoolExecutor:
    """This process's collective lane: one thread, so emulated collectives follow issue order."""
    global _LANE
    with _LANE_LOCK:
        if _LANE is None:
            _LANE = ThreadPoolExecutor(max_workers=1, thread_name_prefix="collective-lane")
        return _LANE


def _exchange_lanes() -> ThreadPoolExecutor:
    """This process's lanes for async exchanges: two, as gloo runs two ops of a group at once."""
    global _EXCHANGE_LANES
    with _LANE_LOCK:
        if _EXCHANGE_LANES is None:
            _EXCHANGE_LANES = ThreadPoolExecutor(max_workers=2, thread_name_prefix="exchange-lane")
        return _EXCHANGE_LANES
