"""The oracle cacher's output: per-step sync plans and per-round cache plans.

All ids are *global row ids* (``schema.table_offsets[f] + row``, see ``bagpipe.core.batch``), int64,
sorted ascending, unique. ``T`` is the number of trainers; trainer ``k`` trains on examples
``k*B/T .. (k+1)*B/T - 1`` of every global batch of ``B`` examples.

Time line (``ci`` = cleanup interval, round ``r`` covers steps ``[r*ci, (r+1)*ci)``)::

    steps of round r-1 run ........|  steps of round r run .......|
    ^ round plan r starts here,      ^ step r*ci waits until round r's prefetch is installed
      in the background (evict, write back, barrier, prefetch)

Per-step plan (:class:`StepPlan`), for global batch ``i`` with unique ids ``U_i``:

* ``sync_now``   = ``U_i ∩ U_{i+1}``: gradients all-reduced *before* step ``i+1`` (critical path);
* ``singleton``  = ids used by exactly one example of batch ``i`` and not again in ``(i, i+L]``: only
  the trainer owning that example (``singleton_owner``) updates them; never all-reduced;
* ``sync_later`` = the rest of ``U_i``: all-reduced in the background, the summed gradient applied
  at step ``i+1``'s optimizer step (invisible, since they are not used at ``i+1``).

Per-round plan (:class:`RoundPlan`) ``r``, executed in the background while round ``r-1`` trains:

* ``evict``: rows to drop after their final value is known. Every evicted row's last use was at a
  step ``<= (r-1)*ci - 2`` (so its delayed sync-later update was applied by step ``(r-1)*ci - 1``).
  ``writeback_owner[j]`` is the one trainer that writes row ``evict[j]`` back to the embedding
  servers: the owner of its last use if that use was a singleton use, otherwise the rows are dealt
  to trainers in disjoint sorted chunks. Each evicted row is written back exactly once.
* ``prefetch``: rows needed by steps of round ``r`` that are not resident; ``prefetch_owner[j]`` is
  ``-1`` when every trainer fetches the row (logically replicated) or ``k`` when only trainer ``k``
  needs it (a row whose only use in the round is a singleton use by trainer ``k``: physically
  partitioned). Fetches of round ``r`` happen after every trainer's write-backs of round ``r`` (the
  read-after-write barrier), so a refetch never sees a stale row.
* A row whose most recent use was a singleton use is stale on the non-owners (if ``T > 1``); it is
  evicted at the
  first round at which it is eligible, even if it will be used again later (and refetched after the
  barrier if round ``r`` uses it).
* Without a capacity, the other evictions are expired leases: rows not used within ``L`` steps after
  their latest use (a row that round ``r`` itself uses is kept instead of evicted and refetched).
* The resident set (the union of the rows any trainer holds: the shared rows, held by all, plus each
  trainer's own partitioned rows) never exceeds ``capacity`` rows, so no trainer needs more slots.
  With a capacity, rows stay resident while they fit (a refetch costs more than a kept row) and are
  evicted to make room by Belady's rule (furthest next use first, next uses beyond the planner's
  horizon ``last_step + L`` counting as never; ties: larger id first). When the rows used by steps
  ``(r-1)*ci - 1 .. last_step`` (rounds ``r-1`` and ``r`` plus the step whose delayed update is
  pending) alone exceed it, planning fails with :class:`CapacityError`, whose message gives the
  minimum capacity.
* After the last round, a flush plan (``round_index`` = number of rounds, ``first_step`` = number of
  steps > ``last_step``, no prefetch) evicts every resident row with its write-back owner, so that
  the servers hold the final tables; apply it after the last step's delayed update.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


class CapacityError(ValueError):
    """The cache cannot hold the rows two consecutive rounds need at once.

    ``min_capacity`` is the number of rows this round needs at once: the smallest capacity that
    lets it plan (later rounds may need more).
    """

    def __init__(self, message: str, min_capacity: int) -> None:
        super().__init__(message)
        self.min_capacity = min_capacity


@dataclass(frozen=True)
class StepPlan:
    """How the gradients of global batch ``step`` are synchronised (see module docstring)."""

    step: int
    sync_now: torch.Tensor
    sync_later: torch.Tensor
    singleton: torch.Tensor
    singleton_owner: torch.Tensor


@dataclass(frozen=True)
class RoundPlan:
    """Evictions and prefetches of round ``round_index`` (steps ``first_step .. last_step``)."""

    round_index: int
    first_step: int
    last_step: int
    evict: torch.Tensor
    writeback_owner: torch.Tensor
    prefetch: torch.Tensor
    prefetch_owner: torch.Tensor

    def prefetch_for(self, trainer: int) -> torch.Tensor:
        """The rows trainer ``trainer`` fetches this round."""
        keep = (self.prefetch_owner == -1) | (self.prefetch_owner == trainer)
        return self.prefetch[keep]

    def writeback_for(self, trainer: int) -> torch.Tensor:
        """The evicted rows trainer ``trainer`` writes back this round."""
        return self.evict[self.writeback_owner == trainer]
