"""A preemption warning stops training at the next step boundary with a checkpoint of exactly that
step, and the resumed run ends with the model of an uninterrupted one; the same through the Hydra
entry point, where the signal's default action then ends the process as it would have."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bagpipe.core.checkpoint import CheckpointStore
from bagpipe.harness.run.preemption import DeferredSignal
from bagpipe.harness.run.recovery import run_with_recovery
from bagpipe.harness.run.runner import Preempted, RunConfig, run_training
from tests.conftest import TINY_SCHEMA, TinySource, assert_states_equal
from tests.fault.test_resume import KeepState, NoisyLocal, _context, _uninterrupted

STEPS = 11


class StopAfter:
    """``stop_requested`` that says yes once ``steps`` steps have been trained."""

    def __init__(self, steps: int) -> None:
        self.steps = steps
        self.seen = 0

    def on_step(self, step: int, metrics: dict[str, float]) -> None:
        self.seen = step + 1

    def __call__(self) -> bool:
        return self.seen >= self.steps


def test_a_stop_request_checkpoints_that_step_and_the_resumed_run_is_exact(tmp_path: Path) -> None:
    cfg = RunConfig(num_steps=STEPS, eval_every=0, warmup_steps=0, checkpoint_every=100)
    reference = _uninterrupted(cfg)
    store = CheckpointStore(tmp_path)
    stop = StopAfter(6)
    with pytest.raises(Preempted) as preempted:
        run_training(NoisyLocal(), _context(), TinySource(TINY_SCHEMA, 8, 2, seed=9), cfg,
                     [stop], checkpoints=store, stop_requested=stop)
    assert (preempted.value.steps_done, preempted.value.checkpointed) == (6, True)
    assert [step for step, _ in store.steps()] == [6]  # no periodic one was due: the stop's own

    systems: list[NoisyLocal] = []

    def make() -> NoisyLocal:
        systems.append(NoisyLocal())
        return systems[-1]

    keep = KeepState(systems)  # type: ignore[arg-type]
    result, restarts = run_with_recovery(
        make, _context(), TinySource(TINY_SCHEMA, 8, 2, seed=9), cfg, store, [keep]
    )
    assert restarts == [] and result.summary["first_step"] == 6.0
    assert keep.state is not None and reference.state is not None
    assert_states_equal(keep.state, reference.state)


def test_deferred_signal_is_delivered_to_the_previous_handler_after_the_block() -> None:
    received: list[int] = []
    original = signal.signal(signal.SIGUSR2, lambda signum, frame: received.append(signum))
    try:
        with DeferredSignal(signal.SIGUSR2) as deferred:
            assert not deferred.requested()
            os.kill(os.getpid(), signal.SIGUSR2)
            time.sleep(0.05)  # the handler runs between bytecodes of the main thread
            assert deferred.requested() and received == []
        assert received == [signal.SIGUSR2]
        os.kill(os.getpid(), signal.SIGUSR2)  # the previous handler is back in place
        time.sleep(0.05)
        assert received == [signal.SIGUSR2, signal.SIGUSR2]
    finally:
        signal.signal(signal.SIGUSR2, original)


def _train(tmp_path: Path, *overrides: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "bagpipe.harness.run", "launcher=inprocess", "system=local",
         "run.batch_size=64", "run.eval_every=0", "run.eval_batches=1", "run.warmup_steps=0",
         "run.progress=false", "tracking.enabled=false", f"hydra.run.dir={tmp_path}/run",
         f"run.checkpoint_dir={tmp_path}/checkpoints", *overrides],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path,
    )


def _record(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "run" / "record" / "run.json").read_text())


def test_hydra_run_preempted_by_sigusr2_resumes_where_it_stopped_to_the_uninterrupted_model(
    tmp_path: Path,
) -> None:
    store = CheckpointStore(tmp_path / "checkpoints")
    first = _train(tmp_path, "run.steps=3000", "run.checkpoint_every=20")
    try:
        deadline = time.monotonic() + 120
        while not store.steps():
            assert first.poll() is None, first.communicate()[0]
            assert time.monotonic() < deadline, "no periodic checkpoint within 120 s"
            time.sleep(0.1)
        first.send_signal(signal.SIGUSR2)
        output, _ = first.communicate(timeout=120)
    finally:
        first.kill()
    assert first.returncode == -signal.SIGUSR2, output  # the default action, after the checkpoint
    stopped_at = store.steps()[-1][0]
    assert 20 <= stopped_at < 3000 and f"preempted after {stopped_at} steps" in output, output
    assert _record(tmp_path)["status"] == "KILLED"

    # The run's length is not part of its identity: resume and stop a few steps later.
    second = _train(tmp_path, f"run.steps={stopped_at + 3}", "run.checkpoint_every=20")
    output, _ = second.communicate(timeout=300)
    assert second.returncode == 0, output
    record = _record(tmp_path)
    assert record["status"] == "FINISHED"
    assert record["summary"]["first_step"] == stopped_at

    # The same run uninterrupted, in its own directories: the resumed steps' losses and the
    # final evaluation (the final model on the same batches) are bit-identical. (The summary's
    # train_loss_last is not compared: it is the mean over the steps this process trained.)
    (tmp_path / "uninterrupted").mkdir()
    whole = _train(tmp_path / "uninterrupted", f"run.steps={stopped_at + 3}",
                   "run.checkpoint_every=20")
    output, _ = whole.communicate(timeout=300)
    assert whole.returncode == 0, output
    want = _record(tmp_path / "uninterrupted")
    assert want["summary"]["first_step"] == 0
    resumed = {m["step"]: m["loss"] for m in record["steps"]}
    assert sorted(resumed) == [stopped_at, stopped_at + 1, stopped_at + 2]
    assert resumed == {m["step"]: m["loss"] for m in want["steps"] if m["step"] in resumed}
    assert (record["summary"]["logloss"], record["summary"]["auc"]) == (
        want["summary"]["logloss"], want["summary"]["auc"])


def test_checkpoints_for_a_system_that_cannot_resume_are_refused(tmp_path: Path) -> None:
    done = _train(tmp_path, "system=het", "run.steps=2", "run.checkpoint_every=1")
    output, _ = done.communicate(timeout=120)
    assert done.returncode != 0
    assert "run.checkpoint_every=1: system 'het' cannot resume" in output
