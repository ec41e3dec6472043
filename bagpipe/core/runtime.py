"""Per-process role state, and the helpers every system uses to move bytes between roles.

Every process of a multi-process system (the driver and each role spawned by
:class:`bagpipe.core.roles.Deployment`) holds one :class:`RoleRuntime`: its role name, its
:class:`~bagpipe.core.meter.Meter` and its :class:`~bagpipe.core.link.Network` (the emulated links it
*sends* on). The Deployment initialises it in every process before any role object is built, so role
code simply calls :func:`current`.

The accounting convention (identical for every system, so byte counts and delays compare):

* **The sender sleeps.** Whoever puts the bytes on the wire calls :func:`delay` (or
  :func:`transfer`) on its link *to the receiver* before the receiver may use them. An embedding
  server answering a pull sleeps on its link ``server -> trainer`` before returning the rows; a
  trainer pushing gradients sleeps on ``trainer -> server`` before the push is sent.
* **The trainer counts.** Only trainers charge the Meter, for both directions of their traffic
  (rows it pulls *and* gradients it pushes), so the per-iteration :class:`StepRecord` a trainer
  returns is complete on its own and records of the T trainers sum to the iteration's traffic.
  Servers and other roles never charge (that would count each byte twice). A role that sends to a
  trainer without the trainer asking (e.g. an oracle pushing plans) returns the byte count, or the
  trainer charges what it received.
* **Data batches are counted, not delayed.** The driver sending a trainer its slice of the batch
  stands for the trainer reading its own data in a real deployment: trainers charge it as
  ``LinkKind.DATA`` on receipt, and no link delay applies. Same for every system.
* **Bytes are exact**: ``t.numel() * t.element_size()`` of every tensor that crosses, including id
  tensors sent with requests.

Example (inside a trainer role object)::

    rt = runtime.current()
    rt.meter.count("steps")
    runtime.charge(LinkKind.DATA, dense, ids, labels)                 # received, not delayed
    runtime.transfer("server_0", LinkKind.EMB_PUSH, ids, grads, rows=len(ids))   # sleep + count
    record = rt.meter.end_step()
"""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from bagpipe.core.link import LinkConfig, Network
from bagpipe.core.meter import LinkKind, Meter, StepRecord

__all__ = [
    "DRIVER",
    "RoleRuntime",
    "charge",
    "current",
    "delay",
    "delay_parallel",
    "error_report_path",
    "init",
    "is_initialised",
    "merge_trainer_records",
    "nbytes",
    "report_failure",
    "start_thread",
    "transfer",
]


#: The role name of the process that drives a system (the runner's process).
DRIVER = "driver"


@dataclass
class RoleRuntime:
    """What one process knows about itself: its role, its Meter and the links it sends on.

    ``error_dir`` is where a role writes the traceback of a failure that happens outside an RPC
    call (a background thread): the driver watches it and fails the run naming the role.
    """

    role: str
    link: LinkConfig
    meter: Meter = field(default_factory=Meter)
    network: Network = field(init=False)
    error_dir: Path | None = None

    def __post_init__(self) -> None:
        self.network = Network(self.link)


_STATE: RoleRuntime | None = None


def init(role: str, link: LinkConfig, error_dir: Path | None = None) -> RoleRuntime:
    """Install this process's runtime (the Deployment does it; tests may too). Replaces any old one."""
    global _STATE
    _STATE = RoleRuntime(role=role, link=link, error_dir=error_dir)
    return _STATE


def is_initialised() -> bool:
    return _STATE is not None


def current() -> RoleRuntime:
    """This process's runtime; raises if no Deployment (or test) initialised it."""
    if _STATE is None:
        raise RuntimeError(
            "bagpipe.core.runtime is not initialised in this process: role objects must be built "
            "through Deployment.remote(...), or call runtime.init(role, link) first"
        )
    return _STATE


def nbytes(*tensors: torch.Tensor) -> int:
    """Exact payload size of ``tensors`` in bytes."""
    return sum(t.numel() * t.element_size() for t in tensors)


def charge(kind: LinkKind | str, *tensors: torch.Tensor, rows: int = 0) -> int:
    """Count ``tensors`` as ``kind`` traffic in this process's Meter (no delay); return the bytes."""
    size = nbytes(*tensors)
    current().meter.add_traffic(kind, size, rows=rows)
    return size


def delay(dst: str, *tensors: torch.Tensor) -> float:
    """Hold the caller for sending ``tensors`` on its link to role ``dst`` (no count); return s."""
    return current().network.send(dst, nbytes(*tensors))


def delay_parallel(sends: Sequence[tuple[str, Sequence[torch.Tensor]]]) -> float:
    """Hold the caller for sends to several roles at once (one link each, overlapping); return s.

    The caller is held until the slowest link is done, as a NIC sending to several peers would be.
    """
    if len(sends) <= 1:
        return sum(delay(dst, *tensors) for dst, tensors in sends)
    start = time.perf_counter()
    threads = [
        threading.Thread(target=delay, args=(dst, *tensors), daemon=True)
        for dst, tensors in sends[1:]
    ]
    for thread in threads:
        thread.start()
    dst, tensors = sends[0]
    delay(dst, *tensors)
    for thread in threads:
        thread.join()
    return time.perf_counter() - start


def transfer(dst: str, kind: LinkKind | str, *tensors: torch.Tensor, rows: int = 0) -> float:
    """The sending trainer's helper: count ``tensors`` as ``kind`` and sleep on the link to ``dst``."""
    charge(kind, *tensors, rows=rows)
    return delay(dst, *tensors)


def merge_trainer_records(records: Sequence[StepRecord]) -> StepRecord:
    """One iteration's record from the T trainers' records: traffic and counters summed over
    trainers, phase times as trainer 0 (``records[0]``) saw them (summing times makes no sense)."""
    merged = StepRecord()
    for record in records:
        merged = merged + record
    merged.phase_s = dict(records[0].phase_s) if records else {}
    return merged


def report_failure(exc: BaseException) -> None:
    """Record a failure that no RPC caller will see (e.g. in a background thread).

    The driver's Deployment notices the report within ~0.1 s and raises ``RoleFailedError`` with this
    traceback from ``Deployment.wait``. Outside a Deployment (no error dir) the exception is re-raised.
    """
    state = current()
    text = "".join(traceback.format_exception(exc))
    if state.error_dir is None:
        raise exc
    tmp = state.error_dir / f".{state.role}.tmp"
    tmp.write_text(text)
    tmp.replace(error_report_path(state.error_dir, state.role))  # never seen half-written


def error_report_path(error_dir: Path, role: str) -> Path:
    """Where ``role`` reports a failure: its formatted traceback, as plain text.

    :func:`report_failure` writes it; the driver's Deployment reads it (``roles.failures``).
    """
    return error_dir / f"{role}.err"


def start_thread(target: Callable[[], None], name: str) -> threading.Thread:
    """Start a daemon thread whose exception is reported to the driver instead of being lost."""

    def run() -> None:
        try:
            target()
        except BaseException as exc:
            report_failure(exc)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread
