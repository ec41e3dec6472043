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
    cfg, ci, lookahead = config, config.ci, config.lookahead
    num_steps = len(id_matrices)
    stats = OracleStats()
    uses: dict[int, list[int]] = {}
    unique: list[list[int]] = []
    once_owner: list[dict[int, int]] = []
    for step, matrix in enumerate(id_matrices):
        batch_size = matrix.shape[0]
        if batch_size % cfg.num_trainers:
            raise ValueError(f"batch {step}: {batch_size} examples for {cfg.num_trainers} trainers")
        per_trainer = batch_size // cfg.num_trainers
        counts: dict[int, int] = {}
        owner: dict[int, int] = {}
        for example, row in enumerate(matrix.tolist()):
            for x in row:
                counts[x] = counts.get(x, 0) + 1
                owner[x] = example // per_trainer
        unique.append(sorted(counts))
        once_owner.append({x: owner[x] for x, c in counts.items() if c == 1})
        for x in counts:
            uses.setdefault(x, []).append(step)

    def next_use(step: int, x: int) -> int:
        steps = uses[x]
        pos = bisect.bisect_right(steps, step)
        return steps[pos] if pos < len(steps) else NEVER

    singleton = [
        {x: k for x, k in once_owner[i].items() if next_use(i, x) > i + lookahead}
        for i in range(num_steps)
    ]

    def step_plan(i: int) -> StepPlan:
        following = set(unique[i + 1]) if i + 1 < num_steps else set()
        now = [x for x in unique[i] if x in following]
        single = sorted(singleton[i])
        later = [x for x in unique[i] if x not in following and x not in singleton[i]]
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
            singleton_owner=_tensor([singleton[i][x] for x in single]),
        )

    latest: dict[int, int] = {}  # resident row -> latest use among committed steps
    stale_owner: dict[int, int] = {}  # resident row whose latest use was a singleton use -> owner

    def evict(rows: set[int]) -> tuple[list[int], list[int]]:
        ordered = sorted(rows)
        owners = writeback_owners(ordered, stale_owner, cfg.num_trainers)
        for x in ordered:
            del latest[x]
            stale_owner.pop(x, None)
        stats.rows_evicted += len(ordered)
        stats.rows_written_back += len(ordered)
        return ordered, owners

    def round_plan(r: int) -> RoundPlan:
        first, last = cfg.round_steps(r, num_steps)
        horizon = last + lookahead
        cutoff = cfg.eviction_cutoff(r)
        round_rows = {x for i in range(first, last + 1) for x in unique[i]}
        needed = {x for i in range(max(0, (r - 1) * ci - 1), last + 1) for x in unique[i]}
        if cfg.capacity is not None and len(needed) > cfg.capacity:
            raise CapacityError(
                f"round {r} (steps {first}..{last}) needs {len(needed)} resident rows at once "
                f"(steps {max(0, (r - 1) * ci - 1)}..{last}); capacity is {cfg.capacity}",
                min_capacity=len(needed),
            )

        def known_next(x: int) -> int:
            n = next_use(latest[x], x)
            return n if n <= horizon else NEVER

        eligible = {x for x, j in latest.items() if j <= cutoff}
        victims = {x for x in eligible if x in stale_owner}
        if cfg.capacity is None:
            victims |= {
                x for x in eligible - victims if known_next(x) > max(latest[x] + lookahead, last)
            }
        else:
            fetch_count = len(round_rows - (set(latest) - victims))
            excess = len(latest) - len(victims) + fetch_count - cfg.capacity
            if excess > 0:
                candidates = sorted(
                    eligible - victims - round_rows, key=lambda x: (known_next(x), x), reverse=True
                )
                forced = candidates[:excess]
                stats.capacity_evictions += len(forced)
                stats.lease_breaks += sum(known_next(x) <= latest[x] + lookahead for x in forced)
                victims |= set(forced)
        evicted, owners = evict(victims)
        prefetch = sorted(round_rows - set(latest))
        prefetch_owner = []
        for x in prefetch:
            steps_in_round = [i for i in uses[x] if first <= i <= last]
            only = steps_in_round[0] if len(steps_in_round) == 1 else None
            prefetch_owner.append(singleton[only].get(x, -1) if only is not None else -1)
        for i in range(first, last + 1):  # commit the round's uses
            for x in unique[i]:
                latest[x] = i
                if x in singleton[i] and cfg.num_trainers > 1:
                    stale_owner[x] = singleton[i][x]
                else:
                    stale_owner.pop(x, None)
        stats.rounds += 1
        stats.rows_prefetched += len(prefetch)
        stats.row_fetches += sum(cfg.num_trainers if k == -1 else 1 for k in prefetch_owner)
        stats.peak_resident_rows = max(stats.peak_resident_rows, len(latest))
        return RoundPlan(
            round_index=r,
            first_step=first,
            last_step=last,
            evict=_tensor(evicted),
            writeback_owner=_tensor(owners),
            prefetch=_tensor(prefetch),
            prefetch_owner=_tensor(prefetch_owner),
        )

    num_rounds = -(-num_steps // ci)
    plans: list[Plan] = []
    for r in range(num_rounds + 1):
        if r < num_rounds:
            plans.append(round_plan(r))
        if r >= 1:
            first, last = cfg.round_steps(r - 1, num_steps)
            plans.extend(step_plan(i) for i in range(first, last + 1))
    if flush:
        evicted, owners = evict(set(latest))
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
    return plans, stats
