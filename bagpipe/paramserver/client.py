"""The trainer-side client of a set of embedding-server shards: vectorised pulls and pushes.

**Traffic convention** (``bagpipe.core.runtime``): a pull is a request (the ids, trainer -> shard)
and a reply (the rows, shard -> trainer): the trainer sleeps for the request, the shard for the
reply, and the trainer charges both. A push (ids + gradients or rows, trainer -> shard) is slept
for and charged by the trainer. Requests to different shards travel on different links, in
parallel.

Extension point: a system whose shards take more arguments subclasses :class:`ShardedTables` and
uses ``_split``/``_send``/``_scatter``.
"""

from __future__ import annotations

import torch
from torch.futures import Future

from bagpipe.core import runtime
from bagpipe.core.meter import LinkKind
from bagpipe.core.roles import RoleRef
from bagpipe.paramserver.layout import ShardLayout

__all__ = ["ShardedTables", "wait_acks"]


class ShardedTables:
    """A trainer's client for a set of :class:`EmbeddingServer` shards (vectorised, one RPC each).

    Args:
        servers: refs of the shards, ``servers[s]`` being shard ``s`` (role ``server_<s>``).
        caller: this process's role name (where pulled rows are sent).
    """

    def __init__(self, servers: list[RoleRef], caller: str) -> None:
        self.servers = servers
        self.roles = [ref.role for ref in servers]
        self.layout = ShardLayout(len(servers))
        self.caller = caller

    def _split(self, ids: torch.Tensor) -> list[tuple[int, torch.Tensor]]:
        """``(shard, positions in ids)`` for every shard that stores some of ``ids``."""
        return [(s, pos) for s, pos in enumerate(self.layout.split(ids)) if pos.numel()]

    def _send(self, kind: LinkKind, parts: list[tuple[int, list[torch.Tensor]]], rows: int) -> None:
        """Charge and sleep for requests to several shards, on their links in parallel."""
        runtime.charge(kind, *[t for _, tensors in parts for t in tensors], rows=rows)
        runtime.delay_parallel([(self.roles[s], tensors) for s, tensors in parts])

    def pull(self, ids: torch.Tensor, kind: LinkKind = LinkKind.EMB_PULL) -> torch.Tensor:
        """Rows of global ``ids`` (``[len(ids), dim]``, in ``ids`` order), charged as ``kind``."""
        split = self._split(ids)
        requests = [(s, [ids[pos]]) for s, pos in split]
        self._send(kind, requests, rows=0)
        futures = [
            self.servers[s].rpc_async().fetch_rows(part[0], self.caller) for s, part in requests
        ]
        replies = torch.futures.wait_all(futures)
        runtime.charge(kind, *replies, rows=int(ids.numel()))
        return self._scatter(ids, split, replies)

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
        parts = [(s, [ids[pos], grads[pos]]) for s, pos in self._split(ids)]
        self._send(LinkKind.EMB_PUSH, parts, rows=int(ids.numel()))
        return torch.futures.collect_all(
            [self.servers[s].rpc_async().apply_gradients(i, g, lr) for s, (i, g) in parts]
        )

    def push_rows(
        self, ids: torch.Tensor, values: torch.Tensor, kind: LinkKind = LinkKind.EMB_PUSH
    ) -> Future:
        """Overwrite rows of ``ids`` on their shards, charged as ``kind``; completes on all acks."""
        parts = [(s, [ids[pos], values[pos]]) for s, pos in self._split(ids)]
        self._send(kind, parts, rows=int(ids.numel()))
        return torch.futures.collect_all(
            [self.servers[s].rpc_async().write_rows(i, v) for s, (i, v) in parts]
        )


def wait_acks(pushed: Future) -> None:
    """Wait for every shard's ack of a push (:meth:`ShardedTables.push_gradients` and friends);
    raises the error of a shard that failed to apply it."""
    for ack in pushed.wait():
        ack.wait()
