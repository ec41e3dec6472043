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
traffic by the wire), the held rows of every trainer in the driver, and each trainer's copy of a
round's evicted replicas for about a round. The driver keeps the entries as they arrive and
folds them into its logs a batch at a time, sorted by row, while the trainers run a step
(:meth:`UpdateLogs.compact`). Logging every updated row instead, replicated ones included, sent
6.7 times the bytes (592 against 88 kB a step, ``bagpipe.bench.fault``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

__all__ = ["FOLD_MIN_ROWS", "LogEntry", "UpdateLog", "UpdateLogs"]

#: The fewest rows the kept entries name before a fold (:class:`UpdateLogs`): a fold costs about a
#: millisecond of fixed work, so folding every few steps cost Bagpipe's driver 0.6 ms a step.
FOLD_MIN_ROWS = 1 << 14


@dataclass(frozen=True)
class LogEntry:
    """One step's change to what a trainer alone may hold (``dropped`` applies first)."""

    dropped: torch.Tensor
    ids: torch.Tensor
    rows: torch.Tensor


class UpdateLog:
    """The driver's copy of one trainer's updated, still-held rows (module docstring): ``ids``
    and their ``rows``, only those, so that it grows with what the trainer holds and not with
    the tables."""

    def __init__(self, dim: int) -> None:
        self.ids = torch.empty(0, dtype=torch.int64)
        self.rows = torch.empty(0, dim)

    def record(self, steps: list[tuple[LogEntry, list[torch.Tensor]]]) -> None:
        """Steps in order, each this trainer's entry and the ids its peers updated alone in that
        step (their entries' ids, disjoint from the entry's). A row ends held, with its logged
        value, if the last of these that names it is this trainer's update; the other events
        (dropped, updated by a peer) end it not held. A row they do not name stays as it was."""
        ids, held, values = [], [], []
        for entry, updated_by_peers in steps:
            for dropped in (entry.dropped, *updated_by_peers):
                ids.append(dropped.to(torch.int64))
                held.append(torch.zeros(dropped.numel(), dtype=torch.bool))
            ids.append(entry.ids.to(torch.int64))
            held.append(torch.ones(entry.ids.numel(), dtype=torch.bool))
            values.append(entry.rows.to(self.rows.dtype))
        if not ids:
            return
        events, is_held = torch.cat(ids), torch.cat(held)
        order = torch.sort(events, stable=True).indices  # by row, each row's events in order
        named, counts = torch.unique_consecutive(events[order], return_counts=True)
        last = order[torch.cumsum(counts, 0) - 1]  # each named row's last event
        kept = last[is_held[last]]
        value_of = torch.cumsum(is_held.to(torch.int64), 0) - 1  # a held event's row in values
        untouched = _absent_from(named, self.ids)
        self.ids = torch.cat([self.ids[untouched], events[kept]])
        self.rows = torch.cat([self.rows[untouched], torch.cat(values)[value_of[kept]]])

    def overlay(self, table: torch.Tensor) -> int:
        """Write the logged rows into the flat row space ``table``; return how many."""
        table[self.ids] = self.rows
        return int(self.ids.numel())


def _absent_from(sorted_ids: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Which of ``ids`` are not in ``sorted_ids`` (ascending, not empty)."""
    at = torch.searchsorted(sorted_ids, ids).clamp_(max=sorted_ids.numel() - 1)
    return sorted_ids[at] != ids


class UpdateLogs:
    """Every trainer's :class:`UpdateLog`, fed one step's entries at a time.

    :meth:`append` keeps a step's entries as they came (no copy); :meth:`compact` folds them into
    the logs, and the driver calls it once it has issued the next step, so that the work
    overlaps the trainers'. A fold copies every held row and has a fixed cost, so it waits until
    the entries kept name as many rows as a log holds, and at least ``fold_min_rows``: the work
    stays in proportion to the entries. A log is read (:meth:`overlay`) with every entry folded
    in.
    """

    def __init__(self, trainers: int, dim: int, fold_min_rows: int = FOLD_MIN_ROWS) -> None:
        self.logs = [UpdateLog(dim) for _ in range(trainers)]
        self.fold_min_rows = fold_min_rows
        self._kept: list[list[LogEntry]] = []
        self._kept_rows = 0  # rows the kept entries name

    def append(self, entries: list[LogEntry | None]) -> None:
        """Keep one step's entries (in trainer order; all ``None`` while the logs are paused)."""
        if all(entry is None for entry in entries):
            return
        if None in entries or len(entries) != len(self.logs):
            raise ValueError("a step's log entries come from every trainer or from none")
        step = [entry for entry in entries if entry is not None]
        self._kept.append(step)
        self._kept_rows += sum(e.ids.numel() + e.dropped.numel() for e in step)

    def compact(self, force: bool = False) -> float:
        """Fold the kept entries into the logs when due (class docstring) or ``force``; returns the
        CPU seconds it took."""
        due = max(self.fold_min_rows, *(log.ids.numel() for log in self.logs))
        if not self._kept or (self._kept_rows < due and not force):
            return 0.0
        started_s = time.thread_time()
        kept, self._kept, self._kept_rows = self._kept, [], 0
        for k, log in enumerate(self.logs):
            log.record([(step[k], [peer.ids for j, peer in enumerate(step) if j != k])
                        for step in kept])
        return time.thread_time() - started_s

    def overlay(self, trainer: int, table: torch.Tensor) -> int:
        """Trainer ``trainer``'s logged rows written into ``table`` (every entry folded in)."""
        self.compact(force=True)
        return self.logs[trainer].overlay(table)
