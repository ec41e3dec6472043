"""A Bagpipe trainer whose write-backs of one round never leave it: the window the update log's
kept replicas exist for.

A round's evictions run at each trainer's pace. When the designated writer of a replicated row
dies after a peer evicted the row and before its own write-back reached a server, the row's
value survives only in what the peer kept (``bagpipe.lrpp.updatelog``); the writer's own
singletons it evicted are then still in its log, since an eviction is reported only once
acknowledged. Armed with ``arm(round)``, this trainer evicts that round's rows and then holds
its write-backs back, so that a kill lands in that window every time.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from bagpipe.core.batch import DatasetSchema
from bagpipe.lrpp import Bagpipe
from bagpipe.lrpp.trainer import BagpipeTrainer
from bagpipe.oracle.cacher import OracleCacher
from bagpipe.oracle.config import OracleConfig
from bagpipe.oracle.plan import RoundPlan
from bagpipe.training.start import TrainingStream

__all__ = ["BagpipeWithSlowWriters", "SlowWriter", "rounds_evicting_replicas_of"]


class SlowWriter(BagpipeTrainer):
    """A :class:`BagpipeTrainer` that holds back its write-backs of an armed round."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._armed_round = -1
        self._released = threading.Event()  # never set: the process is killed meanwhile

    def arm(self, round_index: int) -> None:
        self._armed_round = round_index

    def _write_back(
        self, shard: int, round_index: int, ids: torch.Tensor, rows: torch.Tensor
    ) -> None:
        if round_index == self._armed_round:
            self._released.wait(timeout=120.0)
        super()._write_back(shard, round_index, ids, rows)


class BagpipeWithSlowWriters(Bagpipe):
    """Bagpipe whose trainers are :class:`SlowWriter` (the rebuilt ones too, unarmed)."""

    trainer_class = SlowWriter

    def arm(self, trainer: int, round_index: int) -> None:
        """Arm trainer ``trainer`` (between steps: returns once it is armed)."""
        deployment, _ = self._require_setup()
        deployment.wait(self._trainers[trainer].rpc_async().arm(round_index))


def rounds_evicting_replicas_of(
    writer: int, peer: int, schema: DatasetSchema, config: OracleConfig, stream: TrainingStream
) -> list[int]:
    """The rounds in which ``peer`` evicts rows it holds fresh that ``writer`` writes back: the
    rounds where holding ``writer``'s write-backs back leaves those values only on ``peer``.

    Replays the oracle's plans for ``stream`` as ``peer`` follows them: a round's prefetch
    installs rows, its evictions drop them, and a step's singleton of another trainer makes
    ``peer``'s copy stale.
    """
    fresh: set[int] = set()
    rounds = []
    for plan in OracleCacher(schema, config).plan(stream.global_ids(), flush=False):
        if isinstance(plan, RoundPlan):
            evicted = plan.evict.tolist()
            if any(owner == writer and row in fresh
                   for row, owner in zip(evicted, plan.writeback_owner.tolist(), strict=True)):
                rounds.append(plan.round_index)
            fresh.difference_update(evicted)
            fresh.update(plan.prefetch_for(peer).tolist())
        else:
            fresh.difference_update(plan.singleton[plan.singleton_owner != peer].tolist())
    return rounds
