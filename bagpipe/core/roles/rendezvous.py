"""Where the members of one collective group meet: a TCP store the driver hosts.

The driver hosts the store (:func:`host`) and hands the picklable :class:`Rendezvous` to the role
objects that form the group; each calls ``bagpipe.core.collectives.join_group(spec, rank)``.
Hosting it in the driver makes it reachable from every machine of the world. The same store is a
barrier (:func:`meet`): the processes of a world leave it together through one.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import torch.distributed as dist

__all__ = ["LOCALHOST", "Rendezvous", "host", "meet"]

LOCALHOST = "127.0.0.1"


@dataclass(frozen=True)
class Rendezvous:
    """Where the members of one gloo group meet: a TCP store hosted by the driver."""

    name: str
    host: str
    port: int
    world_size: int


def host(
    name: str, address: str, world_size: int, timeout_s: float
) -> tuple[dist.TCPStore, Rendezvous]:
    """A store on an OS-chosen port of this process, and the rendezvous that names it.

    ``address`` is this machine's address as the members reach it: on the loopback interface the
    store listens there alone, otherwise on every interface. Keep the store as long as the group
    may be joined.
    """
    store = dist.TCPStore(
        LOCALHOST if address == LOCALHOST else "0.0.0.0",
        0,
        is_master=True,
        wait_for_workers=False,
        timeout=timedelta(seconds=timeout_s),
    )
    return store, Rendezvous(name=name, host=address, port=store.port, world_size=world_size)


def meet(spec: Rendezvous, key: str, timeout_s: float, store: dist.Store | None = None) -> None:
    """Block until all ``spec.world_size`` members have called ``meet`` with ``key``: a barrier.

    ``store`` is the host's own store (the driver passes the one :func:`host` returned); the other
    members connect to it. Raises when ``timeout_s`` passes first.
    """
    timeout = timedelta(seconds=timeout_s)
    if store is None:
        store = dist.TCPStore(spec.host, spec.port, is_master=False, timeout=timeout)
    if store.add(f"{key}/arrived", 1) == spec.world_size:
        store.set(f"{key}/all", "1")
    store.wait([f"{key}/all"], timeout)
