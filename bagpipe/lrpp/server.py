"""Bagpipe's embedding-server shards: authoritative rows, per-round write-back and read-after-write.

A :class:`BagpipeServerShard` is an :class:`~bagpipe.paramserver.EmbeddingServer` (same seeded rows,
same ``id % S`` layout, same ``state()``) with Bagpipe's per-round barrier added. Each shard is a
role process (``server_<s>``).

A round of the trainer caches (``RoundPlan``) talks to every shard twice::

    trainer k:  write_back(r, ids_k_s, rows_k_s)   to every shard s (possibly empty: it is also
                                                   the trainer's "I am done writing round r")
                fetch(r, ids)                      blocks on shard s until all T trainers' write-backs
                                                   of round r arrived: the read-after-write barrier

so a row evicted by one trainer and refetched by another in the same round is never read stale. The
original had one server and counted write-back calls; here every shard counts per round, so the
barrier holds with any number of shards. The trainers tag their calls; the wire counts and delays
the rows both ways (``bagpipe.core.net.wire``).
"""

from __future__ import annotations

import threading

import torch

from bagpipe.paramserver import EmbeddingServer


class BagpipeServerShard(EmbeddingServer):
    """One shard of the embedding tables plus the per-round write-back barrier.

    Args:
        shard, num_shards, schema, table_dim, seed, resume: as :class:`EmbeddingServer`'s.
        num_trainers: ``T``, the write-backs a round waits for.
    """

    def __init__(self, *args: object, num_trainers: int, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.num_trainers = num_trainers
        self._writebacks: dict[int, int] = {}
        self._cond = threading.Condition()
        self._released = False

    def write_back(self, round_index: int, ids: torch.Tensor, rows: torch.Tensor) -> None:
        """Store final values of evicted rows and count this trainer's arrival for the round."""
        self.write_rows(ids, rows)
        with self._cond:
            self._writebacks[round_index] = self._writebacks.get(round_index, 0) + 1
            if self._writebacks[round_index] > self.num_trainers:
                raise RuntimeError(
                    f"server_{self.shard}: round {round_index} got more than "
                    f"{self.num_trainers} write-backs"
                )
            self._cond.notify_all()

    def fetch(self, round_index: int, ids: torch.Tensor) -> torch.Tensor:
        """Rows of ``ids`` once every trainer wrote back round ``round_index``."""
        with self._cond:
            self._cond.wait_for(
                lambda: self._writebacks.get(round_index, 0) >= self.num_trainers or self._released
            )
            if self._writebacks.get(round_index, 0) < self.num_trainers:
                raise RuntimeError(f"server_{self.shard}: round {round_index}'s barrier released")
            self._writebacks.pop(round_index - 2, None)  # every fetch of round r-2 is long done
        return self.fetch_rows(ids)

    def release(self) -> None:
        """A trainer died: no round's barrier will fill, so every fetch waiting on one fails now
        (the survivors' rounds end, and the system replaces the shard's object)."""
        with self._cond:
            self._released = True
            self._cond.notify_all()
