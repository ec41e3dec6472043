"""What crossed each host's NIC in one deployment: the wire's books beside the kernel's counters.

Every role keeps a ledger of the bytes its messages and collectives put on its host's NIC and took
off it (``bagpipe.core.net.wire``). Under ``netns`` the kernel counts the same NICs independently
(``bagpipe.core.net.netns``). Putting the two side by side per host is the check that no system
moves a byte the Meter does not see, nor counts a byte that never crossed: a tensor sent around
the wire shows up only in the kernel's column, a payload handed over through shared memory only
in the ledger's.

The kernel counts frames (TCP/IP and Ethernet headers, ACKs), so it reads a little higher than
the payloads; on small volumes the framing dominates, which is why the agreement is judged on
hosts that carry at least :data:`MIN_CHECKED_BYTES`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from bagpipe.core.net.netns import NicCounters
from bagpipe.core.net.wire import Ledger

__all__ = ["MIN_CHECKED_BYTES", "HostTraffic", "NetworkReport"]

#: Hosts whose NIC carried less than this (both directions) are reported, not judged.
MIN_CHECKED_BYTES = 1_000_000


@dataclass(frozen=True)
class HostTraffic:
    """One host: what its roles' ledgers say crossed its NIC, and what the kernel saw (netns)."""

    ledger_tx: int
    ledger_rx: int
    kernel: NicCounters | None = None

    @property
    def ledger_bytes(self) -> int:
        return self.ledger_tx + self.ledger_rx

    @property
    def kernel_bytes(self) -> int | None:
        return None if self.kernel is None else self.kernel.tx_bytes + self.kernel.rx_bytes

    @property
    def kernel_over_ledger(self) -> float | None:
        """Kernel bytes / ledger bytes (framing makes it a little above 1 when they agree)."""
        if self.kernel_bytes is None or self.ledger_bytes == 0:
            return None
        return self.kernel_bytes / self.ledger_bytes


@dataclass(frozen=True)
class NetworkReport:
    """Per host traffic of one deployment (see the module docstring)."""

    backend: str
    hosts: dict[str, HostTraffic] = field(default_factory=dict)

    @classmethod
    def build(
        cls,
        backend: str,
        ledgers: Mapping[str, Ledger],
        host_of_role: Mapping[str, str],
        kernel: Mapping[str, NicCounters] | None,
    ) -> NetworkReport:
        """Sum the roles' ledgers per host and pair them with the kernel's counters."""
        tx: dict[str, int] = {}
        rx: dict[str, int] = {}
        for role, ledger in ledgers.items():
            host = host_of_role[role]
            tx[host] = tx.get(host, 0) + ledger.tx_bytes
            rx[host] = rx.get(host, 0) + ledger.rx_bytes
        hosts = sorted(set(tx) | set(kernel or {}))
        return cls(
            backend,
            {
                host: HostTraffic(tx.get(host, 0), rx.get(host, 0), (kernel or {}).get(host))
                for host in hosts
            },
        )

    def worst_disagreement(self) -> float | None:
        """The largest ``|kernel / ledger - 1|`` over the hosts carrying enough to judge."""
        ratios = [
            abs(h.kernel_over_ledger - 1.0)
            for h in self.hosts.values()
            if h.kernel_over_ledger is not None and h.ledger_bytes >= MIN_CHECKED_BYTES
        ]
        return max(ratios) if ratios else None

    def retransmits(self) -> int:
        return sum(h.kernel.retransmits for h in self.hosts.values() if h.kernel is not None)

    def dropped(self) -> int:
        return sum(h.kernel.dropped for h in self.hosts.values() if h.kernel is not None)

    def flat(self) -> dict[str, float]:
        """``net_<host>_<what>`` values for a run's summary (bytes, and the kernel/ledger ratio)."""
        out: dict[str, float] = {}
        for host, traffic in self.hosts.items():
            out[f"net_{host}_ledger_bytes"] = float(traffic.ledger_bytes)
            if traffic.kernel is not None:
                out[f"net_{host}_kernel_bytes"] = float(traffic.kernel_bytes or 0)
                out[f"net_{host}_control_bytes"] = float(traffic.kernel.control_bytes)
        worst = self.worst_disagreement()
        if worst is not None:
            out["net_kernel_vs_ledger_worst"] = worst
        if any(h.kernel is not None for h in self.hosts.values()):
            out["net_retransmits"] = float(self.retransmits())
            out["net_loss_probes"] = float(
                sum(h.kernel.loss_probes for h in self.hosts.values() if h.kernel is not None)
            )
            out["net_dropped"] = float(self.dropped())
        return out
