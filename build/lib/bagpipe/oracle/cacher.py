"""``OracleCacher``: the fast, streaming oracle planner (same plans as ``reference.plan_reference``).

Usage::

    planner = OracleCacher(schema, OracleConfig(8, lookahead=200, capacity=4_000_000))
    for plan in planner.plan(source):          # a BatchSource, or any iterable of batches
        if isinstance(plan, RoundPlan): ...    # evict / write back / prefetch in the background
        else: ...                              # StepPlan: how to sync batch plan.step's gradients
    planner.stats                              # OracleStats

Order of ``plan()`` (what a trainer consumes): round plans 0 and 1, step plans of round 0, round plan
2, step plans of round 1, ..., step plans of the last round, then the flush plan. Round ``r``'s plan
is therefore in hand before round ``r-1``'s first step, as its background execution needs. To emit
round ``r`` the planner reads batches up to ``last_step(r) + L``.

How it is fast (per batch ``b`` with ``n`` unique ids; no per-row Python loop anywhere):

* unique ids, counts and, for count-1 ids, the owning trainer come per column (``uniques``), in
  two blocks of a few numpy calls each: one ``np.bincount`` over all small-span columns, one
  row-wise sort of int32 ``id << b | trainer`` keys for the rest;
* ``RowMap`` turns ids into dense int32 indices once per (step, id): small tables through a direct
  array, the rest through a hash until 1/32 of a table's rows are seen, then through a direct
  array too (one gather per array); per-row state lives in arrays over rows *seen* (doubled into
  buffers the worker touched ahead of need, ``growth``), and the window keeps per step only dense
  indices, owners and the positions of the round's first uses;
* every (step, id) use has a slot in a ``UseRing`` block holding its *next use*; reading batch
  ``b`` writes ``b`` into the slot of each id's previous use, found from one packed per-row
  ``(step, position)`` of its latest use. A step's ``sync_now`` is then ``next == i+1`` and its
  singletons ``count == 1 & next > i+L``, with no set operations;
* a round's rows are the uses whose previous use lies before the round (so they come out unique,
  without a union); the resident set is an array of dense indices with per-row latest use, stale
  owner and next use, so evictions, Belady's choice and the capacity check are masks over it;
  sorted outputs come from sorting ids packed with their owner (no argsort, no gathers);
* selections by a mask are ``compress`` or ``take`` of ``flatnonzero`` (numpy's boolean indexing
  branches per element: 3-5x slower at mask densities between 0.2 and 0.8), and state is indexed
  with intp rows (int32 indices are cast on every use);
* three threads on two cores: in ``plan()`` a worker takes the next batches' unique ids and
  their dense indices (the ``RowMap`` is the worker's alone) and a stepper makes a round's step
  plans, while the planning thread records batches and makes round plans.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import NamedTuple, ParamSpec, TypeAlias, TypeVar

import numpy as np
import torch

from bagpipe.core.batch import Batch, DatasetSchema, global_ids
from bagpipe.core.memory import small_pages
from bagpipe.oracle.config import OracleConfig
from bagpipe.oracle.growth import Growing, Reserve
from bagpipe.oracle.plan import CapacityError, RoundPlan, StepPlan
from bagpipe.oracle.ring import NEVER, UseRing
from bagpipe.oracle.rowmap import RowMap
from bagpipe.oracle.stats import OracleStats
from bagpipe.oracle.uniques import BatchUniques, batch_uniques

BatchLike: TypeAlias = Batch | torch.Tensor | np.ndarray
DIRECT_ROWS_MAX = 1 << 17  # tables up to this many rows map ids through a direct int32 array
HASH_SLOTS = 1 << 20  # 16 MB: the hash grows only at rows seen >= 2**19
AHEAD = 16  # batches the worker stage may prepare ahead, to keep working through a round plan
MAX_TRAINERS = np.iinfo(np.int16).max  # owners are int16 in the window, 16-bit fields when sorted
_POSITION_BITS = 32  # a row's latest use, packed: step << 32 | position in that step
_T = TypeVar("_T")
_P = ParamSpec("_P")


class _RowState(NamedTuple):
    """Per-row planner state, indexed by dense row (``RowMap``); rows not yet met hold the fills
    of ``_row_layout``."""

    last_use: np.ndarray  # int64 latest recorded use, step << 32 | position; -1 if none
    resident: np.ndarray  # bool
    res_last: np.ndarray  # int32 latest committed use (resident rows)
    res_owner: np.ndarray  # stale owner or -1
    res_next: np.ndarray  # int32 next use after res_last, NEVER if unknown


def _row_layout(owner_dtype: type[np.signedinteger]) -> list[tuple[type, int | bool]]:
    """``(dtype, fill)`` of each ``_RowState`` field."""
    return [(np.int64, -1), (np.bool_, False), (np.int32, -1), (owner_dtype, -1), (np.int32, NEVER)]


@dataclass(frozen=True)
class _Prepared:
    """A batch as the worker stage hands it over: its unique ids and their dense indices."""

    uniques: BatchUniques
    rows: np.ndarray  # [n] int32 dense indices of ``uniques.ids``
    rows_seen: int  # RowMap.size once this batch is indexed: per-row state must cover it
    next_rows: list[np.ndarray] | None  # the worker's reserve of larger ``_RowState`` buffers


@dataclass
class _StepUses:
    """The unique ids of one batch (as dense rows, in id order) and what the planner needs of each."""

    rows: np.ndarray  # [n] int32 dense row indices (RowMap), ascending global id
    once_owner: np.ndarray  # [n] int8/int16: owning trainer for count-1 ids, else -1
    first_in_round: np.ndarray  # positions (in ``rows``) of the ids not used earlier in the round


class _Residents(NamedTuple):
    """The resident set as a round's evictions see it: arrays aligned with ``_resident_rows``."""

    latest: np.ndarray  # latest committed use
    next_use: np.ndarray  # the first use after it: a step read so far (<= horizon) or NEVER
    eligible: np.ndarray  # latest use <= the round's eviction cutoff
    in_round: np.ndarray  # next use within the round


#: One step of a round being planned: its index, its uses and their next uses (a ring view).
_RoundUse: TypeAlias = tuple[int, _StepUses, np.ndarray]


class OracleCacher:
    """Plans prefetch, eviction, write-back and gradient sync for Bagpipe trainers (see ``plan.py``).

    Args:
        schema: turns ``Batch``es into global ids, and tells the planner each column's table (tables
            of at most ``direct_rows_max`` rows skip the hash); ``None`` if batches come as ``[B, F]``
            global ids of unknown tables.
        config: the trainer count, lookahead, cleanup interval and capacity (``OracleConfig``).
        direct_rows_max: the largest table mapped through a direct array (with a schema).

    One instance plans one stream: state carries from batch to batch.
    """

    def __init__(
        self,
        schema: DatasetSchema | None,
        config: OracleConfig,
        *,
        direct_rows_max: int = DIRECT_ROWS_MAX,
    ) -> None:
        self.config = config
        num_trainers, lookahead = config.num_trainers, config.lookahead
        if num_trainers > MAX_TRAINERS:
            raise ValueError(f"OracleCacher: num_trainers={num_trainers} exceeds {MAX_TRAINERS}")
        self.schema = schema
        self.stats = OracleStats()
        self._table_ranges: list[tuple[int, int]] = []  # (first id, rows) per column
        if schema is not None:
            offsets = schema.table_offsets.tolist()
            self._table_ranges = list(zip(offsets, schema.table_sizes, strict=True))
        self._table_first = np.array([first for first, _ in self._table_ranges], dtype=np.int64)
        self._table_last = self._table_first + [rows - 1 for _, rows in self._table_ranges]
        self._rowmap = RowMap(
            self._table_ranges, direct_rows_max=direct_rows_max, initial_slots=HASH_SLOTS
        )
        self._owner_dtype = np.int8 if num_trainers <= np.iinfo(np.int8).max else np.int16
        self._owner_bits = num_trainers.bit_length()  # owner + 1 in 0 .. T, packed beside ids
        row_layout = _row_layout(self._owner_dtype)
        self._row_arrays = Growing(row_layout)
        self._rows = _RowState(*self._row_arrays.arrays)
        self._row_reserve = Reserve(row_layout)  # the worker's: builds the next buffers
        self._resident_rows = np.empty(0, dtype=np.intp)
        self._committed_through = -1  # the last step of the last committed round
        # live: the window, the round being read beyond it, the round planned and the round
        # whose step plans are being made
        self._ring = UseRing(max_live_steps=lookahead + 3 * self.config.ci + 2)
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

    def _check_ranges(self, uniques: BatchUniques, step: int) -> None:
        """Reject ids outside their column's table (they would corrupt the direct maps)."""
        if uniques.columns[0] < 0:  # columns overlap, so at least one of them leaves its table
            raise ValueError(
                f"batch {step}: ids outside their tables' ranges {self._table_ranges} "
                f"(schema {self.schema.name if self.schema else ''!r}; columns overlap)"
            )
        columns = np.asarray(uniques.columns)
        lowest = uniques.ids[uniques.bounds[:-1]]
        highest = uniques.ids[uniques.bounds[1:] - 1]
        bad = (lowest < self._table_first[columns]) | (highest > self._table_last[columns])
        if bad.any():
            k = int(np.flatnonzero(bad)[0])
            column = int(columns[k])
            raise ValueError(
                f"batch {step}: column {column} has global ids {lowest[k]}..{highest[k]} outside "
                f"its table's range {self._table_first[column]}..{self._table_last[column]}"
            )

    def _prepare(self, batch: BatchLike, step: int) -> _Prepared:
        """The worker stage: batch ``step``'s unique ids and dense indices.

        Batches must come in stream order, on one thread: the ``RowMap`` numbers new rows as it
        meets them. The other stage only reads ``RowMap.ids`` of rows handed over already.
        """
        uniques = self._uniques(batch, step)
        rows = self._rowmap.index(uniques.ids, uniques.columns, uniques.bounds)
        size = self._rowmap.size
        return _Prepared(uniques, rows, size, self._row_reserve.advance(size))

    def _uniques(self, batch: BatchLike, step: int) -> BatchUniques:
        """Batch ``step``'s unique ids, validated."""
        matrix = self._matrix(batch)
        if matrix.ndim != 2:
            raise ValueError(f"batch {step}: expected a [B, F] id matrix, got shape {matrix.shape}")
        batch_size, num_features = matrix.shape
        if batch_size % self.config.num_trainers:
            raise ValueError(
                f"batch {step}: {batch_size} examples do not split into "
                f"{self.config.num_trainers} equal trainer slices"
            )
        if self._table_ranges and num_features != len(self._table_ranges):
            raise ValueError(
                f"batch {step}: {num_features} columns for a schema of {len(self._table_ranges)} tables"
            )
        uniques = batch_uniques(matrix, self.config.num_trainers, self._owner_dtype)
        if self._table_ranges and uniques.ids.size:
            self._check_ranges(uniques, step)
        return uniques

    def _record(self, prepared: _Prepared) -> None:
        """Add the next batch's uses to the window (next uses, latest uses)."""
        step = self._ingested
        rows = prepared.rows.astype(np.intp)  # numpy indexes with intp; int32 costs a cast per use
        # per-row state covering the batch's rows, grown into the worker's reserve
        state = self._rows = _RowState(
            *self._row_arrays.cover(prepared.rows_seen, prepared.next_rows)
        )
        previous = state.last_use.take(rows)
        previous_step = previous >> _POSITION_BITS
        self._ring.add(step, rows.size)
        live = np.flatnonzero(previous_step >= self._ring.oldest_step)
        self._ring.record(
            previous_step.take(live), previous.take(live) & ((1 << _POSITION_BITS) - 1), step
        )
        round_start = (step // self.config.ci) * self.config.ci
        first_in_round = np.flatnonzero(previous_step < round_start).astype(np.int32)
        # a previous use no later than the last committed step is the row's committed latest
        # use, so this is the first use after it (rows never met get it too; it is unread
        # until their first commit overwrites it)
        state.res_next[rows.compress(previous_step <= self._committed_through)] = step
        state.last_use[rows] = (step << _POSITION_BITS) | np.arange(rows.size, dtype=np.int64)
        self._steps[step] = _StepUses(prepared.rows, prepared.uniques.once_owner, first_in_round)
        self._ingested += 1

    # ------------------------------------------------------------------ step plans
    def _step_plan(self, step: int, uses: _StepUses, next_use: np.ndarray) -> StepPlan:
        """Step ``step``'s sync plan, from its uses and their next uses (a ring view).

        Runs on the stepper thread while the planning thread reads the next round's batches: the
        only ring writes meanwhile are next uses ``> step + L`` replacing ``NEVER`` in this view,
        which mean the same to this plan, and ``RowMap.ids`` of these rows are final.
        """
        now = next_use == step + 1
        single = (uses.once_owner >= 0) & (next_use > step + self.config.lookahead)
        later = ~(now | single)
        ids = self._rowmap.ids.take(uses.rows)
        stats = self.stats
        stats.steps += 1
        stats.unique_ids += ids.size
        plan = StepPlan(
            step=step,
            sync_now=torch.from_numpy(ids.compress(now)),
            sync_later=torch.from_numpy(ids.compress(later)),
            singleton=torch.from_numpy(ids.compress(single)),
            singleton_owner=torch.from_numpy(uses.once_owner.compress(single).astype(np.int64)),
        )
        stats.sync_now_rows += plan.sync_now.numel()
        stats.singleton_rows += plan.singleton.numel()
        stats.sync_later_rows += plan.sync_later.numel()
        return plan

    def _release(self, step: int) -> None:
        """Forget step ``step`` (its round is committed and its plan made), oldest first."""
        del self._steps[step]
        self._ring.release_oldest()

    # ------------------------------------------------------------------ round plans
    def _round_plan(self, r: int) -> RoundPlan:
        """Round ``r``'s plan: evict, prefetch, then commit the round's uses to the resident set."""
        first, last = self.config.round_steps(r, self._num_steps)
        uses = [(i, self._steps[i], self._ring.next_uses(i)) for i in range(first, last + 1)]
        round_rows, sole_owner = self._round_rows(uses)
        victims = self._victims(r, first, last, round_rows.size)
        evicted, owners = self._evict(self._resident_rows.compress(victims))
        prefetch_ids, prefetch_owner = self._prefetch(round_rows, sole_owner, ~victims)
        self._commit(uses, last)
        return RoundPlan(
            round_index=r,
            first_step=first,
            last_step=last,
            evict=evicted,
            writeback_owner=owners,
            prefetch=torch.from_numpy(prefetch_ids),
            prefetch_owner=torch.from_numpy(prefetch_owner),
        )

    def _round_rows(self, uses: list[_RoundUse]) -> tuple[np.ndarray, np.ndarray]:
        """The round's rows, each once (at its first use in the round), and their fetch owner.

        The owner is the singleton owner if that use is the row's only use in the round (a
        singleton's next use lies beyond ``i + L > last``), else -1.
        """
        lookahead = self.config.lookahead
        round_rows = np.concatenate([u.rows.take(u.first_in_round) for _, u, _ in uses])
        sole_owner = np.concatenate(
            [
                np.where(
                    nxt.take(u.first_in_round) > i + lookahead,
                    u.once_owner.take(u.first_in_round),
                    -1,
                )
                for i, u, nxt in uses
            ]
        )
        return round_rows.astype(np.intp), sole_owner

    def _victims(self, r: int, first: int, last: int, round_size: int) -> np.ndarray:
        """Which resident rows round ``r`` evicts (a mask over ``_resident_rows``).

        Always the eligible stale rows; then expired leases without a capacity, or with one the
        rows Belady's rule picks to make room for the round's ``round_size`` rows.
        """
        cfg = self.config
        state = self._rows
        resident = self._resident_rows
        latest = state.res_last.take(resident)
        # the first use after a committed one: a step read so far (<= horizon) or NEVER
        next_use = state.res_next.take(resident)
        view = _Residents(
            latest=latest,
            next_use=next_use,
            eligible=latest <= cfg.eviction_cutoff(r),
            in_round=next_use <= last,  # (it is at >= first)
        )
        stale = np.asarray(state.res_owner.take(resident)) >= 0
        victims = view.eligible & stale
        if cfg.capacity is None:
            expired = next_use > np.maximum(latest + cfg.lookahead, last)
            victims |= view.eligible & ~stale & expired
        else:
            self._check_capacity(r, first, last, view, round_size)
            self._make_room(victims, view, round_size)
        return victims

    def _check_capacity(
        self, r: int, first: int, last: int, view: _Residents, round_size: int
    ) -> None:
        """Raise ``CapacityError`` if the rows that may not go and the round's rows cannot all
        be resident at once."""
        cfg = self.config
        assert cfg.capacity is not None
        pinned = ~view.eligible
        needed = int(pinned.sum()) + round_size - int((pinned & view.in_round).sum())
        if needed > cfg.capacity:
            raise CapacityError(
                f"round {r} (steps {first}..{last}) needs {needed} resident rows at once "
                f"(steps {max(0, (r - 1) * cfg.ci - 1)}..{last}); capacity is {cfg.capacity}",
                min_capacity=needed,
            )

    def _make_room(self, victims: np.ndarray, view: _Residents, round_size: int) -> None:
        """Add to ``victims`` as many eligible rows the round does not use as must go for the
        resident set to fit the capacity once the round's rows are in, by Belady's rule."""
        cfg = self.config
        assert cfg.capacity is not None
        resident = self._resident_rows
        kept_in_round = int((view.in_round & ~victims).sum())
        size_after = resident.size - int(victims.sum()) + round_size - kept_in_round
        excess = size_after - cfg.capacity
        if excess <= 0:
            return
        candidates = np.flatnonzero(view.eligible & ~victims & ~view.in_round)
        chosen = candidates[
            self._furthest(resident.take(candidates), view.next_use.take(candidates), excess)
        ]
        victims[chosen] = True
        self.stats.capacity_evictions += excess
        self.stats.lease_breaks += int(
            (view.next_use[chosen] <= view.latest[chosen] + cfg.lookahead).sum()
        )

    def _prefetch(
        self, round_rows: np.ndarray, sole_owner: np.ndarray, kept: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Make the round's rows that are not resident (after the evictions) resident; their sorted
        ids and fetch owners. ``kept`` masks the resident rows that were not evicted."""
        state = self._rows
        fetch = np.flatnonzero(~state.resident.take(round_rows))
        prefetch_rows, prefetch_owner = round_rows.take(fetch), sole_owner.take(fetch)
        state.resident[prefetch_rows] = True
        self._resident_rows = np.concatenate([self._resident_rows.compress(kept), prefetch_rows])
        stats = self.stats
        stats.rounds += 1
        stats.rows_prefetched += prefetch_rows.size
        stats.row_fetches += int(np.where(prefetch_owner < 0, self.config.num_trainers, 1).sum())
        stats.peak_resident_rows = max(stats.peak_resident_rows, self._resident_rows.size)
        return _sorted_with_owner(
            self._rowmap.ids.take(prefetch_rows), prefetch_owner, self._owner_bits
        )

    def _commit(self, uses: list[_RoundUse], last: int) -> None:
        """Record each row's latest use in the round (its last use before a step ``> last``) as
        its committed latest use, with its stale owner and its next use."""
        cfg = self.config
        state = self._rows
        for i, u, nxt in uses:
            latest_use = np.flatnonzero(nxt > last)
            rows = u.rows.take(latest_use).astype(np.intp)
            following = nxt.take(latest_use)
            state.res_last[rows] = i
            if cfg.num_trainers > 1:  # with one trainer no copy goes stale
                stale = following > i + cfg.lookahead
                state.res_owner[rows] = np.where(stale, u.once_owner.take(latest_use), -1)
            state.res_next[rows] = following
        self._committed_through = last

    def _furthest(self, rows: np.ndarray, next_use: np.ndarray, count: int) -> np.ndarray:
        """Positions of the ``count`` rows Belady's rule evicts: furthest next use, then larger id.

        Two linear selections instead of one over ``next_use << 32 | id``, which ids ``>= 2**32``
        would corrupt: every row beyond the ``count``-th largest next use goes, and the rows tied
        at it give their largest ids for the remaining places.
        """
        if count >= next_use.size:
            return np.arange(next_use.size)
        threshold = np.partition(next_use, next_use.size - count)[next_use.size - count]
        beyond = np.flatnonzero(next_use > threshold)
        tied = np.flatnonzero(next_use == threshold)
        ids = self._rowmap.ids.take(rows[tied])
        remaining = count - beyond.size  # >= 1: fewer than count rows lie beyond the threshold
        largest = np.argpartition(ids, ids.size - remaining)[ids.size - remaining :]
        return np.concatenate([beyond, tied[largest]])

    def _evict(self, rows: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """Drop ``rows`` from the resident set; their sorted ids and write-back owners."""
        state = self._rows
        ids, owners = _sorted_with_owner(
            self._rowmap.ids.take(rows), state.res_owner.take(rows), self._owner_bits
        )
        shared = owners < 0
        num_shared = int(shared.sum())
        owners[shared] = (np.arange(num_shared) * self.config.num_trainers) // max(1, num_shared)
        state.resident[rows] = False
        state.res_owner[rows] = -1
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

        Two helper threads take work off this one (numpy releases the GIL, so a second core
        shares it): a worker computes the unique ids and dense indices of the next ``AHEAD``
        batches, and a stepper makes a round's step plans while this thread reads the batches of
        the round after. They share no state with this thread but the ``RowMap``'s append-only
        ids and ring values that mean the same to them either way (``_step_plan``), so the plans
        do not depend on the timing. Their time while this thread works is not planning time on
        the critical path and is not counted; time this thread waits for them is.

        While it plans, numpy allocates without advising transparent huge pages, process-wide
        (``bagpipe.core.memory.small_pages``: faulting them in made planning slower).
        """
        if self._started:
            raise RuntimeError("an OracleCacher plans one stream; make a new one for another")
        self._started = True
        with (
            small_pages(),
            ThreadPoolExecutor(1, thread_name_prefix="oracle-prepare") as worker,
            ThreadPoolExecutor(1, thread_name_prefix="oracle-steps") as stepper,
        ):
            yield from self._plans(iter(batches), worker, stepper, flush)

    def _plans(
        self,
        source: Iterator[BatchLike],
        worker: ThreadPoolExecutor,
        stepper: ThreadPoolExecutor,
        flush: bool,
    ) -> Iterator[StepPlan | RoundPlan]:
        """``plan()``'s work: the worker prepares batches ahead, the stepper makes step plans."""
        cfg = self.config
        ahead = _Ahead(source, worker, self._prepare)
        # order: round plans 0 and 1, step plans of round 0, round plan 2, step plans of round 1,
        # ...; round r-1's step plans are made while the batches of round r+1's horizon are read
        r = 0
        started: list[tuple[int, Future[StepPlan]]] = []
        while True:
            first = r * cfg.ci
            self._read_until(first + cfg.ci - 1 + cfg.lookahead, ahead)  # round r's horizon
            yield from self._finish_steps(started)
            if self._num_steps is not None and first >= self._num_steps:
                break
            yield self._timed(self._round_plan, r)
            started = self._start_steps(r - 1, stepper) if r >= 1 else []
            r += 1
        if r >= 1:
            yield from self._finish_steps(self._start_steps(r - 1, stepper))
        if flush and self._num_steps is not None:
            yield self._timed(self._flush_plan, r)

    def _read_until(self, step: int, ahead: _Ahead) -> None:
        """Record batches through ``step`` (or to the end of the stream, which sets ``_num_steps``)."""
        while self._num_steps is None and self._ingested <= step:
            ahead.fill()
            if not ahead:
                self._num_steps = self._ingested
                return
            prepared = self._timed(ahead.popleft().result)
            ahead.fill()  # the worker starts on the next batch before this one is recorded
            self._timed(self._record, prepared)

    def _start_steps(
        self, r: int, stepper: ThreadPoolExecutor
    ) -> list[tuple[int, Future[StepPlan]]]:
        """Round ``r``'s step plans, started on the stepper (views taken on this thread)."""
        return [
            (i, stepper.submit(self._step_plan, i, self._steps[i], self._ring.next_uses(i)))
            for i in range(*_span(self.config.round_steps(r, self._num_steps)))
        ]

    def _finish_steps(self, started: list[tuple[int, Future[StepPlan]]]) -> Iterator[StepPlan]:
        """The started step plans, in step order, each step forgotten once its plan is out."""
        for i, future in started:
            yield self._timed(future.result)
            self._release(i)

    def _timed(self, make: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
        """``make(*args, **kwargs)``, its time on this thread counted as planning time."""
        started = time.perf_counter()
        result = make(*args, **kwargs)
        self.stats.planning_time_s += time.perf_counter() - started
        return result


class _Ahead:
    """The worker stage's queue: up to ``AHEAD`` next batches being prepared, in stream order."""

    def __init__(
        self,
        source: Iterator[BatchLike],
        worker: ThreadPoolExecutor,
        prepare: Callable[[BatchLike, int], _Prepared],
    ) -> None:
        self._source = source
        self._worker = worker
        self._prepare = prepare
        self._futures: deque[Future[_Prepared]] = deque()
        self._exhausted = False
        self._taken = 0  # batches taken from the source

    def fill(self) -> None:
        """Take batches from the source until ``AHEAD`` are queued or the source ends."""
        while not self._exhausted and len(self._futures) < AHEAD:
            try:
                batch = next(self._source)
            except StopIteration:
                self._exhausted = True
                return
            self._futures.append(self._worker.submit(self._prepare, batch, self._taken))
            self._taken += 1

    def popleft(self) -> Future[_Prepared]:
        return self._futures.popleft()

    def __bool__(self) -> bool:
        return bool(self._futures)


def _span(steps: tuple[int, int]) -> tuple[int, int]:
    return steps[0], steps[1] + 1


def _sorted_with_owner(
    ids: np.ndarray, owners: np.ndarray, owner_bits: int
) -> tuple[np.ndarray, np.ndarray]:
    """``ids`` sorted ascending and ``owners`` (``-1 .. T-1``) in the same order, as int64.

    One sort of ``id << b | owner + 1`` (``b = owner_bits`` hold ``0 .. T``; ids are below
    ``2**47`` and ``b <= 15``) instead of an argsort and two gathers, as int32 keys when they fit
    (2.4x faster than int64 on 1 M keys).
    """
    fits = not ids.size or int(ids.max()) < 1 << (31 - owner_bits)
    dtype: type[np.signedinteger] = np.int32 if fits else np.int64
    packed = np.left_shift(ids.astype(dtype, copy=False), owner_bits) | (owners.astype(dtype) + 1)
    packed.sort()
    sorted_ids = (packed >> owner_bits).astype(np.int64, copy=False)
    sorted_owners = (packed & ((1 << owner_bits) - 1)).astype(np.int64, copy=False) - 1
    return sorted_ids, sorted_owners
