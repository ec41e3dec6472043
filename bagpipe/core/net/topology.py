"""The described cluster: hosts, their NICs and compute, and where every role runs.

One topology file (``suites/topology/<name>.yaml``) describes the target cluster once. The network
emulation (``bagpipe.core.net``), the cost model's projections and every run record read the same
file, so a measured run and a projection always name the same cluster::

    name: paper-8xV100
    trainers: 8                  # one host per trainer
    servers: 1                   # embedding-server hosts, one shard each
    trainer_nic: {egress_gbps: 10, ingress_gbps: 10, latency_us: 50}
    server_nic:  {egress_gbps: 25, ingress_gbps: 25, latency_us: 50}
    oracle_nic:  {egress_gbps: 10, ingress_gbps: 10, latency_us: 50}
    compute: {device: V100, peak_tflops: 15.7, efficiency: 0.35, overhead_ms: 2.0}

**Placement** (the same for every system): trainer ``k`` on host ``trainer_k``; embedding-server
shard ``s`` on host ``server_<s mod servers>``; Bagpipe's oracle on a host of its own, ``oracle``,
as in the paper; each trainer reads its own data on its host. The driver (the runner's process)
is not a host of the cluster: it only starts steps and gathers results, over a control path that
the emulation leaves unshaped and outside the byte checks.

A NIC has a bandwidth per direction and a one-way latency per message. :meth:`Topology.dilated`
divides every bandwidth by ``d`` and multiplies every latency by ``d`` (time-dilated emulation:
``reference/emulation.md``), which is how a slow machine reproduces a fast cluster's ratio of
communication to computation.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import yaml

__all__ = ["Compute", "Nic", "Topology", "host_of"]

BITS_PER_BYTE = 8
#: A full Ethernet frame on the wire (1500 bytes of MTU and a 14-byte header) and the TCP payload it
#: carries (less 20 bytes of IP and 32 of TCP with timestamps): a NIC's line rate carries payload
#: at 1448/1514 of it, 95.6%. The kernel (``netns``) frames every byte for real; the ``model``
#: back-end and the cost model charge payload at that share, so all three charge the same rule.
FRAME_BYTES = 1514
TCP_PAYLOAD_PER_FRAME = 1448


@dataclass(frozen=True)
class Nic:
    """One host's network interface: bandwidth each way, and the latency of one message."""

    egress_gbps: float = 10.0
    ingress_gbps: float = 10.0
    latency_us: float = 50.0

    def __post_init__(self) -> None:
        for name in ("egress_gbps", "ingress_gbps"):
            if getattr(self, name) <= 0:
                raise ValueError(f"nic.{name} must be > 0, got {getattr(self, name)}")
        if self.latency_us < 0:
            raise ValueError(f"nic.latency_us must be >= 0, got {self.latency_us}")

    @property
    def egress_bytes_per_s(self) -> float:
        return self.egress_gbps * 1e9 / BITS_PER_BYTE

    @property
    def ingress_bytes_per_s(self) -> float:
        return self.ingress_gbps * 1e9 / BITS_PER_BYTE

    @property
    def egress_payload_bytes_per_s(self) -> float:
        """Payload bytes per second the NIC sends over TCP: its line rate less the framing."""
        return self.egress_bytes_per_s * TCP_PAYLOAD_PER_FRAME / FRAME_BYTES

    @property
    def ingress_payload_bytes_per_s(self) -> float:
        """Payload bytes per second the NIC takes in over TCP: its line rate less the framing."""
        return self.ingress_bytes_per_s * TCP_PAYLOAD_PER_FRAME / FRAME_BYTES

    @property
    def latency_s(self) -> float:
        return self.latency_us * 1e-6

    def dilated(self, factor: float) -> Nic:
        """This NIC ``factor`` times slower: bandwidths divided, latency multiplied."""
        return Nic(self.egress_gbps / factor, self.ingress_gbps / factor, self.latency_us * factor)


@dataclass(frozen=True)
class Compute:
    """The trainers' accelerator, for projections and dilation: one step's compute time is
    ``6 * dense_params * per-trainer batch / (peak * efficiency) + overhead``.

    ``peak_tflops`` ``None`` means "this machine": use the measured compute time.
    """

    device: str = "cpu (measured)"
    peak_tflops: float | None = None
    efficiency: float = 0.4
    overhead_ms: float = 0.0

    def step_time_s(self, dense_params: int, batch_per_trainer: int) -> float | None:
        """Forward + backward time of one trainer's step, or ``None`` for a measured device."""
        if self.peak_tflops is None:
            return None
        flops = 6.0 * dense_params * batch_per_trainer
        return flops / (self.peak_tflops * 1e12 * self.efficiency) + self.overhead_ms * 1e-3


def host_of(role: str, servers: int) -> str:
    """The host a role runs on (module docstring, *Placement*); any other role has its own."""
    shard = re.fullmatch(r"server_(\d+)", role)
    if shard is not None:
        return f"server_{int(shard.group(1)) % servers}"
    return role


@dataclass(frozen=True)
class Topology:
    """A described cluster (module docstring). Load one with :meth:`load`.

    Args:
        name: for records and reports.
        trainers: ``T`` trainer hosts (one trainer each).
        servers: ``S`` embedding-server hosts (one shard each).
        trainer_nic / server_nic / oracle_nic: the NIC of each kind of host.
        compute: the trainers' accelerator (projections, dilation).
        batch_size: the global batch of a projection (``None``: the measured run's).
        description: free text for reports.
    """

    name: str = "local"
    trainers: int = 2
    servers: int = 2
    trainer_nic: Nic = field(default_factory=Nic)
    server_nic: Nic = field(default_factory=Nic)
    oracle_nic: Nic = field(default_factory=Nic)
    compute: Compute = field(default_factory=Compute)
    batch_size: int | None = None
    description: str = ""

    def __post_init__(self) -> None:
        for key in ("trainers", "servers"):
            if getattr(self, key) < 1:
                raise ValueError(f"topology.{key}: must be >= 1, got {getattr(self, key)}")

    # ------------------------------------------------------------------ construction
    @classmethod
    def load(cls, path: Path | str) -> Topology:
        """A topology from a YAML file; an unknown or ill-typed key is an error naming the file.

        The files are also Hydra config options (``topology=<name>``): their ``defaults`` list
        is Hydra's, not the topology's, and is left out here.
        """
        path = Path(path)
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except OSError as err:
            raise ValueError(f"{path}: cannot read topology ({err})") from err
        data.pop("defaults", None)
        try:
            return cls.from_dict(data)
        except (TypeError, ValueError) as err:
            raise ValueError(f"{path}: {err}") from err

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Topology:
        """A topology from plain values (a YAML mapping, a resolved Hydra node)."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown topology key(s) {unknown}; known: {sorted(known)}")
        values = dict(data)
        for key in ("trainer_nic", "server_nic", "oracle_nic"):
            if isinstance(values.get(key), dict):
                values[key] = _typed(Nic, values[key], key)
        if isinstance(values.get("compute"), dict):
            values["compute"] = _typed(Compute, values["compute"], "compute")
        return cls(**values)

    @classmethod
    def uniform(
        cls, gbps: float, latency_us: float = 50.0, trainers: int = 2, servers: int = 2,
        name: str | None = None,
    ) -> Topology:
        """Every host with the same NIC: ``gbps`` each way and ``latency_us`` per message."""
        nic = Nic(gbps, gbps, latency_us)
        return cls(
            name=name or f"uniform-{gbps:g}gbps", trainers=trainers, servers=servers,
            trainer_nic=nic, server_nic=nic, oracle_nic=nic,
        )

    def with_counts(self, trainers: int | None = None, servers: int | None = None) -> Topology:
        """The same hosts, with another number of trainer or server hosts (a run's ``T``, ``S``)."""
        return replace(
            self,
            trainers=self.trainers if trainers is None else trainers,
            servers=self.servers if servers is None else servers,
        )

    def dilated(self, factor: float) -> Topology:
        """Every NIC ``factor`` times slower (bandwidths divided, latencies multiplied)."""
        if factor <= 0:
            raise ValueError(f"dilation must be > 0, got {factor}")
        return replace(
            self,
            trainer_nic=self.trainer_nic.dilated(factor),
            server_nic=self.server_nic.dilated(factor),
            oracle_nic=self.oracle_nic.dilated(factor),
        )

    # ------------------------------------------------------------------ hosts
    def hosts(self, roles: list[str] | tuple[str, ...]) -> dict[str, Nic]:
        """The hosts ``roles`` run on (placement), each with its NIC, in first-use order."""
        out: dict[str, Nic] = {}
        for role in roles:
            host = host_of(role, self.servers)
            out.setdefault(host, self.nic_of(host))
        return out

    def nic_of(self, host: str) -> Nic:
        if host.startswith("trainer_"):
            return self.trainer_nic
        if host.startswith("server_"):
            return self.server_nic
        if host == "oracle":
            return self.oracle_nic
        raise ValueError(f"topology {self.name}: no host kind for {host!r}")

    def as_params(self) -> dict[str, str]:
        """Flat ``topology.*`` values for a run record."""
        out = {"topology.name": self.name, "topology.trainers": str(self.trainers),
               "topology.servers": str(self.servers)}
        for kind in ("trainer", "server", "oracle"):
            nic: Nic = getattr(self, f"{kind}_nic")
            out[f"topology.{kind}_nic"] = (
                f"{nic.egress_gbps:g}/{nic.ingress_gbps:g} Gbps, {nic.latency_us:g} us"
            )
        out["topology.compute"] = self.compute.device
        return out


def _typed(cls: type, values: dict[str, Any], key: str) -> Any:
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"unknown topology.{key} key(s) {unknown}; known: {sorted(known)}")
    return cls(**values)
