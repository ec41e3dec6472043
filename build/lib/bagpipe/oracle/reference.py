"""A slow, obviously-correct oracle planner over Python sets: the specification made executable.

It reads the whole stream up front and follows ``plan.py``'s rules literally, one row at a time. The
fast ``OracleCacher`` must emit exactly the same plans; tests compare the two on random streams.

Rules, for a stream of ``N`` batches, ``U_i`` the unique ids of batch ``i``, round ``r`` = steps
``[r*ci, min((r+1)*ci, N) - 1]`` (``first .. last``):

* ``next_use(i, x)`` = the first step ``> i`` using ``x``. Step plan ``i``: ``sync_now = U_i ∩
  U_{i+1}``; ``singleton`` = ids with count 1 in batch ``i`` and ``next_use > i+L``, owned by the
  trainer of their example; ``sync_later`` = the rest.
* Round ``r`` knows batches up to ``H = last + L``; a next use beyond ``H`` counts as never.
* Resident row ``x`` carries its latest use ``j`` among steps ``< first`` (and whether that use was
  a singleton use, by whom). It is *eligible* for eviction iff ``j <= (r-1)*ci - 2``.
* Evicted: eligible rows whose latest use was a singleton use (always, if ``T > 1``: with one
  trainer no copy goes stale), plus
  - no capacity: eligible rows whose lease expired: next use ``> max(j + L, last)`` (a row needed
    by round ``r`` itself is kept rather than evicted and refetched);
  - capacity ``C``: as many eligible rows not used in round ``r`` as needed for
    ``|resident| + |prefetch| <= C``, furthest next use first (ties: larger id first).
* ``CapacityError`` when the rows used by steps ``max(0, (r-1)*ci - 1) .. last`` exceed ``C``.
* Prefetch = rows used in round ``r`` not resident after the evictions; owner ``k`` iff the row's
  only use in the round is a singleton use by trainer ``k``, else ``-1``.
* Write-back owner: the singleton owner if the row's latest use was a singleton use; the other
  evicted rows, sorted, go to trainer ``(position * T) // count``.
* Consumption order: round plans 0 and 1, steps of round 0, round plan 2, steps of round 1, ...,
  steps of the last round, then (``flush=True``) a flush plan that evicts every resident row.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from bagpipe.oracle.config import OracleConfig
from bagpipe.oracle.plan import CapacityError, RoundPlan, StepPlan
from bagpipe.oracle.stats import OracleStats

NEVER = 1 << 62
Plan = StepPlan | RoundPlan


def _tensor(values: Sequence[int]) -> torch.Tensor:
    return torch.tensor(list(values), dtype=torch.int64)


def writeback_owners(
    rows: list[int], singleton_owner: dict[int, int], num_trainers: int
) -> list[int]:
    """Owners for sorted evicted ``rows``: the singleton owner, else disjoint sorted chunks."""
    shared = [x for x in rows if x not in singleton_owner]
    chunk = {x: (pos * num_trainers) // len(shared) for pos, x in enumerate(shared)}
    return [singleton_owner.get(x, chunk.get(x, 0)) for x in rows]


def plan_reference(
    id_matrices: Sequence[np.ndarray], config: OracleConfig, *, flush: bool = True
) -> tuple[list[Plan], OracleStats]:
    """All plans for a stream of ``[B, F]`` global-id matrices, in consumption order, and stats."""
    planner = _ReferencePlanner(_Stream.read(id_matrices, config), config)
    return planner.plans(flush), planner.stats


@dataclass(frozen=True)
class _Stream:
    """What the planner knows of the whole stream: each batch's ids, and each id's steps."""

    unique: list[list[int]]  # sorted unique ids of each batch
    singleton: list[dict[int, int]]  # per batch: id -> owner, for the batch's singletons
    uses: dict[int, list[int]]  # id -> the steps using it, ascending

    @classmethod
    def read(cls, id_matrices: Sequence[np.ndarray], config: OracleConfig) -> _Stream:
        uses: dict[int, list[int]] = {}
        unique: list[list[int]] = []
        once_owner: list[dict[int, int]] = []
        for step, matrix in enumerate(id_matrices):
            counts, owner = _counts_and_owner(step, matrix, config.num_trainers)
            unique.append(sorted(counts))
            once_owner.append({x: owner[x] for x, c in counts.items() if c == 1})
            for x in counts:
                uses.setdefault(x, []).append(step)
        singleton = [
            {x: k for x, k in once.items() if _next_use(uses[x], i) > i + config.lookahead}
            for i, once in enumerate(once_owner)
        ]
        return cls(unique, singleton, uses)

    @property
    def num_steps(self) -> int:
        return len(self.unique)

    def next_use(self, step: int, x: int) -> int:
        """The first step after ``step`` using ``x``, or ``NEVER``."""
        return _next_use(self.uses[x], step)


def _next_use(steps: list[int], step: int) -> int:
    pos = bisect.bisect_right(steps, step)
    return steps[pos] if pos < len(steps) else NEVER


def _counts_and_owner(
    step: int, matrix: np.ndarray, num_trainers: int
) -> tuple[dict[int, int], dict[int, int]]:
    """Uses of each id in one batch, and the trainer of (the last) example using it."""
    batch_size = matrix.shape[0]
    if batch_size % num_trainers:
        raise ValueError(f"batch {step}: {batch_size} examples for {num_trainers} trainers")
    per_trainer = batch_size // num_trainers
    counts: dict[int, int] = {}
    owner: dict[int, int] = {}
    for example, row in enumerate(matrix.tolist()):
        for x in row:
            counts[x] = counts.get(x, 0) + 1
            owner[x] = example // per_trainer
    return counts, owner


class _ReferencePlanner:
    """The rules of the module docstring, one row at a time, over a stream read in full."""

    def __init__(self, stream: _Stream, config: OracleConfig) -> None:
        self.stream = stream
        self.cfg = config
        self.stats = OracleStats()
        self.latest: dict[int, int] = {}  # resident row -> latest use among committed steps
        # resident row whose latest use was a singleton use -> owner
        self.stale_owner: dict[int, int] = {}

    def plans(self, flush: bool) -> list[Plan]:
        """Round plans and step plans in consumption order, then the flush plan."""
        num_steps = self.stream.num_steps
        num_rounds = -(-num_steps // self.cfg.ci)
        plans: list[Plan] = []
        for r in range(num_rounds + 1):
            if r < num_rounds:
                plans.append(self.round_plan(r))
            if r >= 1:
                first, last = self.cfg.round_steps(r - 1, num_steps)
                plans.extend(self.step_plan(i) for i in range(first, last + 1))
        if flush:
            evicted, owners = self.evict(set(self.latest))
            plans.append(
                RoundPlan(
                    round_index=num_rounds,
                    first_step=num_steps,
                    last_step=num_steps - 1,
                    evict=_tensor(evicted),
                    writeback_owner=_tensor(owners),
                    prefetch=_tensor([]),
                    prefetch_owner=_tensor([]),
                )
            )
        return plans

    def step_plan(self, i: int) -> StepPlan:
        """Step ``i``'s sync plan: ``sync_now``, ``singleton`` (with owners), ``sync_later``."""
        unique, singleton = self.stream.unique, self.stream.singleton[i]
        following = set(unique[i + 1]) if i + 1 < self.stream.num_steps else set()
        now = [x for x in unique[i] if x in following]
        single = sorted(singleton)
        later = [x for x in unique[i] if x not in following and x not in singleton]
        stats = self.stats
        stats.steps += 1
        stats.unique_ids += len(unique[i])
        stats.sync_now_rows += len(now)
        stats.sync_later_rows += len(later)
        stats.singleton_rows += len(single)
        return StepPlan(
            step=i,
            sync_now=_tensor(now),
            sync_later=_tensor(later),
            singleton=_tensor(single),
            singleton_owner=_tensor([singleton[x] for x in single]),
        )

    def round_plan(self, r: int) -> RoundPlan:
        """Round ``r``'s evictions and prefetches; then its uses are committed."""
        first, last = self.cfg.round_steps(r, self.stream.num_steps)
        round_rows = self._rows_used(first, last)
        self._check_capacity(r, first, last)
        evicted, owners = self.evict(self._victims(r, last, round_rows))
        prefetch = sorted(round_rows - set(self.latest))
        prefetch_owner = [self._fetch_owner(x, first, last) for x in prefetch]
        self._commit(first, last)
        stats = self.stats
        stats.rounds += 1
        stats.rows_prefetched += len(prefetch)
        stats.row_fetches += sum(self.cfg.num_trainers if k == -1 else 1 for k in prefetch_owner)
        stats.peak_resident_rows = max(stats.peak_resident_rows, len(self.latest))
        return RoundPlan(
            round_index=r,
            first_step=first,
            last_step=last,
            evict=_tensor(evicted),
            writeback_owner=_tensor(owners),
            prefetch=_tensor(prefetch),
            prefetch_owner=_tensor(prefetch_owner),
        )

    def evict(self, rows: set[int]) -> tuple[list[int], list[int]]:
        """Drop ``rows`` from the resident set; them sorted, and their write-back owners."""
        ordered = sorted(rows)
        owners = writeback_owners(ordered, self.stale_owner, self.cfg.num_trainers)
        for x in ordered:
            del self.latest[x]
            self.stale_owner.pop(x, None)
        self.stats.rows_evicted += len(ordered)
        self.stats.rows_written_back += len(ordered)
        return ordered, owners

    def _rows_used(self, first: int, last: int) -> set[int]:
        """The rows used by steps ``first .. last``."""
        return {x for i in range(first, last + 1) for x in self.stream.unique[i]}

    def _check_capacity(self, r: int, first: int, last: int) -> None:
        """``CapacityError`` when the rows of steps ``(r-1)*ci - 1 .. last`` exceed the capacity."""
        cfg = self.cfg
        if cfg.capacity is None:
            return
        needed = self._rows_used(max(0, (r - 1) * cfg.ci - 1), last)
        if len(needed) > cfg.capacity:
            raise CapacityError(
                f"round {r} (steps {first}..{last}) needs {len(needed)} resident rows at once "
                f"(steps {max(0, (r - 1) * cfg.ci - 1)}..{last}); capacity is {cfg.capacity}",
                min_capacity=len(needed),
            )

    def _victims(self, r: int, last: int, round_rows: set[int]) -> set[int]:
        """The resident rows round ``r`` evicts: stale, then expired or furthest-next-use."""
        cfg, latest, lookahead = self.cfg, self.latest, self.cfg.lookahead
        horizon = last + lookahead
        eligible = {x for x, j in latest.items() if j <= cfg.eviction_cutoff(r)}
        victims = {x for x in eligible if x in self.stale_owner}
        if cfg.capacity is None:
            victims |= {
                x
                for x in eligible - victims
                if self._known_next(x, horizon) > max(latest[x] + lookahead, last)
            }
            return victims
        fetch_count = len(round_rows - (set(latest) - victims))
        excess = len(latest) - len(victims) + fetch_count - cfg.capacity
        if excess > 0:
            candidates = sorted(
                eligible - victims - round_rows,
                key=lambda x: (self._known_next(x, horizon), x),
                reverse=True,
            )
            forced = candidates[:excess]
            self.stats.capacity_evictions += len(forced)
            self.stats.lease_breaks += sum(
                self._known_next(x, horizon) <= latest[x] + lookahead for x in forced
            )
            victims |= set(forced)
        return victims

    def _known_next(self, x: int, horizon: int) -> int:
        """Resident ``x``'s next use after its latest, as known (up to ``horizon``)."""
        n = self.stream.next_use(self.latest[x], x)
        return n if n <= horizon else NEVER

    def _fetch_owner(self, x: int, first: int, last: int) -> int:
        """Trainer ``k`` if ``x``'s only use in the round is a singleton use by ``k``, else -1."""
        steps_in_round = [i for i in self.stream.uses[x] if first <= i <= last]
        if len(steps_in_round) != 1:
            return -1
        return self.stream.singleton[steps_in_round[0]].get(x, -1)

    def _commit(self, first: int, last: int) -> None:
        """Each row used in the round becomes resident with its latest use there."""
        for i in range(first, last + 1):
            singleton = self.stream.singleton[i]
            for x in self.stream.unique[i]:
                self.latest[x] = i
                if x in singleton and self.cfg.num_trainers > 1:
                    self.stale_owner[x] = singleton[x]
                else:
                    self.stale_owner.pop(x, None)
