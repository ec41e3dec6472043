"""Against a real ``mlflow server``: a sweep's runs, their parent and speedups read back over REST;
a run made while the server is unreachable finishes, keeps its results, and uploads later."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from bagpipe.harness.track.ui import MlflowServer, free_port

pytestmark = pytest.mark.slow

TINY = ["run.steps=4", "run.eval_every=2", "run.warmup_steps=1", "run.batch_size=64",
        "run.eval_batches=1", "run.progress=false", "launcher=inprocess"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """An ``mlflow server`` on a free port; its whole process group is stopped afterwards."""
    home = tmp_path_factory.mktemp("mlflow_server")
    with MlflowServer(f"sqlite:///{home}/mlflow.db", log=home / "server.log",
                      workdir=home) as running:
        yield running.url


def rest(uri: str, path: str, body: dict | None = None) -> dict:
    request = urllib.request.Request(
        f"{uri}/api/2.0/mlflow/{path}",
        data=None if body is None else json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as reply:
        return json.loads(reply.read())


def search_runs(uri: str, filter_string: str) -> list[dict]:
    experiments = rest(uri, "experiments/search", {"max_results": 100})["experiments"]
    ids = [e["experiment_id"] for e in experiments]
    return rest(uri, "runs/search", {"experiment_ids": ids, "filter": filter_string,
                                     "max_results": 100}).get("runs", [])


def harness(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=600, check=False)


def tags_of(run: dict) -> dict[str, str]:
    return {t["key"]: t["value"] for t in run["data"].get("tags", [])}


def metrics_of(run: dict) -> dict[str, float]:
    return {m["key"]: m["value"] for m in run["data"].get("metrics", [])}


def test_sweep_runs_are_children_of_one_parent_with_speedups(server: str, tmp_path: Path):
    sweep_dir = tmp_path / "sweep"
    done = harness("bagpipe.harness.run", "suite=smoke", "hydra.sweeper.params.system=local",
                   "tracking.reference_system=local", f"tracking.uri={server}", f"hydra.sweep.dir={sweep_dir}", *TINY, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    parent_id = json.loads((sweep_dir / "mlflow_parent.json").read_text())["run_id"]
    children = search_runs(server, f"tags.`mlflow.parentRunId` = '{parent_id}'")
    assert len(children) == 2  # local x dlrm x seeds 0, 1
    experiment = rest(server, f"experiments/get?experiment_id={children[0]['info']['experiment_id']}")
    experiment_tags = {t["key"]: t["value"] for t in experiment["experiment"]["tags"]}
    assert experiment_tags["mlflow.experimentKind"] == "custom_model_development"  # the runs view
    parent_files = rest(server, f"artifacts/list?run_id={parent_id}")["files"]
    assert "runs.csv" in {f["path"] for f in parent_files}
    for child in children:
        tags = tags_of(child)
        assert (tags["system"], tags["model"], tags["suite"]) == ("local", "dlrm", "smoke")
        assert tags["launcher"] == "inprocess"
        assert (tags["cluster"], tags["dilation"]) == ("paper-8xV100", "1")  # the default topology
        params = {p["key"]: p["value"] for p in child["data"]["params"]}
        assert params["system"] == "local" and not any("_target_" in key for key in params)
        assert tags["sweep_id"] == "sweep" and tags["git_sha"] and tags["slurm_job_id"] == "none"
        metrics = metrics_of(child)
        assert metrics["speedup_vs_local"] == pytest.approx(1.0)
        assert 0.0 <= metrics["auc"] <= 1.0 and metrics["iter_time_mean_s"] > 0
        history = urllib.request.urlopen(
            f"{server}/api/2.0/mlflow/metrics/get-history?run_id={child['info']['run_id']}"
            "&metric_key=loss", timeout=30)
        assert len(json.loads(history.read())["metrics"]) == 4  # one point per step
        artifacts = rest(server, f"artifacts/list?run_id={child['info']['run_id']}")
        assert {"config.yaml", "mllog.txt"} <= {f["path"] for f in artifacts["files"]}
    assert (sweep_dir / "runs.csv").read_text().count("\n") == 3


def test_run_survives_the_server_being_down_and_uploads_later(server: str, tmp_path: Path):
    down = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    run_dir = tmp_path / "run"
    done = harness("bagpipe.harness.run", f"tracking.uri={down}", f"hydra.run.dir={run_dir}",
                   "seed=7", *TINY, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "python -m bagpipe.harness.track.upload" in done.stdout
    assert (run_dir / "record" / "run.json").exists()
    assert not (run_dir / "record" / "mlflow_run.json").exists()
    assert list((run_dir / "results").rglob("result_7.txt"))

    uploaded = harness("bagpipe.harness.track.upload", str(run_dir), "--tracking-uri", server,
                       cwd=tmp_path)
    assert uploaded.returncode == 0, uploaded.stderr[-3000:]
    (run,) = search_runs(server, "tags.`mlflow.runName` = 'local-dlrm-s7'")
    assert run["info"]["status"] == "FINISHED"
    assert metrics_of(run)["iter_time_mean_s"] > 0
    again = harness("bagpipe.harness.track.upload", str(run_dir), "--tracking-uri", server, cwd=tmp_path)
    assert again.returncode == 0
    assert len(search_runs(server, "tags.`mlflow.runName` = 'local-dlrm-s7'")) == 1
