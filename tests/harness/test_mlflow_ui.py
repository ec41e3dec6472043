"""The MLflow UI as a person sees it, in a real browser (headless chromium, driven by Playwright):
a small real sweep (local and sync_ps through the inprocess launcher) and its fig7 report, served
by ``mlflow server`` on a free loopback port.

Skipped only where chromium or playwright is missing; CI installs both (``.ci/run``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from bagpipe.harness.track.browser import ExperimentUI, browser_missing, browser_page
from bagpipe.harness.track.mlflow_runs import default_tracking_uri
from bagpipe.harness.track.ui import (
    DEFAULT_EXPERIMENT,
    MlflowServer,
    find_experiment,
    group_alive,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(browser_missing() is not None, reason=str(browser_missing())),
]

TINY = ["run.steps=4", "run.eval_every=2", "run.warmup_steps=1", "run.batch_size=64",
        "run.eval_batches=1", "launcher=inprocess"]
METRIC = "speedup_vs_sync_ps"
PARENT = "sweep-sweep"  # the parent run of sweep directory "sweep"
RUNS = ("local-dlrm-s0", "sync_ps-dlrm-s0")


@dataclass(frozen=True)
class Store:
    uri: str
    sweep_dir: Path
    parent_run: str


def harness(*args: str, cwd: Path) -> None:
    done = subprocess.run([sys.executable, "-m", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    """The smoke suite at seed 0 (local and sync_ps, dlrm), then its fig7 report."""
    home = tmp_path_factory.mktemp("ui_store")
    sweep_dir = home / "sweep"
    harness("bagpipe.harness.run", "suite=smoke", "hydra.sweeper.params.seed=0", *TINY,
            f"hydra.sweep.dir={sweep_dir}", cwd=home)
    harness("bagpipe.harness.report", "fig7", "--sweep-dir", str(sweep_dir), "--results-dir",
            str(home / "results"), "--reports-dir", str(home / "reports"), cwd=home)
    parent = json.loads((sweep_dir / "mlflow_parent.json").read_text())["run_id"]
    return Store(default_tracking_uri(home), sweep_dir, parent)


@pytest.fixture(scope="module")
def server(store: Store, tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    """``mlflow server`` over the store; afterwards no process of it may be left."""
    workdir = tmp_path_factory.mktemp("ui_server")
    running = MlflowServer(store.uri, log=workdir / "server.log", workdir=workdir)
    with running:
        group = running.process_group
        yield running
    assert not group_alive(group)


@pytest.fixture
def ui(store: Store, server: MlflowServer) -> Iterator[ExperimentUI]:
    """A fresh browser (no state left by another test) on the experiment."""
    experiment = find_experiment(store.uri, DEFAULT_EXPERIMENT)
    assert experiment is not None
    with browser_page() as page:
        yield ExperimentUI(page, server.url, experiment)


def test_the_experiment_lists_the_sweeps_runs_with_their_speedup(ui: ExperimentUI) -> None:
    ui.open_runs(PARENT)
    for name in RUNS:
        ui.shown(name).first.wait_for()
    assert ui.shown("Overview").count() == 0  # the runs view, not GenAI's "Overview / Traces"
    ui.show_column(METRIC)
    assert ui.column_header(METRIC).count() == 1


def test_compare_shows_the_speedup_and_the_systems_by_name(ui: ExperimentUI) -> None:
    ui.open_runs(PARENT)
    ui.select(RUNS)
    ui.compare(METRIC)
    assert ui.plot_label(METRIC).count() >= 1
    for system in ("local", "sync_ps"):  # the system's name, not its class path
        assert ui.plot_label(system).count() >= 1
    assert "baselines.sync_ps" not in ui.page.content()


def test_the_sweeps_parent_run_holds_its_figure_report_and_table(
    ui: ExperimentUI, store: Store
) -> None:
    ui.open_artifacts(store.parent_run)
    for name in ("fig7.png", "fig7.md", "runs.csv"):
        ui.shown(name).first.wait_for()
