"""The rows a Bagpipe trainer wrote back, logged on its side, so that a dead server shard can be
rebuilt in place.

A shard holds the only copy of a row that no trainer caches: its value is the row's latest
write-back, or, if it was written back in no round since the driver's *base* (the model of the
last ``full_state``, i.e. the newest checkpoint, or the model the roles were started from), its
value in the base. So the driver rebuilds a dead shard's rows as::

    the base's rows of the shard, overwritten by every trainer's logged write-backs to the shard
    in round order, overwritten by the trainers' fresh cached rows

Why round order is enough: a row is written back by one trainer per round (its designated
writer), and a later write-back of it is a later round. A logged write-back older than the base
is harmless too: if the row was updated since, it is either still in some trainer's cache (the
last overlay) or was written back again in a later round. So the log is only trimmed, to the
entries logged before the base was taken, to bound its memory.

The cost is a reference to rows the trainer sent anyway (no bytes on the wire), kept until the
next ``full_state``.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch

__all__ = ["WriteBack", "WritebackLog", "replay_write_backs"]


@dataclass(frozen=True)
class WriteBack:
    """Round ``round_index``'s final values of evicted rows ``ids`` sent to shard ``shard``."""

    round_index: int
    shard: int
    ids: torch.Tensor
    rows: torch.Tensor


class WritebackLog:
    """One trainer's write-backs, in the order sent (the round's shard threads append at once)."""

    def __init__(self) -> None:
        self._entries: list[WriteBack] = []
        self._trimmed = 0  # entries dropped from the front so far (marks count from the start)
        self._lock = threading.Lock()

    def append(self, entry: WriteBack) -> None:
        with self._lock:
            self._entries.append(entry)

    def mark(self) -> int:
        """A position: every entry logged so far is before it (see :meth:`trim`)."""
        with self._lock:
            return self._trimmed + len(self._entries)

    def trim(self, mark: int) -> None:
        """Drop the entries logged before ``mark``: the base taken after it holds them."""
        with self._lock:
            drop = max(0, mark - self._trimmed)
            self._entries = self._entries[drop:]
            self._trimmed += drop

    def to_shard(self, shard: int) -> list[WriteBack]:
        with self._lock:
            return [entry for entry in self._entries if entry.shard == shard]


def replay_write_backs(table: torch.Tensor, entries: list[WriteBack]) -> None:
    """Overwrite rows of the flat row space ``table`` with ``entries`` (from any trainers) in
    round order, so that each row ends with its latest write-back (module docstring)."""
    for entry in sorted(entries, key=lambda e: e.round_index):
        table[entry.ids] = entry.rows
