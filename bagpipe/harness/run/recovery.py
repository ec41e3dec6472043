"""Run training through role failures: restart the job from the last checkpoint and carry on.

When a role process of a multi-process system dies (a trainer, an embedding-server shard, the
oracle), the system's :class:`~bagpipe.core.roles.Deployment` raises
:class:`~bagpipe.core.roles.RoleFailedError` naming it within ~0.1 s. :func:`run_with_recovery`
then lets the runner close the system (every role process is ended), builds a fresh system,
resumes it from the newest valid checkpoint in the store and trains on. The restart is whole-job:
the cheapest correct choice here, since every system's state outside the embedding servers is
either replicated (dense weights) or soft (caches), and the servers' rows are in the checkpoint.

Because a checkpoint holds the whole training state (model, step, RNG; SGD has no optimizer
state) and the runner replays the same batches from the checkpointed step, a recovered run ends
with exactly the model of an uninterrupted run with the same seed (``tests/fault`` checks this
bit for bit for a killed trainer and a killed embedding server).

Only role failures are retried: any other exception is a bug or bad input, and retrying a
deterministic run would fail the same way.

This whole-job restart is the ``rollback`` path. A system that can replace a dead role in place
(``sync_ps`` with a standby trainer: ``bagpipe.core.recovery``, path ``replace``) does so inside its
``train_step``, and the failure never reaches here; the run's recoveries list both kinds, in the
order they happened, each with its path, steps redone and time (``result.stats["recoveries"]``).

Callbacks see one run: ``on_run_start`` once, and ``on_step`` / ``on_eval_start`` / ``on_eval``
once per step (steps trained or evaluated again after a restart are not reported twice).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from bagpipe.core.checkpoint import CheckpointStore
from bagpipe.core.interface import System, TrainContext
from bagpipe.core.recovery import REPLACE, Recovery
from bagpipe.core.roles import RoleFailedError
from bagpipe.core.source import BatchSource
from bagpipe.harness.run.runner import EvalPoint, RunConfig, RunResult, notify, run_training

__all__ = ["DEFAULT_CHECKPOINT_EVERY", "Restart", "run_with_recovery"]

#: Steps between checkpoints unless configured: ``bench/fault.py`` measures the training overhead
#: at this interval (target < 5%).
DEFAULT_CHECKPOINT_EVERY = 200

_log = logging.getLogger(__name__)


#: One recovery, on either path (``bagpipe.core.recovery``): the name it has here.
Restart = Recovery


@dataclass
class _Progress:
    """The one run callbacks see across attempts, and what the driver saw of every attempt.

    ``steps`` / ``evals`` keep the latest measurement of each step (a step trained again after a
    restart replaces the lost attempt's); callbacks see each step and evaluation once, the first
    time, and ``on_run_start`` once. An evaluation a failure interrupted is announced once too
    (``eval_started``): its ``on_eval`` comes from the attempt that finishes it.
    """

    callbacks: Sequence[object]
    started: bool = False
    steps: dict[int, dict[str, float]] = field(default_factory=dict)
    eval_started: set[int] = field(default_factory=set)
    evals: dict[int, EvalPoint] = field(default_factory=dict)
    current_step: int = 0
    awaiting_recovery: bool = False
    trained_at_s: list[float] = field(default_factory=list)

    def on_run_start(self, ctx: TrainContext) -> None:
        if not self.started:
            self.started = True
            notify(self.callbacks, "on_run_start", ctx)

    def on_step(self, step: int, metrics: dict[str, float]) -> None:
        self.current_step = step + 1
        if self.awaiting_recovery:
            self.trained_at_s.append(time.perf_counter())
            self.awaiting_recovery = False
        if step not in self.steps:
            notify(self.callbacks, "on_step", step, metrics)
        self.steps[step] = metrics

    def on_eval_start(self, step: int, epoch_fraction: float) -> None:
        if step not in self.eval_started:
            notify(self.callbacks, "on_eval_start", step, epoch_fraction)
        self.eval_started.add(step)

    def on_eval(self, point: EvalPoint) -> None:
        if point.step not in self.evals:
            notify(self.callbacks, "on_eval", point)
        self.evals[point.step] = point

    def on_run_end(self, result: RunResult) -> None:
        notify(self.callbacks, "on_run_end", result)


def run_with_recovery(
    make_system: Callable[[], System],
    ctx: TrainContext,
    eval_source: BatchSource,
    cfg: RunConfig,
    store: CheckpointStore,
    callbacks: Sequence[object] = (),
    *,
    max_restarts: int = 3,
    resume_existing: bool = True,
    stop_requested: Callable[[], bool] | None = None,
) -> tuple[RunResult, list[Restart]]:
    """Train like :func:`~bagpipe.harness.run.runner.run_training`, restarting after role failures.

    Args:
        make_system: builds a fresh, not yet set up system (called once per attempt).
        store: where checkpoints are saved every ``cfg.checkpoint_every`` steps and resumed from.
        max_restarts: role failures tolerated; the next one is re-raised.
        resume_existing: start from the store's newest checkpoint if it has one (a requeued SLURM
            job); ``False`` requires an empty store, so a fresh run never resumes by accident.
        stop_requested: passed to the runner: when it says yes after a step, a checkpoint is
            saved there and :class:`~bagpipe.harness.run.runner.Preempted` is raised (not retried).

    Returns:
        The run's result and its restarts. ``result.steps`` / ``evals`` cover the whole run, each
        step once (its latest training); ``summary`` is the last attempt's, plus ``restarts``,
        ``recovery_s`` (summed) and ``first_step`` (where the last attempt started).
    """
    if max_restarts < 0:
        raise ValueError(f"max_restarts must be >= 0, got {max_restarts}")
    resume = store.load_latest()
    if resume is not None and not resume_existing:
        raise ValueError(
            f"{store.root} already holds checkpoints (newest: step {resume.step}); pass "
            f"resume_existing=True to continue that run, or use an empty directory"
        )
    progress = _Progress(callbacks)
    failures: list[tuple[RoleFailedError, int, int, float]] = []
    systems: list[System] = []
    while True:
        progress.current_step = resume.step if resume is not None else 0
        systems.append(make_system())
        try:
            result = run_training(
                systems[-1], ctx, eval_source, cfg,
                callbacks=[progress], checkpoints=store, resume=resume,
                stop_requested=stop_requested,
            )
            break
        except RoleFailedError as failure:
            detected_at_s = time.perf_counter()
            if progress.awaiting_recovery:  # the previous restart never trained a step
                progress.trained_at_s.append(float("nan"))
            progress.awaiting_recovery = True
            if len(failures) >= max_restarts:
                raise
            resume = store.load_latest()
            resumed_step = resume.step if resume is not None else 0
            _log.warning(
                "role failure at step %d: %s; restarting from step %d",
                progress.current_step, str(failure).splitlines()[0], resumed_step,
            )
            failures.append((failure, progress.current_step, resumed_step, detected_at_s))
    in_place = [r for system in systems for r in system.recoveries()]
    restarts = sorted(
        [*_restarts(failures, progress.trained_at_s), *in_place], key=lambda r: r.detected_at_s
    )
    result.steps = [progress.steps[step] for step in sorted(progress.steps)]
    result.evals = [progress.evals[step] for step in sorted(progress.evals)]
    result.summary["restarts"] = float(len(restarts))
    result.summary["restarts_replace"] = float(sum(r.path == REPLACE for r in restarts))
    result.summary["steps_redone"] = float(sum(r.steps_redone for r in restarts))
    result.summary["recovery_s"] = sum(r.recovery_s for r in restarts)
    result.stats["recoveries"] = [r.as_record() for r in restarts]
    return result, restarts


def _restarts(
    failures: Sequence[tuple[RoleFailedError, int, int, float]], trained_at_s: Sequence[float]
) -> list[Restart]:
    """One whole-job restart (path ``rollback``) per failure (error, failed step, resumed step, detection time), with
    the time the attempt after it first completed a step."""
    return [
        Recovery(
            role=failure.role,
            reason=str(failure).splitlines()[0],
            failed_step=failed_step,
            resumed_step=resumed_step,
            detected_at_s=detected_at_s,
            trained_at_s=trained,
            fallback=failure.fallback,
        )
        for (failure, failed_step, resumed_step, detected_at_s), trained in zip(
            failures, trained_at_s, strict=True
        )
    ]
