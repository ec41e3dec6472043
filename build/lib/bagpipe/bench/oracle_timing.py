"""What the oracle benchmark times: ``OracleCacher`` over a stream, and the iterations it must keep
ahead of.

A planner run reports its planning time (the planning thread's, ``OracleStats.planning_time_s``) and
this process's CPU time (helper threads included), over the whole stream and over its steady state
(:func:`steady_steps`). Peak memory comes from a run of its own under ``tracemalloc``, which slows
every allocation. The iterations are timed on the same machine in the same run, so that their
ratio to the planning time per batch means something on a shared machine.
"""

from __future__ import annotations

import math
import statistics
import time
import tracemalloc

import numpy as np
import torch

from bagpipe.bench.oracle_stream import BATCH_SIZE, kaggle_schema
from bagpipe.core.interface import OptimConfig, TrainContext
from bagpipe.data.examples import Examples
from bagpipe.data.sources import ArraySource
from bagpipe.models import ModelConfig, build_dense_model
from bagpipe.oracle import OracleCacher, OracleConfig
from bagpipe.training.local import LocalSystem

__all__ = [
    "LOOKAHEAD",
    "NUM_TRAINERS",
    "DenseStep",
    "LocalStep",
    "planner_peak_bytes",
    "planner_timing",
    "steady_steps",
]

LOOKAHEAD = 200
NUM_TRAINERS = 8


def steady_steps(num_batches: int) -> tuple[int, int]:
    """Step plans ``first`` .. ``last`` mark the planner's steady state: the window is full (L
    steps planned) and batches are still being read (``last``'s round reads up to ``last + L +
    ci``), so each step of the span costs one batch read, one step plan and 1/ci round plan."""
    ci = OracleConfig(NUM_TRAINERS, LOOKAHEAD).ci
    return LOOKAHEAD, num_batches - LOOKAHEAD - 2 * ci


def planner_timing(
    batches: list[np.ndarray], sizes: list[int], capacity: int | None
) -> dict[str, float]:
    """One timed run: planning and CPU time over the whole stream and over its steady state."""
    planner = _planner(sizes, capacity)
    stats = planner.stats
    first, last = steady_steps(len(batches))
    marks: dict[int, tuple[float, float]] = {}  # step plans emitted -> (planning s, CPU s)
    cpu_started = time.process_time()
    for _ in planner.plan(batches):
        if stats.steps in (first, last) and stats.steps not in marks:
            marks[stats.steps] = (stats.planning_time_s, time.process_time() - cpu_started)
    cpu_s = time.process_time() - cpu_started
    steady = {}
    if first < last:
        steady = {
            "steady_wall_s": marks[last][0] - marks[first][0],
            "steady_cpu_s": marks[last][1] - marks[first][1],
            "steady_batches": last - first,
        }
    return {
        **steady,
        "wall_s": stats.planning_time_s,
        "cpu_s": cpu_s,
        "unique_ids": stats.unique_ids,
        "peak_resident_rows": stats.peak_resident_rows,
        "rows_prefetched": stats.rows_prefetched,
        "capacity_evictions": stats.capacity_evictions,
        "lease_breaks": stats.lease_breaks,
    }


def planner_peak_bytes(batches: list[np.ndarray], sizes: list[int], capacity: int | None) -> int:
    """Peak memory allocated while planning, from a run of its own under ``tracemalloc`` (tracing
    slows every allocation, and the original's timed run is not traced either)."""
    tracemalloc.start()
    for _ in _planner(sizes, capacity).plan(batches):
        pass
    _, peak_bytes = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak_bytes


def _planner(sizes: list[int], capacity: int | None) -> OracleCacher:
    return OracleCacher(
        kaggle_schema(sizes), OracleConfig(NUM_TRAINERS, LOOKAHEAD, capacity=capacity)
    )


class DenseStep:
    """The default small DLRM's dense forward + backward alone at B = 16384 (embedding rows given):
    a lower bound of any training iteration of this configuration. Timed as the best of
    ``repeats``."""

    def __init__(self, num_tables: int, repeats: int) -> None:
        cfg = ModelConfig()
        schema = kaggle_schema([2] * num_tables)
        self.model = build_dense_model(cfg, schema, seed=0)
        self.dense = torch.randn(BATCH_SIZE, schema.num_dense)
        self.pooled = torch.randn(BATCH_SIZE, num_tables, cfg.embedding_dim, requires_grad=True)
        self.labels = torch.randint(0, 2, (BATCH_SIZE,)).float()
        self.repeats = repeats

    def __call__(self) -> float:
        best = math.inf
        for _ in range(self.repeats):
            started = time.perf_counter()
            logits = self.model(self.dense, self.pooled)
            torch.nn.functional.binary_cross_entropy_with_logits(logits, self.labels).backward()
            best = min(best, time.perf_counter() - started)
        return best


class LocalStep:
    """A ``local`` training step (the ideal system: unique, gather, forward, backward, sparse and
    dense SGD) of the default small DLRM on the stream's batches, full-size Kaggle tables: the
    iteration the planner must keep ahead of. Set up once (the tables take seconds to build);
    timed as the median of ``repeats`` steps."""

    def __init__(self, batches: list[np.ndarray], sizes: list[int], repeats: int) -> None:
        schema = kaggle_schema(sizes)
        rng = np.random.default_rng(0)
        count = repeats + 1
        examples = Examples(
            labels=rng.integers(0, 2, count * BATCH_SIZE).astype(np.int8),
            dense=rng.standard_normal((count * BATCH_SIZE, schema.num_dense), dtype=np.float32),
            ids=np.concatenate(batches[:count]) - schema.table_offsets.numpy(),
        )
        self.source = ArraySource(examples, schema, BATCH_SIZE)
        self.system = LocalSystem()
        self.system.setup(
            TrainContext(schema, ModelConfig(), OptimConfig(), BATCH_SIZE, 0, self.source)
        )
        self.system.train_step(0, self.source[0])  # pays first-touch costs
        self.repeats = repeats
        self.step = 1

    def __call__(self) -> float:
        times = []
        for _ in range(self.repeats):
            batch = self.source[self.step % len(self.source)]
            started = time.perf_counter()
            self.system.train_step(self.step, batch)
            times.append(time.perf_counter() - started)
            self.step += 1
        return statistics.median(times)

    def close(self) -> None:
        self.system.close()
