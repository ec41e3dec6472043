"""The wire: every message between two roles passes here, is counted once and delayed by one rule.

No system charges or delays its own traffic. The role layer (:mod:`bagpipe.core.roles`) hands every
RPC to :class:`Wire` on both ends, and the collectives (:mod:`bagpipe.core.collectives`, DDP's comm
hook, TorchRec's all-to-alls) hand it every collective; so a system cannot forget to pay, and two
systems that move the same bytes pay the same.

**What one message costs**, by back-end (``NetworkConfig.backend``):

* ``netns``: the kernel carries it between host namespaces over shaped NICs
  (:mod:`bagpipe.core.net.netns`); the wire only adds the sender NIC's latency (the kernel here has
  no ``netem``);
* ``model``: the sender NIC's latency, then a flow through the sender's egress and the receiver's
  ingress, sharing both max-min fairly with every other flow of the deployment
  (:mod:`bagpipe.core.net.fairshare`);
* ``real``: nothing (a real cluster, or a network-off run).

The driver is not a host of the topology: messages to or from it travel the unshaped control path
(it starts steps, hands trainers their batch slices as a read from local storage would, and
gathers results and state), and are never delayed. Two roles on one host talk over loopback.

**What is counted.** Two things, both from the tensors that actually cross (``numel *
element_size``; nothing estimated):

* the **Meter** (``bagpipe.core.meter``), by :class:`~bagpipe.core.meter.LinkKind`, in the
  *trainer's* record only, for both directions of every message a trainer sends or receives, so
  the T trainers' records sum to the iteration's traffic; the caller names the kind
  (``ref.rpc_async(kind=LinkKind.EMB_PULL)``), a dataclass in a payload may split its fields over
  kinds with a ``wire_kinds`` mapping (HET's metadata beside its rows), and an untagged message
  between two roles lands in ``control``;
* the **NIC ledger** of every role: bytes it put on its host's NIC and took off it, RPC payloads
  and collective wire bytes alike, which the ``netns`` back-end checks against the kernel's
  per-NIC counters (``RoleRuntime.ledger``).

Example (the role layer does this; systems never call it)::

    n = wire.outgoing("server_1", LinkKind.EMB_PULL, (ids,), {})  # caller: count it...
    wire.hold("server_1", n)                                      # ...and pay for it, then send
    wire.incoming("trainer_0", LinkKind.EMB_PULL, (ids,), {})     # callee, on receipt
    wire.reply("trainer_0", LinkKind.EMB_PULL, rows)              # callee, before returning
    wire.replied("server_1", LinkKind.EMB_PULL, rows)             # caller, on the reply
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from bagpipe.core.meter import LinkKind, Meter
from bagpipe.core.net.fairshare import SharedNics
from bagpipe.core.net.topology import Topology, host_of

__all__ = [
    "BACKENDS",
    "DRIVER",
    "Ledger",
    "NetworkConfig",
    "Wire",
    "is_trainer",
    "payload",
]

#: The role name of the process that drives a system (the runner's process).
DRIVER = "driver"
BACKENDS = ("netns", "model", "real")
#: Meter columns whose 2-D floating payloads are embedding rows (``rows_<kind>`` counts them).
_ROW_KINDS = frozenset({LinkKind.EMB_PULL, LinkKind.EMB_PUSH, LinkKind.H2D})


@dataclass(frozen=True)
class NetworkConfig:
    """The network a run trains on: a back-end, the topology it emulates, and the dilation.

    Args:
        backend: ``netns``, ``model`` or ``real`` (module docstring); resolve ``auto`` with
            :func:`bagpipe.core.net.resolve_backend` before building one.
        topology: the described cluster (hosts, NICs, placement).
        dilation: every bandwidth divided, every latency multiplied by it (``reference/emulation.md``).
    """

    backend: str = "real"
    topology: Topology = field(default_factory=Topology)
    dilation: float = 1.0

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"network.backend: {self.backend!r} is not one of {BACKENDS}")
        if self.dilation <= 0:
            raise ValueError(f"network.dilation must be > 0, got {self.dilation}")

    @property
    def emulated(self) -> Topology:
        """The topology as emulated: NICs slowed by the dilation."""
        return self.topology.dilated(self.dilation) if self.dilation != 1.0 else self.topology

    @property
    def shapes_traffic(self) -> bool:
        return self.backend != "real"


def is_trainer(role: str) -> bool:
    """Trainers count traffic in their Meter (``trainer_<k>``); other roles keep only a ledger."""
    return role.startswith("trainer_")


@dataclass
class Ledger:
    """Bytes one role put on its host's NIC (``tx``) and took off it (``rx``), by kind."""

    tx: dict[str, int] = field(default_factory=dict)
    rx: dict[str, int] = field(default_factory=dict)

    def add(self, direction: str, kind: str, nbytes: int) -> None:
        """Book ``nbytes`` of ``kind`` as sent (``direction="tx"``) or received (``"rx"``)."""
        book = {"tx": self.tx, "rx": self.rx}[direction]
        book[kind] = book.get(kind, 0) + nbytes

    @property
    def tx_bytes(self) -> int:
        return sum(self.tx.values())

    @property
    def rx_bytes(self) -> int:
        return sum(self.rx.values())


def payload(obj: Any, kind: str) -> dict[str, tuple[int, int]]:
    """``kind -> (bytes, rows)`` of every tensor in ``obj``, walking containers and dataclasses.

    A dataclass with a ``wire_kinds`` mapping (field -> kind) books those fields under their own
    kinds; rows are the first dimension of 2-D floating tensors of embedding-row kinds.
    """
    out: dict[str, tuple[int, int]] = {}
    for tensor_kind, tensor in _tensors(obj, kind):
        nbytes = tensor.numel() * tensor.element_size()
        rows = (
            int(tensor.shape[0])
            if tensor_kind in _ROW_KINDS and tensor.dim() == 2 and tensor.is_floating_point()
            else 0
        )
        old_bytes, old_rows = out.get(tensor_kind, (0, 0))
        out[tensor_kind] = (old_bytes + nbytes, old_rows + rows)
    return out


def _tensors(obj: Any, kind: str) -> Iterable[tuple[str, torch.Tensor]]:
    if isinstance(obj, torch.Tensor):
        yield kind, obj
    elif isinstance(obj, Mapping):
        for value in obj.values():
            yield from _tensors(value, kind)
    elif isinstance(obj, list | tuple):
        for value in obj:
            yield from _tensors(value, kind)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        kinds: Mapping[str, str] = getattr(obj, "wire_kinds", {})
        for f in dataclasses.fields(obj):
            yield from _tensors(getattr(obj, f.name), str(kinds.get(f.name, kind)))


class Wire:
    """One process's end of the wire (module docstring): its role, host, back-end and books.

    Args:
        role: this process's role name.
        network: the run's network; the driver and every role get the same one.
        meter: this process's Meter (counted into only by trainers).
        nics: the ``model`` back-end's shared NICs (``None`` for the other back-ends).
    """

    def __init__(
        self, role: str, network: NetworkConfig, meter: Meter, nics: SharedNics | None = None
    ) -> None:
        if network.backend == "model" and nics is None and role != DRIVER:
            raise ValueError(f"{role}: the model back-end needs the deployment's shared NICs")
        self.role = role
        self.network = network
        self.meter = meter
        self.nics = nics
        self.topology = network.emulated
        self.host = host_of(role, self.topology.servers)  # the driver: "driver", on no NIC
        self.ledger = Ledger()
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ RPC, both ends
    def outgoing(self, dst: str, kind: str, args: tuple, kwargs: dict) -> int:
        """A call to ``dst`` is being sent: count it now, on the caller's thread (so it lands in
        the step that sent it); return its bytes for :meth:`hold`."""
        sizes = payload((args, kwargs), kind)
        self._book("tx", dst, sizes, count=is_trainer(self.role))
        return sum(n for n, _ in sizes.values())

    def hold(self, dst: str, nbytes: int) -> None:
        """Hold the sending thread for a message of ``nbytes`` to ``dst`` (latency, then the flow)."""
        if not self.delays(dst):
            return
        _sleep(self.topology.nic_of(self.host).latency_s)
        if self.nics is not None and nbytes:
            self.nics.transfer(self.host, [(host_of(dst, self.topology.servers), nbytes)])

    def incoming(self, src: str, kind: str, args: tuple, kwargs: dict) -> None:
        """A call from ``src`` arrived: book it (a trainer called by a non-trainer counts it)."""
        sizes = payload((args, kwargs), kind)
        self._book("rx", src, sizes, count=is_trainer(self.role) and not is_trainer(src))

    def reply(self, dst: str, kind: str, result: Any) -> None:
        """Before the reply to ``dst``'s call leaves: count it and hold for its network time."""
        sizes = payload(result, kind)
        self._book("tx", dst, sizes, count=is_trainer(self.role) and not is_trainer(dst))
        self.hold(dst, sum(n for n, _ in sizes.values()))

    def replied(self, src: str, kind: str, result: Any) -> None:
        """The reply to this process's call to ``src`` arrived: book it."""
        self._book("rx", src, payload(result, kind), count=is_trainer(self.role))

    # ------------------------------------------------------------------ collectives
    def collective(
        self, kind: str, payload_bytes: int, sends: Mapping[str, int], receives: int
    ) -> None:
        """Count a collective this trainer takes part in, on the issuing thread: ``payload_bytes``
        in the Meter as ``kind``; ``sends`` (peer role -> wire bytes) leaving its NIC and
        ``receives`` arriving, in its ledger. :meth:`hold_collective` then pays for it."""
        if payload_bytes:
            self.meter.add_traffic(kind, payload_bytes)
        with self._lock:
            for nbytes in sends.values():
                self.ledger.add("tx", kind, nbytes)
            self.ledger.add("rx", kind, receives)

    def hold_collective(
        self, sends: Mapping[str, int], messages: int, then_receives: Mapping[str, int] | None = None
    ) -> None:
        """Hold the caller for a collective's network time: ``messages`` sequential latencies,
        ``sends`` (peer role -> bytes) leaving this NIC at once, and, for a library that does
        not send and receive at once (gloo's all-to-all), ``then_receives`` arriving after."""
        if not self.network.shapes_traffic or not any(sends.values()):
            return
        _sleep(self.topology.nic_of(self.host).latency_s * messages)
        if self.nics is None:
            return
        servers = self.topology.servers
        self.nics.transfer(self.host, [(host_of(peer, servers), n) for peer, n in sends.items()])
        for peer, nbytes in (then_receives or {}).items():
            self.nics.transfer(host_of(peer, servers), [(self.host, nbytes)])

    def delays(self, peer: str) -> bool:
        """Whether a message to ``peer`` costs emulated time here (a sender then holds it)."""
        return self.network.shapes_traffic and self._crosses(peer)

    # ------------------------------------------------------------------ internals
    def _crosses(self, peer: str) -> bool:
        """A message to ``peer`` crosses this host's NIC (not the driver's control path, not
        loopback between two roles of one host)."""
        if DRIVER in (self.role, peer):
            return False
        return host_of(peer, self.topology.servers) != self.host

    def _book(
        self, direction: str, peer: str, sizes: Mapping[str, tuple[int, int]], count: bool
    ) -> None:
        crosses = self._crosses(peer)
        control_path = DRIVER in (self.role, peer)
        with self._lock:
            for kind, (nbytes, rows) in sizes.items():
                if count and not (control_path and kind == LinkKind.CONTROL):
                    self.meter.add_traffic(kind, nbytes, rows=rows)
                if crosses:
                    self.ledger.add(direction, kind, nbytes)


def _sleep(seconds: float) -> None:
    """Sleep until ``seconds`` have passed (``time.sleep`` may wake early)."""
    deadline = time.perf_counter() + seconds
    while (remaining := deadline - time.perf_counter()) > 0:
        time.sleep(remaining)

