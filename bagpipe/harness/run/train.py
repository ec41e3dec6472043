"""``python -m bagpipe.harness.run``: one training run (or, with ``-m``/a suite, a sweep of them).

Example::

    python -m bagpipe.harness.run system=local model=dlrm dataset=synthetic_kaggle run.steps=100
    python -m bagpipe.harness.run suite=smoke                 # a sweep (suite files set MULTIRUN)
    python -m bagpipe.harness.run -m system=local,sync_ps seed=0,1,2 launcher=slurm

A run builds the dataset, the model config and the :class:`TrainContext`, instantiates the system
from ``cfg.system`` (``hydra.utils.instantiate``), runs :func:`run_training`, prints AUC, logloss
and the iteration time with its phase breakdown, and records everything: a local
:class:`RunRecord` and an MLPerf ``mllog`` file first, then the MLflow run (a child of the sweep's
parent run). A multi-process system spawns its roles inside the job through its own ``Deployment``;
on a multi-node SLURM allocation the Deployment takes ranks from the environment instead (its env
mode), and the launcher's ``tasks_per_node``/``nodes`` give it those ranks.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from bagpipe.harness.run.build import build_parts, build_system, first_line, plain
from bagpipe.harness.run.preemption import DeferredSignal
from bagpipe.harness.run.schema import register_configs
from bagpipe.harness.track.mlflow_runs import default_tracking_uri, upload_record
from bagpipe.harness.track.mlperf import MllogRecorder, Submission, result_path
from bagpipe.harness.track.record import ARTIFACTS_DIR, RECORD_FILE, RunRecord
from bagpipe.harness.track.workspace import git_sha, slurm_job_id

if TYPE_CHECKING:  # torch is imported inside the job, not when Hydra composes a sweep
    from bagpipe.core.batch import DatasetSchema
    from bagpipe.core.checkpoint import CheckpointStore
    from bagpipe.core.interface import TrainContext
    from bagpipe.core.net import NetworkConfig
    from bagpipe.core.source import BatchSource
    from bagpipe.harness.run.runner import RunConfig, RunResult
    from bagpipe.models import ModelConfig

SUITES_DIR = Path(os.environ.get("BAGPIPE_SUITES", Path(__file__).resolve().parents[3] / "suites"))


@dataclass(frozen=True)
class RunPaths:
    """Where one run writes: its own directory, the shared results tree, the sweep (if any)."""

    run_dir: Path
    results_dir: Path
    launch_dir: Path
    sweep_dir: Path | None = None

    @property
    def record_dir(self) -> Path:
        """The run's :class:`RunRecord` (``run.json``) and its artifacts."""
        return self.run_dir / "record"

    @classmethod
    def from_hydra(cls, cfg: DictConfig) -> RunPaths:
        hydra_cfg = HydraConfig.get()
        run_dir = Path(hydra_cfg.runtime.output_dir)
        sweep_dir = Path(hydra_cfg.sweep.dir) if hydra_cfg.mode == RunMode.MULTIRUN else None
        default_results = (sweep_dir or run_dir) / "results"
        results = Path(cfg.mllog.results_dir) if cfg.mllog.results_dir else default_results
        return cls(run_dir, results, Path(hydra_cfg.runtime.cwd), sweep_dir)


class _StepLog:
    """Runner callback that keeps per-step metrics (with a wall-clock stamp) for the record."""

    def __init__(self) -> None:
        self.steps: list[dict[str, float]] = []

    def on_step(self, step: int, metrics: dict[str, float]) -> None:
        self.steps.append({**metrics, "step": float(step), "time_ms": time.time() * 1000.0})


def _flat_params(cfg: DictConfig) -> dict[str, str]:
    """Every resolved config value as a dotted ``key -> str`` (MLflow params are strings): what a
    checkpoint's fingerprint compares."""
    out: dict[str, str] = {}

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                walk(value, f"{prefix}{key}.")
        else:
            out[prefix.rstrip(".")] = str(node)

    walk(OmegaConf.to_container(cfg, resolve=True, enum_to_str=True), "")
    return out


def run_params(cfg: DictConfig, tags: dict[str, str]) -> dict[str, str]:
    """The run's MLflow params: the system's short name as ``system``, then every config value
    except Hydra's own keys (``system._target_`` is a class path, not a name anyone compares)."""
    flat = _flat_params(cfg)
    internal = {key for key in flat if any(part.startswith("_") for part in key.split("."))}
    return {"system": tags["system"], **{k: v for k, v in flat.items() if k not in internal}}


#: Tags taken from config keys that not every config has: the described topology's name, the
#: emulated network's dilation.
OPTIONAL_TAGS = {"cluster": "topology.name", "dilation": "network.dilation"}


def optional_tags(cfg: DictConfig) -> dict[str, str]:
    """The :data:`OPTIONAL_TAGS` whose keys ``cfg`` has (a missing key is no tag, not "None")."""
    values = {tag: OmegaConf.select(cfg, key) for tag, key in OPTIONAL_TAGS.items()}
    return {tag: str(value) for tag, value in values.items() if value is not None}


def _tags(cfg: DictConfig, paths: RunPaths) -> dict[str, str]:
    """What the UI shows and filters a run by."""
    return {
        "system": _system_name(cfg),
        "model": plain(cfg.model)["name"],
        "dataset": _dataset_name(cfg),
        "suite": str(cfg.suite_name),
        "sweep_id": paths.sweep_dir.name if paths.sweep_dir else "none",
        "git_sha": git_sha(paths.launch_dir),
        "launcher": str(cfg.launcher_name),
        "scale": str(cfg.scale_name),
        "slurm_job_id": slurm_job_id(),
        **optional_tags(cfg),
    }


def _system_name(cfg: DictConfig) -> str:
    return str(HydraConfig.get().runtime.choices.get("system", "custom"))


def _dataset_name(cfg: DictConfig) -> str:
    return str(HydraConfig.get().runtime.choices.get("dataset", "custom"))


def execute(
    cfg: DictConfig,
    paths: RunPaths,
    tags: dict[str, str],
    stop_requested: Callable[[], bool] | None = None,
) -> RunRecord:
    """Run one configured training run and record it; return its record (also on failure).

    The record and the mllog file are opened before anything can fail, so even a run whose
    config or data is bad leaves a ``FAILED`` record and a closed log behind.

    With ``run.checkpoint_every`` the run goes through :func:`run_with_recovery`: checkpoints in
    ``run.checkpoint_dir``, restarts after role failures, and a resume when that directory
    already holds this run's checkpoints (a requeued SLURM job). ``stop_requested`` (a pending
    preemption) ends the run at a step boundary with a checkpoint: :class:`Preempted` propagates
    after the record is saved as ``KILLED``, so that the job can be requeued.
    """
    from bagpipe.harness.run.runner import Preempted

    record = _open_record(cfg, paths, tags)
    mllog = _open_mllog(cfg, paths, tags)
    steps = _StepLog()
    try:
        job = _prepare(cfg, paths, tags, record)
        batch_size = int(cfg.run.batch_size)
        mllog.set_samples(len(job.ctx.source) * batch_size, len(job.eval_source) * batch_size)
        result = _train(cfg, job, [mllog, steps], stop_requested)
        record.summary = {**result.summary, "time_to_target_s": _or_nan(mllog.time_to_target_s),
                          "reached_target": float(mllog.status == "success")}
        record.evals = [dict(vars(point)) for point in result.evals]
        record.status = "FINISHED"
    except Preempted as stop:
        record.status = "KILLED"
        record.error = (f"{stop}; the requeued job resumes from "
                        f"{cfg.run.checkpoint_dir or 'its run dir'}")
        print(f"[harness] run {record.run_name} {stop}")
        raise
    except Exception as err:
        mllog.fail()
        record.status = "FAILED"
        record.error = "".join(traceback.format_exception(err))
        record.failure = f"{type(err).__name__}: {first_line(err)}"
    finally:
        _close_record(record, paths, steps.steps, mllog.path)
    return record


def _open_record(cfg: DictConfig, paths: RunPaths, tags: dict[str, str]) -> RunRecord:
    """The run's record, saved as ``RUNNING`` with the resolved config beside it."""
    artifacts = paths.record_dir / ARTIFACTS_DIR
    artifacts.mkdir(parents=True, exist_ok=True)
    record = RunRecord(
        run_name=f"{tags['system']}-{tags['model']}-s{cfg.seed}",
        experiment=str(cfg.tracking.experiment),
        params=run_params(cfg, tags),
        tags=tags,
        start_ms=int(time.time() * 1000),
        sweep_dir=str(paths.sweep_dir) if paths.sweep_dir else None,
        tracking_uri=resolve_tracking_uri(cfg, paths.launch_dir),
    )
    (artifacts / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    record.save(paths.record_dir)
    return record


def _open_mllog(cfg: DictConfig, paths: RunPaths, tags: dict[str, str]) -> MllogRecorder:
    """The run's MLPerf log, opened up to ``init_start`` and the hyperparameters."""
    mllog = MllogRecorder(
        result_path(paths.results_dir, tags["system"], tags["model"], str(cfg.mllog.benchmark),
                    int(cfg.seed)),
        Submission(str(cfg.mllog.benchmark), str(cfg.mllog.division), str(cfg.mllog.org),
                   str(cfg.mllog.platform)),
        target_auc=float(cfg.run.target_auc),
    )
    mllog.init_start(
        int(cfg.seed), int(cfg.run.batch_size),
        {"system": tags["system"], "model": tags["model"], "dataset": tags["dataset"],
         "target_auc": float(cfg.run.target_auc)},
    )
    return mllog


@dataclass(frozen=True)
class _Job:
    """What a run trains and how: the system's context, the evaluation data, the loop's config,
    and the checkpoint store (None: no checkpoints, so no recovery either)."""

    ctx: TrainContext
    eval_source: BatchSource
    run_cfg: RunConfig
    store: CheckpointStore | None


def _prepare(cfg: DictConfig, paths: RunPaths, tags: dict[str, str], record: RunRecord) -> _Job:
    """Build the dataset, the model and optimiser configs, the context and the checkpoint store."""
    import torch
    from hydra.utils import get_class

    from bagpipe.core.device import resolve_device
    from bagpipe.core.interface import System, TrainContext
    from bagpipe.data import make_dataset

    run = cfg.run
    device = resolve_device(str(cfg.device))
    record.params["device_used"] = device  # what ``auto`` resolved to here
    torch.set_num_threads(int(run.torch_threads))
    parts = build_parts(cfg)
    dataset = make_dataset(parts.dataset, progress=bool(run.progress))
    network = _dilated(cfg, parts.network, parts.model, dataset.schema, device, paths, record)
    system_class = get_class(str(cfg.system._target_))
    resumable = issubclass(system_class, System) and system_class.supports_resume
    store = _checkpoint_store(cfg, paths, tags, resumable)
    ctx = TrainContext(
        schema=dataset.schema,
        model=parts.model,
        optim=parts.optim,
        global_batch_size=int(run.batch_size),
        seed=int(cfg.seed),
        source=dataset.train(int(run.batch_size), int(run.steps)),
        network=network,
        workdir=paths.run_dir,
        device=device,
    )
    return _Job(ctx, dataset.eval(int(run.batch_size), int(run.eval_batches)), parts.run, store)


def _dilated(cfg: DictConfig, network: NetworkConfig, model: ModelConfig, schema: DatasetSchema,
             device: str, paths: RunPaths, record: RunRecord) -> NetworkConfig:
    """The run's network with ``dilation: auto`` resolved (once per sweep and model, in the sweep
    directory) and ``dilation_scale`` applied; the factor, its scale and compute times in the
    record's params and ``dilation`` tag, and the back-end that ran (``network.backend_used``)."""
    from bagpipe.harness.run.dilation import Dilation, calibrated, parse_dilation

    if parse_dilation(cfg.network.dilation) is None:
        dilation = calibrated(model, schema, network.topology, int(cfg.run.batch_size),
                              int(cfg.run.torch_threads),
                              (paths.sweep_dir or paths.run_dir) / "dilation", device)
    else:
        dilation = Dilation(network.dilation)
    dilation = dilation.scaled(float(cfg.network.dilation_scale))
    network = dataclasses.replace(network, dilation=dilation.factor)
    record.params.update(dilation.as_params())
    record.params["network.backend_used"] = network.backend  # what ``auto`` resolved to here
    record.tags["dilation"] = f"{dilation.factor:.4g}"
    return network


def _train(cfg: DictConfig, job: _Job, callbacks: list[object],
           stop_requested: Callable[[], bool] | None) -> RunResult:
    """Train the configured system: straight through, or with a checkpoint store through
    :func:`run_with_recovery` (restarts after role failures, resumes a requeued job)."""
    from bagpipe.harness.run.runner import run_training

    if job.store is None:
        return run_training(build_system(cfg), job.ctx, job.eval_source,
                            job.run_cfg, callbacks=callbacks, stop_requested=stop_requested)
    from bagpipe.harness.run.recovery import run_with_recovery

    result, _ = run_with_recovery(
        lambda: build_system(cfg),
        job.ctx, job.eval_source, job.run_cfg, job.store, callbacks,
        max_restarts=int(cfg.run.max_restarts), stop_requested=stop_requested,
    )
    return result


def _close_record(record: RunRecord, paths: RunPaths, steps: list[dict[str, float]],
                  mllog_path: Path) -> None:
    """Finish the record whatever happened: steps, end time, the mllog file and Hydra's config
    beside it, saved."""
    artifacts = paths.record_dir / ARTIFACTS_DIR
    record.steps = steps
    record.end_ms = int(time.time() * 1000)
    shutil.copy(mllog_path, artifacts / "mllog.txt")
    hydra_dir = paths.run_dir / ".hydra"
    if hydra_dir.is_dir():
        shutil.copytree(hydra_dir, artifacts / "hydra", dirs_exist_ok=True)
    record.save(paths.record_dir)


def _checkpoint_store(
    cfg: DictConfig, paths: RunPaths, tags: dict[str, str], supports_resume: bool
) -> CheckpointStore | None:
    """The run's checkpoint store (None: ``run.checkpoint_every`` is 0).

    Its fingerprint is every resolved config value except how long and how verbosely to run, so
    a directory holding another run's checkpoints is refused instead of resumed from.
    """
    from bagpipe.core.checkpoint import CheckpointStore

    every = int(cfg.run.checkpoint_every)
    if every < 0:
        raise ValueError(f"run.checkpoint_every: must be >= 0, got {every}")
    if every == 0:
        return None
    if not supports_resume:
        raise ValueError(
            f"run.checkpoint_every={every}: system {tags['system']!r} cannot resume from a "
            f"checkpoint; use 0 for it"
        )
    root = Path(cfg.run.checkpoint_dir) if cfg.run.checkpoint_dir else paths.run_dir / "checkpoints"
    ignored = ("run.steps", "run.progress", "run.checkpoint_every", "run.max_restarts",
               "run.eval_every", "tracking.", "mllog.")
    fingerprint = {key: value for key, value in _flat_params(cfg).items()
                   if not key.startswith(ignored)}
    return CheckpointStore(root, fingerprint=fingerprint)


def _or_nan(value: float | None) -> float:
    return float("nan") if value is None else value


def print_summary(record: RunRecord, record_dir: Path) -> None:
    """AUC, logloss, mean iteration time and where it goes, on stdout; a run that did not finish
    gets one line on stderr: why, and where its record (the full traceback) is."""
    s = record.summary
    if record.status != "FINISHED":
        print(f"[harness] run {record.run_name} {record.status}: {record.failure or record.error}"
              f" (traceback in {record_dir / RECORD_FILE})", file=sys.stderr)
        return
    phases = {k[len("time_"):-len("_s")]: v for k, v in s.items()
              if k.startswith("time_") and k.endswith("_s") and k != "time_to_target_s"}
    breakdown = ", ".join(f"{name} {1000 * v:.2f} ms" for name, v in phases.items() if v > 0)
    print(
        f"[harness] {record.run_name}: auc {s['auc']:.4f}  logloss {s['logloss']:.4f}  "
        f"iter {1000 * s['iter_time_mean_s']:.2f} ms (p50 {1000 * s['iter_time_p50_s']:.2f}, "
        f"p90 {1000 * s['iter_time_p90_s']:.2f})\n[harness]   phases: {breakdown or 'none'}"
    )


def resolve_tracking_uri(cfg: DictConfig, launch_dir: Path) -> str | None:
    """The store this run goes to; None when tracking is off, the embedded store when unset."""
    if not cfg.tracking.enabled:
        return None
    return str(cfg.tracking.uri) if cfg.tracking.uri else default_tracking_uri(launch_dir)


def record_to_tracking(cfg: DictConfig, paths: RunPaths, record_dir: Path) -> None:
    """Upload the run; if the store is down, say so and how to upload later (nothing is lost)."""
    uri = resolve_tracking_uri(cfg, paths.launch_dir)
    if uri is None:
        return
    try:
        run_id = upload_record(record_dir, uri)
        print(f"[harness] MLflow run {run_id} in {uri}")
    except Exception as err:  # the record on disk is the source of truth
        print(f"[harness] tracking store {uri} unavailable ({err.__class__.__name__}: {err}); "
              f"results kept in {record_dir}. Upload later with: "
              f"python -m bagpipe.harness.track.upload {paths.sweep_dir or record_dir}")


@hydra.main(version_base="1.3", config_path=str(SUITES_DIR), config_name="config")
def main(cfg: DictConfig) -> float | None:
    """The Hydra task: one run. Returns its mean iteration time (None if it failed)."""
    paths = RunPaths.from_hydra(cfg)
    with DeferredSignal() as preemption:  # SLURM's warning before preemption / the time limit
        record = execute(cfg, paths, _tags(cfg, paths), preemption.requested)
    print_summary(record, paths.record_dir)
    record_to_tracking(cfg, paths, paths.record_dir)
    if record.status != "FINISHED":
        if paths.sweep_dir is None:
            raise SystemExit(1)  # its line is printed; Hydra would add a traceback to anything else
        if cfg.fail_fast:
            raise RuntimeError(f"run {record.run_name} failed; see {paths.record_dir}")
    return record.summary.get("iter_time_mean_s")


register_configs()
