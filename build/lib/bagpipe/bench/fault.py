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
* ``detect_s``, ``kill_to_training_s``: ``trainer_0`` SIGKILLed mid-run: until the driver
  notices, and until the restarted job completed its first step again (teardown, new processes,
  restore).

The full run checkpoints at :data:`~bagpipe.harness.run.recovery.DEFAULT_CHECKPOINT_EVERY` (the
target, < 5% overhead, is stated at that interval); quick mode checkpoints every 20 steps of a
60-step run, so its overhead is that of a 10x shorter interval.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

from bagpipe.core.checkpoint import CheckpointStore
from bagpipe.core.interface import OptimConfig, System, TrainContext
from bagpipe.core.registry import load_system
from bagpipe.core.source import BatchSource
from bagpipe.data import DatasetConfig, make_dataset
from bagpipe.harness.run.faults import KillRoles
from bagpipe.harness.run.recovery import DEFAULT_CHECKPOINT_EVERY, run_with_recovery
from bagpipe.harness.run.runner import RunConfig, RunResult, run_training
from bagpipe.models import paper_config

BATCH = 512

#: The resumable systems and how each is built for this workload.
SYSTEMS: dict[str, dict[str, object]] = {
    "bagpipe": {"num_trainers": 2, "num_servers": 2, "lookahead": 40},
    "sync_ps": {"num_trainers": 2, "num_servers": 2},
    "torchrec": {"num_trainers": 2},
}


def _row(metric: str, value: float, unit: str, **config: object) -> dict:
    return {"benchmark": "fault", "metric": metric, "value": value, "unit": unit, **config}


def _factory(name: str) -> Callable[[], System]:
    cls, kwargs = load_system(name), SYSTEMS[name]
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


def _kill_rows(
    make: Callable[[], System], context: Callable[[], TrainContext], eval_source: BatchSource,
    every: int, workdir: Path, config: dict[str, object],
) -> list[dict]:
    kill_after = every + every // 2
    kills = KillRoles({kill_after: "trainer_0"})
    _, restarts = run_with_recovery(
        make, context(), eval_source,
        RunConfig(kill_after + every, eval_every=0, progress=False, checkpoint_every=every),
        CheckpointStore(workdir / "kill"), [kills],
    )
    (_, killed_at_s), (restart,) = kills.killed[0], restarts
    return [
        _row("detect_s", restart.detected_at_s - killed_at_s, "s", role="trainer_0", **config),
        _row("kill_to_training_s", restart.trained_at_s - killed_at_s, "s", role="trainer_0",
             resumed_step=restart.resumed_step, **config),
    ]


def run(quick: bool) -> list[dict]:
    steps = 60 if quick else 2 * DEFAULT_CHECKPOINT_EVERY + 20
    every = 20 if quick else DEFAULT_CHECKPOINT_EVERY
    batches = max(steps, every + every // 2 + every)  # the kill run's length too: no epoch wraps
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
            rows += _kill_rows(make, context, eval_source, every, Path(tmp), config)
    return rows
