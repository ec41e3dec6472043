"""The trainer-side client of a set of embedding-server shards: vectorised pulls and pushes.

A pull is a request (the ids, trainer -> shard) and a reply (the rows, shard -> trainer); a push
carries ids and gradients (or rows). Each call is tagged with its Meter column and the wire
(``bagpipe.core.net.wire``) counts and delays both directions; calls to different shards are in
flight at once, sharing the trainer's NIC.

Extension point: a system whose shards take more arguments subclasses :class:`ShardedTables` and
uses ``_split``/``_scatter``.
"""

from __future__ import annotations

import torch
from torch.futures import Future

from bagpipe.core.meter import LinkKind
from bagpipe.core.roles import RoleRef
from bagpipe.paramserver.layout import ShardLayout

__all__ = ["ShardedTables", "wait_acks"]


class ShardedTables:
    """A trainer's client for a set of :class:`EmbeddingServer` shards (vectorised, one RPC each).

    Args:
        servers: refs of the shards, ``servers[s]`` being shard ``s`` (role ``server_<s>``).
    """

    def __init__(self, servers: list[RoleRef]) -> None:
        self.servers = servers
        self.layout = ShardLayout(len(servers))

    def _split(self, ids: torch.Tensor) -> list[tuple[int, torch.Tensor]]:
        """``(shard, positions in ids)`` for every shard that stores some of ``ids``."""
        return [(s, pos) for s, pos in enumerate(self.layout.split(ids)) if pos.numel()]

    def pull(self, ids: torch.Tensor, kind: LinkKind = LinkKind.EMB_PULL) -> torch.Tensor:
        """Rows of global ``ids`` (``[len(ids), dim]``, in ``ids`` order), charged as ``kind``."""
        split = self._split(ids)
        futures = [self.servers[s].rpc_async(kind=kind).fetch_rows(ids[pos]) for s, pos in split]
        return self._scatter(ids, split, torch.futures.wait_all(futures))

    @staticmethod
    def _scatter(
        ids: torch.Tensor, split: list[tuple[int, torch.Tensor]], replies: list[torch.Tensor]
    ) -> torch.Tensor:
        """Put each shard's reply rows back at their positions in ``ids``."""
        if not replies:
            return torch.empty(0, 0)
        out = torch.empty(ids.numel(), replies[0].shape[1], dtype=replies[0].dtype)
        for (_, pos), rows in zip(split, replies, strict=True):
            out[pos] = rows
        return out

    def push_gradients(self, ids: torch.Tensor, grads: torch.Tensor, lr: float) -> Future:
        """Send gradients of ``ids`` to their shards (SGD there); the Future completes on all acks."""
        return torch.futures.collect_all(
            [
                self.servers[s].rpc_async(kind=LinkKind.EMB_PUSH).apply_gradients(
                    ids[pos], grads[pos], lr
                )
                for s, pos in self._split(ids)
            ]
        )

    def push_rows(
        self, ids: torch.Tensor, values: torch.Tensor, kind: LinkKind = LinkKind.EMB_PUSH
    ) -> Future:
        """Overwrite rows of ``ids`` on their shards, charged as ``kind``; completes on all acks."""
        return torch.futures.collect_all(
            [
                self.servers[s].rpc_async(kind=kind).write_rows(ids[pos], values[pos])
                for s, pos in self._split(ids)
            ]
        )


def wait_acks(pushed: Future) -> None:
    """Wait for every shard's ack of a push (:meth:`ShardedTables.push_gradients` and friends);
    raises the error of a shard that failed to apply it."""
    for ack in pushed.wait():
        ack.wait()
