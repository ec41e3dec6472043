"""A real SLURM sweep (``launcher=slurm``) training a multi-process system, found in MLflow.

Needs a running cluster (``.ci/slurm-up`` starts a single-node one as root); skipped only when
``sbatch`` is not on PATH.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest

from bagpipe.core.registry import registered_systems

pytestmark = [
    pytest.mark.slurm,
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("sbatch") is None, reason="no SLURM (sbatch not on PATH)"),
]

#: Two trainer processes (plus the driver): the reference system once it is installed.
MULTI_PROCESS = next(s for s in ("sync_ps", "torchrec", "bagpipe") if s in registered_systems())


def test_slurm_sweep_trains_a_two_process_system_and_records_it(tmp_path: Path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    sweep_dir = tmp_path / "sweep"
    done = subprocess.run(
        [sys.executable, "-m", "bagpipe.harness.run", "-m", "launcher=slurm",
         f"system={MULTI_PROCESS}", "model=dlrm", "trainers=2", "seed=0,1",
         "run.steps=4", "run.eval_every=2", "run.warmup_steps=1", "run.batch_size=64",
         "run.eval_batches=1", "run.progress=false", "suite_name=slurm_test",
         "hydra.launcher.timeout_min=10", f"tracking.uri={uri}",
         f"hydra.sweep.dir={sweep_dir}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=900, check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    mlflow.set_tracking_uri(uri)
    runs = mlflow.search_runs(experiment_names=["bagpipe-harness"],
                              filter_string="tags.suite = 'slurm_test'", output_format="pandas")
    children = runs[runs["tags.system"] == MULTI_PROCESS]
    assert sorted(children["params.seed"]) == ["0", "1"]
    assert set(children["tags.launcher"]) == {"slurm"}
    assert all(job_id != "none" for job_id in children["tags.slurm_job_id"])
    assert (children["status"] == "FINISHED").all()
    assert (children["metrics.iter_time_mean_s"] > 0).all()

