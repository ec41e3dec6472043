"""A trainer's record of what it pushed, so that a dead ``sync_ps`` shard can be rebuilt in place.

A shard's rows at a step boundary ``n`` are a pure function of two things: its rows at an earlier
boundary ``b`` (the *base*: the run's start, or the model the driver last gathered with
``full_state``, the newest checkpoint's) and every push it applied for steps ``b..n-1``. It
applies step ``m`` as ``w - lr * (g_0 + g_1 + ...)`` summed in trainer-rank order
(``server.py``), so replaying the same pushes, tagged with the same steps and ranks, in a fresh
shard built from the base gives the dead shard's rows bit for bit.

Each trainer keeps its own pushes (one :class:`PushLog`), where the shard's death cannot lose
them: the pushes of a trainer are on that trainer's side of the network already (the gradients
it computed), so logging costs a reference to tensors it built anyway, and no bytes on the wire.
The driver truncates the logs whenever it takes a new base, so they hold at most the steps since
the newest checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["LoggedPush", "PushLog"]


@dataclass(frozen=True)
class LoggedPush:
    """One push as the shard received it: step ``step``'s gradients of global ``ids``."""

    step: int
    ids: torch.Tensor
    grads: torch.Tensor
    lr: float


class PushLog:
    """One trainer's pushes to each of ``num_shards`` shards, in the order it sent them."""

    def __init__(self, num_shards: int) -> None:
        self._by_shard: list[list[LoggedPush]] = [[] for _ in range(num_shards)]

    def append(self, shard: int, push: LoggedPush) -> None:
        self._by_shard[shard].append(push)

    def before(self, shard: int, step: int) -> list[LoggedPush]:
        """The pushes to ``shard`` of the steps before ``step`` (the finished ones)."""
        return [push for push in self._by_shard[shard] if push.step < step]

    def drop_before(self, step: int) -> None:
        """Forget the pushes of the steps before ``step``: the driver took a new base there."""
        self._by_shard = [[p for p in pushes if p.step >= step] for pushes in self._by_shard]

    def drop_from(self, step: int) -> None:
        """Forget the pushes of ``step`` on: a step in flight, trained again from its start."""
        self._by_shard = [[p for p in pushes if p.step < step] for pushes in self._by_shard]
