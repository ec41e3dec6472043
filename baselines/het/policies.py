"""Replacement policies of HET's per-worker embedding cache: LRU, LFU and LFUOpt, as tensors.

A policy only decides *which keys are resident*; the cache (``cache.py``) owns the rows. The
behaviour follows HET's C++ cache (Hsword/Hetu ``src/hetu_cache``), paraphrased:

* ``LRU``: a hit moves the key to the front of a list; inserting into a full cache evicts the key at
  the back (the least recently used).
* ``LFU``: keys sit in per-count buckets, each a list in arrival order. A hit moves the key from its
  bucket to the back of the next one; inserting into a full cache evicts the oldest key of the
  lowest-count bucket *before* the new key is added at count 1 (so a key is never its own victim).
  Counts are unbounded.
* ``LFUOpt``: like LFU, but a new key starts at level 0 and there are ``levels`` (10) levels: a key
  that would reach the top level moves to a *permanent* store and is never evicted. When every
  resident key is permanent, a new key is simply not cached.

HET does this with linked lists and hash maps in C++, one key at a time. Doing the same in Python
costs a dict operation per key per step, which would make HET look slow for a reason of ours. Here
each table's policy is four arrays over its ``capacity`` *ways* (the table's cache lines; ways
``0 .. size-1`` are resident, since a way is only ever freed to be refilled at once)::

    keys     the key in each way
    counts   LFU's use count / LFUOpt's level (LRU: always 0)
    stamps   a per-policy clock value, taken when the key last entered its list or bucket
    pinned   LFUOpt's permanent store

A list or bucket in arrival order is then "the ways of that count, by stamp". HET's victim is the
way with the smallest ``(count, stamp)`` among the unpinned ones; LRU is the case where every count
is 0. A batch of hits (:meth:`CachePolicy.hit`) and a batch of inserts (:meth:`CachePolicy.admit`)
take consecutive stamps in batch order, which is the order HET visits them one by one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

__all__ = [
    "POLICIES",
    "Admission",
    "CachePolicy",
    "LFUOptPolicy",
    "LFUPolicy",
    "LRUPolicy",
    "Placement",
    "make_policy",
]

_NEVER = torch.iinfo(torch.int64).max  # a stamp that sorts after every real one


def _none() -> torch.Tensor:
    return torch.empty(0, dtype=torch.int64)


@dataclass(frozen=True)
class Admission:
    """The outcome of a one-key ``insert``: whether the key is now resident, and whom it displaced."""

    admitted: bool
    victim: int | None = None


@dataclass(frozen=True)
class Placement:
    """What admitting one batch of new keys did to a table, as if inserted one by one in order.

    ``resident`` indexes the batch keys resident afterwards; ``ways`` are their lines. ``victims``
    are the previously resident keys evicted, in eviction order, ``victim_ways`` the lines they
    left (now in ``ways``) and ``triggers`` the batch index of the key whose insertion evicted each.
    ``evicted_new`` batch keys were admitted and then evicted by a later key of the same batch (they
    are the first ones); ``refused`` batch keys were not admitted at all.
    """

    resident: torch.Tensor
    ways: torch.Tensor
    victims: torch.Tensor
    victim_ways: torch.Tensor
    triggers: torch.Tensor
    evicted_new: int = 0
    refused: int = 0

    @classmethod
    def refusing(cls, count: int) -> Placement:
        """A batch of ``count`` keys none of which is cached (no room, nothing evictable)."""
        return cls(_none(), _none(), _none(), _none(), _none(), refused=count)


class CachePolicy:
    """Residency bookkeeping for at most ``capacity`` keys of one table (see the module docstring).

    Subclasses set the rule: ``insert_count`` (where a new key enters), ``counts_hits`` (whether a
    hit raises the count) and ``levels`` (the count at which a key becomes permanent, if any).
    """

    name: ClassVar[str]
    insert_count: ClassVar[int]
    counts_hits: ClassVar[bool]
    levels: int | None = None

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError(f"cache capacity must be >= 0, got {capacity}")
        self.capacity = capacity
        self.size = 0
        self.clock = 0
        self.keys = torch.full((capacity,), -1, dtype=torch.int64)
        self.counts = torch.zeros(capacity, dtype=torch.int64)
        self.stamps = torch.zeros(capacity, dtype=torch.int64)
        self.pinned = torch.zeros(capacity, dtype=torch.bool)

    def __contains__(self, key: int) -> bool:
        return bool((self.keys[: self.size] == key).any())

    def __len__(self) -> int:
        return self.size

    @property
    def permanent(self) -> set[int]:
        """The keys in LFUOpt's permanent store (never evicted)."""
        return set(self.keys[: self.size][self.pinned[: self.size]].tolist())

    def _ticks(self, count: int) -> torch.Tensor:
        """``count`` consecutive stamps, newer than every stamp handed out so far."""
        ticks = torch.arange(self.clock, self.clock + count)
        self.clock += count
        return ticks

    # -- batch operations (the cache's hot path) -------------------------------------------

    def hit(self, ways: torch.Tensor) -> None:
        """Record one hit on each of the distinct resident ``ways``, in the order given.

        Each way moves to the back of its list (LRU) or of the next count's bucket (LFU, LFUOpt);
        an LFUOpt key reaching ``levels`` is pinned. A pinned key's stamp no longer matters.
        """
        self.stamps[ways] = self._ticks(len(ways))
        if not self.counts_hits:
            return
        live = ways[~self.pinned[ways]]
        self.counts[live] += 1
        if self.levels is not None:
            self.pinned[live[self.counts[live] >= self.levels]] = True

    def admit(self, keys: torch.Tensor) -> Placement:
        """Insert the distinct non-resident ``keys`` as HET would one at a time, in the order given.

        The first ``capacity - size`` keys take free ways. Each later key first evicts the
        ``(count, stamp)``-smallest unpinned resident, which may be a key of this very batch: see
        :meth:`_old_victims` for which evictions hit keys resident before the batch.
        """
        free = self.capacity - self.size
        if not len(keys) or self.capacity == 0 or (free == 0 and bool(self.pinned.all())):
            return Placement.refusing(len(keys))
        fill = min(free, len(keys))
        victim_ways = self._old_victims(len(keys) - fill, fill)
        evicted_new = len(keys) - fill - len(victim_ways)
        resident = torch.arange(evicted_new, len(keys))
        ways = torch.cat([torch.arange(self.size, self.size + fill), victim_ways])
        victims = self.keys[victim_ways]
        self.keys[ways] = keys[resident]
        self.counts[ways] = self.insert_count
        self.stamps[ways] = self._ticks(len(keys))[resident]
        self.pinned[ways] = False
        self.size += fill
        triggers = fill + torch.arange(len(victim_ways))
        return Placement(resident, ways, victims, victim_ways, triggers, evicted_new)

    def _old_victims(self, evictions: int, fill: int) -> torch.Tensor:
        """The ways of previously resident keys among a batch's ``evictions``, in eviction order.

        A new key enters at ``insert_count`` with the newest stamp: after every old key of that
        count (the *lowest* bucket, as no count is below it) and before every old key of a higher
        one. So the evictions take the lowest bucket's old keys oldest first, and once those are
        gone, the batch's own keys in order (the oldest of them always ranks first). The exception:
        when no key went into a free way and the lowest bucket holds no old key, the first new key
        is not yet resident at the first eviction, which takes the smallest unpinned old key of a
        higher count (``pop_oldest_of_lowest`` in HET); the batch's keys follow.
        """
        if evictions == 0:
            return _none()
        evictable = ~self.pinned[: self.size]
        lowest = evictable & (self.counts[: self.size] == self.insert_count)
        available = int(lowest.sum())
        if available == 0 and fill == 0:
            return self._smallest_unpinned(evictable)
        stamps = torch.where(lowest, self.stamps[: self.size], _NEVER)
        return torch.topk(stamps, min(available, evictions), largest=False).indices

    def _smallest_unpinned(self, evictable: torch.Tensor) -> torch.Tensor:
        """The way of the oldest key in the lowest nonempty bucket (one element)."""
        ways = torch.nonzero(evictable).flatten()
        counts = self.counts[ways]
        ways = ways[counts == counts.min()]
        return ways[self.stamps[ways].argmin()].view(1)

    # -- one key at a time (examples and tests) --------------------------------------------

    def _way_of(self, key: int) -> torch.Tensor:
        ways = torch.nonzero(self.keys[: self.size] == key).flatten()
        if not len(ways):
            raise KeyError(key)
        return ways

    def touch(self, key: int) -> None:
        """Record a hit on resident ``key``."""
        self.hit(self._way_of(key))

    def insert(self, key: int) -> Admission:
        """Make non-resident ``key`` resident if the policy allows, evicting at most one key."""
        placement = self.admit(torch.tensor([key]))
        victims = placement.victims.tolist()
        return Admission(admitted=placement.refused == 0, victim=victims[0] if victims else None)


class LRUPolicy(CachePolicy):
    """Least recently used: the victim is the way with the oldest stamp."""

    name = "lru"
    insert_count = 0
    counts_hits = False


class LFUPolicy(CachePolicy):
    """Least frequently used, ties broken by arrival in the count bucket; new keys at count 1."""

    name = "lfu"
    insert_count = 1
    counts_hits = True

    def use_count(self, key: int) -> int:
        return int(self.counts[self._way_of(key)])


class LFUOptPolicy(CachePolicy):
    """LFU with ``levels`` count levels from 0; a hit at the top level pins the key for good."""

    name = "lfuopt"
    insert_count = 0
    counts_hits = True

    def __init__(self, capacity: int, levels: int = 10) -> None:
        super().__init__(capacity)
        if levels < 1:
            raise ValueError(f"lfuopt levels must be >= 1, got {levels}")
        self.levels = levels


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
