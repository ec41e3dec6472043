"""Oracle planning throughput on a Criteo-Kaggle-shaped stream, against the original's algorithm.

The stream: DLRM's 26 Kaggle tables at full size with the fitted Zipf exponents, models and
missing rates (``bagpipe.data.presets.CRITEO_KAGGLE``, data.md §3.2), global batch 16384, L = 200,
T = 8. Ids are drawn directly with numpy by inverse CDF (``_TableSampler``); the stream is made
once per run and shared by every variant. Its realised skew (share of accesses taken by the top
0.1/1/10% of touched rows) is reported beside TARGETS.md's anchor (79.1/92.1/96.3%).

Measured in one run, each as wall time and as this process's CPU time (it includes the planner's
helper threads, so the wall time on the planning thread can be lower):

* ``OracleCacher`` told the tables (as ``Batch``es would), without and with a capacity of 0.6 x
  the uncapped peak resident rows (raised to the minimum a round needs if that is more);
* ``original_oracle``, a faithful re-implementation of the ORIGINAL Bagpipe oracle's algorithm
  (dense per-row int64 ``last_seen`` / ``lease`` arrays over every row of every table, per-table
  ``np.unique`` and ``in1d``; bagpipe.md §2.2), for planning alone and with its per-table
  unique/once computation (like with like: our figure includes our unique/once);
* the ratio of planning time per batch to a training iteration of the same configuration, two
  ways: a ``local`` step of the default small DLRM on the stream's own batches with full-size
  Kaggle tables (the ideal system's whole iteration: what the planner must keep ahead of), and
  that model's dense forward + backward alone (embedding rows given), a lower bound of any
  iteration, so that ratio is an upper bound. The planning time in the ratios is per batch in
  steady state (the window full, batches still being read; ``_steady_steps``) when the stream is
  long enough (the full run), else over the whole stream, whose first L batches fill the window
  and whose row map and per-row state grow most.

The machine is shared and its speed drifts by tens of percent within minutes, so the full run
repeats (OracleCacher, original, both iterations) three times and reports medians: each planning
ratio is taken over the mean of the iterations timed just before and just after that planner run,
each speed-up over the original from the pair of runs made together, and the spread of the
target ratio is reported beside its median. Rows fetched at T = 8 include refetches the design
forces (plan.py): a row last used by one trainer alone is stale on the others, so it is written
back, evicted and fetched again if reused; they are not counted apart here.
"""

from __future__ import annotations

import itertools
import math
import statistics
import time
import tracemalloc
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from bagpipe.core.batch import DatasetSchema
from bagpipe.core.interface import OptimConfig, TrainContext
from bagpipe.data.sources import ArraySource
from bagpipe.data.examples import Examples
from bagpipe.data.presets import CRITEO_KAGGLE, TableSpec
from bagpipe.harness.track.workspace import git_sha, machine
from bagpipe.models import ModelConfig, build_dense_model
from bagpipe.oracle import CapacityError, OracleCacher, OracleConfig
from bagpipe.training.local import LocalSystem

BATCH_SIZE = 16_384
LOOKAHEAD = 200
NUM_TRAINERS = 8
_HEAD_RANKS = 1 << 16  # exact CDF over the first ranks of a large table, Pareto tail beyond


@dataclass
class _TableSampler:
    """Rows of one table by inverse CDF: rank 0 = missing row 0; ranks 1.. Zipf(s) over the table
    (``finite``: truncated; ``heaps``: infinite, tail beyond the head drawn as a continuous Pareto
    and folded onto the table); ranks scattered over rows by a bijection ``rank * a mod rows``."""

    spec: TableSpec
    cdf: np.ndarray  # over ranks 1 .. len(cdf), conditional on not missing, ending at head mass
    tail_mass: float  # probability of a rank beyond the head (heaps tables)
    multiplier: int

    @classmethod
    def build(cls, spec: TableSpec) -> _TableSampler:
        rows = spec.rows
        head = min(rows - 1, _HEAD_RANKS)
        weights = np.arange(1, head + 1, dtype=np.float64) ** -spec.zipf_s
        tail = 0.0
        if spec.model == "heaps":
            s = spec.zipf_s
            n = head + 0.5
            tail = n ** (1 - s) / (s - 1)  # integral of k**-s beyond the head
        total = float(weights.sum()) + tail
        multiplier = int(rows * 0.6180339887) | 1
        while math.gcd(multiplier, rows) != 1:
            multiplier += 2
        return cls(spec, np.cumsum(weights) / total, tail / total, multiplier)

    def sample(self, rng: np.random.Generator, count: int) -> np.ndarray:
        rows = self.spec.rows
        ranks = np.searchsorted(self.cdf, rng.random(count), side="right") + 1
        beyond = ranks > self.cdf.size
        if self.tail_mass == 0.0:  # finite table: only rounding can pass the last rank
            np.minimum(ranks, self.cdf.size, out=ranks)
        elif beyond.any():
            s = self.spec.zipf_s
            v = rng.random(int(beyond.sum()))
            pareto = (self.cdf.size + 0.5) * v ** (-1.0 / (s - 1))
            ranks[beyond] = (np.minimum(pareto, 2.0**62).astype(np.int64) - 1) % (rows - 1) + 1
        out = (ranks * self.multiplier) % rows
        out[rng.random(count) < self.spec.missing_rate] = 0
        return out


def kaggle_stream(num_batches: int, seed: int = 0) -> tuple[list[np.ndarray], list[int]]:
    """``num_batches`` ``[B, 26]`` global-id matrices (Kaggle-shaped) and the table sizes.

    Stored feature by feature, as ``global_ids`` of a KJT ``Batch`` lays them out (a KJT's values
    are key-major), so that no variant pays a transpose that batches from a real source skip.
    """
    rng = np.random.default_rng(seed)
    samplers = [_TableSampler.build(t) for t in CRITEO_KAGGLE.tables]
    sizes = [t.rows for t in CRITEO_KAGGLE.tables]
    offsets = np.cumsum([0, *sizes[:-1]])
    batches = []
    for _ in range(num_batches):
        columns = np.empty((len(sizes), BATCH_SIZE), dtype=np.int64)
        for f, sampler in enumerate(samplers):
            columns[f] = sampler.sample(rng, BATCH_SIZE) + offsets[f]
        batches.append(columns.T)
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


def _schema(sizes: list[int]) -> DatasetSchema:
    names = tuple(t.name for t in CRITEO_KAGGLE.tables)
    return DatasetSchema(CRITEO_KAGGLE.name, len(CRITEO_KAGGLE.dense), tuple(sizes), names)


def _steady_steps(num_batches: int) -> tuple[int, int]:
    """Step plans ``first`` .. ``last`` mark the planner's steady state: the window is full (L
    steps planned) and batches are still being read (``last``'s round reads up to ``last + L +
    ci``), so each step of the span costs one batch read, one step plan and 1/ci round plan."""
    ci = OracleConfig(NUM_TRAINERS, LOOKAHEAD).ci
    return LOOKAHEAD, num_batches - LOOKAHEAD - 2 * ci


def _planner(sizes: list[int], capacity: int | None) -> OracleCacher:
    return OracleCacher(
        _schema(sizes), OracleConfig(NUM_TRAINERS, LOOKAHEAD, capacity=capacity)
    )


def _planner_timing(
    batches: list[np.ndarray], sizes: list[int], capacity: int | None
) -> dict[str, float]:
    """One timed run: planning and CPU time over the whole stream and over its steady state."""
    planner = _planner(sizes, capacity)
    stats = planner.stats
    first, last = _steady_steps(len(batches))
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


def _planner_peak_bytes(batches: list[np.ndarray], sizes: list[int], capacity: int | None) -> int:
    """Peak memory allocated while planning, from a run of its own under ``tracemalloc`` (tracing
    slows every allocation, and the original's timed run is not traced either)."""
    tracemalloc.start()
    for _ in _planner(sizes, capacity).plan(batches):
        pass
    _, peak_bytes = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak_bytes


def _skew(batches: list[np.ndarray]) -> dict[str, float]:
    """Share of all accesses taken by the top 0.1/1/10% of touched rows."""
    counts = np.unique(np.concatenate([b.reshape(-1) for b in batches]), return_counts=True)[1]
    counts = np.sort(counts)[::-1]
    total = counts.sum()
    return {
        f"top_{p}%_share": float(counts[: max(1, int(counts.size * p / 100))].sum() / total)
        for p in (0.1, 1, 10)
    }


class _DenseStep:
    """The default small DLRM's dense forward + backward alone at B = 16384 (embedding rows given):
    a lower bound of any training iteration of this configuration. Timed as the best of
    ``repeats``."""

    def __init__(self, num_tables: int, repeats: int) -> None:
        cfg = ModelConfig()
        schema = _schema([2] * num_tables)
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


class _LocalStep:
    """A ``local`` training step (the ideal system: unique, gather, forward, backward, sparse and
    dense SGD) of the default small DLRM on the stream's batches, full-size Kaggle tables: the
    iteration the planner must keep ahead of. Set up once (the tables take seconds to build);
    timed as the median of ``repeats`` steps."""

    def __init__(self, batches: list[np.ndarray], sizes: list[int], repeats: int) -> None:
        schema = _schema(sizes)
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


def run(quick: bool) -> list[dict]:
    num_batches = 260 if quick else 800  # only a stream over 2L + 2ci batches has a steady state
    batches, sizes = kaggle_stream(num_batches)  # made once, shared by every variant
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
                "trainers": NUM_TRAINERS,
            }
        )

    for name, share in _skew(batches[: min(num_batches, 100)]).items():
        add("stream", name, share, "fraction")

    def add_speed(variant: str, wall_s: float, cpu_s: float, unique_ids: int) -> None:
        add(variant, "ms_per_batch_wall", 1e3 * wall_s / num_batches, "ms")
        add(variant, "ms_per_batch_cpu", 1e3 * cpu_s / num_batches, "ms")
        add(variant, "batches_per_s_cpu", num_batches / cpu_s, "batches/s")
        add(variant, "unique_ids_per_s_cpu", unique_ids / cpu_s, "ids/s")

    # repetitions of (OracleCacher, original, the two iterations), each planning ratio over the
    # mean of the iterations timed just before and just after it, so that a drift of the shared
    # machine's speed moves numerator and denominator alike; medians over the repetitions
    repeats = 1 if quick else 3
    local = _LocalStep(batches, sizes, 3 if quick else 5)
    timers: dict[str, Callable[[], float]] = {
        "local_dlrm_small_step_b16384_cpu": local,
        "dlrm_small_dense_fwd_bwd_b16384_cpu": _DenseStep(len(sizes), 3 if quick else 5),
    }
    iteration_s = {name: [timer()] for name, timer in timers.items()}
    ours, originals = [], []
    for _ in range(repeats):
        ours.append(_planner_timing(batches, sizes, None))
        cpu_started = time.process_time()
        original = original_oracle(batches, sizes, LOOKAHEAD)
        originals.append({**original, "cpu_s": time.process_time() - cpu_started})
        for name, timer in timers.items():
            iteration_s[name].append(timer())
    local.close()

    free = ours[0]
    unique_ids = int(free["unique_ids"])
    add("ratio", "repetitions", repeats, "runs")
    add("ratio", "unique_ids_per_batch", unique_ids / num_batches, "ids")
    median = statistics.median
    add_speed(
        "oracle_cacher",
        median(run["wall_s"] for run in ours),
        median(run["cpu_s"] for run in ours),
        unique_ids,
    )
    # per batch in steady state, else over the whole stream (window fill and table growth included)
    steady = "steady_batches" in free
    batches_timed = free["steady_batches"] if steady else num_batches
    planning = {
        clock: [
            run[f"steady_{clock}_s" if steady else f"{clock}_s"] / batches_timed for run in ours
        ]
        for clock in ("wall", "cpu")
    }
    if steady:
        add("oracle_cacher_steady", "batches", batches_timed, "batches")
        for clock, per_batch in planning.items():
            add("oracle_cacher_steady", f"ms_per_batch_{clock}", 1e3 * median(per_batch), "ms")
    add(
        "oracle_cacher",
        "peak_traced_memory",
        _planner_peak_bytes(batches, sizes, None) / 2**20,
        "MiB",
    )
    add("oracle_cacher", "peak_resident_rows", free["peak_resident_rows"], "rows")
    add("oracle_cacher", "rows_prefetched", free["rows_prefetched"], "rows")
    # 0.6 x the uncapped peak, raised to the minimum a round needs when that is larger (the
    # CapacityError says it); each failed try costs a partial run
    capacity = int(0.6 * free["peak_resident_rows"])
    capped = None
    for _ in range(3):
        try:
            capped = _planner_timing(batches, sizes, capacity)
            break
        except CapacityError as error:
            capacity = max(capacity + 1, int(1.02 * error.min_capacity))
    variant = f"oracle_cacher_capacity_{capacity}"
    if capped is None:
        add(variant, "capacity_error", float("nan"), "rows")
    else:
        add(variant, "capacity_over_uncapped_peak", capacity / free["peak_resident_rows"], "x")
        add_speed(variant, capped["wall_s"], capped["cpu_s"], unique_ids)
        peak_bytes = _planner_peak_bytes(batches, sizes, capacity)
        add(variant, "peak_traced_memory", peak_bytes / 2**20, "MiB")
        for key in ("rows_prefetched", "capacity_evictions", "lease_breaks"):
            add(variant, key, capped[key], "rows")

    original_wall = [run["plan_s"] + run["unique_s"] for run in originals]
    original_cpu = [run["cpu_s"] for run in originals]
    add_speed(
        "original_dense_numpy_with_unique", median(original_wall), median(original_cpu), unique_ids
    )
    add(
        "original_dense_numpy",
        "ms_per_batch_wall_planning_only",
        1e3 * median(run["plan_s"] for run in originals) / num_batches,
        "ms",
    )
    add("original_dense_numpy", "state_memory", 2 * 8 * sum(sizes) / 2**20, "MiB")
    for clock, theirs in (("cpu", original_cpu), ("wall", original_wall)):
        speedups = [other / run[f"{clock}_s"] for other, run in zip(theirs, ours, strict=True)]
        add(
            "ratio", f"oracle_cacher_speed_over_original_with_unique_{clock}", median(speedups), "x"
        )
    for name, times in iteration_s.items():
        add(name, "iteration_ms", 1e3 * median(times), "ms")
        around = [(before + after) / 2 for before, after in itertools.pairwise(times)]
        for clock, per_batch in planning.items():
            shares = [plan_s / iter_s for plan_s, iter_s in zip(per_batch, around, strict=True)]
            metric = f"oracle_cacher_{clock}_per_batch_over_{name}"
            add("ratio", metric, median(shares), "x")
            if repeats > 1:
                add("ratio", f"{metric}_min", min(shares), "x")
                add("ratio", f"{metric}_max", max(shares), "x")
    return rows


TARGET_SHARE = 0.05  # TARGETS.md: planning time per batch <= 5% of the iteration time


def _verdicts(value: Callable[[str, str], float | None]) -> list[str]:
    """One line per target, from the rows: the measured figure and whether it meets the target."""
    lines = []
    share_metric = "oracle_cacher_wall_per_batch_over_local_dlrm_small_step_b16384_cpu"
    share = value("ratio", share_metric)
    if share is not None:
        low, high = value("ratio", f"{share_metric}_min"), value("ratio", f"{share_metric}_max")
        spread = f" (repetitions {low:.1%} to {high:.1%})" if low is not None and high is not None else ""
        verdict = "met" if share <= TARGET_SHARE else "not met"
        lines.append(
            f"* Measured: planning (planning thread, wall) per batch is {share:.1%} of a `local` "
            f"step{spread}: {verdict}."
        )
    for clock in ("wall", "cpu"):
        speedup = value("ratio", f"oracle_cacher_speed_over_original_with_unique_{clock}")
        if speedup is not None:
            verdict = "met" if speedup >= 1 else "not met"
            lines.append(
                f"* Measured: {speedup:.2f}x the original's speed by {clock} time: {verdict}."
            )
    ids_per_s = value("oracle_cacher", "unique_ids_per_s_cpu")
    if ids_per_s is not None:
        verdict = "met" if ids_per_s >= 1e6 else "not met"
        lines.append(f"* Measured: {ids_per_s / 1e6:.1f} M unique ids per CPU-second: {verdict}.")
    return lines


def report(frame: pd.DataFrame, reports_dir: Path) -> list[Path]:
    """``reports/oracle.{png,md}``: planning time per batch of each variant beside 5% of the two
    iterations, and the ratios the targets are stated in."""
    import seaborn as sns

    from bagpipe.harness.report.figures import pyplot, save_figure

    def value(variant: str, metric: str) -> float | None:
        found = frame[(frame.variant == variant) & (frame.metric == metric)].value
        return float(found.iloc[0]) if len(found) else None

    capped = next((v for v in frame.variant.unique() if v.startswith("oracle_cacher_capacity")), "")
    capped_share = value(capped, "capacity_over_uncapped_peak") or float("nan")
    bars = []
    for label, variant in (
        ("OracleCacher, whole stream", "oracle_cacher"),
        ("OracleCacher, steady state", "oracle_cacher_steady"),
        (f"OracleCacher, capacity {capped_share:.2f}x peak", capped),
        ("original (dense arrays) + unique", "original_dense_numpy_with_unique"),
    ):
        for clock in ("wall", "cpu"):
            ms = value(variant, f"ms_per_batch_{clock}")
            if ms is not None:
                bars.append({"variant": label, "clock": clock, "ms per batch": ms})
    fig, ax = pyplot().subplots(figsize=(8, 4.2))
    sns.barplot(pd.DataFrame(bars), y="variant", x="ms per batch", hue="clock", ax=ax)
    iterations = frame[frame.metric == "iteration_ms"]
    for (variant, ms), style in zip(
        iterations[["variant", "value"]].values, ("--", ":"), strict=False
    ):
        ax.axvline(TARGET_SHARE * ms, color="k", linestyle=style, label=f"5% of {variant}")
    ax.set_ylabel("")
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.4, -0.18), ncol=2)
    ax.set_title("Oracle planning per batch (Kaggle-shaped, B=16384, L=200, T=8)", fontsize=10)
    figure = save_figure(fig, reports_dir / "oracle.png")

    rows = ["| variant | metric | value | unit |", "|---|---|---|---|"]
    for record in frame.itertuples(index=False):
        rows.append(f"| {record.variant} | {record.metric} | {record.value:.4g} | {record.unit} |")
    text = [
        "# oracle: planning throughput against the original and against the iteration",
        "",
        f"![oracle]({figure.name})",
        "",
        *rows,
        "",
        "## Targets (TARGETS.md)",
        "",
        "* Planning time per batch <= 5% of the training iteration time of the same configuration.",
        "* At least the original implementation's speed on the same stream, while also enforcing "
        "the capacity and keeping memory proportional to rows seen; >= 1 M unique ids/s per core.",
        "",
        *_verdicts(value),
        "",
        "## Setting and provenance",
        "",
        f"* {frame.batches.iloc[0]} batches of {frame.batch_size.iloc[0]}, L = "
        f"{frame.lookahead.iloc[0]}, T = {frame.trainers.iloc[0]}; what each row measures: the "
        "docstring of `bagpipe/bench/oracle.py`.",
        f"* Machine: {machine()}",
        f"* Commit: {git_sha(Path.cwd())}",
        "* Regenerate: `nox -s bench -- --only oracle`.",
        "",
    ]
    path = reports_dir / "oracle.md"
    path.write_text("\n".join(text))
    return [figure, path]
