"""One measured data job in a fresh process, for ``bagpipe.bench.data_scale``.

A process's peak resident memory (``VmHWM``) only ever grows, so each job whose memory is reported
runs in a process of its own and prints one JSON line before exiting::

    python -m bagpipe.bench.data_probe prepare CONFIG_JSON
        prepare a file dataset (``bagpipe.data.prepare``): rows, seconds, CPU seconds, peak RSS
    python -m bagpipe.bench.data_probe stream CONFIG_JSON BATCH
        read one epoch of the training split, batch by batch, and the ids of every eval batch
    python -m bagpipe.bench.data_probe train CONFIG_JSON BATCH STEPS LAUNCHED_AT
        train Bagpipe (2 trainers, 2 embedding servers, an oracle) for STEPS steps on the dataset:
        seconds from LAUNCHED_AT (the parent's ``time.time()`` before starting this process) to
        the end of the first step (and its parts: imports, opening the dataset, starting the
        roles), the wall time of every step (reading the batch included), and the peak RSS of
        this process (the driver) and of every role process.
    python -m bagpipe.bench.data_probe system NAME CONFIG_JSON BATCH STEPS
        train the system the suites call NAME (``suites/system/NAME.yaml``, the suites' DLRM)
        through the harness's runner for STEPS steps, then evaluate on the evaluation split:
        iteration time, AUC, and the peak RSS of this process (the driver) and of every role.

CONFIG_JSON is a ``DatasetConfig`` as JSON (tuples as lists).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

MODEL = {"name": "dlrm", "embedding_dim": 16, "bottom_mlp": (64, 16), "top_mlp": (64, 1)}
EVAL_BATCHES = 4


def peak_rss_bytes(pid: int | str = "self") -> int:
    """``VmHWM`` of a process: the most resident memory it has held so far."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise LookupError(f"no VmHWM for process {pid}")


def role_peaks(system: object) -> dict[str, int]:
    """Peak RSS of every role process a system's deployment started (none for one that trains
    in the driver); read while the roles still run."""
    deployment = getattr(system, "_deployment", None)
    roles = deployment.pids() if deployment is not None else {}
    return {role: peak_rss_bytes(pid) for role, pid in roles.items()}


def _config(text: str) -> Any:
    from bagpipe.data import DatasetConfig

    fields = json.loads(text)
    for name in ("table_sizes", "hot_set"):
        if fields.get(name) is not None:
            fields[name] = tuple(fields[name])
    return DatasetConfig(**fields)


def prepare(cfg_json: str) -> dict[str, float]:
    from bagpipe.data.prepare import prepare as prepare_dataset

    start, cpu = time.perf_counter(), time.process_time()
    prepared = prepare_dataset(_config(cfg_json), progress=False)
    return {"rows": prepared.manifest.rows, "seconds": time.perf_counter() - start,
            "cpu_seconds": time.process_time() - cpu, "peak_rss": peak_rss_bytes()}


def stream(cfg_json: str, batch: str) -> dict[str, float]:
    import torch

    from bagpipe.data import make_dataset

    torch.set_num_threads(1)  # as the harness's runs (run.torch_threads)
    start = time.perf_counter()
    dataset = make_dataset(_config(cfg_json))
    opened = time.perf_counter() - start
    train, evaluation = dataset.train(int(batch)), dataset.eval(int(batch))
    start = time.perf_counter()
    for index in range(len(train)):
        train[index]
    train_s = time.perf_counter() - start
    for index in range(len(evaluation)):
        evaluation.ids(index)
    return {"open_s": opened, "train_rows": len(train) * train.batch_size,
            "eval_rows": len(evaluation) * evaluation.batch_size, "train_s": train_s,
            "peak_rss": peak_rss_bytes()}


def train(cfg_json: str, batch: str, steps: str, launched_at: str) -> dict[str, Any]:
    import torch

    from bagpipe.core.interface import ModelConfig, OptimConfig, TrainContext
    from bagpipe.data import make_dataset
    from bagpipe.lrpp import Bagpipe

    torch.set_num_threads(1)
    imported_at = time.time() - float(launched_at)
    start = time.perf_counter()
    dataset = make_dataset(_config(cfg_json))
    opened = time.perf_counter() - start
    source = dataset.train(int(batch), int(steps))
    ctx = TrainContext(schema=dataset.schema, model=ModelConfig(**MODEL),  # type: ignore[arg-type]
                       optim=OptimConfig(), global_batch_size=int(batch), seed=0,
                       source=source)  # the default network: real, nothing shaped
    system = Bagpipe(num_trainers=2, num_servers=2)  # the default lookahead, L = 200
    times: list[float] = []
    first_step_at = 0.0
    try:
        start = time.perf_counter()
        system.setup(ctx)
        setup_s = time.perf_counter() - start
        for step in range(int(steps)):
            begin = time.perf_counter()
            system.train_step(step, source[step])
            times.append(time.perf_counter() - begin)
            if step == 0:
                first_step_at = time.time() - float(launched_at)
        peaks = role_peaks(system)
    finally:
        system.close()
    return {"launch_to_first_step_s": first_step_at, "imports_s": imported_at, "open_s": opened,
            "setup_s": setup_s, "step_s": times,
            "peak_rss": {"driver": peak_rss_bytes(), **peaks},
            "table_bytes": dataset.schema.total_rows * MODEL["embedding_dim"] * 4}  # type: ignore[operator]


def system(name: str, cfg_json: str, batch: str, steps: str) -> dict[str, Any]:
    import torch
    from hydra import compose, initialize_config_dir

    from bagpipe.core.interface import TrainContext
    from bagpipe.data import make_dataset
    from bagpipe.harness.run.build import build_parts, build_system
    from bagpipe.harness.run.runner import RunConfig, RunResult, run_training
    from bagpipe.harness.run.schema import register_configs
    from bagpipe.harness.run.train import SUITES_DIR

    torch.set_num_threads(1)
    register_configs()
    with initialize_config_dir(config_dir=str(SUITES_DIR), version_base="1.3"):
        cfg = compose("config", overrides=[f"system={name}"])
    parts = build_parts(cfg)
    dataset = make_dataset(_config(cfg_json))
    ctx = TrainContext(schema=dataset.schema, model=parts.model, optim=parts.optim,
                       global_batch_size=int(batch), seed=0,
                       source=dataset.train(int(batch), int(steps)))
    trained = build_system(cfg)
    peaks: dict[str, int] = {}

    class RolePeaks:
        def on_run_end(self, result: RunResult) -> None:  # before the roles are closed
            peaks.update(role_peaks(trained))

    result = run_training(trained, ctx, dataset.eval(int(batch), EVAL_BATCHES),
                          RunConfig(num_steps=int(steps), eval_every=0, progress=False),
                          callbacks=[RolePeaks()])
    return {"iter_time_mean_s": result.summary["iter_time_mean_s"], "auc": result.summary["auc"],
            "init_time_s": result.summary["init_time_s"],
            "peak_rss": {"driver": peak_rss_bytes(), **peaks},
            "table_bytes": dataset.schema.total_rows * parts.model.embedding_dim * 4}


def main(argv: list[str]) -> None:
    jobs: dict[str, Callable[..., dict[str, Any]]] = {"prepare": prepare, "stream": stream,
                                                       "train": train, "system": system}
    print(json.dumps(jobs[argv[0]](*argv[1:])))


if __name__ == "__main__":
    main(sys.argv[1:])
