"""Fault-tolerance benchmark: checkpoint size and time, training overhead, time from a kill to training.

Workload: the paper's DLRM on the Kaggle-shaped synthetic dataset (scale 0.001, ~127k table rows),
batch 512, 2 trainers (and 2 server shards where the system has them), link model off (the figures
are about the checkpoint path, not the emulated network), for every system that can resume:
``bagpipe``, ``sync_ps`` and ``torchrec``. Rows per system:

* ``checkpoint_bytes`` (on disk, all files) and ``checkpoint_payload_bytes`` (tensors);
* ``checkpoint_time_s``: mean time to take one (``full_state`` gathered from wherever the rows
  live, serialised, sha256, fsynced, renamed);
* ``overhead_pct``: training wall time with a checkpoint every ``checkpoint_every`` steps against
  the same job without, measured as four back-to-back runs in the order plain, checkpointed,
  checkpointed, plain (so a drift in machine speed cancels) and compared in sum;
  ``overhead_share_pct``: the checkpoints' own time as a share of the plain runs' training time
  (the same quantity without the run-to-run noise);
* ``detect_s``, ``kill_to_training_s``, ``kill_to_caught_up_s``, ``steps_redone``: a role
  (``trainer_0``; for ``bagpipe`` and ``sync_ps`` also ``server_0``) SIGKILLed halfway between
  two checkpoints:
  until the driver notices, until the recovered job completed its first step, until it completed
  the step the kill interrupted, and how many finished steps it trained again. Each row names the
  ``role`` and its ``path`` (``bagpipe.core.recovery``): ``rollback``, the whole-job restart
  (teardown, new processes, restore the checkpoint, redo the steps since), and where the system
  can (:data:`STANDBYS`) also ``replace``, the same kill with standbys (the survivors keep their
  state, the standby takes over, the step in flight is trained again; a dead shard is rebuilt
  from the checkpoint's model and what the trainers logged since: ``sync_ps``'s pushes,
  ``pushlog``, Bagpipe's write-backs, ``writebacklog``). The standby's process was spawned with
  the job, so to compare protocols and not process start-up, the rollback gets the same
  credit: ``restart_spawn_s`` (the restarted job's
  process start-up, spawn to RPC world joined) and ``kill_to_caught_up_prespawned_s`` (caught up
  minus that);
* ``log_overhead_pct`` (``bagpipe``, ``sync_ps``): the steady-state cost of the replace path,
  measured within one run with the standbys of :data:`STANDBYS`: the logs a replacement is built
  from (Bagpipe's update log of the rows only a trainer holds, ``bagpipe.lrpp.updatelog``, and its
  write-back log; ``sync_ps``'s push logs, ``baselines.sync_ps.pushlog``) and the trainers'
  agreements (Bagpipe's on each round, ``sync_ps``'s after the pull and after the acks). Between
  two runs this machine's speed drifts by more than the 3% goal, so the run switches that work
  off and on between steps (``PausableRecoveryLogs``) in windows of :data:`_LOG_WINDOW` steps,
  in pairs ordered on-off, off-on, ... (so a drift within a pair cancels over pairs), after a
  warm-up of one window. A window is one of Bagpipe's rounds, so each holds one agreement.
  Each pair gives the ratio of its windows' mean iteration times; the row is their geometric
  mean minus 1, with a 95% interval (``ci_low_pct``, ``ci_high_pct``:
  ``bagpipe.harness.report.paired``) over ``pairs`` pairs. Beside it, the parts measured
  directly, as shares of the unlogged windows' mean iteration: ``log_cpu_share_pct``, the CPU
  time a logged step spends on its logs on the critical path (``recovery_log_cpu_s`` per
  trainer: Bagpipe's log entry, sync_ps's push-log appends; and Bagpipe's driver recording the
  entries); ``agree_wall_share_pct``, a trainer's wall time in the agreements
  (``recovery_agree_s``, waiting for the slower peer included); ``log_extra_phase_s`` rows, per
  trainer phase (``phase``), the logged windows' mean time less the unlogged ones' (where the
  rest lands: contention for the cores shows in ``forward`` and ``backward``); and
  ``log_bytes_per_iter``, what the entries add to the replies (the wire charges them as
  ``data`` traffic on emulated runs).

The full run checkpoints at :data:`~bagpipe.harness.run.recovery.DEFAULT_CHECKPOINT_EVERY` (the
target, < 5% overhead, is stated at that interval); quick mode checkpoints every 20 steps of a
60-step run, so its overhead is that of a 10x shorter interval.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bagpipe.core.checkpoint import CheckpointStore
from bagpipe.core.interface import OptimConfig, System, TrainContext
from bagpipe.core.recovery import ROLLBACK, PausableRecoveryLogs
from bagpipe.core.registry import load_system
from bagpipe.core.roles.deployment import startup_times_s
from bagpipe.core.source import BatchSource
from bagpipe.data import DatasetConfig, make_dataset
from bagpipe.harness.report.paired import paired_speedup
from bagpipe.harness.run.faults import KillRoles
from bagpipe.harness.run.recovery import DEFAULT_CHECKPOINT_EVERY, run_with_recovery
from bagpipe.harness.run.runner import RunConfig, RunResult, run_training
from bagpipe.models import paper_config

BATCH = 512
TRAINERS = 2
_LOG_WINDOW = 10  # steps with the logs on (or off): one of Bagpipe's rounds (ci = 10 here)
_LOG_PAIRS = {True: 6, False: 30}  # pairs of windows on and off, in quick mode and in full

#: The systems that replace dead roles in place, and the standbys that lets them.
STANDBYS: dict[str, dict[str, object]] = {
    "bagpipe": {"standby_trainers": 1, "standby_servers": 1},
    "sync_ps": {"standby_trainers": 1, "standby_servers": 1},
}
#: The roles each system's kill runs kill (one per run).
KILLED = {"bagpipe": ("trainer_0", "server_0"), "sync_ps": ("trainer_0", "server_0"),
          "torchrec": ("trainer_0",)}

#: The resumable systems and how each is built for this workload.
SYSTEMS: dict[str, dict[str, object]] = {
    "bagpipe": {"num_trainers": TRAINERS, "num_servers": 2, "lookahead": 40},
    "sync_ps": {"num_trainers": TRAINERS, "num_servers": 2},
    "torchrec": {"num_trainers": TRAINERS},
}


def _row(metric: str, value: float, unit: str, **config: object) -> dict:
    return {"benchmark": "fault", "metric": metric, "value": value, "unit": unit, **config}


def _factory(name: str, **extra: object) -> Callable[[], System]:
    cls, kwargs = load_system(name), {**SYSTEMS[name], **extra}
    return lambda: cls(**kwargs)


def _overhead_rows(
    make: Callable[[], System], context: Callable[[], TrainContext], eval_source: BatchSource,
    steps: int, every: int, workdir: Path, config: dict[str, object],
) -> list[dict]:
    plain_cfg = RunConfig(steps, eval_every=0, progress=False)
    ckpt_cfg = RunConfig(steps, eval_every=0, progress=False, checkpoint_every=every)
    plain: list[RunResult] = []
    checkpointed: list[RunResult] = []
    for attempt, with_checkpoints in enumerate((False, True, True, False)):
        if with_checkpoints:
            store = CheckpointStore(workdir / f"overhead_{attempt}")
            checkpointed.append(run_training(make(), context(), eval_source, ckpt_cfg,
                                             checkpoints=store))
        else:
            plain.append(run_training(make(), context(), eval_source, plain_cfg))
    newest = store.steps()[-1][1]
    loaded = store.load_latest()
    assert loaded is not None
    taken = 2 * sum(ckpt_cfg.checkpoint_due(done) for done in range(1, steps + 1))
    plain_s = sum(r.summary["train_wall_s"] for r in plain)
    ckpt_s = sum(r.summary["train_wall_s"] for r in checkpointed)
    own_s = sum(r.summary["checkpoint_wall_s"] for r in checkpointed)
    return [
        _row("checkpoint_bytes", float(sum(f.stat().st_size for f in newest.iterdir())), "B",
             **config),
        _row("checkpoint_payload_bytes", float(loaded.nbytes()), "B", **config),
        _row("checkpoint_time_s", own_s / taken, "s", checkpoints=taken, **config),
        _row("iter_time_mean_s", sum(r.summary["iter_time_mean_s"] for r in plain) / 2, "s",
             **config),
        _row("overhead_pct", 100.0 * (ckpt_s - plain_s) / plain_s, "%", **config),
        _row("overhead_share_pct", 100.0 * own_s / plain_s, "%", **config),
    ]


class _StepClock:
    """Runner callback: when each step was first reported (``perf_counter``)."""

    def __init__(self) -> None:
        self.at_s: dict[int, float] = {}

    def on_step(self, step: int, metrics: dict[str, float]) -> None:
        self.at_s[step] = time.perf_counter()


def _kill_rows(
    make: Callable[[], System], context: Callable[[], TrainContext], eval_source: BatchSource,
    every: int, workdir: Path, config: dict[str, object], role: str,
) -> list[dict]:
    """``role`` killed halfway between two checkpoints; rows say which path the recovery took
    (``replace``: a standby took over in place; ``rollback``: the whole job restarted)."""
    kill_after = every + every // 2
    kills, clock = KillRoles({kill_after: role}), _StepClock()
    first_startup = len(startup_times_s())
    _, restarts = run_with_recovery(
        make, context(), eval_source,
        RunConfig(kill_after + every, eval_every=0, progress=False, checkpoint_every=every),
        CheckpointStore(workdir / f"kill_{len(list(workdir.iterdir()))}"), [kills, clock],
    )
    (_, killed_at_s), (restart,) = kills.killed[0], restarts
    caught_up_s = clock.at_s[restart.failed_step] - killed_at_s
    config = {**config, "role": role, "path": restart.path,
              "resumed_step": restart.resumed_step}
    rows = [
        _row("detect_s", restart.detected_at_s - killed_at_s, "s", **config),
        _row("kill_to_training_s", restart.trained_at_s - killed_at_s, "s", **config),
        _row("kill_to_caught_up_s", caught_up_s, "s", **config),
        _row("steps_redone", float(restart.steps_redone), "steps", **config),
    ]
    if restart.path == ROLLBACK:  # as if the new job's processes were pre-spawned (standbys)
        spawn_s = startup_times_s()[first_startup + 1]
        rows += [
            _row("restart_spawn_s", spawn_s, "s", **config),
            _row("kill_to_caught_up_prespawned_s", caught_up_s - spawn_s, "s", **config),
        ]
    return rows


class _LogWindows:
    """Runner callback: the system's recovery logs on and off in windows (module docstring,
    ``log_overhead_pct``), and each measured step's metrics by window."""

    def __init__(self, system: PausableRecoveryLogs, pairs: int) -> None:
        self.system = system
        self.windows: list[list[dict[str, float]]] = [[] for _ in range(2 * pairs)]

    @staticmethod
    def logged(window: int) -> bool:
        """Pairs on-off, off-on, on-off, ...: windows 0, 3, 4, 7, ... are logged."""
        return window % 4 in (0, 3)

    def on_step(self, step: int, metrics: dict[str, float]) -> None:
        window = step // _LOG_WINDOW - 1  # window -1 is the warm-up, logged
        if 0 <= window < len(self.windows):
            self.windows[window].append(metrics)
        if (step + 1) % _LOG_WINDOW == 0 and window + 1 < len(self.windows):
            self.system.pause_recovery_logs(not self.logged(window + 1))


def _log_overhead_rows(
    name: str, context: Callable[[], TrainContext], eval_source: BatchSource, quick: bool,
    config: dict[str, object],
) -> list[dict]:
    """What the replace path costs in steady state (module docstring: ``log_overhead_pct``)."""
    system = _factory(name, **STANDBYS[name])()
    assert isinstance(system, PausableRecoveryLogs)
    windows = _LogWindows(system, _LOG_PAIRS[quick])
    steps = _LOG_WINDOW * (1 + len(windows.windows))
    run_training(system, context(), eval_source, RunConfig(steps, eval_every=0, progress=False),
                 [windows])

    def mean_s(window: list[dict[str, float]]) -> float:
        return statistics.mean(m["iter_time_s"] for m in window)

    def mean_of(on: bool, key: str) -> float:
        return statistics.mean(m.get(key, 0.0) for w, window in enumerate(windows.windows)
                               if windows.logged(w) == on for m in window)

    pairs = list(zip(windows.windows[::2], windows.windows[1::2], strict=True))
    slowdown = paired_speedup([mean_s(first) / mean_s(second) if windows.logged(2 * k)
                               else mean_s(second) / mean_s(first)
                               for k, (first, second) in enumerate(pairs)])
    plain_s = mean_of(False, "iter_time_s")
    critical_s = (mean_of(True, "recovery_log_cpu_s") / TRAINERS
                  + mean_of(True, "recovery_log_record_cpu_s"))
    agree_s = mean_of(True, "recovery_agree_s") / TRAINERS
    phases = sorted({key for window in windows.windows for m in window for key in m
                     if key.startswith("time_")})
    return [
        _row("log_overhead_pct", 100.0 * (slowdown.speedup - 1.0), "%",
             ci_low_pct=100.0 * (slowdown.low - 1.0), ci_high_pct=100.0 * (slowdown.high - 1.0),
             pairs=slowdown.blocks, window_steps=_LOG_WINDOW, plain_iter_time_s=plain_s,
             **config),
        _row("log_cpu_share_pct", 100.0 * critical_s / plain_s, "%", **config),
        _row("agree_wall_share_pct", 100.0 * agree_s / plain_s, "%", **config),
        *(_row("log_extra_phase_s", (mean_of(True, key) - mean_of(False, key)) / TRAINERS, "s",
               phase=key.removeprefix("time_").removesuffix("_s"), **config) for key in phases),
        _row("log_bytes_per_iter", mean_of(True, "bytes_data") - mean_of(False, "bytes_data"),
             "B", **config),
    ]


def run(quick: bool) -> list[dict]:
    steps = 60 if quick else 2 * DEFAULT_CHECKPOINT_EVERY + 20
    every = 20 if quick else DEFAULT_CHECKPOINT_EVERY
    log_steps = _LOG_WINDOW * (1 + 2 * _LOG_PAIRS[quick])
    # the kill run's and the logs' run's lengths too: no epoch wraps
    batches = max(steps, every + every // 2 + every, log_steps)
    dataset = make_dataset(DatasetConfig(scale=0.001))
    eval_source = dataset.eval(BATCH, 2)

    def context() -> TrainContext:
        return TrainContext(
            schema=dataset.schema, model=paper_config("dlrm"), optim=OptimConfig(),
            global_batch_size=BATCH, seed=0, source=dataset.train(BATCH, batches),
        )

    rows: list[dict] = []
    for name in SYSTEMS:
        config = {"system": name, "model": "dlrm", "rows": dataset.schema.total_rows,
                  "steps": steps, "checkpoint_every": every}
        make = _factory(name)
        with tempfile.TemporaryDirectory() as tmp:
            rows += _overhead_rows(make, context, eval_source, steps, every, Path(tmp), config)
            for role in KILLED[name]:
                rows += _kill_rows(make, context, eval_source, every, Path(tmp), config, role)
                if name in STANDBYS:
                    rows += _kill_rows(_factory(name, **STANDBYS[name]), context, eval_source,
                                       every, Path(tmp), config, role)
        if name in STANDBYS:
            rows += _log_overhead_rows(name, context, eval_source, quick, config)
    return rows
