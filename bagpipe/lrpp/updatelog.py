"""The rows a Bagpipe trainer alone may hold, kept where its death cannot lose them.

A trainer's cache holds the only fresh copy of its partitioned singletons once it has updated
them and until it has written them back. Every other row it holds fresh is a replicated row,
which every peer holds too, with the same value (they all apply the same summed update), except
for a while after each round's evictions: the trainers run a round at their own pace, so a peer
may have dropped a replicated row whose designated writer (this trainer) has not yet written it
back. With logging on (``Bagpipe(standby_trainers=...)``):

* every step's reply carries, besides the loss, the trainer's :class:`LogEntry`: the singletons it
  updated in the step (ids and new values) and the rows it evicted since its previous reply (an
  eviction is reported only once its write-back is acknowledged, so the log keeps a row until a
  server has it). The driver keeps :class:`UpdateLogs`, per trainer the latest value of each
  logged row the trainer still holds fresh. A row a peer updates alone in a step is stale here
  from that step on; the driver knows those rows from the peer's entry of the same step, so no
  trainer sends them;
* every trainer keeps the fresh replicated rows it evicts that a peer writes back, until the round
  is installed on every trainer (the agreement at the round's first step), by when every
  write-back of the round is acknowledged (``BagpipeTrainer.salvage`` hands them over).

Why this is exact at a step boundary ``n`` (the last step every trainer replied to): a row the
dead trainer held fresh at ``n`` is its singleton, in its log with its value after ``n``; or a
replicated row, in every survivor's cache with the same value or, if a survivor evicted it in a
round not yet done everywhere, among that survivor's kept rows. A row it dropped by ``n`` is out
of the log, and its value is on a server or in a survivor's cache. Drops after its last reply (a
round of evictions running ahead) are not in the log, but no role updates a row after ``n`` (the
step in flight never applies on a survivor, or the fast path is not taken), so the log's value of
such a row is still its latest. Recovery builds the model at ``n`` as servers' rows, overwritten
by the dead trainer's log, overwritten by the survivors' fresh cached and kept rows
(``bagpipe.lrpp.system``).

The cost is one copy of the step's singleton updates per step, in the reply (counted as ``data``
traffic by the wire), a ``[rows, D]`` tensor per trainer in the driver, and each trainer's copy
of a round's evicted replicas for about a round. The driver records a step's entries while the
trainers run the next step (:meth:`UpdateLogs.hold`), not between the two, when every trainer
waits for it. Logging every updated row instead, replicated ones included, sent 6.7 times the
bytes (592 against 88 kB a step, ``bagpipe.bench.fault``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

__all__ = ["LogEntry", "UpdateLog", "UpdateLogs"]


@dataclass(frozen=True)
class LogEntry:
    """One step's change to what a trainer alone may hold (``dropped`` applies first)."""

    dropped: torch.Tensor
    ids: torch.Tensor
    rows: torch.Tensor


class UpdateLog:
    """The driver's copy of one trainer's updated, still-held rows (module docstring)."""

    def __init__(self, total_rows: int, dim: int) -> None:
        self.rows = torch.zeros(total_rows, dim)
        self.held = torch.zeros(total_rows, dtype=torch.bool)

    def record(self, entry: LogEntry, updated_by_peers: list[torch.Tensor]) -> None:
        """This trainer's ``entry`` of a step, in which its peers updated ``updated_by_peers``
        alone (their entries' ids, disjoint from ``entry.ids``)."""
        for ids in (entry.dropped, *updated_by_peers):
            self.held.index_fill_(0, ids, False)
        self.rows.index_copy_(0, entry.ids, entry.rows)
        self.held.index_fill_(0, entry.ids, True)

    def overlay(self, table: torch.Tensor) -> int:
        """Write the logged rows into the flat row space ``table``; return how many."""
        ids = torch.nonzero(self.held).flatten()
        table[ids] = self.rows[ids]
        return int(ids.numel())


class UpdateLogs:
    """Every trainer's :class:`UpdateLog`, fed one step's entries at a time.

    :meth:`hold` keeps a step's entries and :meth:`flush` records them: the driver flushes once
    it has issued the next step, so the recording overlaps the trainers' work instead of holding
    every trainer between two steps. A log is read (:meth:`overlay`) with everything recorded.
    """

    def __init__(self, trainers: int, total_rows: int, dim: int) -> None:
        self.logs = [UpdateLog(total_rows, dim) for _ in range(trainers)]
        self._held: list[LogEntry] = []

    def hold(self, entries: list[LogEntry | None]) -> None:
        """Keep one step's entries (in trainer order; all ``None`` while the logs are paused),
        after recording those of the step before if they are still held."""
        self.flush()
        if all(entry is None for entry in entries):
            return
        if None in entries or len(entries) != len(self.logs):
            raise ValueError("a step's log entries come from every trainer or from none")
        self._held = [entry for entry in entries if entry is not None]

    def flush(self) -> float:
        """Record the entries held; returns the CPU seconds it took."""
        started_s = time.thread_time()
        held, self._held = self._held, []
        for k, (log, entry) in enumerate(zip(self.logs, held, strict=False)):
            log.record(entry, [peer.ids for j, peer in enumerate(held) if j != k])
        return time.thread_time() - started_s

    def overlay(self, trainer: int, table: torch.Tensor) -> int:
        """Trainer ``trainer``'s logged rows written into ``table`` (every entry recorded)."""
        self.flush()
        return self.logs[trainer].overlay(table)
