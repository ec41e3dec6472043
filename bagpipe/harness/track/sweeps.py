"""A sweep's runs as one table: the order systems and models are shown in, the newest sweep of a
suite, one tidy row per run, and speedups over a reference system.

Both sides read these: closing a sweep (:mod:`bagpipe.harness.run.sweep`) writes the table and the
speedups into the records, and every report (:mod:`bagpipe.harness.report`) reads them back, so the
columns, the pairing of runs and the ordering are defined once.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import pandas as pd

from bagpipe.harness.track.record import RunRecord, find_records

#: The tidy table a sweep (and the fig7 report) writes: one row per run.
RUNS_CSV = "runs.csv"
#: The order systems are drawn and tabulated in (baselines first, then Bagpipe, then the
#: embedding-free bound Bagpipe is measured against, ``bagpipe.harness.report.bound``).
SYSTEM_ORDER = ("local", "sync_ps", "fae", "het", "torchrec", "bagpipe", "embedding_free")
MODEL_ORDER = ("dlrm", "wdl", "deepfm", "dcn")


def in_order(values: Iterable[str], preferred: Sequence[str]) -> list[str]:
    """The distinct ``values``: those in ``preferred`` first, in its order, then the others as met."""
    present = list(dict.fromkeys(values))
    return [v for v in preferred if v in present] + [v for v in present if v not in preferred]


def latest_sweep(root: Path, suite: str) -> Path:
    """The newest sweep directory of ``suite`` under ``root`` (``multirun/<suite>/<stamp>``)."""
    candidates = sorted(p for p in (root / suite).glob("*") if p.is_dir() and find_records(p))
    if not candidates:
        raise FileNotFoundError(f"no sweep of suite {suite!r} with run records under {root / suite}")
    return candidates[-1]


def speedup_key(reference: str) -> str:
    return f"speedup_vs_{reference}"


def add_speedups(records: Sequence[RunRecord], reference: str) -> int:
    """Set ``speedup_vs_<reference>`` (reference iteration time / own) where a reference run exists
    in the same block (:func:`block_of`).

    Returns how many runs got one. A run without a matching finished reference run gets none.
    """
    key = speedup_key(reference)
    reference_time = {
        block_of(r): r.summary["iter_time_mean_s"]
        for r in records
        if r.tags.get("system") == reference and r.status == "FINISHED"
        and r.summary.get("iter_time_mean_s")
    }
    count = 0
    for record in records:
        ref_time = reference_time.get(block_of(record))
        own_time = record.summary.get("iter_time_mean_s")
        if ref_time and own_time and record.status == "FINISHED":
            record.summary[key] = ref_time / own_time
            count += 1
    return count


def block_of(record: RunRecord) -> tuple[str, ...]:
    """The block a run belongs to: what a speedup holds fixed while only the system changes.

    That is the model, the dataset, the seed and the whole regime (:data:`REGIME_PARAMS`: the
    topology, the network's back-end and dilation, the trainer count, the run's size). A sweep
    that varies the regime beside the system (``fig7_dilation``'s d/2 and 2d, a trainer-count
    sweep) has one block per regime and seed; pairing by seed alone would divide a run at 2d by
    its reference at d/2."""
    _, model, dataset, seed = _identity(record)
    return _block_key(model, dataset, seed, _regime_params(record.params))


#: The column :func:`with_blocks` adds to a runs table.
BLOCK = "block"


def with_blocks(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` (a runs table: :func:`runs_frame`, a ``runs.csv``, MLflow's) with a
    :data:`BLOCK` column: :func:`block_of` of each row, read from its columns.

    Every table that pairs runs (a bound, a profile, Bagpipe against each baseline) pivots on it,
    so a set that spans regimes pairs each run with its own regime's, by the speedups' one rule.
    A regime param a row lacks is left out of its key, as :func:`block_of` leaves it out."""
    regime = [c for c in frame.columns if is_regime_param(str(c))]
    keys = [
        "|".join(_block_key(str(row["model"]), str(row["dataset"]), str(row["seed"]),
                            {k: str(row[k]) for k in regime if pd.notna(row[k])}))
        for row in frame.to_dict("records")
    ]
    return frame.assign(**{BLOCK: pd.Series(keys, index=frame.index, dtype=object)})


def _block_key(model: str, dataset: str, seed: str, regime: dict[str, str]) -> tuple[str, ...]:
    return (model, dataset, seed, *(f"{k}={regime[k]}" for k in sorted(regime)))


def _identity(record: RunRecord) -> tuple[str, ...]:
    """A run's system, model, dataset and seed (its row's first columns)."""
    return (
        record.tags.get("system", ""),
        record.tags.get("model", ""),
        record.tags.get("dataset", ""),
        record.params.get("seed", ""),
    )


#: Params a row carries beside the metrics: the regime a report states and projects onto (the
#: topology, its back-end and dilation, the run's size and target). Keys ending in ``.`` are
#: prefixes.
REGIME_PARAMS = ("dilation.", "topology.", "network.", "trainers", "run.steps", "run.batch_size",
                 "run.warmup_steps", "run.target_auc", "model.embedding_dim")


def _regime_params(params: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in params.items() if is_regime_param(k)}


def is_regime_param(key: str) -> bool:
    """Whether the param ``key`` is one of :data:`REGIME_PARAMS` (or under one of its prefixes)."""
    return any(key.startswith(p) if p.endswith(".") else key == p for p in REGIME_PARAMS)


def runs_frame(records: Sequence[RunRecord]) -> pd.DataFrame:
    """One tidy row per run: identity, status, the cluster it ran on (tag ``cluster``), its
    :data:`REGIME_PARAMS`, then every summary metric."""
    rows = []
    for record in records:
        system, model, dataset, seed = _identity(record)
        rows.append(
            {
                "system": system,
                "model": model,
                "dataset": dataset,
                "seed": int(seed) if seed else 0,
                "suite": record.tags.get("suite", ""),
                "status": record.status,
                "run_name": record.run_name,
                "git_sha": record.tags.get("git_sha", "unknown"),
                "cluster": record.tags.get("cluster", ""),
                "start_ms": record.start_ms,
                "end_ms": record.end_ms,
                **_regime_params(record.params),
                **record.summary,
            }
        )
    frame = pd.DataFrame(rows)
    if not frame.empty:
        frame = frame.sort_values(["model", "system", "seed"], kind="stable").reset_index(drop=True)
    return frame
