"""The ``model`` back-end: NICs shared by concurrent transfers as TCP flows share them.

For machines where the ``netns`` back-end cannot run (no root): every transfer between two hosts
is a *flow* that needs the sender's egress and the receiver's ingress at once. Concurrent flows get
**max-min fair** rates (progressive filling over the NICs they cross), recomputed whenever a flow
starts or ends, which is how long-lived TCP flows share a bottleneck; they are not served first
come, first served. A prefetch and an all-reduce that leave one NIC together therefore each get
half of it, and the two finish in the sum of their times, not the max::

    trainer_0 egress 10 Gbps:   |== prefetch 5 Gbps ==|====== 10 ======|
                                |== all-reduce 5 Gbps ==|(done)

The state lives in shared memory (one table of flows for all processes of a deployment, guarded
by one lock), so flows from different role processes meet on the NICs they share. Progress is an
exact fluid simulation advanced by whichever process looks at the table: between two looks it
steps from event to event (the next flow to finish), so a flow is credited with finishing at the
right moment even when its owner wakes up late; a waiting owner sleeps until its own projected end
and is woken early whenever the set of flows changes.

The sender's thread waits for the flow (a transfer costs no CPU while it waits), then the real
bytes move over loopback. One back-end per machine: a real multi-machine cluster uses ``real``.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Mapping, Sequence
from multiprocessing.context import BaseContext
from typing import Any

from bagpipe.core.net.topology import Nic

__all__ = ["SharedNics"]

_MAX_FLOWS = 512
_DONE_EPSILON_BYTES = 1e-6
# Field offsets in one flow slot of the shared table.
_ACTIVE, _SRC, _DST, _REMAINING = range(4)
_SLOT = 4


class SharedNics:
    """Max-min fair NIC sharing among the processes of one deployment (module docstring).

    Build it in the driver with the multiprocessing context that starts the roles, and pass it to
    them (it pickles as shared memory plus a lock). ``transfer`` blocks the calling thread for the
    emulated time of its flows.

    Args:
        hosts: host name -> NIC (bandwidth each way).
        context: the multiprocessing context of the role processes.
    """

    def __init__(self, hosts: Mapping[str, Nic], context: BaseContext) -> None:
        self.hosts = tuple(hosts)
        self._index = {host: i for i, host in enumerate(self.hosts)}
        self._egress = [hosts[h].egress_bytes_per_s for h in self.hosts]
        self._ingress = [hosts[h].ingress_bytes_per_s for h in self.hosts]
        self._flows: Any = context.RawArray(ctypes.c_double, _MAX_FLOWS * _SLOT)
        self._clock: Any = context.RawArray(ctypes.c_double, 1)
        self._clock[0] = time.monotonic()
        self._changed = context.Condition(context.Lock())

    # ------------------------------------------------------------------ public
    def transfer(self, src: str, dsts: Sequence[tuple[str, float]]) -> float:
        """Send ``nbytes`` from host ``src`` to each ``(dst, nbytes)`` at once (one flow each);
        return when all have arrived. Returns the seconds waited."""
        flows = [(self._index[src], self._index[dst], float(n)) for dst, n in dsts
                 if n > 0 and dst != src]
        if not flows:
            return 0.0
        started = time.monotonic()
        with self._changed:
            self._advance(time.monotonic())
            slots = [self._open(src_i, dst_i, n) for src_i, dst_i, n in flows]
            self._changed.notify_all()
            while True:
                now = time.monotonic()
                self._advance(now)
                if all(self._remaining(s) <= _DONE_EPSILON_BYTES for s in slots):
                    break
                self._changed.wait(timeout=self._time_to_next_event() + 1e-4)
            for slot in slots:
                self._flows[slot * _SLOT + _ACTIVE] = 0.0
            self._changed.notify_all()
        return time.monotonic() - started

    # ------------------------------------------------------------------ the fluid model
    def _open(self, src: int, dst: int, nbytes: float) -> int:
        table = self._flows
        for slot in range(_MAX_FLOWS):
            if table[slot * _SLOT + _ACTIVE] == 0.0:
                base = slot * _SLOT
                table[base + _ACTIVE] = 1.0
                table[base + _SRC] = float(src)
                table[base + _DST] = float(dst)
                table[base + _REMAINING] = nbytes
                return slot
        raise RuntimeError(f"more than {_MAX_FLOWS} concurrent emulated transfers")

    def _remaining(self, slot: int) -> float:
        return float(self._flows[slot * _SLOT + _REMAINING])

    def _active(self) -> list[tuple[int, int, int]]:
        """``(slot, src, dst)`` of every flow with bytes left to send."""
        table = self._flows
        out = []
        for slot in range(_MAX_FLOWS):
            base = slot * _SLOT
            if table[base + _ACTIVE] and table[base + _REMAINING] > _DONE_EPSILON_BYTES:
                out.append((slot, int(table[base + _SRC]), int(table[base + _DST])))
        return out

    def _rates(self, flows: list[tuple[int, int, int]]) -> dict[int, float]:
        """Max-min fair rates (bytes/s) by progressive filling over egress and ingress NICs."""
        capacity = {("out", h): c for h, c in enumerate(self._egress)}
        capacity.update({("in", h): c for h, c in enumerate(self._ingress)})
        users: dict[tuple[str, int], set[int]] = {}
        for slot, src, dst in flows:
            users.setdefault(("out", src), set()).add(slot)
            users.setdefault(("in", dst), set()).add(slot)
        rates: dict[int, float] = {}
        while len(rates) < len(flows):
            share, bottleneck = min(
                (capacity[nic] / len(slots), nic) for nic, slots in users.items() if slots
            )
            for slot in list(users[bottleneck]):
                rates[slot] = share
                for nic, slots in users.items():
                    if slot in slots:
                        slots.discard(slot)
                        capacity[nic] -= share
        return rates

    def _advance(self, now: float) -> None:
        """Move every flow's progress from the table's clock to ``now``, event by event."""
        clock = self._clock[0]
        table = self._flows
        while now > clock:
            flows = self._active()
            if not flows:
                break
            rates = self._rates(flows)
            step = min(now - clock, min(self._remaining(s) / rates[s] for s, _, _ in flows))
            for slot, _, _ in flows:
                base = slot * _SLOT
                table[base + _REMAINING] = max(0.0, table[base + _REMAINING] - rates[slot] * step)
            clock += step
        self._clock[0] = now

    def _time_to_next_event(self) -> float:
        """Seconds until the next flow ends if none starts meanwhile (rates change then)."""
        flows = self._active()
        if not flows:
            return 0.0
        rates = self._rates(flows)
        return min(self._remaining(s) / rates[s] for s, _, _ in flows)
