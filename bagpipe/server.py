"""Bagpipe's embedding-server shards: authoritative rows, per-round write-back and read-after-write.

The flat global row space is dealt to ``S`` shards by ``id % S`` (hot rows of every table spread over
all shards); shard ``s`` stores row ``id`` at local index ``id // S``. Each shard is a role process
(``server_<s>``) holding a :class:`BagpipeServerShard`.

A round of the trainer caches (``RoundPlan``) talks to every shard twice::

    trainer k:  write_back(r, ids_k_s, rows_k_s)   to every shard s (possibly empty: it is also
                                                   the trainer's "I am done writing round r")
                fetch(r, ids, dst)                 blocks on shard s until all T trainers' write-backs
                                                   of round r arrived: the read-after-write barrier

so a row evicted by one trainer and refetched by another in the same round is never read stale. The
original had one server and counted write-back calls; here every shard counts per round, so the
barrier holds with any number of shards. Rows returned by ``fetch`` are delayed on the shard's link
to the trainer (the sender sleeps, ``bagpipe.core.runtime``); trainers count the bytes.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch

from bagpipe.core import runtime
from bagpipe.core.batch import DatasetSchema
from bagpipe.core.system import ModelState
from bagpipe.systems.start import start_table


@dataclass(frozen=True)
class ShardLayout:
    """Which shard stores each global row id (``id % num_shards``), and where in it."""

    num_shards: int

    def shard_of(self, ids: torch.Tensor) -> torch.Tensor:
        return ids % self.num_shards

    def local_index(self, ids: torch.Tensor) -> torch.Tensor:
        return ids // self.num_shards

    def split(self, ids: torch.Tensor) -> list[torch.Tensor]:
        """Positions in ``ids`` of the ids each shard stores (``ids[pos[s]]`` go to shard ``s``)."""
        shard = self.shard_of(ids)
        return [torch.nonzero(shard == s).flatten() for s in range(self.num_shards)]


class BagpipeServerShard:
    """One shard of the embedding tables plus the per-round write-back barrier.

    Args:
        shard: this shard's index ``s``.
        num_shards: ``S``.
        schema: the dataset schema (table sizes define the global row space).
        table_dim: row width.
        seed: model seed; the shard builds its rows from the same seeded tables as every system.
        num_trainers: ``T``, the write-backs a round waits for.
        resume: a checkpoint's model to start from instead of the seeded tables.
    """

    def __init__(
        self, shard: int, num_shards: int, schema: DatasetSchema, table_dim: int, seed: int,
        num_trainers: int, resume: ModelState | None = None,
    ) -> None:
        self.layout = ShardLayout(num_shards)
        self.shard = shard
        self.num_trainers = num_trainers
        offsets = schema.table_offsets.tolist()
        parts = []
        for index, offset in enumerate(offsets):
            table = start_table(schema, index, table_dim, seed, resume)
            first = (shard - offset) % num_shards  # first local row whose global id is ours
            parts.append(table[first::num_shards])
        self.rows = torch.cat(parts)
        self._writebacks: dict[int, int] = {}
        self._cond = threading.Condition()

    def write_back(self, round_index: int, ids: torch.Tensor, rows: torch.Tensor) -> None:
        """Store final values of evicted rows and count this trainer's arrival for the round."""
        self._check(ids)
        self.rows[self.layout.local_index(ids)] = rows
        with self._cond:
            self._writebacks[round_index] = self._writebacks.get(round_index, 0) + 1
            if self._writebacks[round_index] > self.num_trainers:
                raise RuntimeError(
                    f"server_{self.shard}: round {round_index} got more than "
                    f"{self.num_trainers} write-backs"
                )
            self._cond.notify_all()

    def fetch(self, round_index: int, ids: torch.Tensor, dst: str) -> torch.Tensor:
        """Rows of ``ids`` once every trainer wrote back round ``round_index``; sent to ``dst``."""
        self._check(ids)
        with self._cond:
            self._cond.wait_for(lambda: self._writebacks.get(round_index, 0) >= self.num_trainers)
            self._writebacks.pop(round_index - 2, None)  # every fetch of round r-2 is long done
        rows = self.rows[self.layout.local_index(ids)]
        runtime.delay(dst, rows)
        return rows

    def shard_rows(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(global ids, rows)`` of this shard (``full_state``)."""
        ids = torch.arange(self.rows.shape[0], dtype=torch.int64) * self.layout.num_shards
        return ids + self.shard, self.rows.clone()

    def _check(self, ids: torch.Tensor) -> None:
        if ids.numel() and bool((self.layout.shard_of(ids) != self.shard).any()):
            raise ValueError(f"server_{self.shard}: got ids of another shard")
