"""Runner checkpoints and resume, and recovery from role failures, on the in-process system.

A run stopped by a (simulated) role failure and resumed from its last checkpoint must end with
exactly the model, and RNG state, of an uninterrupted run with the same seed.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bagpipe.core.batch import Batch
from bagpipe.core.checkpoint import CheckpointStore, CheckpointWarning
from bagpipe.core.interface import ModelState, OptimConfig, StepResult, TrainContext
from bagpipe.core.roles import RoleFailedError
from bagpipe.harness.run.recovery import run_with_recovery
from bagpipe.harness.run.runner import RunConfig, run_training
from bagpipe.training.local import LocalSystem
from tests.conftest import TINY_MODEL, TINY_SCHEMA, TinySource, assert_states_equal

STEPS = 11


class NoisyLocal(LocalSystem):
    """LocalSystem that draws from the global RNG every step (as dropout would) and can fail once."""

    name = "noisy_local"

    def __init__(self, fail_at: int | None = None) -> None:
        super().__init__()
        self.fail_at = fail_at

    def train_step(self, step: int, batch: Batch) -> StepResult:
        if step == self.fail_at:
            raise RoleFailedError("trainer_0", "died (exit code -9, SIGKILL) [simulated]")
        result = super().train_step(step, batch)
        result.loss += float(torch.rand(()))
        return result


def _context() -> TrainContext:
    return TrainContext(
        schema=TINY_SCHEMA,
        model=TINY_MODEL,
        optim=OptimConfig(),
        global_batch_size=8,
        seed=3,
        source=TinySource(TINY_SCHEMA, 8, 5, seed=3),  # 5 batches: the run wraps into epoch 2
    )


class KeepState:
    """A callback that keeps the system's final state and the RNG state at the end of the run."""

    def __init__(self, systems: list[LocalSystem]) -> None:
        self.systems = systems
        self.state: ModelState | None = None
        self.rng: torch.Tensor | None = None
        self.losses: dict[int, float] = {}

    def on_step(self, step: int, metrics: dict[str, float]) -> None:
        self.losses[step] = metrics["loss"]

    def on_run_end(self, result: object) -> None:
        self.state = self.systems[-1].full_state()
        self.rng = torch.get_rng_state()



def _uninterrupted(cfg: RunConfig) -> KeepState:
    systems = [NoisyLocal()]
    keep = KeepState(systems)
    run_training(systems[0], _context(), TinySource(TINY_SCHEMA, 8, 2, seed=9), cfg, [keep])
    return keep


def test_checkpoints_at_the_interval(tmp_path: Path) -> None:
    cfg = RunConfig(num_steps=STEPS, eval_every=0, warmup_steps=0, checkpoint_every=4)
    store = CheckpointStore(tmp_path, keep=5)
    result = run_training(
        NoisyLocal(), _context(), TinySource(TINY_SCHEMA, 8, 2, seed=9), cfg, checkpoints=store
    )
    assert [step for step, _ in store.steps()] == [4, 8]
    assert result.summary["checkpoint_wall_s"] > 0


def test_recovered_run_equals_uninterrupted(tmp_path: Path) -> None:
    cfg = RunConfig(num_steps=STEPS, eval_every=5, warmup_steps=0, checkpoint_every=3)
    reference = _uninterrupted(cfg)
    attempts = iter([NoisyLocal(fail_at=7), NoisyLocal(fail_at=10), NoisyLocal()])
    systems: list[LocalSystem] = []

    def make() -> LocalSystem:
        systems.append(next(attempts))
        return systems[-1]

    keep = KeepState(systems)
    store = CheckpointStore(tmp_path, keep=2)
    result, restarts = run_with_recovery(
        make, _context(), TinySource(TINY_SCHEMA, 8, 2, seed=9), cfg, store, [keep]
    )
    assert [(r.role, r.failed_step, r.resumed_step) for r in restarts] == [
        ("trainer_0", 7, 6),
        ("trainer_0", 10, 9),
    ]
    assert all(r.recovery_s > 0 for r in restarts)
    assert keep.state is not None and reference.state is not None
    assert_states_equal(keep.state, reference.state)
    assert torch.equal(keep.rng, reference.rng)  # the RNG stream continued where it stopped
    assert [m["step"] for m in result.steps] == list(range(STEPS))
    assert [m["loss"] for m in result.steps] == [reference.losses[s] for s in range(STEPS)]
    assert [p.step for p in result.evals] == [5, 10, 11]
    assert sorted(keep.losses) == list(range(STEPS))  # callbacks saw every step once
    assert result.summary["restarts"] == 2.0


class CorruptingLocal(NoisyLocal):
    """Fails at ``fail_at`` after damaging the newest checkpoint of ``store`` (its tables file cut
    short, as a disk that lost the last write would leave it)."""

    def __init__(self, fail_at: int, store: CheckpointStore) -> None:
        super().__init__(fail_at)
        self.store = store

    def train_step(self, step: int, batch: Batch) -> StepResult:
        if step == self.fail_at:
            _, newest = self.store.steps()[-1]
            tables = newest / "tables.pt"
            tables.write_bytes(tables.read_bytes()[:-9])
        return super().train_step(step, batch)


def test_recovery_inside_a_job_passes_over_a_corrupt_newest_checkpoint(tmp_path: Path) -> None:
    cfg = RunConfig(num_steps=STEPS, eval_every=0, warmup_steps=0, checkpoint_every=3)
    reference = _uninterrupted(cfg)
    store = CheckpointStore(tmp_path, keep=3)
    attempts = iter([CorruptingLocal(fail_at=10, store=store), NoisyLocal()])
    systems: list[LocalSystem] = []

    def make() -> LocalSystem:
        systems.append(next(attempts))
        return systems[-1]

    keep = KeepState(systems)
    with pytest.warns(CheckpointWarning, match="step_00000009.*truncated"):
        result, restarts = run_with_recovery(
            make, _context(), TinySource(TINY_SCHEMA, 8, 2, seed=9), cfg, store, [keep]
        )
    # step 9's checkpoint is unreadable: the run goes back to step 6's and retrains 6 .. 10
    assert [(r.failed_step, r.resumed_step) for r in restarts] == [(10, 6)]
    assert keep.state is not None and reference.state is not None
    assert_states_equal(keep.state, reference.state)
    assert torch.equal(keep.rng, reference.rng)
    assert [m["loss"] for m in result.steps] == [reference.losses[s] for s in range(STEPS)]


def test_failure_before_any_checkpoint_starts_over(tmp_path: Path) -> None:
    cfg = RunConfig(num_steps=6, eval_every=0, warmup_steps=0, checkpoint_every=4)
    reference = _uninterrupted(cfg)
    attempts = iter([NoisyLocal(fail_at=2), NoisyLocal()])
    systems: list[LocalSystem] = []

    def make() -> LocalSystem:
        systems.append(next(attempts))
        return systems[-1]

    keep = KeepState(systems)
    _, restarts = run_with_recovery(
        make, _context(), TinySource(TINY_SCHEMA, 8, 2, seed=9), cfg,
        CheckpointStore(tmp_path), [keep],
    )
    assert [r.resumed_step for r in restarts] == [0]
    assert keep.state is not None and reference.state is not None
    assert_states_equal(keep.state, reference.state)


def test_too_many_failures_reraise(tmp_path: Path) -> None:
    cfg = RunConfig(num_steps=6, eval_every=0, warmup_steps=0, checkpoint_every=2)
    with pytest.raises(RoleFailedError, match="trainer_0"):
        run_with_recovery(
            lambda: NoisyLocal(fail_at=3), _context(), TinySource(TINY_SCHEMA, 8, 2, seed=9),
            cfg, CheckpointStore(tmp_path), max_restarts=2,
        )


def test_other_errors_are_not_retried(tmp_path: Path) -> None:
    class Broken(NoisyLocal):
        def train_step(self, step: int, batch: Batch) -> StepResult:
            raise ValueError("a bug, not a failure")

    made = []
    cfg = RunConfig(num_steps=3, eval_every=0, warmup_steps=0)
    with pytest.raises(ValueError, match="a bug"):
        run_with_recovery(
            lambda: made.append(1) or Broken(), _context(), TinySource(TINY_SCHEMA, 8, 2, seed=9),
            cfg, CheckpointStore(tmp_path),
        )
    assert len(made) == 1


def test_fresh_run_refuses_a_used_store(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    cfg = RunConfig(num_steps=5, eval_every=0, warmup_steps=0, checkpoint_every=2)
    run_training(NoisyLocal(), _context(), TinySource(TINY_SCHEMA, 8, 2, seed=9), cfg, checkpoints=store)
    with pytest.raises(ValueError, match="already holds checkpoints"):
        run_with_recovery(
            NoisyLocal, _context(), TinySource(TINY_SCHEMA, 8, 2, seed=9), cfg, store,
            resume_existing=False,
        )


def test_system_without_resume_support_is_refused(tmp_path: Path) -> None:
    class NoResume(NoisyLocal):
        supports_resume = False

    store = CheckpointStore(tmp_path)
    cfg = RunConfig(num_steps=5, eval_every=0, warmup_steps=0, checkpoint_every=2)
    run_training(NoisyLocal(), _context(), TinySource(TINY_SCHEMA, 8, 2, seed=9), cfg, checkpoints=store)
    with pytest.raises(ValueError, match="does not declare supports_resume"):
        run_training(
            NoResume(), _context(), TinySource(TINY_SCHEMA, 8, 2, seed=9), cfg,
            resume=store.load_latest(),
        )
