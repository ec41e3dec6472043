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
  minus that).

The steady-state cost of the replace path's logs is its own benchmark, ``fault_logs``.

The full run checkpoints at :data:`~bagpipe.harness.run.recovery.DEFAULT_CHECKPOINT_EVERY` (the
target, < 5% overhead, is stated at that interval); quick mode checkpoints every 20 steps of a
60-step run, so its overhead is that of a 10x shorter interval.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bagpipe.core.checkpoint import CheckpointStore
from bagpipe.core.interface import OptimConfig, System, TrainContext
from bagpipe.core.recovery import ROLLBACK
from bagpipe.core.registry import load_system
from bagpipe.core.roles.deployment import startup_times_s
from bagpipe.core.source import BatchSource
from bagpipe.data import DatasetConfig, make_dataset
from bagpipe.harness.run.faults import KillRoles
from bagpipe.harness.run.recovery import DEFAULT_CHECKPOINT_EVERY, run_with_recovery
from bagpipe.harness.run.runner import RunConfig, RunResult, run_training
from bagpipe.models import paper_config

BATCH = 512
TRAINERS = 2

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


def fault_row(metric: str, value: float, unit: str, **config: object) -> dict:
    """One row of this benchmark (``fault_logs`` relabels its own)."""
    return {"benchmark": "fault", "metric": metric, "value": value, "unit": unit, **config}


def system_factory(name: str, **extra: object) -> Callable[[], System]:
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
        fault_row("checkpoint_bytes", float(sum(f.stat().st_size for f in newest.iterdir())), "B",
             **config),
        fault_row("checkpoint_payload_bytes", float(loaded.nbytes()), "B", **config),
        fault_row("checkpoint_time_s", own_s / taken, "s", checkpoints=taken, **config),
        fault_row("iter_time_mean_s", sum(r.summary["iter_time_mean_s"] for r in plain) / 2, "s",
             **config),
        fault_row("overhead_pct", 100.0 * (ckpt_s - plain_s) / plain_s, "%", **config),
        fault_row("overhead_share_pct", 100.0 * own_s / plain_s, "%", **config),
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
        fault_row("detect_s", restart.detected_at_s - killed_at_s, "s", **config),
        fault_row("kill_to_training_s", restart.trained_at_s - killed_at_s, "s", **config),
        fault_row("kill_to_caught_up_s", caught_up_s, "s", **config),
        fault_row("steps_redone", float(restart.steps_redone), "steps", **config),
    ]
    if restart.path == ROLLBACK:  # as if the new job's processes were pre-spawned (standbys)
        spawn_s = startup_times_s()[first_startup + 1]
        rows += [
            fault_row("restart_spawn_s", spawn_s, "s", **config),
            fault_row("kill_to_caught_up_prespawned_s", caught_up_s - spawn_s, "s", **config),
        ]
    return rows


def workload(batches: int) -> tuple[Callable[[], TrainContext], BatchSource, int]:
    """The benchmark's workload (module docstring): a fresh context per run over ``batches``
    batches, the evaluation source, and the tables' total rows."""
    dataset = make_dataset(DatasetConfig(scale=0.001))

    def context() -> TrainContext:
        return TrainContext(
            schema=dataset.schema, model=paper_config("dlrm"), optim=OptimConfig(),
            global_batch_size=BATCH, seed=0, source=dataset.train(BATCH, batches),
        )

    return context, dataset.eval(BATCH, 2), dataset.schema.total_rows


def run(quick: bool) -> list[dict]:
    steps = 60 if quick else 2 * DEFAULT_CHECKPOINT_EVERY + 20
    every = 20 if quick else DEFAULT_CHECKPOINT_EVERY
    # the kill run's length too: no epoch wraps
    context, eval_source, rows_total = workload(max(steps, every + every // 2 + every))
    rows: list[dict] = []
    for name in SYSTEMS:
        config = {"system": name, "model": "dlrm", "rows": rows_total, "steps": steps,
                  "checkpoint_every": every}
        make = system_factory(name)
        with tempfile.TemporaryDirectory() as tmp:
            rows += _overhead_rows(make, context, eval_source, steps, every, Path(tmp), config)
            for role in KILLED[name]:
                rows += _kill_rows(make, context, eval_source, every, Path(tmp), config, role)
                if name in STANDBYS:
                    rows += _kill_rows(system_factory(name, **STANDBYS[name]), context, eval_source,
                                       every, Path(tmp), config, role)
    return rows
