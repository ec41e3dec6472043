"""``python -m bagpipe.harness.track.ui``: the MLflow UI on a store, opened on the experiment's runs.

``nox -s mlflow_ui`` runs this on the embedded store (``./mlflow.db``). It starts ``mlflow server``
on a loopback port and prints the URL of the experiment's runs table, not the server's root: MLflow
3's UI opens an experiment as a GenAI one ("Overview / Traces") unless its view is the "machine
learning" workflow, which that URL selects. The browser test and the screenshot command start the
server the same way (:class:`MlflowServer`); it runs in a process group of its own, which is
stopped whole, because ``mlflow server`` leaves job-runner children behind its own process.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

from mlflow.tracking import MlflowClient

from bagpipe.harness.track.mlflow_runs import default_tracking_uri, is_reachable

LOOPBACK = "127.0.0.1"
DEFAULT_EXPERIMENT = "bagpipe-harness"
#: The UI's query that selects its "machine learning" view (the runs table, the compare view).
ML_VIEW = "workflowType=machine_learning"
_START_S = 120.0
_STOP_S = 20.0


def free_port() -> int:
    """A loopback TCP port that was free a moment ago."""
    with socket.socket() as probe:
        probe.bind((LOOPBACK, 0))
        return int(probe.getsockname()[1])


def group_alive(group: int) -> bool:
    """Whether any process of process group ``group`` is left."""
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


def runs_page(base_url: str, experiment_id: str) -> str:
    """The URL of an experiment's runs table."""
    return f"{base_url}/#/experiments/{experiment_id}/runs?{ML_VIEW}"


def run_page(base_url: str, experiment_id: str, run_id: str, tab: str = "") -> str:
    """The URL of one run's page (``tab``: e.g. ``artifacts``)."""
    suffix = f"/{tab}" if tab else ""
    return f"{base_url}/#/experiments/{experiment_id}/runs/{run_id}{suffix}?{ML_VIEW}"


def find_experiment(store: str, name: str) -> str | None:
    """The id of experiment ``name`` in ``store`` (None: no run was recorded there yet)."""
    found = MlflowClient(tracking_uri=store).get_experiment_by_name(name)
    return None if found is None else found.experiment_id


class MlflowServer:
    """``mlflow server`` over ``store`` on ``port`` (a free one by default), started on entry and
    stopped, with every process it started, on exit; ``url`` is its root. It runs in ``workdir``
    (default: here), where runs logged through it keep their artifacts (``./mlartifacts``)."""

    def __init__(self, store: str, port: int | None = None, log: Path | None = None,
                 workdir: Path | None = None) -> None:
        self.store = store
        self.port = port or free_port()
        self.url = f"http://{LOOPBACK}:{self.port}"
        self._log = log
        self._workdir = workdir
        self._process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> MlflowServer:
        output = self._log.open("wb") if self._log is not None else subprocess.DEVNULL
        self._process = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", self.store,
             "--host", LOOPBACK, "--port", str(self.port), "--workers", "1"],
            cwd=self._workdir, stdout=output, stderr=subprocess.STDOUT, start_new_session=True,
        )
        try:
            self._wait_until_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    @property
    def process_group(self) -> int:
        """The process group of the server and everything it started."""
        assert self._process is not None, "the server is not running"
        return self._process.pid

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.stop()

    def _wait_until_healthy(self) -> None:
        assert self._process is not None
        deadline = time.monotonic() + _START_S
        while True:
            if is_reachable(self.url, timeout_s=2.0):
                return
            if self._process.poll() is not None or time.monotonic() > deadline:
                where = f"; see {self._log}" if self._log is not None else ""
                raise RuntimeError(f"mlflow server on {self.url} did not start{where}")
            time.sleep(0.5)

    def stop(self) -> None:
        """Stop the server's whole process group: SIGTERM, then SIGKILL for what is left, and
        return once no process of the group is left (or after ``_STOP_S`` more)."""
        if self._process is None:
            return
        group = self._process.pid
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._process.wait(timeout=_STOP_S)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)  # the job runner outlives its parent
        self._process.wait()
        self._process = None
        deadline = time.monotonic() + _STOP_S
        while group_alive(group) and time.monotonic() < deadline:
            time.sleep(0.1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bagpipe.harness.track.ui",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--store", default=default_tracking_uri(Path.cwd()),
                        help="tracking store (default: the embedded ./mlflow.db)")
    parser.add_argument("--port", type=int, help="default: a free one")
    parser.add_argument("--experiment", default=DEFAULT_EXPERIMENT)
    args = parser.parse_args(argv)
    with MlflowServer(args.store, args.port) as server:
        experiment = find_experiment(args.store, args.experiment)
        where = (runs_page(server.url, experiment) if experiment is not None
                 else f"{server.url}  (no experiment {args.experiment!r} in the store yet)")
        print(f"MLflow UI: {where}\nstore {args.store}; Ctrl-C stops it", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            while True:
                time.sleep(3600)
    return 0


if __name__ == "__main__":
    sys.exit(main())
