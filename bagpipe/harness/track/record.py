"""A run's results as local files: the record that survives a tracking server being down.

Every job writes its record first (``<run dir>/record/run.json`` plus ``artifacts/``) and only then
uploads it to MLflow; an upload that fails leaves the record for
``python -m bagpipe.harness.track.upload <dir>`` to send later. Uploading is the same code either way, so
a late upload carries exactly what a live one would have (params, tags, per-step metrics, the
resolved config, the mllog file, speedups). After an upload, ``mlflow_run.json`` beside
``run.json`` names the MLflow run, which makes uploading idempotent.
"""

from __future__ import annotations

import ast
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

RECORD_FILE = "run.json"
UPLOADED_FILE = "mlflow_run.json"
ARTIFACTS_DIR = "artifacts"


@dataclass
class RunRecord:
    """Everything one run reports: what it was (params, tags) and what it measured."""

    run_name: str
    experiment: str
    params: dict[str, str]
    tags: dict[str, str]
    summary: dict[str, float] = field(default_factory=dict)
    steps: list[dict[str, float]] = field(default_factory=list)
    evals: list[dict[str, float]] = field(default_factory=list)
    status: str = "RUNNING"  # MLflow run status: RUNNING, FINISHED, FAILED
    #: The full traceback of a failed run, and its one line (``Type: message``) for printing.
    error: str | None = None
    failure: str | None = None
    start_ms: int = 0
    end_ms: int | None = None
    #: The sweep directory whose ``mlflow_parent.json`` names the parent run (None: no parent).
    sweep_dir: str | None = None
    #: The store the run was meant for (what a later upload uses unless told otherwise).
    tracking_uri: str | None = None

    def save(self, directory: Path) -> None:
        """Write ``run.json`` atomically (a reader never sees half a file)."""
        directory.mkdir(parents=True, exist_ok=True)
        tmp = directory / f".{RECORD_FILE}.{os.getpid()}"
        tmp.write_text(json.dumps(asdict(self), indent=1, default=float))
        tmp.replace(directory / RECORD_FILE)

    @classmethod
    def load(cls, directory: Path) -> RunRecord:
        data: dict[str, Any] = json.loads((directory / RECORD_FILE).read_text())
        return cls(**data)


def param_value(text: str | None) -> Any:
    """A recorded param back as a value: params are stored as ``str(value)`` (MLflow's strings),
    so ``"[0.01, 0.9]"`` is a list again, ``"None"`` is ``None``, and any other text stays text."""
    if text is None:
        return None
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def find_records(root: Path) -> list[Path]:
    """Every record directory under ``root`` (or ``root`` itself), in a stable order."""
    if (root / RECORD_FILE).exists():
        return [root]
    return sorted(p.parent for p in root.rglob(RECORD_FILE))


def uploaded_run(directory: Path, tracking_uri: str) -> str | None:
    """The MLflow run id this record was uploaded as, to ``tracking_uri`` (None if not yet)."""
    marker = directory / UPLOADED_FILE
    if not marker.exists():
        return None
    data = json.loads(marker.read_text())
    return data["run_id"] if data.get("tracking_uri") == tracking_uri else None


def mark_uploaded(directory: Path, tracking_uri: str, run_id: str) -> None:
    (directory / UPLOADED_FILE).write_text(
        json.dumps({"tracking_uri": tracking_uri, "run_id": run_id})
    )
