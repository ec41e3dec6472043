"""Per-process role state: who this process is, its Meter, and its end of the wire.

Every process of a multi-process system (the driver and each role spawned by
:class:`bagpipe.core.roles.Deployment`) holds one :class:`RoleRuntime`: its role name, its
:class:`~bagpipe.core.meter.Meter` and its :class:`~bagpipe.core.net.wire.Wire`. The Deployment
initialises it in every process before any role object is built, so role code simply calls
:func:`current`.

Systems never charge or delay traffic themselves: every message between roles goes through the
role layer and every collective through ``bagpipe.core.collectives``, which hand it to the wire
(``bagpipe.core.net.wire``: one rule for counting, one for delaying, for every system). What a
role does with its runtime is measure its own work::

    rt = runtime.current()
    with rt.meter.phase(Phase.FORWARD):
        logits = model(dense, pooled)
    rt.meter.count("rows_prefetched", len(ids))
    record = rt.meter.end_step()
"""

from __future__ import annotations

import os
import sys
import threading
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from bagpipe.core.allocator import keep_freed_memory
from bagpipe.core.meter import Meter, StepRecord
from bagpipe.core.net.fairshare import SharedNics
from bagpipe.core.net.wire import DRIVER, NetworkConfig, Wire

__all__ = [
    "DRIVER",
    "RoleRuntime",
    "assume_role",
    "current",
    "error_report_path",
    "init",
    "is_initialised",
    "merge_trainer_records",
    "nbytes",
    "report_failure",
    "run_in_background",
    "start_thread",
]


@dataclass
class RoleRuntime:
    """What one process knows about itself: its role, its Meter and its end of the wire.

    ``error_dir`` is where a role writes the traceback of a failure that happens outside an RPC
    call (a background thread): the driver watches it and fails the run naming the role.
    """

    role: str
    network: NetworkConfig
    nics: SharedNics | None = None
    meter: Meter = field(default_factory=Meter)
    wire: Wire = field(init=False)
    error_dir: Path | None = None

    def __post_init__(self) -> None:
        self.wire = Wire(self.role, self.network, self.meter, self.nics)


_STATE: RoleRuntime | None = None

#: How long a thread that wants the GIL waits before it asks the running thread to hand it over
#: (Python's default is 5 ms). A trainer's step hands the GIL between threads several times (its
#: comm hooks, the collective lane, RPC handlers, a system's round or communication thread), and
#: each hand-over then cost up to 5 ms of a 15-70 ms iteration, a Python artefact the target's
#: C++/CUDA trainers do not have. Set in every process of every system alike (:func:`init`).
GIL_SWITCH_INTERVAL_S = 0.0002


def init(
    role: str,
    network: NetworkConfig | None = None,
    error_dir: Path | None = None,
    nics: SharedNics | None = None,
) -> RoleRuntime:
    """Install this process's runtime (the Deployment does it; tests may too). Replaces any old one.

    ``network`` defaults to the ``real`` back-end (nothing emulated). Also sets the process's GIL
    switch interval (:data:`GIL_SWITCH_INTERVAL_S`) and its allocator's rule
    (:func:`~bagpipe.core.allocator.keep_freed_memory`): every process that runs a role or drives
    one gets them, so no system is timed under another threading or memory rule than the others.
    """
    global _STATE
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    keep_freed_memory()
    _STATE = RoleRuntime(
        role=role, network=network or NetworkConfig(), nics=nics, error_dir=error_dir
    )
    return _STATE


def assume_role(role: str) -> RoleRuntime:
    """This process serves ``role`` from now on (a standby taking over a dead role's place).

    Its wire books and delays traffic as ``role``'s, on ``role``'s host of the topology, and its
    failures are reported under ``role``; the Meter carries on (a standby has counted nothing).
    """
    state = current()
    state.role = role
    state.wire = Wire(role, state.network, state.meter, state.nics)
    return state


def is_initialised() -> bool:
    return _STATE is not None


def current() -> RoleRuntime:
    """This process's runtime; raises if no Deployment (or test) initialised it."""
    if _STATE is None:
        raise RuntimeError(
            "bagpipe.core.runtime is not initialised in this process: role objects must be built "
            "through Deployment.remote(...), or call runtime.init(role) first"
        )
    return _STATE


def nbytes(*tensors: torch.Tensor) -> int:
    """Exact payload size of ``tensors`` in bytes."""
    return sum(t.numel() * t.element_size() for t in tensors)


def merge_trainer_records(records: Sequence[StepRecord]) -> StepRecord:
    """One iteration's record from the T trainers' records: traffic and counters summed over
    trainers, phase times (wall and CPU) and the span as trainer 0 (``records[0]``) saw them
    (summing times makes no sense), and the slowest trainer's span."""
    merged = StepRecord()
    for record in records:
        merged = merged + record
    merged.phase_s = dict(records[0].phase_s) if records else {}
    merged.phase_cpu_s = dict(records[0].phase_cpu_s) if records else {}
    merged.span_s = records[0].span_s if records else 0.0
    merged.slowest_span_s = max((r.span_s for r in records), default=0.0)
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


#: How much lower a background thread's CPU priority is than its process's (``nice``): the same
#: step a helper role's process is below a trainer's (``bagpipe.core.roles.spawn``).
BACKGROUND_NICE = 10


def run_in_background() -> None:
    """Lower the calling thread's CPU priority by :data:`BACKGROUND_NICE` (Linux nices threads
    one by one), for a thread that works behind a trainer's step: Bagpipe's cache rounds, HET's
    communication thread. On the target, that work runs on the trainer host's spare CPU cores
    while its GPU computes; here it shares two cores with the step's forward and backward, so it
    gets only what they leave. Every system's background threads call it (``start_thread`` with
    ``background=True``, or as a thread pool's ``initializer``), so the rule is one."""
    tid = threading.get_native_id()
    os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + BACKGROUND_NICE)


def start_thread(
    target: Callable[[], None], name: str, background: bool = False
) -> threading.Thread:
    """Start a daemon thread whose exception is reported to the driver instead of being lost
    (``background``: at a lower CPU priority, :func:`run_in_background`)."""

    def run() -> None:
        try:
            if background:
                run_in_background()
            target()
        except BaseException as exc:
            report_failure(exc)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread
