"""Replacement policies of HET's per-worker embedding cache: LRU, LFU and LFUOpt.

A policy only decides *which keys are resident*; the cache (``cache.py``) owns the rows. The
behaviour follows HET's C++ cache (Hsword/Hetu ``src/hetu_cache``), paraphrased:

* ``LRU``: a hit moves the key to the front; inserting into a full cache evicts the least recently
  used key.
* ``LFU``: a hit raises the key's use count by one; inserting into a full cache evicts the oldest
  key of the lowest-count bucket (before the new key, at count 1, is added, so it is never its own
  victim). Counts are unbounded.
* ``LFUOpt``: like LFU, but with ``levels`` (10) count levels: a key that would reach the top level
  moves to a *permanent* store and is never evicted. When every resident key is permanent, a new key
  is simply not cached (``insert`` returns ``admitted=False``).

Per-key Python structures are fine at harness scale: the cache calls a policy once per unique key
of a batch, and the tensor work around it is vectorised.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import OrderedDict
from dataclasses import dataclass
from typing import ClassVar

__all__ = [
    "POLICIES",
    "Admission",
    "CachePolicy",
    "LFUOptPolicy",
    "LFUPolicy",
    "LRUPolicy",
    "make_policy",
]


@dataclass(frozen=True)
class Admission:
    """The outcome of ``insert``: whether the new key is now resident, and whom it displaced."""

    admitted: bool
    victim: int | None = None


class CachePolicy(ABC):
    """Residency bookkeeping for at most ``capacity`` keys."""

    name: ClassVar[str]

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError(f"cache capacity must be >= 0, got {capacity}")
        self.capacity = capacity

    @abstractmethod
    def __contains__(self, key: int) -> bool: ...

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def touch(self, key: int) -> None:
        """Record a hit on resident ``key``."""

    @abstractmethod
    def insert(self, key: int) -> Admission:
        """Make non-resident ``key`` resident if the policy allows, evicting at most one key."""


class LRUPolicy(CachePolicy):
    """Least recently used: an ``OrderedDict`` whose first key is the next victim."""

    name = "lru"

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self._order: OrderedDict[int, None] = OrderedDict()

    def __contains__(self, key: int) -> bool:
        return key in self._order

    def __len__(self) -> int:
        return len(self._order)

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


class LFUPolicy(CachePolicy):
    """Least frequently used, ties broken by age within the count bucket."""

    name = "lfu"

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self._counts = _CountBuckets()

    def __contains__(self, key: int) -> bool:
        return key in self._counts.count_of

    def __len__(self) -> int:
        return len(self._counts.count_of)

    def use_count(self, key: int) -> int:
        return self._counts.count_of[key]

    def touch(self, key: int) -> None:
        self._counts.add(key, self._counts.remove(key) + 1)

    def insert(self, key: int) -> Admission:
        if self.capacity == 0:
            return Admission(admitted=False)
        victim = None
        if len(self) >= self.capacity:
            victim = self._counts.pop_oldest_of_lowest()
        self._counts.add(key, 1)
        return Admission(admitted=True, victim=victim)


class LFUOptPolicy(CachePolicy):
    """LFU with ``levels`` count levels; keys reaching the top level become permanent."""

    name = "lfuopt"

    def __init__(self, capacity: int, levels: int = 10) -> None:
        super().__init__(capacity)
        if levels < 1:
            raise ValueError(f"lfuopt levels must be >= 1, got {levels}")
        self.levels = levels
        self._counts = _CountBuckets()  # levels 0 .. levels-1, evictable
        self.permanent: set[int] = set()

    def __contains__(self, key: int) -> bool:
        return key in self.permanent or key in self._counts.count_of

    def __len__(self) -> int:
        return len(self.permanent) + len(self._counts.count_of)

    def touch(self, key: int) -> None:
        if key in self.permanent:
            return
        level = self._counts.remove(key) + 1
        if level >= self.levels:
            self.permanent.add(key)
        else:
            self._counts.add(key, level)

    def insert(self, key: int) -> Admission:
        if self.capacity == 0:
            return Admission(admitted=False)
        victim = None
        if len(self) >= self.capacity:
            if not self._counts.count_of:
                return Admission(admitted=False)
            victim = self._counts.pop_oldest_of_lowest()
        self._counts.add(key, 0)
        return Admission(admitted=True, victim=victim)


POLICIES: dict[str, type[CachePolicy]] = {
    policy.name: policy for policy in (LRUPolicy, LFUPolicy, LFUOptPolicy)
}


def make_policy(name: str, capacity: int) -> CachePolicy:
    """The policy called ``name`` (``lru``, ``lfu``, ``lfuopt``) with room for ``capacity`` keys."""
    if name not in POLICIES:
        raise ValueError(
            f"het.policy: unknown cache policy {name!r}; choose one of {sorted(POLICIES)}"
        )
    return POLICIES[name](capacity)
