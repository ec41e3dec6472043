"""A job on the local SLURM cluster is preempted mid-run, checkpoints at that step, is requeued by
submitit, resumes from exactly there and ends with the model of an uninterrupted run."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.fault.slurm_job import PreemptibleTraining, progress_file, train

pytestmark = pytest.mark.slurm

REPO_ROOT = Path(__file__).resolve().parents[2]
STEPS = 20
EVERY = 1000  # no periodic checkpoint: the one the job resumes from is the preemption's own


def _cluster_up() -> None:
    if shutil.which("sbatch") is None:
        pytest.skip("no SLURM client (sbatch) on PATH")
    probe = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=30)
    if probe.returncode != 0 or not probe.stdout.strip():
        pytest.fail(f"SLURM is installed but not running (start it with .ci/slurm-up): {probe.stderr}")


def _state(job_id: str) -> str:
    out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True,
                         text=True, timeout=30)
    return out.stdout.strip()


def _wait_for(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.2)


def _node_idle() -> bool:
    out = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=30)
    return out.returncode == 0 and all(state == "idle" for state in out.stdout.split())


def _result_starting_requeues_early(job, timeout_s: float, settle_s: float = 2.0) -> dict:
    """Wait for the job's result, starting the requeued instance early.

    SLURM holds a requeued job for a while (its BeginTime, about 2 min), so the test asks for it
    to start now, but only once the first instance has been gone from the node for ``settle_s``:
    slurmd revokes the first instance's credential when it ends, and refuses a new one made in the
    same second ("Job credential revoked"), which ends the job for good. The requeue may land at
    any moment after the signal, so this is checked on every poll rather than once."""
    deadline = time.monotonic() + timeout_s
    settled_since: float | None = None
    while not job.paths.result_pickle.exists():
        if time.monotonic() > deadline:
            pytest.fail(f"no result after {timeout_s} s; squeue says {_state(job.job_id)!r}; "
                        f"job stderr:\n{job.stderr()}")
        if _state(job.job_id) == "PENDING" and _node_idle():
            settled_since = settled_since or time.monotonic()
            if time.monotonic() - settled_since >= settle_s:
                subprocess.run(["scontrol", "update", f"jobid={job.job_id}", "StartTime=now"],
                               capture_output=True, timeout=30)
        else:
            settled_since = None
        time.sleep(0.5)
    return job.result()


@pytest.mark.timeout(480)
def test_preempted_job_resumes_to_the_same_model(tmp_path: Path, monkeypatch) -> None:
    _cluster_up()
    import submitit

    reference = train(tmp_path / "reference", STEPS, EVERY, step_sleep_s=0.0)
    monkeypatch.setenv("PYTHONPATH", f"{REPO_ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    executor = submitit.AutoExecutor(folder=tmp_path / "submitit", cluster="slurm")
    executor.update_parameters(timeout_min=10, slurm_partition="debug", cpus_per_task=1)
    store = tmp_path / "store"
    job = executor.submit(PreemptibleTraining(str(store), STEPS, EVERY, step_sleep_s=0.25))
    try:
        progress = progress_file(store)
        _wait_for(lambda: progress.exists() and int(progress.read_text() or 0) >= 3, 120,
                  "the job's third step")
        # What SLURM sends a preempted (or timed-out) job; submitit checkpoints and requeues it.
        subprocess.run(["scancel", "--signal=USR2", job.job_id], check=True, timeout=30)
        _wait_for(lambda: "Requeued job" in (job.stderr() or ""), 60, "submitit's requeue")
        outcome = _result_starting_requeues_early(job, 240)
    finally:
        subprocess.run(["scancel", job.job_id], capture_output=True, timeout=30)
    assert 3 <= outcome["first_step"] < STEPS, "the requeued job did not resume where it stopped"
    assert outcome["digest"] == reference["digest"]
