"""Once-per-sweep work: check every job's config up front, show progress, and close the sweep.

Closing a sweep computes each run's speedup over the suite's reference system (same model, dataset
and seed), stores it in the run records, writes the tidy ``runs.csv`` and brings MLflow up to date:
runs uploaded during the sweep get their ``speedup_vs_<ref>`` metric, runs that could not be
uploaded are uploaded now if the store answers, and the parent run gets ``runs.csv`` and is ended.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import TextIO

import pandas as pd
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf

from bagpipe.harness.run.blocks import interleaved_blocks
from bagpipe.harness.run.build import JobConfigError, check_job
from bagpipe.harness.track.mlflow_runs import (
    end_parent_run,
    is_reachable,
    log_to_parent,
    upload_all,
)
from bagpipe.harness.track.record import RunRecord, find_records
from bagpipe.harness.track.sweeps import RUNS_CSV, add_speedups, runs_frame


def sweep_jobs(config: DictConfig) -> list[list[str]]:
    """The override list of every job the sweeper will launch, in launch order (the ``blocks``
    sweeper's interleaved order when it is the configured one)."""
    sweeper = config.hydra.sweeper
    params = sweeper.get("params") or {}
    arguments = [f"{k}={v}" for k, v in params.items()]
    arguments += list(config.hydra.overrides.task)
    overrides = OverridesParser.create().parse_overrides(arguments)
    (jobs,) = BasicSweeper.split_arguments(overrides, max_batch_size=None)
    if "block_key" in sweeper:
        return interleaved_blocks(jobs, str(sweeper.block_key), int(sweeper.order_seed),
                                  str(sweeper.get("pair_key", "model")))
    return jobs


class SweepConfigError(SystemExit):
    """A job of the sweep has an invalid config. A ``SystemExit`` on purpose: Hydra turns an
    ordinary exception raised in a callback into a warning and launches the sweep anyway."""


def validate_sweep(config: DictConfig) -> list[list[str]]:
    """Compose, resolve and check (:func:`~bagpipe.harness.run.build.check_job`) every job's config
    before any job is launched; return the jobs.

    The basic sweeper composes a batch only when it launches it, so with bounded concurrency a typo
    in the last value of a swept list would otherwise surface after hours of runs.
    """
    jobs = sweep_jobs(config)
    loader = GlobalHydra.instance().config_loader()
    for number, overrides in enumerate(jobs):
        job = f"job #{number} ({' '.join(overrides)})"
        try:
            job_cfg = loader.load_sweep_config(config, list(overrides))
            OmegaConf.to_container(
                OmegaConf.masked_copy(job_cfg, [str(k) for k in job_cfg if k != "hydra"]),
                resolve=True,
            )
        except Exception as err:
            detail = f"{err}\n{err.__cause__}" if err.__cause__ else str(err)
            raise SweepConfigError(
                f"sweep {job} has an invalid config; nothing was launched:\n{detail}"
            ) from err
        try:
            check_job(job_cfg)
        except JobConfigError as err:
            raise SweepConfigError(f"[sweep] {job} refused: {err}; nothing was launched") from err
    return jobs


def finalize_sweep(sweep_dir: Path, reference: str, tracking_uri: str | None) -> pd.DataFrame:
    """Speedups into every record, ``<sweep_dir>/runs.csv``, and MLflow brought up to date."""
    directories = find_records(sweep_dir)
    records = [RunRecord.load(d) for d in directories]
    add_speedups(records, reference)
    for directory, record in zip(directories, records, strict=True):
        record.save(directory)
    frame = runs_frame(records)
    frame.to_csv(sweep_dir / RUNS_CSV, index=False)
    if tracking_uri is not None:
        if is_reachable(tracking_uri):
            _, pending = upload_all(directories, tracking_uri)
            log_to_parent(sweep_dir, [sweep_dir / RUNS_CSV])
            end_parent_run(sweep_dir, tracking_uri)
            if pending:
                print(f"[harness] {len(pending)} run(s) not uploaded; retry with: "
                      f"python -m bagpipe.harness.track.upload {sweep_dir}")
        else:
            print(f"[harness] tracking server {tracking_uri} is unreachable; every result is in "
                  f"{sweep_dir}. Upload later with: python -m bagpipe.harness.track.upload {sweep_dir}")
    return frame


class SweepProgress(threading.Thread):
    """Prints a line each time a run of the sweep finishes: count, failures, elapsed, ETA, result.

    Jobs write their output to the launcher's log files, so this watcher of the sweep directory is
    what the person who launched the sweep sees.
    """

    def __init__(
        self, sweep_dir: Path, total_jobs: int, interval_s: float = 2.0, stream: TextIO = sys.stdout
    ) -> None:
        super().__init__(name="sweep-progress", daemon=True)
        self.sweep_dir = sweep_dir
        self.total_jobs = total_jobs
        self.interval_s = interval_s
        self.stream = stream
        self._stop_event = threading.Event()
        self._seen: set[Path] = set()
        self._failed = 0
        self._start_time = time.monotonic()

    def stop(self) -> None:
        self._stop_event.set()
        self.join()
        self.poll()

    def run(self) -> None:
        while not self._stop_event.wait(self.interval_s):
            self.poll()

    def poll(self) -> None:
        for directory in find_records(self.sweep_dir) if self.sweep_dir.exists() else []:
            if directory in self._seen:
                continue
            try:
                record = RunRecord.load(directory)
            except (OSError, ValueError):
                continue
            if record.status == "RUNNING":
                continue
            self._seen.add(directory)
            self._failed += record.status != "FINISHED"
            self._report(record)

    def _report(self, record: RunRecord) -> None:
        done = len(self._seen)
        elapsed_s = time.monotonic() - self._start_time
        eta_s = elapsed_s / done * (self.total_jobs - done)
        iter_ms = 1000 * record.summary.get("iter_time_mean_s", float("nan"))
        auc = record.summary.get("auc", float("nan"))
        print(
            f"[sweep] {done}/{self.total_jobs} runs done ({self._failed} failed) | "
            f"elapsed {_clock(elapsed_s)} | eta {_clock(eta_s)} | {record.run_name}: "
            f"{record.status.lower()}, {iter_ms:.1f} ms/iter, auc {auc:.4f}",
            file=self.stream,
            flush=True,
        )


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s"
