"""The executable spec of HET's cache policies: the per-key Python version the tensors replaced.

Each policy handles one key at a time with ``OrderedDict``s, as HET's C++ cache does with lists and
hash maps; :class:`ReferenceHetCache` is :class:`~baselines.het.cache.HetCache` with its policy work
(hits, inserts, evictions) done by these, one key at a time in the batch's order. The randomized
tests in ``test_het_cache.py`` drive both caches side by side and require identical results.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import OrderedDict
from typing import Any, ClassVar

import torch

from baselines.het.cache import HetCache
from baselines.het.policies import Admission

__all__ = ["REFERENCE_POLICIES", "ReferenceHetCache", "ReferenceLFUOpt"]


class ReferencePolicy(ABC):
    """Residency bookkeeping for at most ``capacity`` keys."""

    name: ClassVar[str]

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity

    @abstractmethod
    def resident(self) -> set[int]:
        """The resident keys."""

    @abstractmethod
    def touch(self, key: int) -> None:
        """Record a hit on resident ``key``."""

    @abstractmethod
    def insert(self, key: int) -> Admission:
        """Make non-resident ``key`` resident if the policy allows, evicting at most one key."""

    @property
    def permanent(self) -> set[int]:
        return set()


class ReferenceLRU(ReferencePolicy):
    """Least recently used: an ``OrderedDict`` whose first key is the next victim."""

    name = "lru"

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self._order: OrderedDict[int, None] = OrderedDict()

    def resident(self) -> set[int]:
        return set(self._order)

    def touch(self, key: int) -> None:
        self._order.move_to_end(key)

    def insert(self, key: int) -> Admission:
        if self.capacity == 0:
            return Admission(admitted=False)
        victim = None
        if len(self._order) >= self.capacity:
            victim, _ = self._order.popitem(last=False)
        self._order[key] = None
        return Admission(admitted=True, victim=victim)


class _CountBuckets:
    """Keys grouped by use count; within a bucket the first key is the oldest arrival."""

    def __init__(self) -> None:
        self.count_of: dict[int, int] = {}
        self.buckets: dict[int, OrderedDict[int, None]] = {}

    def add(self, key: int, count: int) -> None:
        self.count_of[key] = count
        self.buckets.setdefault(count, OrderedDict())[key] = None

    def remove(self, key: int) -> int:
        count = self.count_of.pop(key)
        bucket = self.buckets[count]
        del bucket[key]
        if not bucket:
            del self.buckets[count]
        return count

    def pop_oldest_of_lowest(self) -> int:
        lowest = min(self.buckets)
        key = next(iter(self.buckets[lowest]))
        self.remove(key)
        return key


class ReferenceLFU(ReferencePolicy):
    """Least frequently used, ties broken by age within the count bucket."""

    name = "lfu"

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.counts = _CountBuckets()

    def resident(self) -> set[int]:
        return set(self.counts.count_of)

    def touch(self, key: int) -> None:
        self.counts.add(key, self.counts.remove(key) + 1)

    def insert(self, key: int) -> Admission:
        if self.capacity == 0:
            return Admission(admitted=False)
        victim = None
        if len(self.counts.count_of) >= self.capacity:
            victim = self.counts.pop_oldest_of_lowest()
        self.counts.add(key, 1)
        return Admission(admitted=True, victim=victim)


class ReferenceLFUOpt(ReferencePolicy):
    """LFU with ``levels`` count levels; keys reaching the top level become permanent."""

    name = "lfuopt"

    def __init__(self, capacity: int, levels: int = 10) -> None:
        super().__init__(capacity)
        self.levels = levels
        self.counts = _CountBuckets()  # levels 0 .. levels-1, evictable
        self.pinned: set[int] = set()

    @property
    def permanent(self) -> set[int]:
        return set(self.pinned)

    def resident(self) -> set[int]:
        return self.pinned | set(self.counts.count_of)

    def touch(self, key: int) -> None:
        if key in self.pinned:
            return
        level = self.counts.remove(key) + 1
        if level >= self.levels:
            self.pinned.add(key)
        else:
            self.counts.add(key, level)

    def insert(self, key: int) -> Admission:
        if self.capacity == 0:
            return Admission(admitted=False)
        victim = None
        if len(self.pinned) + len(self.counts.count_of) >= self.capacity:
            if not self.counts.count_of:
                return Admission(admitted=False)
            victim = self.counts.pop_oldest_of_lowest()
        self.counts.add(key, 0)
        return Admission(admitted=True, victim=victim)


REFERENCE_POLICIES: dict[str, type[ReferencePolicy]] = {
    policy.name: policy for policy in (ReferenceLRU, ReferenceLFU, ReferenceLFUOpt)
}


class ReferenceHetCache(HetCache):
    """:class:`HetCache` with hits, inserts and evictions done one key at a time, in batch order.

    Lines come from one free list over all tables (the cache before vectorisation), so slots differ
    from :class:`HetCache`'s; everything observable through keys must not.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """Arguments as :class:`HetCache`'s; each table gets the reference twin of its policy."""
        super().__init__(*args, **kwargs)
        self.reference = [REFERENCE_POLICIES[p.name](p.capacity) for p in self.policies]
        self._free_slots = list(range(self.capacity - 1, -1, -1))

    def _touch(self, slots: torch.Tensor) -> None:
        keys = self.key_of_slot()[slots]
        for key, table in zip(keys.tolist(), self._table_of(keys).tolist(), strict=True):
            self.reference[table].touch(key)

    def _insert(self, keys: torch.Tensor, rows: torch.Tensor, versions: torch.Tensor) -> None:
        placed: dict[int, tuple[int, int]] = {}  # key -> (slot, index into keys)
        for index, (key, table) in enumerate(
            zip(keys.tolist(), self._table_of(keys).tolist(), strict=True)
        ):
            admission = self.reference[table].insert(key)
            if admission.victim is not None:
                self._evict_one(admission.victim, placed)
            if not admission.admitted:
                self.stats["not_admitted"] += 1
                continue
            slot = self._free_slots.pop()
            self.slot_of[key] = slot
            placed[key] = (slot, index)
        if placed:
            slots, indices = (torch.tensor(v) for v in zip(*placed.values(), strict=True))
            self.values.write(slots, rows[indices])
            self.version[slots] = versions[indices]
            self.pending.zero_(slots)
            self.updates[slots] = 0

    def _evict_one(self, victim: int, placed: dict[int, tuple[int, int]]) -> None:
        slot = int(self.slot_of[victim])
        self.slot_of[victim] = -1
        self._free_slots.append(slot)
        if placed.pop(victim, None) is None and int(self.updates[slot]) > 0:
            self._evicted.append(
                (
                    torch.tensor([victim]),
                    self.pending.read_to_host(torch.tensor([slot])),
                    self.updates[slot : slot + 1].clone(),
                )
            )
            self.stats["evictions_dirty"] += 1
        else:
            self.stats["evictions_clean"] += 1
