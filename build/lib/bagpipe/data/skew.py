"""Access skew: what share of lookups the most popular rows take.

The cache results of every system depend on this, so every dataset reports it (``Dataset.describe``).
"Top ``q`` of rows" means the ``max(1, round(q * N))`` most accessed rows out of *all* ``N`` rows of the
tables (untouched rows count in ``N``), ranked by access count (or by probability, for the analytic
figure). "Overall" ranks the rows of all tables together in the flat global row space.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

SKEW_FRACTIONS: tuple[float, ...] = (0.001, 0.01, 0.1)


def top_count(num_rows: int, fraction: float) -> int:
    """How many rows "the top ``fraction``" of ``num_rows`` rows is."""
    return max(1, round(fraction * num_rows))


def top_share(weights: np.ndarray, fraction: float) -> float:
    """Share of the total weight (counts or probabilities) held by the top ``fraction`` of entries."""
    total = float(weights.sum())
    if total <= 0.0:
        return 0.0
    k = top_count(weights.size, fraction)
    if k >= weights.size:
        return 1.0
    top = np.partition(weights, weights.size - k)[weights.size - k :]
    return float(top.sum()) / total


def fraction_label(fraction: float) -> str:
    """``0.01 -> "1pct"``, ``0.001 -> "0.1pct"`` (for metric names)."""
    return f"{fraction * 100:g}pct"


def access_counts(ids: np.ndarray, table_sizes: Sequence[int]) -> list[np.ndarray]:
    """Per-table access counts (``[D_f]`` int64) of an ``[N, F]`` id matrix."""
    if ids.ndim != 2 or ids.shape[1] != len(table_sizes):
        raise ValueError(f"ids of shape {ids.shape} for {len(table_sizes)} tables")
    return [np.bincount(ids[:, f], minlength=d) for f, d in enumerate(table_sizes)]


def skew_report(
    weights: Sequence[np.ndarray],
    feature_names: Sequence[str] | None = None,
    fractions: Sequence[float] = SKEW_FRACTIONS,
) -> dict[str, float]:
    """Top-row shares overall and per table from per-table weights (counts or probabilities).

    Keys: ``skew_top<q>`` overall (e.g. ``skew_top1pct``) and ``skew_top<q>/<feature>`` per table.
    Probabilities of different tables are comparable because every example does one lookup per table.
    """
    names = list(feature_names) if feature_names is not None else [f"cat_{i}" for i in range(len(weights))]
    flat = np.concatenate([np.asarray(w, dtype=np.float64) for w in weights])
    report: dict[str, float] = {}
    for q in fractions:
        report[f"skew_top{fraction_label(q)}"] = top_share(flat, q)
    for name, w in zip(names, weights, strict=True):
        for q in fractions:
            report[f"skew_top{fraction_label(q)}/{name}"] = top_share(np.asarray(w, np.float64), q)
    return report


def id_skew_report(
    ids: np.ndarray, table_sizes: Sequence[int], feature_names: Sequence[str] | None = None
) -> dict[str, float]:
    """Realised skew of an ``[N, F]`` id stream (see ``skew_report``)."""
    return skew_report(access_counts(ids, table_sizes), feature_names)
