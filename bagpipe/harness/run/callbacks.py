"""The Hydra callbacks: a single run's config check, and the one that owns a sweep (checks, MLflow
parent run, progress, closing).

Run-level callbacks run in the launching process, job-level ones inside each job
(harness.md §2.4), so everything here happens once per run or sweep whatever the launcher.
"""

from __future__ import annotations

import traceback
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from bagpipe.harness.run.build import JobConfigError, check_job
from bagpipe.harness.run.sweep import SweepProgress, finalize_sweep, validate_sweep
from bagpipe.harness.track.mlflow_runs import (
    TrackingUnavailableError,
    default_tracking_uri,
    ensure_parent_run,
)
from bagpipe.harness.track.sweeps import RUNS_CSV
from bagpipe.harness.track.workspace import git_sha


def tracking_uri(config: DictConfig) -> str | None:
    """The store runs go to (None when tracking is off); null in config means the embedded one."""
    if not config.tracking.enabled:
        return None
    return config.tracking.uri or default_tracking_uri(Path(config.hydra.runtime.cwd))


class ConfigCheck(Callback):
    """Refuses a single run whose config a part of the job would refuse, before anything starts
    (a sweep's jobs are checked by :class:`SweepCallback`). The refusal is one line and a non-zero
    exit: a ``SystemExit``, because Hydra turns any other exception from a callback into a warning
    and runs the job anyway."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        try:
            check_job(config)
        except JobConfigError as err:
            raise SystemExit(f"[harness] invalid config: {err}") from err


class SweepCallback(Callback):
    """Validates every job, opens the MLflow parent run, shows progress, then closes the sweep."""

    def __init__(self, progress_interval_s: float = 2.0) -> None:
        self.progress_interval_s = progress_interval_s
        self._progress: SweepProgress | None = None

    def __getstate__(self) -> dict[str, Any]:
        """The launcher pickles itself with its callbacks into every job: leave the thread out."""
        return {"progress_interval_s": self.progress_interval_s, "_progress": None}

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        jobs = validate_sweep(config)
        sweep_dir = Path(config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        uri = tracking_uri(config)
        if uri is not None:
            tags = {
                "suite": config.suite_name,
                "sweep_id": sweep_dir.name,
                "git_sha": git_sha(Path(config.hydra.runtime.cwd)),
                "launcher": config.launcher_name,
                "jobs": str(len(jobs)),
            }
            try:
                run_id = ensure_parent_run(sweep_dir, uri, config.tracking.experiment, tags)
                print(f"[sweep] {len(jobs)} jobs; MLflow parent run {run_id} in {uri}")
            except TrackingUnavailableError as err:
                print(f"[sweep] {len(jobs)} jobs; {err}: runs are kept in {sweep_dir} "
                      f"for `python -m bagpipe.harness.track.upload {sweep_dir}`")
        self._progress = SweepProgress(sweep_dir, len(jobs), self.progress_interval_s)
        self._progress.start()

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if self._progress is not None:
            self._progress.stop()
        sweep_dir = Path(config.hydra.sweep.dir)
        try:
            frame = finalize_sweep(sweep_dir, config.tracking.reference_system, tracking_uri(config))
        except Exception:  # Hydra would reduce it to a one-line warning
            traceback.print_exc()
            print(f"[sweep] closing the sweep failed; every run is recorded in {sweep_dir}. "
                  f"Retry with: python -m bagpipe.harness.track.upload {sweep_dir}")
            return
        print(f"[sweep] {len(frame)} runs recorded in {sweep_dir / RUNS_CSV}")
