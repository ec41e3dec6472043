"""Fault-tolerance benchmark: checkpoint size and time, training overhead, time from a kill to training.

Workload: Bagpipe (2 trainers, 2 server shards) training the paper's DLRM on the Kaggle-shaped
synthetic dataset (scale 0.001, ~127k table rows), link model off (the figures are about the
checkpoint path, not the emulated network). Rows:

* ``checkpoint_bytes`` (on disk, all files) and ``checkpoint_payload_bytes`` (tensors);
* ``checkpoint_time_s``: mean time to take one (``full_state`` gathered from servers and caches,
  serialised, sha256, fsynced, renamed), over the checkpoints of the run below;
* ``overhead_pct``: training wall time with checkpoints every ``DEFAULT_CHECKPOINT_EVERY`` steps
  against the same job without, back to back in this process (``overhead_share_pct``: the
  checkpoints' own time as a share of the job's training time, the noise-free figure);
* ``detect_s``, ``kill_to_training_s``: a trainer SIGKILLed mid-run: until the driver notices,
  and until the restarted job completed its first step again (teardown, new processes, restore).

Quick mode shortens the run (and checkpoints more often so it still takes several).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from bagpipe.core.checkpoint import CheckpointStore
from bagpipe.core.link import LinkConfig
from bagpipe.core.system import OptimConfig, TrainContext
from bagpipe.data import DatasetConfig, make_dataset
from bagpipe.harness.faults import KillRoles
from bagpipe.harness.recovery import DEFAULT_CHECKPOINT_EVERY, run_with_recovery
from bagpipe.harness.runner import RunConfig, run_training
from bagpipe.models import paper_config
from bagpipe.system import Bagpipe

BATCH = 512


def _row(metric: str, value: float, unit: str, **config: object) -> dict:
    return {"benchmark": "fault", "metric": metric, "value": value, "unit": unit, **config}


def run(quick: bool) -> list[dict]:
    steps = 60 if quick else 2 * DEFAULT_CHECKPOINT_EVERY + 20
    every = 20 if quick else DEFAULT_CHECKPOINT_EVERY
    dataset = make_dataset(DatasetConfig(scale=0.001))
    eval_source = dataset.eval(BATCH, 2)

    def context() -> TrainContext:
        return TrainContext(
            schema=dataset.schema, model=paper_config("dlrm"), optim=OptimConfig(),
            global_batch_size=BATCH, seed=0, source=dataset.train(BATCH, steps),
            link=LinkConfig(enabled=False),
        )

    def system() -> Bagpipe:
        return Bagpipe(num_trainers=2, num_servers=2, lookahead=40)

    config = {"system": "bagpipe", "model": "dlrm", "rows": dataset.schema.total_rows,
              "steps": steps, "checkpoint_every": every}
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        plain = run_training(system(), context(), eval_source,
                             RunConfig(steps, eval_every=0, progress=False))
        store = CheckpointStore(Path(tmp) / "overhead")
        cfg = RunConfig(steps, eval_every=0, progress=False, checkpoint_every=every)
        with_ckpt = run_training(system(), context(), eval_source, cfg, checkpoints=store)
        taken = sum(cfg.checkpoint_due(done) for done in range(1, steps + 1))
        newest = store.steps()[-1][1]
        disk_bytes = sum(f.stat().st_size for f in newest.iterdir())
        loaded = store.load_latest()
        assert loaded is not None
        base_s, ckpt_s = plain.summary["train_wall_s"], with_ckpt.summary["train_wall_s"]
        rows += [
            _row("checkpoint_bytes", float(disk_bytes), "B", **config),
            _row("checkpoint_payload_bytes", float(loaded.nbytes()), "B", **config),
            _row("checkpoint_time_s", with_ckpt.summary["checkpoint_wall_s"] / taken, "s",
                 checkpoints=taken, **config),
            _row("iter_time_mean_s", plain.summary["iter_time_mean_s"], "s", **config),
            _row("overhead_pct", 100.0 * (ckpt_s - base_s) / base_s, "%", **config),
            _row("overhead_share_pct",
                 100.0 * with_ckpt.summary["checkpoint_wall_s"]
                 / (ckpt_s - with_ckpt.summary["checkpoint_wall_s"]), "%", **config),
        ]
        kill_after = every + every // 2
        kills = KillRoles({kill_after: "trainer_0"})
        _, restarts = run_with_recovery(
            system, context(), eval_source,
            RunConfig(kill_after + every, eval_every=0, progress=False, checkpoint_every=every),
            CheckpointStore(Path(tmp) / "kill"), [kills],
        )
        (_, killed_at_s), (restart,) = kills.killed[0], restarts
        rows += [
            _row("detect_s", restart.detected_at_s - killed_at_s, "s", role="trainer_0", **config),
            _row("kill_to_training_s", restart.trained_at_s - killed_at_s, "s", role="trainer_0",
                 resumed_step=restart.resumed_step, **config),
        ]
    return rows
