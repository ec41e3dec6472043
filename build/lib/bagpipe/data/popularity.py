"""Per-table access distributions of the synthetic generator and the skew calibration knob κ.

Each table's distribution is kept in *rank order* (``rank_probs``, rank 0 = the missing row) with a
seeded permutation ``rank_to_row`` that scatters the hot ranks over the table, so hot rows are not
clustered at low ids (that matters for range sharding and FAE-style hot/cold splits).

Zipf mode (data.md §3.3), table with ``D`` rows, missing rate ``m`` and exponent ``s``:

* rank 0 -> row 0 with probability ``m``;
* ranks ``k = 1 .. D-1`` share ``1 - m``: a truncated Zipf ``k**-s`` for ``finite`` tables; for
  ``heaps`` tables an infinite Zipf(s) whose mass beyond ``D-1`` is folded onto ranks ``1 .. D-1``. A
  hash fold spreads that tail uniformly in expectation, so it is added as a uniform floor; sampling
  uses exactly these probabilities, so the analytic skew *is* the distribution that is sampled.

Calibration: with ``s' = 1 + κ (s - 1)`` for heaps tables and ``s' = κ s`` for finite ones, κ is
bisected until the analytic share of accesses taken by the global top 1% of rows equals the target
(no sampling). ``κ = 1`` is the fitted model.

Hot-set mode (Bagpipe's ``generate_dataset.py``): ``ceil(k D)`` hot rows take a share ``u`` of the
lookups uniformly, the rest are uniform over the whole table; there is no missing row.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from bagpipe.data.presets import TableSpec
from bagpipe.data.skew import top_share

KAPPA_RANGE: tuple[float, float] = (0.02, 50.0)
_EM_START = 64  # explicit partial sums up to here, Euler-Maclaurin beyond


def _zipf_tail(start: int, s: float) -> float:
    """``sum_{k >= start} k**-s`` for ``s > 1`` (explicit head, Euler-Maclaurin remainder)."""
    stop = max(start, _EM_START)
    head = float(np.sum(np.arange(start, stop, dtype=np.float64) ** -s)) if stop > start else 0.0
    n = float(stop)
    return head + n ** (1 - s) / (s - 1) + 0.5 * n**-s + s * n ** (-s - 1) / 12


def effective_exponent(spec: TableSpec, kappa: float) -> float:
    return 1.0 + kappa * (spec.zipf_s - 1.0) if spec.model == "heaps" else kappa * spec.zipf_s


def zipf_rank_probs(spec: TableSpec, rows: int, kappa: float = 1.0) -> np.ndarray:
    """``[rows]`` float64 probabilities in rank order (rank 0 = missing row), summing to 1."""
    s = effective_exponent(spec, kappa)
    ranks = np.arange(1, rows, dtype=np.float64)
    weights = ranks**-s
    if spec.model == "heaps":
        if s <= 1.0:
            raise ValueError(f"table {spec.name}: heaps exponent {s:.3f} must exceed 1")
        tail = _zipf_tail(rows, s)
        zeta = float(weights.sum()) + tail
        weights = weights / zeta + tail / zeta / (rows - 1)
    else:
        weights = weights / weights.sum()
    probs = np.empty(rows, dtype=np.float64)
    probs[0] = spec.missing_rate
    probs[1:] = (1.0 - spec.missing_rate) * weights
    return probs


def hot_set_rank_probs(rows: int, hot_fraction: float, hot_share: float) -> np.ndarray:
    """``[rows]`` probabilities in rank order: ``ceil(k D)`` hot ranks first."""
    hot = min(rows, math.ceil(hot_fraction * rows))
    probs = np.full(rows, (1.0 - hot_share) / rows)
    probs[:hot] += hot_share / hot
    return probs


class TablePopularity:
    """One table's access distribution, ready to sample by inverse CDF.

    Args:
        rank_probs: ``[D]`` probabilities in rank order.
        rank_to_row: ``[D]`` int64 permutation, the row id of each rank.
    """

    def __init__(self, rank_probs: np.ndarray, rank_to_row: np.ndarray) -> None:
        self.rank_probs = rank_probs
        self.rank_to_row = rank_to_row
        cdf = np.cumsum(rank_probs)
        self._cdf = cdf / cdf[-1]

    @classmethod
    def build(cls, rank_probs: np.ndarray, rng: np.random.Generator, keep_row0: bool) -> TablePopularity:
        """Scatter ranks over rows with a seeded permutation (rank 0 stays row 0 if ``keep_row0``)."""
        rows = rank_probs.size
        if keep_row0:
            perm = np.concatenate(([0], 1 + rng.permutation(rows - 1)))
        else:
            perm = rng.permutation(rows)
        return cls(rank_probs, perm.astype(np.int64))

    def sample(self, uniforms: np.ndarray) -> np.ndarray:
        """Row ids for uniforms in [0, 1)."""
        ranks = np.searchsorted(self._cdf, uniforms, side="right")
        np.minimum(ranks, self.rank_probs.size - 1, out=ranks)
        return self.rank_to_row[ranks]

    def row_probs(self) -> np.ndarray:
        """Probability of each row id."""
        probs = np.empty_like(self.rank_probs)
        probs[self.rank_to_row] = self.rank_probs
        return probs


def expected_top_share(
    specs: Sequence[TableSpec], sizes: Sequence[int], kappa: float, fraction: float = 0.01
) -> float:
    """Analytic share of all lookups taken by the global top ``fraction`` of rows at knob ``kappa``."""
    probs = np.concatenate([zipf_rank_probs(t, d, kappa) for t, d in zip(specs, sizes, strict=True)])
    return top_share(probs, fraction)


def calibrate_kappa(
    specs: Sequence[TableSpec],
    sizes: Sequence[int],
    target_share: float,
    fraction: float = 0.01,
    tolerance: float = 1e-4,
) -> float:
    """Bisect κ (in log space) so the expected top-``fraction`` share equals ``target_share``."""
    lo, hi = KAPPA_RANGE
    share_lo = expected_top_share(specs, sizes, lo, fraction)
    share_hi = expected_top_share(specs, sizes, hi, fraction)
    if not share_lo <= target_share <= share_hi:
        raise ValueError(
            f"skew_target={target_share} is out of reach for these tables: the top {fraction:.2%} "
            f"of rows can take between {share_lo:.4f} and {share_hi:.4f} of accesses"
        )
    log_lo, log_hi = math.log(lo), math.log(hi)
    for _ in range(60):
        mid = 0.5 * (log_lo + log_hi)
        share = expected_top_share(specs, sizes, math.exp(mid), fraction)
        if abs(share - target_share) < tolerance:
            return math.exp(mid)
        if share < target_share:
            log_lo = mid
        else:
            log_hi = mid
    return math.exp(0.5 * (log_lo + log_hi))
