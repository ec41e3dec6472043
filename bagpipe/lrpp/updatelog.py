"""The rows a Bagpipe trainer alone may hold, logged where its death cannot lose them.

A trainer's cache holds the only fresh copy of some rows: its partitioned singletons with
updates not yet written back, and replicated rows whose other holders dropped them without a
write-back (the trainer is their designated writer). When the trainer dies, those values are
gone with it unless they are kept elsewhere. With logging on (``Bagpipe(standby_trainers=...)``),
every step's reply carries, besides the loss, the trainer's :class:`LogEntry`: the rows it
updated in the step (ids and new values) and the rows it dropped since its previous reply
(evicted, or marked stale because another trainer updates them alone). The driver keeps one
:class:`UpdateLog` per trainer: the latest value of each row the trainer updated and still holds.

Why this is exact at a step boundary ``n`` (the last step every trainer replied to): a row the
dead trainer still held fresh at ``n`` is in its log with its value after ``n``; a row it dropped
by ``n`` is out of the log, and its value is on a server or in a survivor's cache. Drops after
its last reply (a round of evictions running ahead) are not in the log, but no role updates a
row after ``n`` (the step in flight never applies on a survivor, or the fast path is not taken),
so the log's value of such a row is still its latest. Recovery builds the model at ``n`` as
servers' rows, overwritten by the dead trainer's log, overwritten by the survivors' fresh cached
rows (``bagpipe.lrpp.system``).

The cost is one copy of the updated rows per step, in the reply (counted as ``data`` traffic by
the wire), and a ``[rows, D]`` tensor per trainer in the driver.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["LogEntry", "UpdateLog"]


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

    def record(self, entry: LogEntry) -> None:
        self.held[entry.dropped] = False
        self.rows[entry.ids] = entry.rows
        self.held[entry.ids] = True

    def overlay(self, table: torch.Tensor) -> int:
        """Write the logged rows into the flat row space ``table``; return how many."""
        ids = torch.nonzero(self.held).flatten()
        table[ids] = self.rows[ids]
        return int(ids.numel())
