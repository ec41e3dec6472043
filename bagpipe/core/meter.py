"""The Meter: the one place that counts bytes, rows, cache hits and phase times (wall and CPU).

Every system charges the same Meter through the same helpers, so byte counts are comparable across
systems and exact (taken from tensor sizes, never estimated). Each process (trainer, embedding server,
driver) owns one Meter; per-iteration :class:`StepRecord` objects are merged with ``+`` when the
driver gathers them from the roles.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    import pandas as pd


class LinkKind(StrEnum):
    """What a transfer carried, i.e. which column of the byte accounting it lands in."""

    EMB_PULL = "emb_pull"  # embedding rows server -> trainer
    EMB_PUSH = "emb_push"  # embedding rows / gradients trainer -> server
    EMB_META = "emb_meta"  # keys, versions and counts sent beside rows (HET's read/write metadata)
    ALLREDUCE = "allreduce"  # collective among trainers (dense grads, cached-row grads)
    ALLTOALL = "alltoall"  # model-parallel exchange (TorchRec)
    H2D = "h2d"  # host -> device copies (a trainer's inputs and rows; FAE's hot/cold swaps)
    D2H = "d2h"  # device -> host copies (a trainer's row gradients and state)
    DATA = "data"  # input batches and plans sent to trainers (the loader's traffic)
    CONTROL = "control"  # any other message between two roles (untagged calls)


class Phase(StrEnum):
    """Where the wall time of one iteration goes (the paper's breakdown).

    One rule for every system, so that forward + backward is the same dense work everywhere (the
    CPU-share check compares it): getting a step's rows, deduplicating its ids and reading them
    from the servers, a cache or a replica, is ``fetch_wait``; waiting for a collective or a push,
    DDP's wait at backward's end included (``bagpipe.training.step.backward_timing_sync``), is
    ``sync``.
    """

    DATA = "data"
    FETCH_WAIT = "fetch_wait"
    FORWARD = "forward"
    BACKWARD = "backward"
    SYNC = "sync"
    OPTIMIZER = "optimizer"


@dataclass
class StepRecord:
    """What one role measured during one iteration. Records of several roles sum with ``+``.

    Byte and row counts add up across roles (total traffic of the iteration). Phase times are kept
    per role by the caller; summing them only makes sense for records of the same role.

    ``phase_cpu_s`` is the CPU the thread that ran each phase spent in it (``time.thread_time``):
    a phase's wall time less its CPU is waiting (for the network, a peer or a core), and a role's
    CPU beyond the sum is work done outside its step's thread (background threads, a collective's
    own threads, RPC).

    ``span_s`` is the wall time from the start of the iteration's first phase to
    :meth:`Meter.end_step`: the step as the role saw it, so that the driver's iteration time less
    the phases ("other") splits into the role's time between its phases, a slower peer
    (``slowest_span_s``, the longest span among the trainers,
    :func:`bagpipe.core.runtime.merge_trainer_records`) and the driver
    with the RPCs around the step.
    """

    bytes_sent: dict[str, int] = field(default_factory=dict)
    rows_sent: dict[str, int] = field(default_factory=dict)
    phase_s: dict[str, float] = field(default_factory=dict)
    phase_cpu_s: dict[str, float] = field(default_factory=dict)
    cache_hits: int = 0
    cache_misses: int = 0
    counters: dict[str, float] = field(default_factory=dict)
    span_s: float = 0.0
    slowest_span_s: float = 0.0

    def __add__(self, other: StepRecord) -> StepRecord:
        return StepRecord(
            bytes_sent=_merge(self.bytes_sent, other.bytes_sent),
            rows_sent=_merge(self.rows_sent, other.rows_sent),
            phase_s=_merge(self.phase_s, other.phase_s),
            phase_cpu_s=_merge(self.phase_cpu_s, other.phase_cpu_s),
            cache_hits=self.cache_hits + other.cache_hits,
            cache_misses=self.cache_misses + other.cache_misses,
            counters=_merge(self.counters, other.counters),
            span_s=self.span_s + other.span_s,
            slowest_span_s=self.slowest_span_s + other.slowest_span_s,
        )

    @property
    def total_bytes(self) -> int:
        return sum(self.bytes_sent.values())

    @property
    def hit_rate(self) -> float | None:
        looked_up = self.cache_hits + self.cache_misses
        return self.cache_hits / looked_up if looked_up else None

    def flat(self) -> dict[str, float]:
        """One flat ``name -> value`` dict, the shape MLflow metrics and CSV rows want."""
        out: dict[str, float] = {}
        out.update({f"bytes_{k}": float(v) for k, v in self.bytes_sent.items()})
        out.update({f"rows_{k}": float(v) for k, v in self.rows_sent.items()})
        out.update({f"time_{k}_s": v for k, v in self.phase_s.items()})
        out.update({f"cpu_{k}_s": v for k, v in self.phase_cpu_s.items()})
        out.update(self.counters)
        if self.hit_rate is not None:
            out["cache_hits"] = float(self.cache_hits)
            out["cache_misses"] = float(self.cache_misses)
            out["hit_rate"] = self.hit_rate
        return out


def _merge(a: dict, b: dict) -> dict:
    out = dict(a)
    for key, value in b.items():
        out[key] = out.get(key, 0) + value
    return out


#: One step's times or a runs table's columns of them.
Times = TypeVar("Times", float, "pd.Series")


#: The parts of the time no phase of trainer 0 covers, by the names :func:`other_time_parts`
#: gives them: trainer 0 between its phases, the slowest trainer's longer step, and the driver
#: with the RPCs around the step.
OTHER_TIME_PARTS = ("between_phases", "slower_peer", "driver_rpc")


def other_time_parts(
    iteration_s: Times, phases_s: Times, span_s: Times, slowest_span_s: Times
) -> dict[str, Times]:
    """The time no phase of trainer 0 covers (``iteration_s - phases_s``), in the three parts of
    :attr:`StepRecord.span_s`'s docstring; they add up to it. Works on floats and on columns."""
    parts = (span_s - phases_s, slowest_span_s - span_s, iteration_s - slowest_span_s)
    return dict(zip(OTHER_TIME_PARTS, parts, strict=True))


class Meter:
    """Per-process accumulator of traffic, cache and timing for the iteration in progress.

    Example::

        meter = Meter()
        with meter.phase(Phase.FORWARD):
            logits = model(batch)
        meter.add_traffic(LinkKind.EMB_PULL, rows.numel() * rows.element_size(), rows=len(ids))
        record = meter.end_step()   # closes the iteration, starts the next one
    """

    def __init__(self) -> None:
        self._current = _OpenRecord()
        self.records: list[StepRecord] = []

    def add_traffic(self, kind: LinkKind | str, nbytes: int, rows: int = 0) -> None:
        self._current.bytes_sent[str(kind)] += int(nbytes)
        if rows:
            self._current.rows_sent[str(kind)] += int(rows)

    def add_cache(self, hits: int, misses: int) -> None:
        self._current.hits += int(hits)
        self._current.misses += int(misses)

    def add_phase_time(self, phase: Phase | str, seconds: float, cpu_seconds: float = 0.0) -> None:
        """Charge ``seconds`` of wall time, of which the charging thread spent ``cpu_seconds`` on
        a CPU, to ``phase``."""
        self._current.phase_s[str(phase)] += seconds
        self._current.phase_cpu_s[str(phase)] += cpu_seconds
        self._current.started(time.perf_counter() - seconds)

    def count(self, name: str, value: float = 1.0) -> None:
        """A system-specific counter (e.g. ``rows_sync_now``), summed over the iteration."""
        self._current.counters[name] += value

    @contextmanager
    def phase(self, phase: Phase | str) -> Iterator[None]:
        """Charge the block's wall time and this thread's CPU time to ``phase``."""
        start, start_cpu = time.perf_counter(), time.thread_time()
        try:
            yield
        finally:  # the CPU clock read inside the wall clock's interval: never more CPU than wall
            cpu_s = time.thread_time() - start_cpu
            self.add_phase_time(phase, time.perf_counter() - start, cpu_s)

    def end_step(self) -> StepRecord:
        record = self._current.freeze()
        self.records.append(record)
        self._current = _OpenRecord()
        return record

    def total(self) -> StepRecord:
        out = StepRecord()
        for record in self.records:
            out = out + record
        return out


class _OpenRecord:
    """The mutable record of the iteration in progress (defaultdicts, cheap to bump)."""

    def __init__(self) -> None:
        self.bytes_sent: defaultdict[str, int] = defaultdict(int)
        self.rows_sent: defaultdict[str, int] = defaultdict(int)
        self.phase_s: defaultdict[str, float] = defaultdict(float)
        self.phase_cpu_s: defaultdict[str, float] = defaultdict(float)
        self.counters: defaultdict[str, float] = defaultdict(float)
        self.hits = 0
        self.misses = 0
        self.first_phase_at: float | None = None  # perf_counter at the earliest phase's start

    def started(self, at: float) -> None:
        """A phase of the iteration started at ``at`` (``perf_counter``)."""
        if self.first_phase_at is None or at < self.first_phase_at:
            self.first_phase_at = at

    def freeze(self) -> StepRecord:
        span_s = 0.0 if self.first_phase_at is None else time.perf_counter() - self.first_phase_at
        return StepRecord(
            bytes_sent=dict(self.bytes_sent),
            rows_sent=dict(self.rows_sent),
            phase_s=dict(self.phase_s),
            phase_cpu_s=dict(self.phase_cpu_s),
            cache_hits=self.hits,
            cache_misses=self.misses,
            counters=dict(self.counters),
            span_s=span_s,
        )
