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

HET does this in C++ with linked lists and hash maps, one key at a time, one cache per table. The
same in Python costs a dict operation per key per step, which would make HET look slow for a reason
of ours. Here the state of every table of a cache is a few arrays over its *lines* (table ``t``
owns lines ``line_offsets[t] ..``; its resident keys fill the first ``sizes[t]`` of them, since a
line is only ever freed to be refilled at once)::

    keys      the key on each line
    counts    LFU's use count / LFUOpt's level (LRU: always 0)
    stamps    a clock value, taken when the key last entered its list or bucket
    pinned    LFUOpt's permanent store
    resident  whether the line holds a key

A list or bucket in arrival order is then "the lines of that count, by stamp"; HET's victim is the
unpinned line with the smallest ``(count, stamp)`` (LRU: every count is 0). The three policies
differ only in a :class:`Rule`. A batch of hits (:meth:`PolicyState.hit`) or inserts
(:meth:`PolicyState.admit`) over all tables at once takes consecutive stamps in batch order, the
order HET visits them in. It costs a fixed number of tensor operations, plus one ``topk`` per table
that evicts; none per key.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
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
    "PolicyState",
    "Rule",
    "TablePolicies",
    "make_policy",
]

_UNBOUNDED = torch.iinfo(torch.int64).max


def _none() -> torch.Tensor:
    return torch.empty(0, dtype=torch.int64)


def _group_starts(counts: torch.Tensor) -> torch.Tensor:
    """Where each group starts in a list sorted by group, given the groups' sizes."""
    return counts.cumsum(0) - counts


@dataclass(frozen=True)
class Rule:
    """How a policy counts: where a new key enters, what a hit adds, and the level that pins."""

    insert_count: int
    hit_increment: int
    levels: int | None = None


@dataclass(frozen=True)
class Admission:
    """The outcome of a one-key ``insert``: whether the key is now resident, and whom it displaced."""

    admitted: bool
    victim: int | None = None


@dataclass(frozen=True)
class Placement:
    """What inserting a batch of new keys did, as if inserted one by one in the order given.

    ``resident`` indexes the batch keys resident afterwards; ``lines`` are their lines. ``victims``
    are the previously resident keys evicted, in eviction order, ``victim_lines`` the lines they
    left (all in ``lines`` now) and ``triggers`` the batch index of the key whose insertion evicted
    each. ``evicted_new`` batch keys were admitted and then evicted by a later key of their table in
    the same batch; ``refused`` batch keys were not admitted at all.
    """

    resident: torch.Tensor
    lines: torch.Tensor
    victims: torch.Tensor
    victim_lines: torch.Tensor
    triggers: torch.Tensor
    evicted_new: int
    refused: int


@dataclass(frozen=True)
class _Plan:
    """Per table, for one batch: keys wanted, admitted or not, free lines filled, evictions."""

    wanted: torch.Tensor
    admits: torch.Tensor
    fill: torch.Tensor
    old: torch.Tensor  # evictions that take a key resident before the batch
    evicted_new: torch.Tensor  # evictions that take one of the batch's own keys
    skips_lowest: torch.Tensor  # the lowest bucket holds no old key: the one old victim is above


class PolicyState:
    """The replacement state of a set of tables, one :class:`Rule` each (module docstring)."""

    def __init__(self, capacities: Sequence[int], rules: Sequence[Rule]) -> None:
        if any(c < 0 for c in capacities):
            raise ValueError(f"cache capacities must be >= 0, got {list(capacities)}")
        self.capacities = torch.tensor(list(capacities), dtype=torch.int64)
        self.line_offsets = _group_starts(self.capacities)
        self._blocks = [
            (int(a), int(a + c)) for a, c in zip(self.line_offsets, self.capacities, strict=True)
        ]
        lines = int(self.capacities.sum())
        self.table_of_line = torch.repeat_interleave(torch.arange(len(capacities)), self.capacities)
        self.sizes = torch.zeros(len(capacities), dtype=torch.int64)
        self.keys = torch.full((lines,), -1, dtype=torch.int64)
        self.counts = torch.zeros(lines, dtype=torch.int64)
        self.stamps = torch.zeros(lines, dtype=torch.int64)
        self.pinned = torch.zeros(lines, dtype=torch.bool)
        self.resident = torch.zeros(lines, dtype=torch.bool)
        self.clock = 0
        # each line's rule, so that the hot path reads it with the line's state
        self.entry_counts = torch.zeros(lines, dtype=torch.int64)
        self.hit_increments = torch.zeros(lines, dtype=torch.int64)
        self.levels = torch.zeros(lines, dtype=torch.int64)
        for table, rule in enumerate(rules):
            self.set_rule(table, rule)

    def set_rule(self, table: int, rule: Rule) -> None:
        block = slice(*self._blocks[table])
        self.entry_counts[block] = rule.insert_count
        self.hit_increments[block] = rule.hit_increment
        self.levels[block] = _UNBOUNDED if rule.levels is None else rule.levels

    def _ticks(self, count: int) -> torch.Tensor:
        """``count`` consecutive stamps, newer than every stamp handed out so far."""
        ticks = torch.arange(self.clock, self.clock + count)
        self.clock += count
        return ticks

    def hit(self, lines: torch.Tensor) -> None:
        """Record one hit on each of the distinct resident ``lines``, in the order given.

        Each line moves to the back of its list (LRU) or of the next count's bucket (LFU, LFUOpt);
        an LFUOpt key reaching ``levels`` is pinned. A pinned key's stamp and count no longer matter.
        """
        self.stamps[lines] = self._ticks(len(lines))
        counts = self.counts[lines] + self.hit_increments[lines] * ~self.pinned[lines]
        self.counts[lines] = counts
        self.pinned[lines] |= counts >= self.levels[lines]

    def admit(self, keys: torch.Tensor, tables: torch.Tensor) -> Placement:
        """Insert the distinct non-resident ``keys`` of ``tables`` as HET would one at a time.

        Per table, the first ``capacity - size`` keys take free lines; each later key first evicts
        the unpinned line with the smallest ``(count, stamp)``, which may hold a key of this very
        batch (see :meth:`_plan`). The work is on the batch sorted by table, stably, so that each
        table's keys keep their order and start at ``starts[t]``.
        """
        order = torch.argsort(tables, stable=True)
        evictable = self.resident & ~self.pinned
        lowest = evictable & (self.counts == self.entry_counts)
        plan = self._plan(self._count(tables), evictable, lowest)
        starts = _group_starts(plan.wanted)
        victim_lines, victim_tables, nth = self._old_victims(plan, evictable, lowest)
        trigger = starts[victim_tables] + plan.fill[victim_tables] + nth  # the evicting keys
        staying, lines = self._place(plan, starts, tables[order], trigger, victim_lines)
        placed = order[staying]
        in_order = torch.argsort(order[trigger])  # eviction order across tables
        victim_lines = victim_lines[in_order]
        victims = self.keys[victim_lines]
        self.keys[lines] = keys[placed]
        self.counts[lines] = self.entry_counts[lines]
        self.stamps[lines] = self._ticks(len(keys))[placed]
        self.pinned[lines] = False
        self.resident[lines] = True
        self.sizes += plan.fill
        return Placement(
            resident=placed,
            lines=lines,
            victims=victims,
            victim_lines=victim_lines,
            triggers=order[trigger[in_order]],
            evicted_new=int(plan.evicted_new.sum()),
            refused=int(plan.wanted[~plan.admits].sum()),
        )

    def _place(
        self,
        plan: _Plan,
        starts: torch.Tensor,
        by_table: torch.Tensor,
        trigger: torch.Tensor,
        victim_lines: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The keys that stay (indices into the sorted batch) and their lines.

        They are each admitting table's keys after its first ``evicted_new``. The j-th of them
        takes the table's free line j, or for ``j >= fill`` the line its j-th key emptied: keys
        ``fill, fill+1, ...`` evicted the old victims in turn (``trigger``).
        """
        line_emptied_by = torch.empty_like(by_table)
        line_emptied_by[trigger] = victim_lines
        skipped = torch.where(plan.admits, plan.evicted_new, len(by_table))
        rank = torch.arange(len(by_table)) - starts[by_table]
        staying = torch.nonzero(rank >= skipped[by_table]).flatten()
        table = by_table[staying]
        nth = staying - (starts + plan.evicted_new)[table]
        lines = torch.where(
            nth < plan.fill[table],
            (self.line_offsets + self.sizes)[table] + nth,
            line_emptied_by[starts[table] + nth],
        )
        return staying, lines

    def _plan(self, wanted: torch.Tensor, evictable: torch.Tensor, lowest: torch.Tensor) -> _Plan:
        """Per table: admitted or not, free lines filled, and whom the evictions take.

        ``evictable`` marks the resident unpinned lines, ``lowest`` those of them in the bucket
        a new key enters (its rule's ``insert_count``: no count is below it). A new key enters
        with the newest stamp: after every old key of that bucket and before every old key of a
        higher count. So a table's evictions take the lowest bucket's old keys oldest first and,
        once those are gone, the batch's own keys in order (the first of them always ranks first).
        The exception: when no key went into a free line and the lowest bucket holds no old key,
        the first new key is not yet resident at the first eviction, which takes the smallest
        unpinned old key of a higher count (HET's ``pop_oldest_of_lowest``); the batch's keys
        follow. A table with no free line and only pinned keys admits nothing (LFUOpt); neither
        does one with no lines at all.
        """
        free = self.capacities - self.sizes
        in_lowest = self._per_table(lowest)
        admits = (self.capacities > 0) & ((free > 0) | (self._per_table(evictable) > 0))
        fill = torch.where(admits, torch.minimum(free, wanted), 0)
        evictions = torch.where(admits, wanted - fill, 0)
        skips_lowest = (evictions > 0) & (fill == 0) & (in_lowest == 0)
        old = torch.where(skips_lowest, 1, torch.minimum(in_lowest, evictions))
        return _Plan(wanted, admits, fill, old, evictions - old, skips_lowest)

    def _old_victims(
        self, plan: _Plan, evictable: torch.Tensor, lowest: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The lines of the old keys the evictions take, their tables, and which eviction (0, 1,
        ...) of its table takes each: the lowest bucket's ``plan.old`` oldest, or the smallest
        unpinned line (:meth:`_plan`)."""
        oldest = self._oldest(lowest, torch.where(plan.skips_lowest, 0, plan.old))
        tables = self.table_of_line[oldest]
        nth = torch.arange(len(oldest)) - _group_starts(self._count(tables))[tables]
        above = (
            self._smallest_unpinned(evictable & plan.skips_lowest[self.table_of_line])
            if bool(plan.skips_lowest.any())
            else _none()
        )
        lines = torch.cat([oldest, above])
        return lines, self.table_of_line[lines], torch.cat([nth, torch.zeros_like(above)])

    def _oldest(self, lines: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """The ``counts[t]`` oldest of the ``lines`` (a mask) of each table t, by table then age.

        One ``topk`` per table that needs any, on its block of lines: a selection costs about a
        pass over the block, where sorting all lines by (table, stamp) at once costs several.
        """
        stamps = torch.where(lines, self.stamps, _UNBOUNDED)
        found = [
            torch.topk(stamps[start:end], count, largest=False).indices + start
            for (start, end), count in zip(self._blocks, counts.tolist(), strict=True)
            if count
        ]
        return torch.cat(found) if found else _none()

    def _smallest_unpinned(self, candidates: torch.Tensor) -> torch.Tensor:
        """The ``(count, stamp)``-smallest of the ``candidates`` lines (a mask) of each table."""
        lines = torch.nonzero(candidates).flatten()
        for key in (self.counts, self.stamps):  # lexicographic: the lowest count, then the oldest
            tables = self.table_of_line[lines]
            best = torch.full_like(self.capacities, _UNBOUNDED).scatter_reduce(
                0, tables, key[lines], "amin"
            )
            lines = lines[key[lines] == best[tables]]
        return lines

    def _per_table(self, lines: torch.Tensor) -> torch.Tensor:
        """How many of ``lines`` (a mask over all lines) each table has."""
        return torch.zeros_like(self.capacities).index_add_(0, self.table_of_line, lines.long())

    def _count(self, tables: torch.Tensor) -> torch.Tensor:
        """How many of ``tables`` (one entry per key or line) name each table."""
        return torch.bincount(tables, minlength=len(self.capacities))

    # -- one table's view, for the per-key API ---------------------------------------------

    def table_lines(self, table: int) -> slice:
        """The resident lines of ``table``."""
        start = int(self.line_offsets[table])
        return slice(start, start + int(self.sizes[table]))

    def line_of(self, table: int, key: int) -> torch.Tensor:
        """The line of resident ``key`` of ``table`` (one element); ``KeyError`` if not resident."""
        lines = self.table_lines(table)
        found = torch.nonzero(self.keys[lines] == key).flatten()
        if not len(found):
            raise KeyError(key)
        return found + lines.start


class CachePolicy(ABC):
    """One table's replacement policy: its :class:`Rule` and its table in a :class:`PolicyState`.

    Made on its own it owns a one-table state; a :class:`TablePolicies` (a cache) moves it into
    the cache's shared state, so that the cache works on all tables at once while ``touch``,
    ``insert``, ``in`` and ``len`` still speak of this table, one key at a time.
    """

    name: ClassVar[str]

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError(f"cache capacity must be >= 0, got {capacity}")
        self.capacity = capacity
        self.state = PolicyState([capacity], [self.rule])
        self.table = 0

    @property
    @abstractmethod
    def rule(self) -> Rule:
        """How this policy counts (see :class:`Rule`)."""

    def __contains__(self, key: int) -> bool:
        return bool((self.state.keys[self.state.table_lines(self.table)] == key).any())

    def __len__(self) -> int:
        return int(self.state.sizes[self.table])

    @property
    def permanent(self) -> set[int]:
        """The keys in LFUOpt's permanent store (never evicted)."""
        lines = self.state.table_lines(self.table)
        return set(self.state.keys[lines][self.state.pinned[lines]].tolist())

    def touch(self, key: int) -> None:
        """Record a hit on resident ``key``."""
        self.state.hit(self.state.line_of(self.table, key))

    def insert(self, key: int) -> Admission:
        """Make non-resident ``key`` resident if the policy allows, evicting at most one key."""
        placement = self.state.admit(torch.tensor([key]), torch.tensor([self.table]))
        victims = placement.victims.tolist()
        return Admission(admitted=placement.refused == 0, victim=victims[0] if victims else None)


class LRUPolicy(CachePolicy):
    """Least recently used: every count stays 0, the victim is the oldest stamp."""

    name = "lru"

    @property
    def rule(self) -> Rule:
        return Rule(insert_count=0, hit_increment=0)


class LFUPolicy(CachePolicy):
    """Least frequently used, ties broken by arrival in the count bucket; new keys at count 1."""

    name = "lfu"

    @property
    def rule(self) -> Rule:
        return Rule(insert_count=1, hit_increment=1)

    def use_count(self, key: int) -> int:
        return int(self.state.counts[self.state.line_of(self.table, key)])


class LFUOptPolicy(CachePolicy):
    """LFU with ``levels`` count levels from 0; a hit at the top level pins the key for good."""

    name = "lfuopt"

    def __init__(self, capacity: int, levels: int = 10) -> None:
        if levels < 1:
            raise ValueError(f"lfuopt levels must be >= 1, got {levels}")
        self.levels = levels
        super().__init__(capacity)

    @property
    def rule(self) -> Rule:
        return Rule(insert_count=0, hit_increment=1, levels=self.levels)


class TablePolicies:
    """The policies of a cache's tables (``policies[t]`` is table t's), over one shared state.

    Setting ``policies[t]`` to a fresh policy of the same capacity swaps table t's rule, as long as
    the table holds no key yet.
    """

    def __init__(self, policies: Sequence[CachePolicy]) -> None:
        self._policies = list(policies)
        self.state = PolicyState([p.capacity for p in policies], [p.rule for p in policies])
        for table, policy in enumerate(policies):
            self[table] = policy

    def __getitem__(self, table: int) -> CachePolicy:
        return self._policies[table]

    def __setitem__(self, table: int, policy: CachePolicy) -> None:
        if policy.capacity != self._policies[table].capacity or len(policy):
            raise ValueError(f"table {table} takes only a fresh policy of its capacity")
        if len(self._policies[table]):
            raise ValueError(f"table {table} already caches keys; its policy stays")
        self.state.set_rule(table, policy.rule)
        self._policies[table] = policy
        policy.state, policy.table = self.state, table

    def __len__(self) -> int:
        return len(self._policies)

    def __iter__(self) -> Iterator[CachePolicy]:
        return iter(self._policies)


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
