"""The link model: an emulated datacenter network for roles that share one machine.

Every cross-role transfer is delayed on the *sending* side by ``latency + bytes * 8 / bandwidth``,
identically for every system. Transfers on one link are serialised (two concurrent transfers share the
link's bandwidth, so the second finishes after twice the time), transfers on different links overlap.
A transfer made from a background thread therefore overlaps compute, and one made on the critical
path stalls it: that difference is what caching and prefetching systems are built to exploit.

The delay is a ``sleep``, so an emulated transfer costs no CPU: on a 2-core machine the roles are not
slowed by each other's network time. On a real cluster the model is switched off (``enabled=False``).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

BITS_PER_BYTE = 8


@dataclass(frozen=True)
class LinkConfig:
    """Parameters of every emulated link.

    Defaults stand for the paper's trainers: p3.2xlarge instances with "up to 10 Gbps" networking.
    """

    bandwidth_gbps: float = 10.0
    latency_us: float = 50.0
    enabled: bool = True

    def __post_init__(self) -> None:
        if self.bandwidth_gbps <= 0:
            raise ValueError(f"link.bandwidth_gbps must be > 0, got {self.bandwidth_gbps}")
        if self.latency_us < 0:
            raise ValueError(f"link.latency_us must be >= 0, got {self.latency_us}")

    def transfer_time_s(self, nbytes: int) -> float:
        """Time one transfer of ``nbytes`` occupies a link (0 when the model is off)."""
        if not self.enabled:
            return 0.0
        return self.latency_us * 1e-6 + nbytes * BITS_PER_BYTE / (self.bandwidth_gbps * 1e9)

    def ring_allreduce_time_s(self, nbytes: int, world: int) -> float:
        """Time of a ring all-reduce of an ``nbytes`` tensor over ``world`` ranks.

        Each rank sends ``2 (world-1)/world * nbytes`` in ``2 (world-1)`` messages on its ring link.
        """
        if not self.enabled or world <= 1:
            return 0.0
        steps = 2 * (world - 1)
        wire_bytes = steps * nbytes / world
        return steps * self.latency_us * 1e-6 + wire_bytes * BITS_PER_BYTE / (
            self.bandwidth_gbps * 1e9
        )


class Link:
    """One directed link ``src -> dst``, owned by the sending process.

    ``send`` blocks the calling thread for the emulated duration. Sends from several threads queue
    behind each other: the link is busy until the previous transfer has finished.
    """

    def __init__(self, config: LinkConfig) -> None:
        self.config = config
        self._lock = threading.Lock()
        self._busy_until = 0.0

    def occupy(self, duration_s: float) -> float:
        """Hold the link for ``duration_s`` after any transfer already queued; return the wait."""
        if duration_s <= 0:
            return 0.0
        start = time.perf_counter()
        with self._lock:
            begin = max(start, self._busy_until)
            finish = begin + duration_s
            self._busy_until = finish
        _sleep_until(finish)
        return time.perf_counter() - start

    def send(self, nbytes: int) -> float:
        """Emulate sending ``nbytes``; return the seconds the caller was held."""
        return self.occupy(self.config.transfer_time_s(nbytes))


class Network:
    """The links a process sends on, created on first use and keyed by destination role name."""

    def __init__(self, config: LinkConfig) -> None:
        self.config = config
        self._links: dict[str, Link] = {}
        self._lock = threading.Lock()

    def link(self, dst: str) -> Link:
        with self._lock:
            if dst not in self._links:
                self._links[dst] = Link(self.config)
            return self._links[dst]

    def send(self, dst: str, nbytes: int) -> float:
        return self.link(dst).send(nbytes)

    def allreduce(self, nbytes: int, world: int) -> float:
        """Delay for a ring all-reduce, on this rank's outgoing ring link."""
        return self.link("ring").occupy(self.config.ring_allreduce_time_s(nbytes, world))


def _sleep_until(deadline: float) -> None:
    remaining = deadline - time.perf_counter()
    while remaining > 0:
        time.sleep(remaining)
        remaining = deadline - time.perf_counter()
