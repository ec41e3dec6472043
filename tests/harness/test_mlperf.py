"""mllog files pass the MLPerf compliance checker; olympic scoring matches the result summarizer."""

from __future__ import annotations

import math
import random
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from mlperf_logging.mllog import mllog as mllog_module
from mlperf_logging.result_summarizer import result_summarizer

from bagpipe.core.interface import ModelState, TrainContext
from bagpipe.harness.run.runner import EvalPoint, RunConfig, run_training
from bagpipe.harness.track.mlperf import (
    NOT_CONVERGED,
    MllogRecorder,
    Submission,
    olympic_score,
    read_mllog,
    result_path,
    score_results_dir,
    time_to_train_min,
)
from bagpipe.training.local import LocalSystem
from tests.conftest import TINY_SCHEMA, TinySource

SUBMISSION = Submission("dlrm_dcnv2", "open", "bagpipe-harness", "test-machine")


def write_run(path: Path, aucs: list[float], target: float = 0.75) -> MllogRecorder:
    """A run with one evaluation per AUC value, as the runner would drive the recorder."""
    recorder = MllogRecorder(path, SUBMISSION, target_auc=target)
    recorder.init_start(seed=3, global_batch_size=64, hyperparameters={"system": "local"})
    recorder.set_samples(6400, 640)
    recorder.on_run_start()
    for i, auc in enumerate(aucs, start=1):
        recorder.on_eval_start(10 * i, i / len(aucs))
        recorder.on_eval(EvalPoint(step=10 * i, auc=auc, logloss=0.5, epoch_fraction=i / len(aucs),
                                   wall_s=float(i)))
    recorder.on_run_end()
    return recorder


def check_compliance(path: Path) -> subprocess.CompletedProcess[str]:
    """The upstream checker's CLI (it writes ``compliance_checker.log`` into its working dir)."""
    return subprocess.run(
        [sys.executable, "-m", "mlperf_logging.compliance_checker", "--usage", "training",
         "--ruleset", "6.0.0", str(path)],
        capture_output=True, text=True, check=False, cwd=path.parent,
    )


def test_log_passes_the_compliance_checker_and_stops_the_clock_at_the_target(tmp_path: Path):
    path = result_path(tmp_path, "local", "dlrm", "dlrm_dcnv2", 3)
    recorder = write_run(path, [0.6, 0.8, 0.9])
    assert path == tmp_path / "local-dlrm" / "dlrm_dcnv2" / "result_3.txt"
    checked = check_compliance(path)
    assert "SUCCESS" in checked.stdout + checked.stderr, checked.stdout + checked.stderr
    keys = [e["key"] for e in read_mllog(path)]
    # evaluations after the target was reached are not part of the MLPerf timeline
    assert keys.count("eval_accuracy") == 2
    assert keys[-1] == "run_stop"
    assert recorder.status == "success"
    assert recorder.time_to_target_s == 2.0
    assert math.isfinite(time_to_train_min(path))


class SlowToSnapshot(LocalSystem):
    """LocalSystem whose state takes ``EVAL_WORK_S`` to hand over: the evaluation's own work."""

    def full_state(self) -> ModelState:
        time.sleep(EVAL_WORK_S)
        return super().full_state()


EVAL_WORK_S = 0.3


def test_eval_start_and_eval_stop_bracket_the_evaluation_of_a_run(
    tmp_path: Path, tiny_context: Callable[..., TrainContext]
):
    path = tmp_path / "result_0.txt"
    recorder = MllogRecorder(path, SUBMISSION, target_auc=1.1)  # never reached: every eval logged
    recorder.init_start(seed=0, global_batch_size=8, hyperparameters={"system": "local"})
    recorder.set_samples(32, 32)
    eval_source = TinySource(TINY_SCHEMA, batch_size=16, num_batches=2, seed=1)
    result = run_training(SlowToSnapshot(), tiny_context(), eval_source,
                          RunConfig(num_steps=4, eval_every=2, progress=False), [recorder])

    events = read_mllog(path)
    keys = [e["key"] for e in events]
    evals = [k for k in keys if k.startswith("eval_") and k != "eval_samples"]
    assert evals == ["eval_start", "eval_accuracy", "eval_stop"] * 2
    starts = [e for e in events if e["key"] == "eval_start"]
    stops = [e for e in events if e["key"] == "eval_stop"]
    for start, stop, point in zip(starts, stops, result.evals, strict=True):
        assert start["metadata"]["epoch_num"] == stop["metadata"]["epoch_num"] == point.epoch_fraction
        # the evaluation (its slow snapshot included) runs between the two, not before both
        assert stop["time_ms"] - start["time_ms"] >= 1000 * EVAL_WORK_S - 1
        assert point.eval_s >= EVAL_WORK_S
    checked = check_compliance(path)
    assert "SUCCESS" in checked.stdout + checked.stderr, checked.stdout + checked.stderr


def test_run_that_misses_the_target_is_aborted_and_not_converged(tmp_path: Path):
    path = tmp_path / "result_0.txt"
    write_run(path, [0.6, 0.7])
    stop = [e for e in read_mllog(path) if e["key"] == "run_stop"]
    assert stop[0]["metadata"]["status"] == "aborted"
    assert time_to_train_min(path) == NOT_CONVERGED
    checked = check_compliance(path)
    assert "SUCCESS" in checked.stdout + checked.stderr


def test_failed_run_still_writes_a_closed_log(tmp_path: Path):
    path = tmp_path / "result_1.txt"
    recorder = MllogRecorder(path, SUBMISSION, target_auc=0.7)
    recorder.init_start(seed=1, global_batch_size=8, hyperparameters={})
    recorder.fail()
    keys = [e["key"] for e in read_mllog(path)]
    assert keys[-1] == "run_stop" and "run_start" in keys


@pytest.mark.parametrize(
    ("times", "expected"),
    [
        ([3.0, 1.0, 2.0], 2.0),
        ([1.0, 2.0, 3.0, 10.0], 2.5),
        ([1.0, 2.0, 3.0, NOT_CONVERGED], 2.5),  # one non-converged run is the dropped slowest
        ([1.0, 2.0, NOT_CONVERGED, NOT_CONVERGED], None),  # more than one: invalid
        ([1.0, 2.0], None),  # nothing left after dropping both ends
    ],
)
def test_olympic_score(times: list[float], expected: float | None):
    assert olympic_score(times) == expected


def test_olympic_score_matches_the_mlperf_result_summarizer(tmp_path: Path, monkeypatch):
    """Ten runs of 60, 66, ... 114 minutes (harness.md §1.3): both give the middle-eight mean."""
    folder = tmp_path / "local-dlrm" / "dlrm_dcnv2"
    minutes = [60 + 6 * i for i in range(10)]
    random.Random(0).shuffle(minutes)
    for seed, duration in enumerate(minutes):
        start_ms = 1_700_000_000_000 + seed * 10**8
        monkeypatch.setattr(mllog_module, "_current_time_ms", lambda s=start_ms: s)
        path = folder / f"result_{seed}.txt"
        recorder = MllogRecorder(path, SUBMISSION, target_auc=0.7)
        recorder.init_start(seed=seed, global_batch_size=64, hyperparameters={})
        recorder.set_samples(640, 64)
        recorder.on_run_start()
        # the target is reached exactly `duration` minutes after run_start
        monkeypatch.setattr(mllog_module, "_current_time_ms",
                            lambda s=start_ms, d=duration: s + d * 60_000)
        recorder.on_eval_start(1, 1.0)
        recorder.on_eval(EvalPoint(step=1, auc=0.8, logloss=0.4, epoch_fraction=1.0, wall_s=1.0))
        recorder.close()
    theirs, _, _ = result_summarizer._compute_strong_score_standalone(
        "dlrm_dcnv2", "local-dlrm", False, str(folder), "training", "6.0.0"
    )
    ours = score_results_dir(folder)
    assert ours == pytest.approx(87.0, abs=1e-3)
    assert ours == pytest.approx(theirs, rel=1e-9)
