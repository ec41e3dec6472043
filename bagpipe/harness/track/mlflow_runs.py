"""MLflow: the store every run goes to, one parent run per sweep, uploading local records.

Experiments are created as MLflow's "machine learning" kind (``mlflow.experimentKind``), the kind
whose page is the runs table; a sweep's parent run holds its ``runs.csv`` and, once a report has
been drawn from it, its figure and page (:func:`log_to_parent`).

The default store is embedded: ``sqlite:///<absolute launch dir>/mlflow.db`` (an absolute path,
because a relative ``sqlite:///mlflow.db`` resolves against each process's working directory;
harness.md §3.2). Any other tracking URI, e.g. an ``http://`` server, is a config value.

Nothing here is on a job's critical path: a job saves its :class:`RunRecord` first and uploads it
afterwards, so an unreachable server costs a message, never results.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from mlflow.entities import Metric, Param
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from bagpipe.harness.track.record import (
    ARTIFACTS_DIR,
    RunRecord,
    mark_uploaded,
    uploaded_run,
)

PARENT_FILE = "mlflow_parent.json"
#: MLflow's experiment tag for the kind of work, and its value for model training: MLflow 3's UI
#: otherwise treats an experiment as a GenAI one (an empty "Overview / Traces" page).
EXPERIMENT_KIND_TAG, MODEL_TRAINING = "mlflow.experimentKind", "custom_model_development"
#: MLflow's batch limits (per ``log_batch`` call).
_MAX_METRICS, _MAX_PARAMS, _MAX_TAGS = 1000, 100, 100


class TrackingUnavailableError(RuntimeError):
    """The tracking store did not answer; the record stays on disk for a later upload."""


def default_tracking_uri(launch_dir: Path) -> str:
    """The embedded store: ``sqlite:///<absolute launch_dir>/mlflow.db``."""
    return f"sqlite:///{launch_dir.resolve()}/mlflow.db"


def is_reachable(uri: str, timeout_s: float = 3.0) -> bool:
    """Whether the store answers now. A local database always does; a server must pass /health."""
    if not uri.startswith(("http://", "https://")):
        return True
    try:
        with urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=timeout_s) as reply:
            return reply.status == 200
    except (urllib.error.URLError, OSError, TimeoutError):
        return False


@contextlib.contextmanager
def _fail_fast_http() -> Iterator[None]:
    """MLflow's HTTP client retries for minutes by default; a job should give up in seconds."""
    keys = ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT")
    saved = {k: os.environ.get(k) for k in keys}
    os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = "1"
    os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] = "20"
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _client(uri: str) -> MlflowClient:
    if not is_reachable(uri):
        raise TrackingUnavailableError(f"tracking server {uri} is not reachable")
    return MlflowClient(tracking_uri=uri)


def experiment_id(client: MlflowClient, name: str) -> str:
    """The id of experiment ``name``, created if missing (tolerating a concurrent creator), of the
    model-training kind (also an experiment created before that tag was set)."""
    found = client.get_experiment_by_name(name)
    if found is None:
        try:
            return client.create_experiment(name, tags={EXPERIMENT_KIND_TAG: MODEL_TRAINING})
        except MlflowException:
            found = client.get_experiment_by_name(name)
            if found is None:
                raise
    if found.tags.get(EXPERIMENT_KIND_TAG) != MODEL_TRAINING:
        client.set_experiment_tag(found.experiment_id, EXPERIMENT_KIND_TAG, MODEL_TRAINING)
    return found.experiment_id


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``path``: jobs of one sweep never create two parent runs."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def recorded_parent(sweep_dir: Path) -> tuple[str, str] | None:
    """The sweep's parent run as ``(tracking uri, run id)``, None if none was created."""
    marker = sweep_dir / PARENT_FILE
    if not marker.exists():
        return None
    data = json.loads(marker.read_text())
    return str(data["tracking_uri"]), str(data["run_id"])


def parent_run_id(sweep_dir: Path, uri: str) -> str | None:
    """The parent run recorded for this sweep in store ``uri`` (None if none was created)."""
    parent = recorded_parent(sweep_dir)
    return parent[1] if parent is not None and parent[0] == uri else None


def ensure_parent_run(
    sweep_dir: Path, uri: str, experiment: str, tags: dict[str, str]
) -> str:
    """The sweep's parent run, created on first call and named in ``<sweep_dir>/mlflow_parent.json``.

    Called by the sweep callback before any job starts (which also creates the SQLite schema and
    the experiment before concurrent jobs could race on them, harness.md §3.4), and again by a late
    upload when the server was down at sweep start.
    """
    with _locked(sweep_dir / f".{PARENT_FILE}.lock"):
        existing = parent_run_id(sweep_dir, uri)
        if existing is not None:
            return existing
        with _fail_fast_http():
            client = _client(uri)
            run = client.create_run(
                experiment_id(client, experiment),
                tags={**tags, "mlflow.runName": f"sweep-{sweep_dir.name}", "sweep_dir": str(sweep_dir)},
            )
        (sweep_dir / PARENT_FILE).write_text(
            json.dumps({"tracking_uri": uri, "run_id": run.info.run_id})
        )
        return run.info.run_id


def log_to_parent(sweep_dir: Path, files: list[Path]) -> str | None:
    """Attach ``files`` to the sweep's parent run as artifacts; its run id (None: the sweep has no
    parent run, tracking was off). Raises :class:`TrackingUnavailableError` when the store does
    not answer."""
    parent = recorded_parent(sweep_dir)
    if parent is None:
        return None
    uri, run_id = parent
    with _fail_fast_http():
        client = _client(uri)
        for path in files:
            client.log_artifact(run_id, str(path))
    return run_id


def end_parent_run(sweep_dir: Path, uri: str) -> None:
    run_id = parent_run_id(sweep_dir, uri)
    if run_id is not None:
        with _fail_fast_http():
            _client(uri).set_terminated(run_id, "FINISHED")


def _chunks(items: list, size: int) -> Iterator[list]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _metric_history(record: RunRecord) -> list[Metric]:
    """Per-step metrics (each step's ``time_ms`` as timestamp), eval points, then the summary."""
    metrics: list[Metric] = []
    for row in record.steps:
        step = int(row["step"])
        stamp = int(row.get("time_ms", record.start_ms))
        metrics.extend(
            Metric(key, float(value), stamp, step)
            for key, value in row.items()
            if key not in ("step", "time_ms")
        )
    for point in record.evals:
        stamp = record.start_ms + int(1000 * point.get("wall_s", 0.0))
        metrics.extend(
            Metric(key, float(point[key]), stamp, int(point["step"]))
            for key in ("auc", "logloss", "epoch_fraction")
            if key in point
        )
    metrics.extend(_summary_metrics(record))
    return metrics


def _summary_metrics(record: RunRecord) -> list[Metric]:
    stamp = record.end_ms or record.start_ms
    last_step = int(record.steps[-1]["step"]) if record.steps else 0
    return [
        Metric(key, float(value), stamp, last_step)
        for key, value in record.summary.items()
        if value is not None
    ]


def upload_record(directory: Path, uri: str) -> str:
    """Send one record to the store ``uri``; return its MLflow run id.

    Idempotent: a record already uploaded to ``uri`` only has its summary metrics refreshed (that
    is how speedups computed at the end of a sweep reach runs uploaded during it).
    Raises :class:`TrackingUnavailableError` when the store does not answer.
    """
    record = RunRecord.load(directory)
    with _fail_fast_http():
        existing = uploaded_run(directory, uri)
        if existing is not None:
            _client(uri).log_batch(existing, metrics=_summary_metrics(record))
            return existing
        client = _client(uri)
        tags = {**record.tags, "mlflow.runName": record.run_name}
        if record.sweep_dir is not None:
            tags["mlflow.parentRunId"] = ensure_parent_run(
                Path(record.sweep_dir), uri, record.experiment, _sweep_tags(record)
            )
        run = client.create_run(
            experiment_id(client, record.experiment), start_time=record.start_ms, tags=tags
        )
        run_id = run.info.run_id
        params = [Param(k, str(v)[:6000]) for k, v in record.params.items()]
        for chunk in _chunks(params, _MAX_PARAMS):
            client.log_batch(run_id, params=chunk)
        for chunk in _chunks(_metric_history(record), _MAX_METRICS):
            client.log_batch(run_id, metrics=chunk)
        artifacts = directory / ARTIFACTS_DIR
        if artifacts.is_dir():
            client.log_artifacts(run_id, str(artifacts))
        client.set_terminated(run_id, record.status, end_time=record.end_ms)
    mark_uploaded(directory, uri, run_id)
    return run_id


def _sweep_tags(record: RunRecord) -> dict[str, str]:
    keys = ("suite", "sweep_id", "git_sha", "launcher")
    return {k: record.tags[k] for k in keys if k in record.tags}


def upload_all(directories: list[Path], uri: str) -> tuple[list[str], list[Path]]:
    """Upload every record; return the run ids and the records that could not be uploaded."""
    run_ids: list[str] = []
    pending: list[Path] = []
    for directory in directories:
        try:
            run_ids.append(upload_record(directory, uri))
        except (TrackingUnavailableError, MlflowException, OSError) as err:
            pending.append(directory)
            print(f"[harness] could not upload {directory}: {err}")
    return run_ids, pending
