"""A Criteo-Kaggle-shaped stream of global batches for the oracle benchmark, and its realised skew.

DLRM's 26 Kaggle tables at full size with the fitted Zipf exponents, models and missing rates
(``bagpipe.data.presets.CRITEO_KAGGLE``, data.md §3.2), global batch ``BATCH_SIZE``. Ids are drawn
directly with numpy by inverse CDF (``_TableSampler``), far faster than the data generator, so a
stream long enough for the planner's steady state takes seconds to make.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from bagpipe.core.batch import DatasetSchema
from bagpipe.data.presets import CRITEO_KAGGLE, TableSpec

__all__ = ["BATCH_SIZE", "kaggle_schema", "kaggle_stream", "skew"]

BATCH_SIZE = 16_384
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


def kaggle_schema(sizes: list[int]) -> DatasetSchema:
    """The Kaggle schema with tables of ``sizes`` rows (the stream's, or stand-ins)."""
    names = tuple(t.name for t in CRITEO_KAGGLE.tables)
    return DatasetSchema(CRITEO_KAGGLE.name, len(CRITEO_KAGGLE.dense), tuple(sizes), names)


def skew(batches: list[np.ndarray]) -> dict[str, float]:
    """Share of all accesses taken by the top 0.1/1/10% of touched rows."""
    counts = np.unique(np.concatenate([b.reshape(-1) for b in batches]), return_counts=True)[1]
    counts = np.sort(counts)[::-1]
    total = counts.sum()
    return {
        f"top_{p}%_share": float(counts[: max(1, int(counts.size * p / 100))].sum() / total)
        for p in (0.1, 1, 10)
    }
