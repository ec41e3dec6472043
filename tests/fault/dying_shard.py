"""A ``sync_ps`` shard that dies in the middle of a step, after one trainer's call and before the other's.

The kill tests' :class:`~bagpipe.harness.run.faults.KillRoles` kills between steps, where every
trainer meets the dead shard alike. A death inside a step is the harder case: the trainer that
reached the shard first got its rows (or its ack) and goes on, the other fails. Armed with
``arm(call, step)``, this shard serves the first trainer's pull (or push) of ``step`` and exits at
the second one's, once its reply to the first has gone out. The shard that replaces it is built
unarmed.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import torch

from baselines.sync_ps import SyncPS
from baselines.sync_ps.server import StepOrderedServer

__all__ = ["DyingShard", "SyncPSWithDyingShards"]

_REPLY_SENT_S = 0.5  # time for the first trainer's reply to leave before this process exits


class DyingShard(StepOrderedServer):
    """A :class:`StepOrderedServer` that exits at the second ``call`` of an armed step."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._armed: tuple[str, int] | None = None
        self._seen = 0
        self._seen_lock = threading.Lock()

    def arm(self, call: str, step: int) -> None:
        """Exit at the second trainer's ``call`` (``"pull"`` or ``"push"``) of ``step``."""
        self._armed = (call, step)

    def fetch_rows_at(self, step: int, ids: torch.Tensor) -> torch.Tensor:
        self._maybe_exit("pull", step)
        return super().fetch_rows_at(step, ids)

    def push_at(
        self, step: int, rank: int, ids: torch.Tensor, grads: torch.Tensor, lr: float
    ) -> None:
        self._maybe_exit("push", step)
        super().push_at(step, rank, ids, grads, lr)

    def _maybe_exit(self, call: str, step: int) -> None:
        if self._armed != (call, step):
            return
        with self._seen_lock:
            self._seen += 1
            second = self._seen == 2
        if second:
            time.sleep(_REPLY_SENT_S)
            os._exit(1)


class SyncPSWithDyingShards(SyncPS):
    """``sync_ps`` whose shards are :class:`DyingShard` (the replacements too, unarmed)."""

    server_class = DyingShard

    def arm(self, shard: int, call: str, step: int) -> None:
        """Arm shard ``shard`` (between steps: the driver's call returns once it is armed)."""
        self._wait(self._servers[shard].rpc_async().arm(call, step))
