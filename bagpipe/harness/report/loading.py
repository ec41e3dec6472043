"""Where reports get their runs: sweep directories of run records, an MLflow store, or a tidy CSV
written earlier. Every report reads through here, so "the latest sweep" and the table's columns
mean the same in all of them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from bagpipe.harness.track.record import RunRecord, find_records
from bagpipe.harness.track.sweeps import add_speedups, is_regime_param, latest_sweep, runs_frame


def sweeps(multirun_root: Path, suite: str, sweep_dir: Path | None = None,
           companions: Sequence[str] = ()) -> list[Path]:
    """The sweeps a report reads: ``sweep_dir`` alone when given; else the latest sweep of
    ``suite``, then the latest of every companion suite that has run (a directory under
    ``multirun_root``), e.g. ``convergence_het`` beside ``convergence``."""
    if sweep_dir is not None:
        return [sweep_dir]
    found = [latest_sweep(multirun_root, suite)]
    found += [latest_sweep(multirun_root, name) for name in companions
              if (multirun_root / name).is_dir()]
    return found


def load_records(sweep_dirs: Iterable[Path]) -> list[RunRecord]:
    """Every run record under the given sweep directories, sweep by sweep, in a stable order."""
    return [RunRecord.load(d) for sweep in sweep_dirs for d in find_records(sweep)]


@dataclass(frozen=True)
class RunsTable:
    """One row per run (:func:`~bagpipe.harness.track.sweeps.runs_frame`'s columns) and where
    the rows came from: ``source`` for the report's provenance, ``sweep`` when read from a sweep
    directory (its ``results/`` holds the runs' mllog files)."""

    frame: pd.DataFrame
    source: str
    sweep: Path | None = None
    csv: Path | None = None


class UncleanResultsError(ValueError):
    """A result set that mixes commits or was made from a tree with uncommitted changes."""


def require_one_clean_commit(frame: pd.DataFrame, what: str) -> str:
    """The one commit every run of ``frame`` was made from; refused (:class:`UncleanResultsError`)
    when the runs come from several commits or any from uncommitted changes (``-dirty``), since
    then no one can rerun what made the numbers. Runs made outside a git checkout say
    ``unknown`` and pass, as long as every run agrees."""
    shas = sorted(set(frame.get("git_sha", pd.Series(["unknown"])).astype(str)))
    dirty = [sha for sha in shas if sha.endswith("-dirty")]
    if len(shas) > 1 or dirty:
        raise UncleanResultsError(
            f"{what}: a result set must come from one clean commit, these runs come from "
            f"{', '.join(shas)}{' (uncommitted changes)' if dirty else ''}; commit, rerun the "
            "sweep, and report again (--allow-unclean draws a draft marked as such)"
        )
    return shas[0]


def table_from_sweep(sweep: Path, reference: str) -> RunsTable:
    """The sweep's runs with their speedups over ``reference``."""
    records = load_records([sweep])
    add_speedups(records, reference)
    return RunsTable(runs_frame(records), f"sweep {sweep}", sweep=sweep)


def table_from_csv(path: Path) -> RunsTable:
    """A tidy table written earlier (a sweep's or a report's ``runs.csv``), re-rendered."""
    return RunsTable(pd.read_csv(path), str(path), csv=path)


def table_from_mlflow(tracking_uri: str, experiment: str, suite: str) -> RunsTable:
    """The runs of the suite's latest sweep in an MLflow store, in the tidy table's shape."""
    import mlflow

    mlflow.set_tracking_uri(tracking_uri)
    runs = mlflow.search_runs(
        experiment_names=[experiment], filter_string=f"tags.suite = '{suite}'",
        output_format="pandas",
    )
    assert isinstance(runs, pd.DataFrame)
    runs = runs[runs["tags.sweep_id"] != "none"] if "tags.sweep_id" in runs else runs
    if runs.empty:
        raise LookupError(f"no runs of suite {suite!r} in {tracking_uri} ({experiment})")
    latest = runs.sort_values("start_time")["tags.sweep_id"].iloc[-1]
    runs = runs[(runs["tags.sweep_id"] == latest) & runs["tags.system"].notna()]
    frame = pd.DataFrame(
        {
            "system": runs["tags.system"], "model": runs["tags.model"],
            "dataset": runs["tags.dataset"], "seed": runs["params.seed"].astype(int),
            "suite": suite, "status": runs["status"], "run_name": runs["tags.mlflow.runName"],
            "git_sha": runs["tags.git_sha"],
        }
    )
    for column in runs.columns:
        key = column.partition(".")[2]
        if column.startswith("metrics.") or (column.startswith("params.")
                                              and is_regime_param(key)):
            frame[key] = runs[column]
    frame = frame.sort_values(["model", "system", "seed"]).reset_index(drop=True)
    return RunsTable(frame, f"MLflow {tracking_uri}")
