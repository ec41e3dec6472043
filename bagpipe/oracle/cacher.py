"""``OracleCacher``: the fast, streaming oracle planner (same plans as ``reference.plan_reference``).

Usage::

    planner = OracleCacher(schema, num_trainers=8, lookahead=200, capacity=4_000_000)
    for plan in planner.plan(source):          # a BatchSource, or any iterable of batches
        if isinstance(plan, RoundPlan): ...    # evict / write back / prefetch in the background
        else: ...                              # StepPlan: how to sync batch plan.step's gradients
    planner.stats                              # OracleStats

Order of ``plan()`` (what a trainer consumes): round plans 0 and 1, step plans of round 0, round plan
2, step plans of round 1, ..., step plans of the last round, then the flush plan. Round ``r``'s plan
is therefore in hand before round ``r-1``'s first step, as its background execution needs. To emit
round ``r`` the planner reads batches up to ``last_step(r) + L``.

How it is fast (per batch ``b`` with ``n`` unique ids; no per-row Python loop anywhere):

* one sort of the batch's ``[B*F]`` ids packed with their positions gives the unique ids, their
  counts and, for count-1 ids, the owning example;
* ``RowMap`` turns ids into dense indices; per-row state lives in arrays over rows *seen*;
* every (step, id) use gets a slot in a ring buffer holding its *next use*; reading batch ``b``
  writes ``b`` into the slot of each id's previous use. A step's ``sync_now`` is then
  ``next == i+1`` and its singletons ``count == 1 & next > i+L``, with no set operations;
* a round's rows are the uses whose previous use lies before the round (so they come out unique,
  without a union); the resident set is an array of dense indices with per-row latest use, stale
  owner and next use, so evictions, Belady's choice and the capacity check are masks over it.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import torch

from bagpipe.core.batch import Batch, DatasetSchema, global_ids
from bagpipe.oracle.config import OracleConfig
from bagpipe.oracle.plan import CapacityError, RoundPlan, StepPlan
from bagpipe.oracle.rowmap import RowMap
from bagpipe.oracle.stats import OracleStats

NEVER = np.iinfo(np.int32).max  # "no next use known"
BatchLike = Batch | torch.Tensor | np.ndarray


@dataclass
class _StepUses:
    """The unique ids of one batch and what the planner needs to know about each."""

    ids: np.ndarray  # [n] int64, sorted
    rows: np.ndarray  # [n] dense row indices (RowMap)
    once_owner: np.ndarray  # [n] int16: owning trainer for count-1 ids, else -1
    first_in_round: np.ndarray  # [n] bool: no earlier use in this step's round
    base_slot: int  # ring slots base_slot .. base_slot + n - 1


def _grown(array: np.ndarray, size: int, fill: int) -> np.ndarray:
    bigger = np.full(size, fill, dtype=array.dtype)
    bigger[: array.size] = array
    return bigger


class OracleCacher:
    """Plans prefetch, eviction, write-back and gradient sync for Bagpipe trainers (see ``plan.py``).

    Args:
        schema: turns ``Batch``es into global ids; ``None`` if batches come as ``[B, F]`` global ids.
        num_trainers, lookahead, cleanup_interval, capacity: see ``OracleConfig``.

    One instance plans one stream: state carries from batch to batch.
    """

    def __init__(
        self,
        schema: DatasetSchema | None,
        num_trainers: int,
        lookahead: int = 200,
        cleanup_interval: int | None = None,
        capacity: int | None = None,
    ) -> None:
        self.config = OracleConfig(num_trainers, lookahead, cleanup_interval, capacity)
        self.schema = schema
        self.stats = OracleStats()
        self._rowmap = RowMap()
        self._row_slots = 0
        self._last_seen = np.empty(0, dtype=np.int64)  # step of each row's latest ingested use
        self._last_slot = np.empty(0, dtype=np.int64)  # ring slot of that use
        self._resident = np.empty(0, dtype=bool)
        self._res_last = np.empty(0, dtype=np.int64)  # latest committed use (resident rows)
        self._res_owner = np.empty(0, dtype=np.int16)  # stale owner (singleton latest use) or -1
        self._res_next = np.empty(0, dtype=np.int64)  # next use after res_last, NEVER if unknown
        self._round_mark = np.empty(0, dtype=np.int64)  # last round that used the row
        self._resident_rows = np.empty(0, dtype=np.int64)
        self._ring = np.full(1 << 16, NEVER, dtype=np.int64)  # next use of each (step, id) slot
        self._next_slot = 0
        self._steps: dict[int, _StepUses] = {}
        self._ingested = 0  # batches read
        self._num_steps: int | None = None  # known once the stream ends
        self._started = False

    # ------------------------------------------------------------------ ingestion
    def _matrix(self, batch: BatchLike) -> np.ndarray:
        if isinstance(batch, Batch):
            if self.schema is None:
                raise ValueError(
                    "OracleCacher got a Batch but no schema to map its ids to global ids"
                )
            return global_ids(batch, self.schema).numpy()
        if isinstance(batch, torch.Tensor):
            return batch.numpy()
        return np.asarray(batch)

    def _ensure_rows(self, count: int) -> None:
        if count <= self._row_slots:
            return
        size = max(count, 2 * self._row_slots, 1024)
        self._last_seen = _grown(self._last_seen, size, -1)
        self._last_slot = _grown(self._last_slot, size, -1)
        self._resident = _grown(self._resident, size, False)
        self._res_last = _grown(self._res_last, size, -1)
        self._res_owner = _grown(self._res_owner, size, -1)
        self._res_next = _grown(self._res_next, size, NEVER)
        self._round_mark = _grown(self._round_mark, size, -1)
        self._row_slots = size

    def _ring_floor(self) -> int:
        """The oldest ring slot still live (the first slot of the oldest step kept)."""
        return self._steps[min(self._steps)].base_slot if self._steps else self._next_slot

    def _ring_reserve(self, count: int) -> None:
        floor = self._ring_floor()
        live = self._next_slot - floor
        if live + count <= self._ring.size:
            return
        size = self._ring.size
        while size < live + count:
            size *= 2
        live_slots = np.arange(floor, self._next_slot)
        ring = np.full(size, NEVER, dtype=np.int64)
        ring[live_slots & (size - 1)] = self._ring[live_slots & (self._ring.size - 1)]
        self._ring = ring

    def ingest(self, batch: BatchLike) -> None:
        """Read the next global batch of the stream."""
        matrix = self._matrix(batch)
        step = self._ingested
        if matrix.ndim != 2:
            raise ValueError(f"batch {step}: expected a [B, F] id matrix, got shape {matrix.shape}")
        batch_size, num_features = matrix.shape
        if batch_size % self.config.num_trainers:
            raise ValueError(
                f"batch {step}: {batch_size} examples do not split into "
                f"{self.config.num_trainers} equal trainer slices"
            )
        ids, once_example = _unique_with_once_example(
            matrix.reshape(-1).astype(np.int64, copy=False)
        )
        once_owner = np.full(ids.size, -1, dtype=np.int16)
        has_once = once_example >= 0
        per_trainer = batch_size // self.config.num_trainers
        once_owner[has_once] = (once_example[has_once] // num_features) // per_trainer

        rows = self._rowmap.index(ids)
        self._ensure_rows(self._rowmap.size)
        self._ring_reserve(ids.size)
        mask = self._ring.size - 1
        previous = self._last_slot[rows]
        live = previous >= self._ring_floor()
        self._ring[previous[live] & mask] = step
        first_in_round = self._last_seen[rows] < (step // self.config.ci) * self.config.ci
        unknown_next = self._res_next[rows] == NEVER
        self._res_next[rows[unknown_next]] = step
        slots = np.arange(self._next_slot, self._next_slot + ids.size)
        self._ring[slots & mask] = NEVER
        self._last_slot[rows] = slots
        self._last_seen[rows] = step
        self._steps[step] = _StepUses(ids, rows, once_owner, first_in_round, self._next_slot)
        self._next_slot += ids.size
        self._ingested += 1

    def _next_uses(self, uses: _StepUses) -> np.ndarray:
        slots = np.arange(uses.base_slot, uses.base_slot + uses.ids.size)
        return self._ring[slots & (self._ring.size - 1)]

    # ------------------------------------------------------------------ step plans
    def _step_plan(self, step: int) -> StepPlan:
        uses = self._steps[step]
        next_use = self._next_uses(uses)
        now = next_use == step + 1
        single = (uses.once_owner >= 0) & (next_use > step + self.config.lookahead)
        later = ~(now | single)
        stats = self.stats
        stats.steps += 1
        stats.unique_ids += uses.ids.size
        stats.sync_now_rows += int(now.sum())
        stats.singleton_rows += int(single.sum())
        stats.sync_later_rows += int(later.sum())
        plan = StepPlan(
            step=step,
            sync_now=torch.from_numpy(uses.ids[now]),
            sync_later=torch.from_numpy(uses.ids[later]),
            singleton=torch.from_numpy(uses.ids[single]),
            singleton_owner=torch.from_numpy(uses.once_owner[single].astype(np.int64)),
        )
        if self.config.round_of(step) < self.stats.rounds:  # its round is committed: drop it
            del self._steps[step]
        return plan

    # ------------------------------------------------------------------ round plans
    def _round_plan(self, r: int) -> RoundPlan:
        cfg = self.config
        first, last = cfg.round_steps(r, self._num_steps)
        horizon = last + cfg.lookahead
        cutoff = cfg.eviction_cutoff(r)
        steps = [self._steps[i] for i in range(first, last + 1)]
        next_uses = [self._next_uses(u) for u in steps]

        # rows of the round, each once (at its first use in the round), and their fetch owner
        round_rows = np.concatenate([u.rows[u.first_in_round] for u in steps])
        sole_owner = np.concatenate(
            [
                np.where(
                    (u.once_owner >= 0) & (nxt > i + cfg.lookahead) & (nxt > last), u.once_owner, -1
                )[u.first_in_round]
                for i, u, nxt in zip(range(first, last + 1), steps, next_uses, strict=True)
            ]
        )
        self._round_mark[round_rows] = r

        resident = self._resident_rows
        latest = self._res_last[resident]
        eligible = latest <= cutoff
        stale = self._res_owner[resident] >= 0
        victims = eligible & stale
        next_use = self._res_next[resident]
        next_use = np.where(next_use > horizon, NEVER, next_use)
        in_round = self._round_mark[resident] == r
        if cfg.capacity is None:
            victims |= eligible & ~stale & (next_use > np.maximum(latest + cfg.lookahead, last))
        else:
            pinned = ~eligible
            needed = int(pinned.sum()) + round_rows.size - int((pinned & in_round).sum())
            if needed > cfg.capacity:
                raise CapacityError(
                    f"round {r} (steps {first}..{last}) needs {needed} resident rows at once "
                    f"(steps {max(0, (r - 1) * cfg.ci - 1)}..{last}); capacity is {cfg.capacity}",
                    min_capacity=needed,
                )
            kept_in_round = int((in_round & ~victims).sum())
            size_after = resident.size - int(victims.sum()) + round_rows.size - kept_in_round
            excess = size_after - cfg.capacity
            if excess > 0:
                candidates = np.flatnonzero(eligible & ~victims & ~in_round)
                ids = self._rowmap.ids[resident[candidates]]
                key = (next_use[candidates] << 32) | ids  # furthest next use, then larger id
                chosen = candidates[np.argpartition(-key, excess - 1)[:excess]]
                victims[chosen] = True
                self.stats.capacity_evictions += excess
                self.stats.lease_breaks += int(
                    (next_use[chosen] <= latest[chosen] + cfg.lookahead).sum()
                )

        evicted, owners = self._evict(resident[victims])
        self._resident_rows = resident[~victims]

        fetch = ~self._resident[round_rows]
        prefetch_rows, prefetch_owner = round_rows[fetch], sole_owner[fetch]
        prefetch_ids = self._rowmap.ids[prefetch_rows]
        order = np.argsort(prefetch_ids)
        self._resident[prefetch_rows] = True
        self._resident_rows = np.concatenate([self._resident_rows, prefetch_rows])

        for i, u, nxt in zip(range(first, last + 1), steps, next_uses, strict=True):  # commit
            latest_use = nxt > last
            rows = u.rows[latest_use]
            single = (u.once_owner[latest_use] >= 0) & (nxt[latest_use] > i + cfg.lookahead)
            single &= cfg.num_trainers > 1  # with one trainer no copy goes stale
            self._res_last[rows] = i
            self._res_owner[rows] = np.where(single, u.once_owner[latest_use], -1)
            self._res_next[rows] = nxt[latest_use]

        stats = self.stats
        stats.rounds += 1
        stats.rows_prefetched += prefetch_rows.size
        stats.row_fetches += int(np.where(prefetch_owner < 0, cfg.num_trainers, 1).sum())
        stats.peak_resident_rows = max(stats.peak_resident_rows, self._resident_rows.size)
        return RoundPlan(
            round_index=r,
            first_step=first,
            last_step=last,
            evict=evicted,
            writeback_owner=owners,
            prefetch=torch.from_numpy(prefetch_ids[order]),
            prefetch_owner=torch.from_numpy(prefetch_owner[order].astype(np.int64)),
        )

    def _evict(self, rows: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """Drop ``rows`` from the resident set; their sorted ids and write-back owners."""
        ids = self._rowmap.ids[rows]
        order = np.argsort(ids)
        ids, rows = ids[order], rows[order]
        owners = self._res_owner[rows].astype(np.int64)
        shared = owners < 0
        owners[shared] = (np.arange(int(shared.sum())) * self.config.num_trainers) // max(
            1, int(shared.sum())
        )
        self._resident[rows] = False
        self._res_owner[rows] = -1
        self.stats.rows_evicted += rows.size
        self.stats.rows_written_back += rows.size
        return torch.from_numpy(ids), torch.from_numpy(owners)

    def _flush_plan(self, num_rounds: int) -> RoundPlan:
        evicted, owners = self._evict(self._resident_rows)
        self._resident_rows = self._resident_rows[:0]
        empty = torch.empty(0, dtype=torch.int64)
        assert self._num_steps is not None
        return RoundPlan(
            num_rounds, self._num_steps, self._num_steps - 1, evicted, owners, empty, empty
        )

    # ------------------------------------------------------------------ driving
    def plan(
        self, batches: Iterable[BatchLike], *, flush: bool = True
    ) -> Iterator[StepPlan | RoundPlan]:
        """Plans for a stream of global batches, in consumption order (see the module docstring).

        ``flush=True`` ends with a plan that evicts every resident row (write everything back).
        Planning time (ingestion included, the batch source's own time excluded) is in
        ``stats.planning_time_s``.
        """
        if self._started:
            raise RuntimeError("an OracleCacher plans one stream; make a new one for another")
        self._started = True
        source = iter(batches)
        cfg = self.config

        def read_until(step: int) -> None:
            while self._num_steps is None and self._ingested <= step:
                try:
                    batch = next(source)
                except StopIteration:
                    self._num_steps = self._ingested
                    return
                started = time.perf_counter()
                self.ingest(batch)
                self.stats.planning_time_s += time.perf_counter() - started

        def timed(make, *args):  # type: ignore[no-untyped-def]
            started = time.perf_counter()
            result = make(*args)
            self.stats.planning_time_s += time.perf_counter() - started
            return result

        r = 0
        while True:
            first = r * cfg.ci
            read_until(first + cfg.ci - 1 + cfg.lookahead)  # round r's horizon
            if self._num_steps is not None and first >= self._num_steps:
                break
            yield timed(self._round_plan, r)
            if r >= 1:
                for i in range(*_span(cfg.round_steps(r - 1, self._num_steps))):
                    yield timed(self._step_plan, i)
            r += 1
        if r >= 1:
            for i in range(*_span(cfg.round_steps(r - 1, self._num_steps))):
                yield timed(self._step_plan, i)
        if flush and self._num_steps is not None:
            yield timed(self._flush_plan, r)


def _span(steps: tuple[int, int]) -> tuple[int, int]:
    return steps[0], steps[1] + 1


def _unique_with_once_example(flat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted unique ids of ``flat`` and, per id, its position in ``flat`` if it occurs once, else -1.

    One sort of ``id << bits | position`` (the positions need ``bits`` bits) gives both, where
    ``np.unique(return_index=True)`` would need a slower stable argsort.
    """
    if flat.size == 0:
        return flat, flat
    bits = max(1, (flat.size - 1).bit_length())
    if int(flat.max()) >= 1 << (63 - bits) or int(flat.min()) < 0:
        raise ValueError(
            f"global ids must lie in [0, 2**{63 - bits}) for a batch of {flat.size} ids"
        )
    packed = (flat << bits) | np.arange(flat.size, dtype=np.int64)
    packed.sort()
    ids = packed >> bits
    starts = np.flatnonzero(np.concatenate(([True], ids[1:] != ids[:-1])))
    counts = np.diff(np.append(starts, flat.size))
    positions = packed[starts] & ((1 << bits) - 1)
    return ids[starts], np.where(counts == 1, positions, -1)
