"""Oracle planning throughput on a Criteo-Kaggle-shaped stream, against the original's algorithm.

The stream: DLRM's 26 Kaggle tables at full size with the fitted Zipf exponents and missing rates
(``bagpipe.data.presets.CRITEO_KAGGLE``, data.md §3.2), ids drawn directly with numpy (a Zipf rank
per lookup, folded onto the table, missing = row 0), global batch 16384, L = 200.

Measured in one run: ``OracleCacher`` without and with a capacity, and ``original_oracle``, a
faithful re-implementation of the ORIGINAL Bagpipe oracle's algorithm (dense per-row int64
``last_seen`` / ``lease`` arrays over every row of every table, per-table ``np.unique`` and
``in1d``; ``bagpipe.md`` §2.2), timed (a) for planning alone and (b) including its per-table
unique/once computation. The ratio to a training iteration is left to ``bench/systems.py`` (not
measured here).
"""

from __future__ import annotations

import time
import tracemalloc
from collections import deque

import numpy as np

from bagpipe.data.presets import CRITEO_KAGGLE
from bagpipe.oracle import OracleCacher

BATCH_SIZE = 16_384
LOOKAHEAD = 200


def kaggle_stream(num_batches: int, seed: int = 0) -> tuple[list[np.ndarray], list[int]]:
    """``num_batches`` ``[B, 26]`` global-id matrices (Kaggle-shaped) and the table sizes."""
    rng = np.random.default_rng(seed)
    sizes = [t.rows for t in CRITEO_KAGGLE.tables]
    offsets = np.cumsum([0, *sizes[:-1]])
    permutations = [rng.permutation(size) if size < 1 << 22 else None for size in sizes]
    batches = []
    for _ in range(num_batches):
        columns = []
        for f, table in enumerate(CRITEO_KAGGLE.tables):
            s = max(table.zipf_s, 1.01)
            rank = rng.zipf(s, size=BATCH_SIZE) % max(1, table.rows - 1) + 1
            perm = permutations[f]
            rows = perm[rank] if perm is not None else (rank * 2654435761) % table.rows
            missing = rng.random(BATCH_SIZE) < table.missing_rate
            columns.append(np.where(missing, 0, rows) + offsets[f])
        batches.append(np.stack(columns, axis=1).astype(np.int64))
    return batches, sizes


def original_oracle(
    batches: list[np.ndarray], sizes: list[int], lookahead: int
) -> dict[str, float]:
    """The original oracle's per-batch work (dense arrays over all rows, per-table sets).

    Returns seconds spent in the per-table unique/once computation and in planning proper.
    """
    offsets = np.cumsum([0, *sizes[:-1]])
    last_seen = [np.full(size, -1, dtype=np.int64) for size in sizes]
    lease = [np.full(size, -1, dtype=np.int64) for size in sizes]
    window: deque = deque()
    unique_s = plan_s = 0.0
    per_table_unique = []
    started = time.perf_counter()
    for matrix in batches:
        tables = []
        for f in range(len(sizes)):
            ids, counts = np.unique(matrix[:, f] - offsets[f], return_counts=True)
            tables.append((ids, ids[counts == 1]))
        per_table_unique.append(tables)
    unique_s = time.perf_counter() - started
    started = time.perf_counter()
    for b in range(len(batches)):
        now_later = []
        for f in range(len(sizes)):
            ids, _ = per_table_unique[b][f]
            last_seen[f][ids] = b
            following = per_table_unique[b + 1][f][0] if b + 1 < len(batches) else ids[:0]
            now = ids[np.isin(ids, following, assume_unique=True)]
            now_later.append((now, np.setdiff1d(ids, now, assume_unique=True)))
        window.append((b, now_later))
        if len(window) < lookahead and b + 1 < len(batches):
            continue
        i, now_later = window.popleft()
        for f in range(len(sizes)):
            ids, once = per_table_unique[i][f]
            _prefetch = ids[lease[f][ids] < i]
            seen = last_seen[f][ids]
            reuse = ids[(seen > i) & (seen <= i + lookahead)]
            lease[f][reuse] = last_seen[f][reuse]
            no_sync = once[last_seen[f][once] == i]
            _later = np.setdiff1d(now_later[f][1], no_sync, assume_unique=True)
    plan_s = time.perf_counter() - started
    return {"unique_s": unique_s, "plan_s": plan_s}


def _planner_run(batches: list[np.ndarray], capacity: int | None) -> tuple[float, int, int, int]:
    planner = OracleCacher(None, num_trainers=8, lookahead=LOOKAHEAD, capacity=capacity)
    tracemalloc.start()
    for _ in planner.plan(batches):
        pass
    _, peak_bytes = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    stats = planner.stats
    return stats.planning_time_s, stats.unique_ids, peak_bytes, stats.peak_resident_rows


def run(quick: bool) -> list[dict]:
    num_batches = 260 if quick else 600
    batches, sizes = kaggle_stream(num_batches)
    rows: list[dict] = []

    def add(variant: str, metric: str, value: float, unit: str) -> None:
        rows.append(
            {
                "benchmark": "oracle",
                "variant": variant,
                "metric": metric,
                "value": value,
                "unit": unit,
                "batches": num_batches,
                "batch_size": BATCH_SIZE,
                "lookahead": LOOKAHEAD,
            }
        )

    uncapped_s, unique_ids, peak_bytes, peak_rows = _planner_run(batches, None)
    for variant, seconds, mem, resident in [("oracle_cacher", uncapped_s, peak_bytes, peak_rows)]:
        add(variant, "ms_per_batch", 1e3 * seconds / num_batches, "ms")
        add(variant, "unique_ids_per_s", unique_ids / seconds, "ids/s")
        add(variant, "peak_traced_memory", mem / 2**20, "MiB")
        add(variant, "peak_resident_rows", resident, "rows")
    capacity = int(0.6 * peak_rows)
    try:
        capped_s, _, capped_bytes, _ = _planner_run(batches, capacity)
        add(
            f"oracle_cacher_capacity_{capacity}", "ms_per_batch", 1e3 * capped_s / num_batches, "ms"
        )
        add(
            f"oracle_cacher_capacity_{capacity}", "unique_ids_per_s", unique_ids / capped_s, "ids/s"
        )
        add(f"oracle_cacher_capacity_{capacity}", "peak_traced_memory", capped_bytes / 2**20, "MiB")
    except ValueError as error:  # CapacityError: report rather than fail the whole suite
        add(f"oracle_cacher_capacity_{capacity}", "capacity_error", float("nan"), str(error)[:80])
    original = original_oracle(batches, sizes, LOOKAHEAD)
    dense_bytes = 2 * 8 * sum(sizes)
    add(
        "original_dense_numpy",
        "ms_per_batch_planning",
        1e3 * original["plan_s"] / num_batches,
        "ms",
    )
    add(
        "original_dense_numpy",
        "unique_ids_per_s_planning",
        unique_ids / original["plan_s"],
        "ids/s",
    )
    total = original["plan_s"] + original["unique_s"]
    add("original_dense_numpy", "unique_ids_per_s_with_unique", unique_ids / total, "ids/s")
    add("original_dense_numpy", "state_memory", dense_bytes / 2**20, "MiB")
    add("ratio", "oracle_cacher_speed_over_original_with_unique", total / uncapped_s, "x")
    add("ratio", "unique_ids_per_batch", unique_ids / num_batches, "ids")
    return rows
