"""``python -m bagpipe.harness.report skew`` (E4, pure data, no training): the share of accesses
held by the most accessed share of rows, per dataset preset and for the hot-set mode (the paper:
~1% of rows take >92% of accesses). ``--file kind:path[:preset]`` adds a real file read by the
project's readers, so the synthetic calibration can be checked against the data it imitates.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from bagpipe.harness.report.plotting import Outputs, pyplot, save_csv, save_figure, write_report

SUITE = "skew"
#: Points of the CDF's x axis (share of rows, most accessed first), log-spaced.
ROW_SHARES = np.unique(np.concatenate([np.logspace(-5, 0, 61), [0.001, 0.01, 0.1]]))
CLAIM = "around 1% of embeddings take more than 92% of all accesses (SOSP'23 abstract)"


def access_cdf(ids: np.ndarray, table_sizes: Sequence[int]) -> np.ndarray:
    """Share of all accesses held by the top ``ROW_SHARES`` of all rows (tables ranked together)."""
    offsets = np.concatenate([[0], np.cumsum(table_sizes)[:-1]])
    counts = np.bincount((ids + offsets).ravel(), minlength=int(sum(table_sizes)))
    ranked = np.sort(counts)[::-1].astype(np.float64)
    cumulative = np.cumsum(ranked) / ranked.sum()
    top = np.maximum(1, np.round(ROW_SHARES * ranked.size).astype(int))
    return cumulative[np.minimum(top, ranked.size) - 1]


def sources(scale: float, samples: int,
            files: Sequence[str]) -> list[tuple[str, np.ndarray, tuple[int, ...]]]:
    """(label, training ids, table sizes) of every synthetic preset at ``scale`` (``samples``
    examples each), the hot-set mode, and every ``kind:path[:preset]`` file."""
    from bagpipe.data import DatasetConfig, make_dataset
    from bagpipe.data.dataset import SyntheticDataset

    out = []
    configs = [(f"{p} (synthetic)", DatasetConfig(preset=p, scale=scale))
               for p in ("criteo_kaggle", "avazu", "criteo_terabyte")]
    configs.append(("criteo_kaggle hot-set 1%/90%",
                    DatasetConfig(preset="criteo_kaggle", scale=scale, hot_set=(0.01, 0.9))))
    for spec in files:
        kind, path, *preset = spec.split(":")
        configs.append((f"{Path(path).name} ({kind})", DatasetConfig(
            kind=kind, path=path, preset=preset[0] if preset else "criteo_kaggle")))
    for label, cfg in configs:
        dataset = make_dataset(cfg)
        if isinstance(dataset, SyntheticDataset):
            ids = dataset.generator.examples("train", 0, samples).ids
        else:
            ids = dataset.train_examples.ids  # type: ignore[attr-defined]
        out.append((label, np.asarray(ids, dtype=np.int64), tuple(dataset.schema.table_sizes)))
    return out


def report(out: Outputs, scale: float, samples: int, files: Sequence[str]) -> None:
    """``results/skew/cdf.csv`` and ``reports/skew.{png,md}``."""
    rows = []
    for label, ids, sizes in sources(scale, samples, files):
        for share, accesses in zip(ROW_SHARES, access_cdf(ids, sizes), strict=True):
            rows.append({"dataset": label, "row_share": share, "access_share": accesses,
                         "table_rows": sum(sizes), "lookups": ids.size})
    frame = pd.DataFrame(rows)
    save_csv(frame, out.table(SUITE, "cdf.csv"))
    fig, ax = pyplot().subplots(figsize=(6.5, 4.2))
    for dataset, group in frame.groupby("dataset", sort=False):
        ax.plot(100 * group["row_share"], 100 * group["access_share"], label=str(dataset))
    ax.axvline(1.0, color="grey", lw=0.8, ls="--")
    ax.axhline(92.0, color="grey", lw=0.8, ls=":")
    ax.set(xscale="log", xlabel="most accessed rows (% of all rows)",
           ylabel="accesses (% of all lookups)", title="Access skew (CDF)")
    ax.legend(fontsize=8)
    figure = save_figure(fig, out.figure(SUITE))
    at_1pct = frame[np.isclose(frame["row_share"], 0.01)]
    table = ["| dataset | table rows | lookups sampled | accesses to top 1% of rows |",
             "|---|---|---|---|"]
    table += [
        f"| {r['dataset']} | {int(r['table_rows']):,} | {int(r['lookups']):,} | "
        f"{100 * float(r['access_share']):.1f}% |"
        for r in at_1pct.to_dict("records")
    ]
    write_report(out, SUITE, "Access skew: share of lookups vs share of rows", figure, table,
                 CLAIM, [
                     f"Synthetic presets at scale {scale} (table sizes scaled down, the "
                     "generator calibrated to the paper's skew at that size), "
                     f"{samples:,} training examples each; all tables ranked together.",
                 ])
