"""The trainer-side embedding cache of Bagpipe: logically replicated, physically partitioned (LRPP).

One :class:`TrainerCache` lives in every trainer. It holds embedding rows addressed by *global row id*
(``schema.table_offsets[f] + row``) in one ``[capacity, D]`` tensor::

    slot       0    1    2    3    4        capacity = 5, D = table_dim
    occupied   T    F    T    T    F        empty slots are a mask, never a -1 sentinel
    slot_id    17   .    3    42   .        global id held by each occupied slot
    stale      F    .    T    F    .        a row another trainer updated as a singleton

The id -> slot map is one ``int32`` tensor indexed by global id (``-1``: not resident), so a
lookup of N ids is one gather, an install writes its N entries and an eviction clears its own:
``O(N)`` each, no per-row Python, never a pass over every resident row while holding the lock the
training thread's reads and updates wait for. It grows (doubling) to cover the largest id ever
installed, so it costs 4 bytes per row of the row space: 1/D of the row's own bytes (D floats), on
the host beside the slot arrays. A sorted map (two tensors and ``searchsorted``) would cost
``O(log R)`` per id for R resident rows; at fig7's sizes (1.5k ids among 18k resident rows) that
binary search took 9x the gather's CPU on the 2-core machine, and a step looks up rows three times.

*Logically replicated*: every trainer holds every row the global batch uses in the current window and
applies the *summed* gradient of all trainers, so shared rows are bit-identical on all replicas.
*Physically partitioned*: a singleton row (used by one example and not again within the lookahead) is
fetched, held and updated only by the trainer that owns that example; a non-owner that happens to hold
an older copy marks it stale (:meth:`mark_stale`) and must not read it again until it is refetched
(the oracle evicts such rows at the first eligible round). The write-back of evicted rows is split by
``RoundPlan.writeback_owner``: each evicted row is written back by exactly one trainer, which holds its
final value (the fix of the original's write-back partition bug, reference §6 item 10).

All methods take a lock: the round-plan thread installs and evicts rows while the training thread
gathers and updates others. Operations are short vectorised tensor ops, so the lock is never held
across network time.

**Where it lives.** The rows are a :class:`~bagpipe.core.rowstore.RowStore` on the trainer's
device; the slot bookkeeping above stays on the host, where the round thread plans. The rows a
step reads (:meth:`read_for_step`) stay on the device; rows leave it only to be written back,
logged or snapshotted (:meth:`evict`, :meth:`gather`, :meth:`fresh`, :meth:`resident` return
host rows). A background install (the prefetch) goes on the store's side stream.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch

from bagpipe.core.device import HOST
from bagpipe.core.meter import Meter
from bagpipe.core.rowstore import RowStore


class CacheError(RuntimeError):
    """The cache was asked for something a correct plan never asks (a bug in the plan or its use)."""


@dataclass(frozen=True)
class Lookup:
    """Where ids live in the cache: ``slots[j]`` is meaningful only where ``found[j]``."""

    slots: torch.Tensor
    found: torch.Tensor


class TrainerCache:
    """Embedding rows of one trainer, addressed by global row id.

    Args:
        capacity: slots (rows). ``None`` starts small and doubles when an install needs more room
            (no capacity was planned for); an int is a hard limit and overflowing it is an error.
        dim: row width (the table dim of the model).
        dtype: row dtype.
        journal: keep the ids of rows evicted since the last :meth:`drain_dropped`, for a
            trainer that logs its rows elsewhere (``bagpipe.lrpp.updatelog``), when the trainer
            says (:meth:`journal_dropped`): once its write-back of them is acknowledged, so that
            its log keeps a row until a server has it. Rows marked stale are not journaled: the
            log learns them from the peer that updates them.
        device: where the rows live (the trainer's device).
        meter: where host<->device copies are charged (the trainer's Meter).
    """

    _INITIAL_UNBOUNDED_SLOTS = 1024

    def __init__(
        self, capacity: int | None, dim: int, dtype: torch.dtype = torch.float32,
        journal: bool = False, device: torch.device = HOST,
        meter: Meter | None = None,
    ) -> None:
        if capacity is not None and capacity <= 0:
            raise ValueError(f"cache capacity must be a positive number of rows, got {capacity}")
        self.capacity_limit = capacity
        self.dim = dim
        slots = capacity if capacity is not None else self._INITIAL_UNBOUNDED_SLOTS
        self.store = RowStore(slots, dim, dtype, device, meter)
        self.occupied = torch.zeros(slots, dtype=torch.bool)
        self.stale = torch.zeros(slots, dtype=torch.bool)
        self.slot_id = torch.zeros(slots, dtype=torch.int64)
        # Rows installed by a fetch and not read since: the first read of such a row is a "miss".
        self._fetched_unread = torch.zeros(slots, dtype=torch.bool)
        #: ``slot_of[id]``: the slot holding global row ``id``, ``-1`` where none does.
        self.slot_of = torch.empty(0, dtype=torch.int32)
        self._lock = threading.RLock()
        self._dropped: list[torch.Tensor] | None = [] if journal else None

    # ----------------------------------------------------------------------------- queries
    @property
    def num_slots(self) -> int:
        return self.store.num_slots

    def __len__(self) -> int:
        return int(self.occupied.sum())

    def lookup(self, ids: torch.Tensor) -> Lookup:
        """Slots of ``ids`` (any order, repeats allowed) and which of them are resident."""
        with self._lock:
            return self._lookup(ids)

    def contains(self, ids: torch.Tensor) -> torch.Tensor:
        return self.lookup(ids).found

    def gather(self, ids: torch.Tensor) -> torch.Tensor:
        """Host copies of the rows of ``ids`` ``[N, D]``; every id must be resident and fresh."""
        with self._lock:
            return self.store.read_to_host(self._require(ids, "gather"))

    def read_for_step(self, ids: torch.Tensor) -> tuple[torch.Tensor, int, int]:
        """Rows of unique ``ids`` for a training step, plus ``(hits, misses)``.

        A miss is the first read of a row since a fetch installed it (the row needed a fetch for
        this use); every later read of it is a hit (served by the cache alone). The rows are a new
        tensor on the cache's device, so the caller may build autograd on them while the cache is
        updated concurrently.
        """
        with self._lock:
            slots = self._require(ids, "read")
            misses = int(self._fetched_unread.index_select(0, slots).sum())
            self._fetched_unread.index_fill_(0, slots, False)
            return self.store.read(slots), ids.numel() - misses, misses

    def resident(self, include_stale: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """``(ids, host rows)`` of the cached rows, sorted by id; stale copies left out by default."""
        with self._lock:
            held = self.occupied if include_stale else self.occupied & ~self.stale
            slots = torch.nonzero(held).flatten()
            ids, order = torch.sort(self.slot_id[slots])
            return ids, self.store.read_to_host(slots[order])

    # ----------------------------------------------------------------------------- updates
    def install(self, ids: torch.Tensor, rows: torch.Tensor, background: bool = False) -> None:
        """Put fetched rows ``rows [N, D]`` for unique, non-resident ``ids`` into free slots
        (``background``: a prefetch, copied on the store's side stream)."""
        if ids.numel() == 0:
            return
        if rows.shape != (ids.numel(), self.dim):
            raise ValueError(f"install: rows {tuple(rows.shape)} for {ids.numel()} ids, dim {self.dim}")
        with self._lock:
            already = self._lookup(ids).found
            if bool(already.any()):
                present = ids[already][:5].tolist()
                raise CacheError(f"install: ids already resident, e.g. {present}")
            free = torch.nonzero(~self.occupied).flatten()
            if free.numel() < ids.numel():
                self._grow(ids.numel() - free.numel())
                free = torch.nonzero(~self.occupied).flatten()
            slots = free[: ids.numel()]
            self.store.write(slots, rows, background)
            self.occupied.index_fill_(0, slots, True)
            self.stale.index_fill_(0, slots, False)
            self._fetched_unread.index_fill_(0, slots, True)
            self.slot_id.index_copy_(0, slots, ids.to(torch.int64))
            self._map(ids, slots)

    def evict(
        self, ids: torch.Tensor, writeback: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Drop whichever of ``ids`` are resident; return the final rows of ``writeback`` (host)
        and the ids dropped.

        ``writeback`` (a subset of ``ids``: the rows this trainer writes back) must be resident and
        fresh here; the other ids may be absent (others' singletons are never fetched here) or
        stale. Reading and dropping happen under one lock, so no update can slip in between.
        The drops are journaled only by :meth:`journal_dropped` (``journal`` in the class).
        """
        with self._lock:
            rows = (
                self.store.read_to_host(self._require(writeback, "write back"))
                if writeback is not None
                else torch.zeros(0, self.dim, dtype=self.store.rows.dtype)
            )
            found = self._lookup(ids)
            slots = torch.masked_select(found.slots, found.found)
            dropped = self.slot_id.index_select(0, slots)
            for flags in (self.occupied, self.stale, self._fetched_unread):
                flags.index_fill_(0, slots, False)
            self.slot_of.index_fill_(0, dropped, -1)
            return rows, dropped

    def fresh(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(ids, host rows)`` of those of ``ids`` resident and fresh here (copies); the rest are
        left out."""
        with self._lock:
            found = self._lookup(ids)
            keep = found.found.clone()
            keep[found.found] = ~self.stale[found.slots[found.found]]
            return ids[keep].clone(), self.store.read_to_host(found.slots[keep])

    def apply_sgd(self, ids: torch.Tensor, grads: torch.Tensor, lr: float) -> None:
        """``row -= lr * grad`` for unique resident ``ids`` (the summed gradient of all trainers)."""
        if ids.numel() == 0:
            return
        with self._lock:
            slots = self._require(ids, "update")
            self.store.add_(slots, grads, alpha=-lr)

    def mark_stale(self, ids: torch.Tensor) -> int:
        """Flag resident copies of ``ids`` that another trainer updates alone (its singletons)."""
        with self._lock:
            found = self._lookup(ids)
            slots = torch.masked_select(found.slots, found.found)
            self.stale.index_fill_(0, slots, True)
            return int(slots.numel())

    def drain_dropped(self) -> torch.Tensor:
        """Ids of the rows journaled (evicted) since the last call (``journal=True``)."""
        with self._lock:
            if self._dropped is None:
                raise CacheError("drain_dropped: this cache keeps no journal")
            dropped, self._dropped = self._dropped, []
            return torch.cat(dropped) if dropped else torch.empty(0, dtype=torch.int64)

    def journal_dropped(self, ids: torch.Tensor) -> None:
        """Journal ``ids`` as dropped (rows :meth:`evict` dropped)."""
        with self._lock:
            if self._dropped is not None and ids.numel():
                self._dropped.append(ids.clone())

    # ----------------------------------------------------------------------------- internals

    def _lookup(self, ids: torch.Tensor) -> Lookup:
        ids = ids.to(torch.int64)
        if self.slot_of.numel() == 0:
            nowhere = torch.zeros_like(ids)
            return Lookup(nowhere, torch.zeros_like(ids, dtype=torch.bool))
        # An id past the map's end was never installed: it reads the last entry, found only if
        # the id is that entry's.
        last = self.slot_of.numel() - 1
        slots = self.slot_of.index_select(0, ids.clamp(max=last)).to(torch.int64)
        found = (slots >= 0) & (ids <= last)
        return Lookup(slots, found)

    def _require(self, ids: torch.Tensor, what: str) -> torch.Tensor:
        found = self._lookup(ids)
        if not bool(found.found.all()):
            missing = ids[~found.found][:5].tolist()
            raise CacheError(f"{what}: ids not resident, e.g. {missing} (plan not followed?)")
        slots = found.slots
        stale_here = self.stale.index_select(0, slots)
        if bool(stale_here.any()):
            stale = ids[stale_here][:5].tolist()
            raise CacheError(f"{what}: stale copies of other trainers' singletons, e.g. {stale}")
        return slots

    def _map(self, ids: torch.Tensor, slots: torch.Tensor) -> None:
        """Point the map's entries of non-resident ``ids`` at ``slots``, growing it (doubling) to
        cover the largest id."""
        needed = int(ids.max()) + 1
        if needed > self.slot_of.numel():
            grown = torch.full((max(needed, 2 * self.slot_of.numel()),), -1, dtype=torch.int32)
            grown[: self.slot_of.numel()] = self.slot_of
            self.slot_of = grown
        self.slot_of.index_copy_(0, ids.to(torch.int64), slots.to(torch.int32))

    def _grow(self, extra_slots: int) -> None:
        if self.capacity_limit is not None:
            raise CacheError(
                f"cache capacity {self.capacity_limit} rows exceeded by {extra_slots} rows "
                "(the oracle's plan should never need more; is cache_capacity the planner's?)"
            )
        new_slots = max(2 * self.num_slots, self.num_slots + extra_slots)
        grow = new_slots - self.num_slots
        self.store.grow(grow)
        self.occupied = torch.cat([self.occupied, self.occupied.new_zeros(grow)])
        self.stale = torch.cat([self.stale, self.stale.new_zeros(grow)])
        self._fetched_unread = torch.cat([self._fetched_unread, self._fetched_unread.new_zeros(grow)])
        self.slot_id = torch.cat([self.slot_id, self.slot_id.new_zeros(grow)])
