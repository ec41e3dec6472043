"""A preemptible training job for the SLURM test: submitit ``Checkpointable``, resumes from its store.

On preemption (SIGUSR2 from SLURM) training stops after the step in flight with a checkpoint of
that step; submitit then calls ``checkpoint()``, which resubmits this same callable, and requeues
the job. The requeued job calls it again; ``run_with_recovery`` finds the checkpoint in the same
store directory and resumes from it.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import submitit
import torch

from bagpipe.core.checkpoint import CheckpointStore, state_digest
from bagpipe.core.interface import OptimConfig, TrainContext
from bagpipe.harness.run.preemption import DeferredSignal
from bagpipe.harness.run.recovery import run_with_recovery
from bagpipe.harness.run.runner import RunConfig
from bagpipe.training.local import LocalSystem
from tests.conftest import TINY_MODEL, TINY_SCHEMA, TinySource

SEED = 5


def context() -> TrainContext:
    return TrainContext(
        schema=TINY_SCHEMA,
        model=TINY_MODEL,
        optim=OptimConfig(),
        global_batch_size=8,
        seed=SEED,
        source=TinySource(TINY_SCHEMA, 8, 16, seed=SEED),
    )


def eval_source() -> TinySource:
    return TinySource(TINY_SCHEMA, 8, 2, seed=SEED + 100)


class _Finish:
    """Keeps the final model's digest; optionally slows every step so the job can be preempted,
    and counts the steps trained in ``progress_file`` so a test knows when to preempt it."""

    def __init__(self, systems: list[LocalSystem], step_sleep_s: float, progress_file: Path) -> None:
        self.systems = systems
        self.step_sleep_s = step_sleep_s
        self.progress_file = progress_file
        self.digest = ""

    def on_step(self, step: int, metrics: dict[str, float]) -> None:
        self.progress_file.write_text(str(step + 1))
        time.sleep(self.step_sleep_s)

    def on_run_end(self, result: object) -> None:
        self.digest = state_digest(self.systems[-1].full_state())


def train(store_dir: Path, num_steps: int, checkpoint_every: int, step_sleep_s: float) -> dict[str, Any]:
    """Train (resuming from ``store_dir`` if it holds checkpoints); the final digest and start."""
    torch.set_num_threads(1)
    systems: list[LocalSystem] = []

    def make() -> LocalSystem:
        systems.append(LocalSystem())
        return systems[-1]

    finish = _Finish(systems, step_sleep_s, progress_file(store_dir))
    cfg = RunConfig(num_steps, eval_every=0, warmup_steps=0, checkpoint_every=checkpoint_every,
                    progress=False)
    store = CheckpointStore(store_dir, fingerprint={"system": "local", "seed": SEED})
    # SLURM's warning (SIGUSR2) stops training at a step boundary with a checkpoint, then goes to
    # submitit's handler, which resubmits this callable and requeues the job.
    with DeferredSignal() as preemption:
        result, _ = run_with_recovery(make, context(), eval_source(), cfg, store, [finish],
                                      stop_requested=preemption.requested)
    return {"digest": finish.digest, "first_step": int(result.summary["first_step"])}


def progress_file(store_dir: Path) -> Path:
    return store_dir.parent / f"{store_dir.name}.progress"


class PreemptibleTraining(submitit.helpers.Checkpointable):
    """The submitted callable: ``checkpoint()`` (inherited) resubmits it unchanged."""

    def __init__(self, store_dir: str, num_steps: int, checkpoint_every: int, step_sleep_s: float):
        self.store_dir = store_dir
        self.num_steps = num_steps
        self.checkpoint_every = checkpoint_every
        self.step_sleep_s = step_sleep_s

    def __call__(self) -> dict[str, Any]:
        return train(Path(self.store_dir), self.num_steps, self.checkpoint_every, self.step_sleep_s)
