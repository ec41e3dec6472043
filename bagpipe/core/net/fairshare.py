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

import numpy as np

from bagpipe.core.net.topology import Nic

__all__ = ["SharedNics"]

_MAX_FLOWS = 512
_DONE_EPSILON_BYTES = 1e-6
_TIE = 1.0 + 1e-12  # NICs whose fair share equals the smallest, up to rounding, fill together
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
        self._egress = np.array([hosts[h].egress_payload_bytes_per_s for h in self.hosts])
        self._ingress = np.array([hosts[h].ingress_payload_bytes_per_s for h in self.hosts])
        self._raw: Any = context.RawArray(ctypes.c_double, _MAX_FLOWS * _SLOT + 1)
        self._changed = context.Condition(context.Lock())
        self._view: np.ndarray | None = None
        self._clock_view()[0] = time.monotonic()

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_view": None}  # views are rebuilt over the shared buffer

    # ------------------------------------------------------------------ public
    def transfer(self, src: str, dsts: Sequence[tuple[str, float]]) -> float:
        """Send ``nbytes`` from host ``src`` to each ``(dst, nbytes)`` at once (one flow each);
        return when all have arrived. Returns the seconds waited."""
        flows = [(self._index[src], self._index[dst], float(n)) for dst, n in dsts
                 if n > 0 and dst != src]
        if not flows:
            return 0.0
        started = time.monotonic()
        table = self._table()
        with self._changed:
            self._advance(time.monotonic())
            slots = np.array([self._open(src_i, dst_i, n) for src_i, dst_i, n in flows])
            self._changed.notify_all()
            while True:
                self._advance(time.monotonic())
                if bool((table[slots, _REMAINING] <= _DONE_EPSILON_BYTES).all()):
                    break
                self._changed.wait(timeout=self._time_to_next_event() + 1e-4)
            table[slots, _ACTIVE] = 0.0
            self._changed.notify_all()
        return time.monotonic() - started

    # ------------------------------------------------------------------ the fluid model
    def _table(self) -> np.ndarray:
        """``[slots, (active, src, dst, remaining)]`` over the shared buffer."""
        if self._view is None:
            self._view = np.frombuffer(self._raw, dtype=np.float64)
        return self._view[: _MAX_FLOWS * _SLOT].reshape(_MAX_FLOWS, _SLOT)

    def _clock_view(self) -> np.ndarray:
        if self._view is None:
            self._view = np.frombuffer(self._raw, dtype=np.float64)
        return self._view[_MAX_FLOWS * _SLOT :]

    def _open(self, src: int, dst: int, nbytes: float) -> int:
        table = self._table()
        free = np.flatnonzero(table[:, _ACTIVE] == 0.0)
        if free.size == 0:
            raise RuntimeError(f"more than {_MAX_FLOWS} concurrent emulated transfers")
        table[free[0]] = (1.0, float(src), float(dst), nbytes)
        return int(free[0])

    def _flowing(self) -> tuple[np.ndarray, np.ndarray]:
        """Slots of the flows with bytes left, and their max-min fair rates (bytes/s)."""
        table = self._table()
        slots = np.flatnonzero(
            (table[:, _ACTIVE] > 0.0) & (table[:, _REMAINING] > _DONE_EPSILON_BYTES)
        )
        return slots, self._rates(table[slots, _SRC].astype(np.intp),
                                  table[slots, _DST].astype(np.intp))

    def _rates(self, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        """Progressive filling: raise every unfrozen flow's rate together until a NIC direction
        is full, freeze the flows through it, repeat."""
        hosts = len(self.hosts)
        out_left, in_left = self._egress.copy(), self._ingress.copy()
        rate = np.zeros(src.size)
        frozen = np.zeros(src.size, dtype=bool)
        while not frozen.all():
            live_src, live_dst = src[~frozen], dst[~frozen]
            users_out = np.bincount(live_src, minlength=hosts)
            users_in = np.bincount(live_dst, minlength=hosts)
            with np.errstate(divide="ignore", invalid="ignore"):
                share_out = np.where(users_out > 0, out_left / users_out, np.inf)
                share_in = np.where(users_in > 0, in_left / users_in, np.inf)
            share = min(share_out.min(), share_in.min())
            full_out, full_in = share_out <= share * _TIE, share_in <= share * _TIE
            fix = ~frozen & (full_out[src] | full_in[dst])
            rate[fix] = share
            frozen |= fix
            out_left -= np.bincount(src[fix], minlength=hosts) * share
            in_left -= np.bincount(dst[fix], minlength=hosts) * share
        return rate

    def _advance(self, now: float) -> None:
        """Move every flow's progress from the table's clock to ``now``, event by event."""
        clock = self._clock_view()
        table = self._table()
        while now > clock[0]:
            slots, rates = self._flowing()
            if slots.size == 0:
                break
            remaining = table[slots, _REMAINING]
            step = min(now - clock[0], float((remaining / rates).min()))
            table[slots, _REMAINING] = np.maximum(0.0, remaining - rates * step)
            clock[0] += step
        clock[0] = now

    def _time_to_next_event(self) -> float:
        """Seconds until the next flow ends if none starts meanwhile (rates change then)."""
        slots, rates = self._flowing()
        if slots.size == 0:
            return 0.0
        return float((self._table()[slots, _REMAINING] / rates).min())
