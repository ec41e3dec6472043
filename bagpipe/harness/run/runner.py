"""The training loop every system runs under: data order, timing, evaluation cadence, callbacks.

The runner, not the system, owns what must be identical across systems for a comparison to hold:

* **data order**: batch ``step`` is ``source[step % len(source)]`` of the source the system's
  ``prepare_dataset`` returned (the identity except for FAE, which the result records through
  ``reorders_samples``); wrapping around announces ``PhaseInfo(step, "epoch")``;
* **seeds**: the global torch RNG is seeded with ``ctx.seed`` before ``setup``;
* **timing**: ``init_time_s`` is ``setup``; an iteration's ``iter_time_s`` is ``train_step`` alone
  (``time.perf_counter``), fetching the batch is timed apart as ``data_time_s`` (the paper's
  prototype pre-loaded its batches, so loading is not iteration time), and so is producing the
  batches a system reads ahead (``System.reads_ahead``, :class:`ReadAhead`); the CPU every
  process spent in the timed steps is counted by kind (``bagpipe.core.roles.cpu.CpuTally``), since
  on a shared machine a helper role's CPU is a trainer's lost time;
* **system stats**: ``system.stats()`` is kept whole in ``RunResult.stats``; its numeric values
  also enter the summary as ``system_<key>``;
* **evaluation**: every ``eval_every`` steps and after the last step, by the same
  :class:`Evaluator` for every system (``on_eval_start`` before it scores, ``on_eval`` after, so
  an MLPerf log brackets exactly the evaluation), then
  ``on_phase_boundary(PhaseInfo(step, "eval", logloss))``;
* **checkpoints** (given a :class:`~bagpipe.core.checkpoint.CheckpointStore`): every
  ``checkpoint_every`` steps, after that step's boundaries and evaluation, the runner saves
  ``system.full_state()``, the step and the torch RNG state (``checkpoint_wall_s`` in the summary
  counts in ``train_wall_s``, not in any iteration). ``resume=checkpoint`` sets up the system from
  it (``ctx.resume``; only systems with ``supports_resume``), restores the RNG state and trains
  steps ``checkpoint.step .. num_steps - 1``: the same steps, on the same state, as the
  uninterrupted run (``bagpipe.harness.run.recovery`` restarts a run that failed this way).

Callbacks (mllog, MLflow, tests) observe the run in this order::

    system.setup(ctx)                       # init_time_s
    on_run_start(ctx)                       # e.g. INIT_STOP + RUN_START
    on_step(step, metrics)  ...             # per step: loss, iter_time_s, bytes_*, time_*_s ...
    on_eval_start(step, epoch_fraction) ... # the evaluation after `step` steps begins: EVAL_START
    on_eval(point)          ...             # EvalPoint; wall_s counts from on_run_start
    on_run_end(result)                      # only when the run completed
    system.close()                          # always, also after an error (which is re-raised)

Iteration-time statistics skip the first ``warmup_steps`` iterations (allocator and thread-pool
warm-up, cache fill); the per-iteration byte, phase and hit-rate figures use the same window. If the
run is not longer than the warm-up, every step is measured.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import torch
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from bagpipe.core.allocator import keep_freed_memory
from bagpipe.core.checkpoint import Checkpoint, CheckpointStore
from bagpipe.core.interface import PhaseInfo, System, TrainContext
from bagpipe.core.meter import LinkKind, Phase, StepRecord
from bagpipe.core.net.report import NetworkReport
from bagpipe.core.roles import last_network_report
from bagpipe.core.roles.cpu import CpuTally
from bagpipe.core.source import BatchSource
from bagpipe.harness.run.evaluate import Evaluator, base_rate_logloss
from bagpipe.harness.run.leftovers import RunningWork, refuse_leftovers
from bagpipe.harness.run.readahead import ReadAhead


@dataclass(frozen=True)
class RunConfig:
    """How long to train and how often to evaluate.

    Args:
        num_steps: training iterations (global batches).
        eval_every: evaluate after every ``eval_every`` steps; ``0`` evaluates only at the end.
        warmup_steps: iterations left out of the iteration-time statistics.
        progress: show a progress bar (only when stderr is a terminal).
        checkpoint_every: save a checkpoint every this many steps (``0``: never); needs a
            checkpoint store passed to :func:`run_training`.
        torch_threads: the driver's intra-op threads while :func:`run_training` runs. One, as
            every spawned role has (``threads_per_role``): on a shared host a second OpenMP
            thread spins after each parallel op and takes a core from the trainers (a Bagpipe
            driver recording its update logs burned 2.9 ms of CPU a step with two threads, 0.5
            with one), so a run driven from elsewhere (a benchmark) could not be compared.
    """

    num_steps: int
    eval_every: int
    warmup_steps: int = 5
    progress: bool = True
    checkpoint_every: int = 0
    torch_threads: int = 1

    def __post_init__(self) -> None:
        if self.num_steps < 1:
            raise ValueError(f"run.num_steps: must be >= 1, got {self.num_steps}")
        if self.eval_every < 0:
            raise ValueError(f"run.eval_every: must be >= 0, got {self.eval_every}")
        if self.warmup_steps < 0:
            raise ValueError(f"run.warmup_steps: must be >= 0, got {self.warmup_steps}")
        if self.checkpoint_every < 0:
            raise ValueError(f"run.checkpoint_every: must be >= 0, got {self.checkpoint_every}")
        if self.torch_threads < 1:
            raise ValueError(f"run.torch_threads: must be >= 1, got {self.torch_threads}")

    def eval_due(self, steps_done: int) -> bool:
        periodic = self.eval_every > 0 and steps_done % self.eval_every == 0
        return periodic or steps_done == self.num_steps

    def checkpoint_due(self, steps_done: int) -> bool:
        """A checkpoint after ``steps_done`` steps (never after the last: the run is over)."""
        every = self.checkpoint_every
        return every > 0 and steps_done % every == 0 and steps_done < self.num_steps


@dataclass(frozen=True)
class EvalPoint:
    """One evaluation: after ``step`` training steps, at ``wall_s`` seconds since the run started
    (training and evaluation both count, as in MLPerf), taking ``eval_s`` itself."""

    step: int
    auc: float
    logloss: float
    epoch_fraction: float
    wall_s: float
    eval_s: float = 0.0
    positive_rate: float = math.nan  # of the evaluation labels: the base rate logloss must beat


@dataclass
class RunResult:
    """Everything a run measured: per-step metrics, evaluations and the summary.

    ``network`` is what crossed each host's NIC (the wire's ledgers, and under ``netns`` the
    kernel's counters), for systems that deploy roles; its values are also in the summary.
    """

    steps: list[dict[str, float]] = field(default_factory=list)
    evals: list[EvalPoint] = field(default_factory=list)
    summary: dict[str, float] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=dict)
    reorders_samples: bool = False
    network: NetworkReport | None = None


class RunCallback(Protocol):
    """Observer of a run. Every method is optional: the runner calls only those an object has.

    ``on_eval_start`` is called after the step's ``on_step`` and before the evaluation scores
    anything, ``on_eval`` once the scores are in: between them runs only the evaluation, which is
    what an MLPerf log's ``eval_start``/``eval_stop`` must bracket.
    """

    def on_run_start(self, ctx: TrainContext) -> None: ...

    def on_step(self, step: int, metrics: dict[str, float]) -> None: ...

    def on_eval_start(self, step: int, epoch_fraction: float) -> None: ...

    def on_eval(self, point: EvalPoint) -> None: ...

    def on_run_end(self, result: RunResult) -> None: ...


def notify(callbacks: Sequence[object], method: str, *args: Any) -> None:
    """Call ``method`` on every callback that has it (every :class:`RunCallback` hook is optional)."""
    for callback in callbacks:
        hook = getattr(callback, method, None)
        if hook is not None:
            hook(*args)


def run_training(
    system: System,
    ctx: TrainContext,
    eval_source: BatchSource,
    cfg: RunConfig,
    callbacks: Sequence[object] = (),
    *,
    checkpoints: CheckpointStore | None = None,
    resume: Checkpoint | None = None,
    stop_requested: Callable[[], bool] | None = None,
) -> RunResult:
    """Set ``system`` up, train it for ``cfg.num_steps`` steps, evaluate, and always close it.

    With ``resume``, training starts after ``resume.step`` steps from that checkpoint's state;
    ``result.steps`` then holds only the steps this call trained.

    ``stop_requested`` is asked after every step (a job told it is about to be preempted): when it
    says yes, the runner saves a checkpoint at that step boundary (if it has a store and did not
    just save one) and raises :class:`Preempted`, so a requeued job resumes exactly there.

    Errors from the system propagate after ``close``; ``on_run_end`` is then not called. A run
    that completed but left a thread or process running after ``close`` raises
    :class:`~bagpipe.harness.run.leftovers.LeftoverWorkError` (after ``on_run_end``: the system is
    still open there, and only ``close`` can show what outlives it): runs that share a process
    would share the CPU with it.
    """
    result = RunResult(reorders_samples=type(system).reorders_samples)
    last_network_report()  # forget any earlier run's
    running_before, completed = RunningWork.now(), False
    threads = torch.get_num_threads()
    torch.set_num_threads(cfg.torch_threads)
    keep_freed_memory()  # every run's driver, a local one too (bagpipe.core.allocator)
    try:
        ctx, first_step = _starting_point(system, ctx, cfg, resume)
        init_time_s = _set_up(system, ctx, resume)
        source = system.prepare_dataset(ctx.source)
        if not isinstance(source, ReadAhead):  # re-packed (FAE): read one batch at a time
            source = ReadAhead(source, 0)
        if len(source) == 0:
            raise ValueError("training source has no batches")
        evaluator = Evaluator(ctx.model, ctx.schema, eval_source)
        notify(callbacks, "on_run_start", ctx)
        loop = _TrainingLoop(system, source, evaluator, cfg, callbacks, result,
                             checkpoints, stop_requested)
        loop.run(first_step)
        result.stats = {**system.stats(), "state_devices": system.state_devices()}
        result.summary = loop.summary(init_time_s, first_step)
        notify(callbacks, "on_run_end", result)
        completed = True
        return result
    finally:
        system.close()
        torch.set_num_threads(threads)
        _add_network_report(result)
        if completed:  # after an error, that error is the one to see
            refuse_leftovers(type(system).name, running_before)


def _add_network_report(result: RunResult) -> None:
    """What crossed the hosts' NICs, as the system's deployment recorded it when it closed."""
    report = last_network_report()
    if report is not None:
        result.network = report
        result.summary.update(report.flat())


def _starting_point(
    system: System, ctx: TrainContext, cfg: RunConfig, resume: Checkpoint | None
) -> tuple[TrainContext, int]:
    """The context the system is set up with (the run's length, and the resume point if any)
    and the first step to train."""
    first_step = 0
    if resume is not None:
        if not type(system).supports_resume:
            raise ValueError(
                f"system {type(system).name!r} cannot resume from a checkpoint "
                f"({resume.path}): it does not declare supports_resume"
            )
        ctx = replace(ctx, resume=resume.resume_point())
        first_step = resume.step
    source = ReadAhead(ctx.source, system.reads_ahead())
    return replace(ctx, num_steps=cfg.num_steps, source=source), first_step


def _set_up(system: System, ctx: TrainContext, resume: Checkpoint | None) -> float:
    """Seed, set the system up and, on a resume, restore the checkpoint's RNG state; the seconds
    ``setup`` took (``init_time_s``)."""
    torch.manual_seed(ctx.seed)
    init_start = time.perf_counter()
    system.setup(ctx)
    init_time_s = time.perf_counter() - init_start
    if resume is not None:
        torch.set_rng_state(resume.rng_state)
    return init_time_s


@dataclass
class _TrainingLoop:
    """The steps of one :func:`run_training` call and the work at every step boundary (epoch
    boundary, evaluation, checkpoint, preemption), with the wall time each kind of work took.

    It starts the run's clock when it is built (just after ``on_run_start``): evaluation points'
    ``wall_s`` and the summary's wall times count from there.
    """

    system: System
    source: ReadAhead
    evaluator: Evaluator
    cfg: RunConfig
    callbacks: Sequence[object]
    result: RunResult
    checkpoints: CheckpointStore | None
    stop_requested: Callable[[], bool] | None
    records: list[StepRecord] = field(default_factory=list, init=False)
    cpu: CpuTally = field(default_factory=CpuTally, init=False)  # the timed steps' CPU
    eval_wall_s: float = field(default=0.0, init=False)
    checkpoint_wall_s: float = field(default=0.0, init=False)
    total_wall_s: float = field(default=0.0, init=False)
    run_start: float = field(default_factory=time.perf_counter, init=False)

    def run(self, first_step: int) -> None:
        with _progress_bar(self.cfg, first_step) as advance:
            for step in range(first_step, self.cfg.num_steps):
                advance(self._train(step))
                self._step_boundary(step + 1)
        self.total_wall_s = time.perf_counter() - self.run_start

    def _train(self, step: int) -> dict[str, float]:
        """Train batch ``step``, keep and report its metrics; return them."""
        data_start = time.perf_counter()
        batch = self.source.prepare(step)
        timed = len(self.result.steps) >= self.cfg.warmup_steps
        with self.cpu.window() if timed else nullcontext():
            step_start = time.perf_counter()
            out = self.system.train_step(step, batch)
            iter_time_s = time.perf_counter() - step_start
        loss = float(out.loss)
        metrics = {
            "step": float(step),
            "loss": loss,
            "iter_time_s": iter_time_s,
            "data_time_s": step_start - data_start,
            **out.record.flat(),
        }
        self.result.steps.append(metrics)
        self.records.append(out.record)
        notify(self.callbacks, "on_step", step, metrics)
        return metrics

    def _step_boundary(self, done: int) -> None:
        """After ``done`` steps: epoch boundary, evaluation, checkpoint, preemption, in that order."""
        if done % len(self.source) == 0 and done < self.cfg.num_steps:
            self.system.on_phase_boundary(PhaseInfo(done, "epoch"))
        if self.cfg.eval_due(done):
            self._evaluate(done)
        self._checkpoint_or_stop(done)

    def _checkpoint_or_stop(self, done: int) -> None:
        """Save the periodic checkpoint if one is due; then, if the job was told to stop, make
        sure a checkpoint of exactly ``done`` steps exists and raise :class:`Preempted`."""
        saved = False
        if self.checkpoints is not None and self.cfg.checkpoint_due(done):
            self.checkpoint_wall_s += _save_checkpoint(self.checkpoints, done, self.system)
            saved = True
        if self.stop_requested is not None and done < self.cfg.num_steps and self.stop_requested():
            if self.checkpoints is not None and not saved:
                _save_checkpoint(self.checkpoints, done, self.system)
            raise Preempted(done, checkpointed=self.checkpoints is not None)

    def _evaluate(self, done: int) -> None:
        """Score the system's state after ``done`` steps, between ``on_eval_start`` and
        ``on_eval``, then tell the system the evaluation's logloss."""
        epoch_fraction = done / len(self.source)
        notify(self.callbacks, "on_eval_start", done, epoch_fraction)
        eval_start = time.perf_counter()
        scores = self.evaluator.score(self.system.full_state())
        eval_s = time.perf_counter() - eval_start
        self.eval_wall_s += eval_s
        point = EvalPoint(
            step=done,
            auc=scores.auc,
            logloss=scores.logloss,
            epoch_fraction=epoch_fraction,
            wall_s=time.perf_counter() - self.run_start,
            eval_s=eval_s,
            positive_rate=scores.positive_rate,
        )
        self.result.evals.append(point)
        notify(self.callbacks, "on_eval", point)
        self.system.on_phase_boundary(PhaseInfo(done, "eval", scores.logloss))

    def summary(self, init_time_s: float, first_step: int) -> dict[str, float]:
        """:func:`summarize`'s figures, the wall times of setup, training, evaluation and
        checkpoints, the numeric system stats as ``system_<key>``, and the CPU seconds per timed
        step of a trainer, of the other roles together and of the driver
        (``per_iter_{trainer,helpers,driver}_cpu_s``, :class:`CpuTally`; NaN if no step was
        past the warm-up)."""
        result = self.result
        summary = summarize(result.steps, self.records, result.evals, self.cfg,
                            self.source.batch_size)
        summary.update(
            init_time_s=init_time_s,
            train_wall_s=self.total_wall_s - self.eval_wall_s,
            eval_wall_s=self.eval_wall_s,
            checkpoint_wall_s=self.checkpoint_wall_s,
            first_step=float(first_step),
            reorders_samples=float(result.reorders_samples),
        )
        summary.update((f"per_iter_{key}", value)
                       for key, value in self.cpu.per_window().items())
        summary.update(
            (f"system_{key}", float(value))
            for key, value in result.stats.items()
            if isinstance(value, int | float) and not isinstance(value, bool)
        )
        return summary


class Preempted(Exception):
    """Training stopped at a step boundary because the job was told to stop (SLURM preemption or
    time limit); ``checkpointed``: a checkpoint of exactly ``steps_done`` steps was saved."""

    def __init__(self, steps_done: int, checkpointed: bool) -> None:
        saved = "checkpoint saved" if checkpointed else "no checkpoint store"
        super().__init__(f"preempted after {steps_done} steps ({saved})")
        self.steps_done = steps_done
        self.checkpointed = checkpointed


def _save_checkpoint(store: CheckpointStore, steps_done: int, system: System) -> float:
    """Save the system's state, the step and the RNG state; the seconds it took."""
    start = time.perf_counter()
    store.save(steps_done, system.full_state(), torch.get_rng_state())
    return time.perf_counter() - start


def summarize(
    steps: Sequence[dict[str, float]],
    records: Sequence[StepRecord],
    evals: Sequence[EvalPoint],
    cfg: RunConfig,
    batch_size: int,
) -> dict[str, float]:
    """The run's summary over the measured window (steps after the warm-up).

    Keys: ``steps``, ``measured_steps``, ``iter_time_{mean,p50,p90}_s``, ``samples_per_s``,
    ``bytes_per_iter_<kind>`` and ``rows_per_iter_<kind>`` for every :class:`LinkKind`,
    ``time_<phase>_s`` (mean per iteration) and ``share_<phase>`` (of the mean iteration time)
    for every :class:`Phase`, ``hit_rate`` (``nan`` for a system without a cache), ``auc``,
    ``logloss``, ``epoch_fraction`` (of the last evaluation), ``eval_positive_rate`` and
    ``base_rate_logloss`` (the evaluation labels' positive rate and the constant predictor's
    logloss, the bar ``logloss`` must beat), ``train_loss_last`` (mean loss of the last ten steps)
    and ``per_iter_<counter>`` for every counter of the system's step records (``rows_prefetched``,
    ``rows_written_back`` ...): means over the window, so a report can check what happened after
    the warm-up, which the system's own totals (``system_total_*``) do not separate.
    """
    first = cfg.warmup_steps if cfg.warmup_steps < len(steps) else 0
    window = steps[first:]
    times = sorted(m["iter_time_s"] for m in window)
    total = StepRecord()
    for record in records[first:]:
        total = total + record
    count = len(window)
    mean_s = statistics.fmean(times)
    summary: dict[str, float] = {
        "steps": float(len(steps)),
        "measured_steps": float(count),
        "iter_time_mean_s": mean_s,
        "iter_time_p50_s": _quantile(times, 0.5),
        "iter_time_p90_s": _quantile(times, 0.9),
        "samples_per_s": batch_size / mean_s if mean_s > 0 else float("inf"),
        "train_loss_last": statistics.fmean(m["loss"] for m in steps[-10:]),
    }
    for kind in LinkKind:
        summary[f"bytes_per_iter_{kind}"] = total.bytes_sent.get(kind, 0) / count
        summary[f"rows_per_iter_{kind}"] = total.rows_sent.get(kind, 0) / count
    for phase in Phase:
        phase_s = total.phase_s.get(phase, 0.0) / count
        summary[f"time_{phase}_s"] = phase_s
        summary[f"share_{phase}"] = phase_s / mean_s if mean_s > 0 else 0.0
        summary[f"cpu_{phase}_s"] = total.phase_cpu_s.get(phase, 0.0) / count
    # trainer 0's step from its first phase to its end, and the slowest trainer's (StepRecord)
    summary["step_span_s"] = total.span_s / count
    summary["slowest_step_span_s"] = total.slowest_span_s / count
    # every counter the run ever counted, so one silent in the window reads 0, not "not recorded"
    for name in dict.fromkeys(key for record in records for key in record.counters):
        summary[f"per_iter_{name}"] = total.counters.get(name, 0.0) / count
    hit_rate = total.hit_rate
    summary["hit_rate"] = float("nan") if hit_rate is None else hit_rate
    last = evals[-1] if evals else None
    summary["auc"] = last.auc if last else float("nan")
    summary["logloss"] = last.logloss if last else float("nan")
    summary["epoch_fraction"] = last.epoch_fraction if last else float("nan")
    summary["eval_positive_rate"] = last.positive_rate if last else float("nan")
    summary["base_rate_logloss"] = base_rate_logloss(summary["eval_positive_rate"])
    return summary


def _quantile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile of already sorted values (numpy's default method)."""
    position = q * (len(sorted_values) - 1)
    low = int(position)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (position - low)


@contextmanager
def _progress_bar(cfg: RunConfig, first_step: int) -> Iterator[Callable[[dict[str, float]], None]]:
    """Yield ``advance(step_metrics)``: a rich bar on a terminal (steps, loss, the last
    iteration's time, elapsed and remaining time), a no-op otherwise (log files, sweeps)."""
    console = Console(stderr=True)
    progress = Progress(
        TextColumn("[bold]train"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]:.4f}"),
        TextColumn("{task.fields[iter_ms]:.1f} ms/iter"),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
        console=console,
        disable=not (cfg.progress and console.is_terminal),
    )
    with progress:
        task = progress.add_task("train", total=cfg.num_steps, completed=first_step,
                                 loss=float("nan"), iter_ms=float("nan"))

        def advance(metrics: dict[str, float]) -> None:
            progress.update(task, advance=1, loss=metrics["loss"],
                            iter_ms=1000 * metrics["iter_time_s"])

        yield advance
