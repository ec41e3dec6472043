"""``network.dilation: auto``: slow the emulated network by as much as this machine's trainers are
slower than the target's, so that communication takes the share of an iteration it takes there.

A CPU core here computes a DLRM step tens of times slower than a V100. Emulating the target's NICs
at their real speed would make the network a rounding error and compare the systems' CPU overheads
instead of their traffic (time-dilated network emulation: divide every bandwidth and multiply every
latency by the same factor, and the ratio of compute to communication is the target's again)::

    d = trainer compute time here / trainer compute time on the target

*Here* is measured: ``T`` processes (the sweep's trainer count, sharing these cores as its trainers
will) each time the forward and backward pass of their slice of the global batch. *The target* is
the topology's compute estimate for the same slice (:meth:`bagpipe.core.net.Compute.step_time_s`).
One ``d`` holds per (sweep, model, data shape, trainers, batch), the same for every system (the
``datasets`` suite has one per dataset shape): the first job that
needs it measures it and writes it into the sweep directory; every other job reads it. What
dilation cannot slow is CPU work that the target runs on other machines (servers, the oracle):
runs report it apart.
"""

from __future__ import annotations

import fcntl
import json
import multiprocessing
import statistics
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from bagpipe.core.batch import DatasetSchema
from bagpipe.core.net import Topology
from bagpipe.models import ModelConfig

AUTO = "auto"
_WARMUP_STEPS, _TIMED_STEPS = 3, 10


@dataclass(frozen=True)
class Dilation:
    """A resolved dilation and, for ``auto``, the two compute times it came from."""

    factor: float
    compute_here_s: float | None = None
    compute_target_s: float | None = None
    scale: float = 1.0  # ``network.dilation_scale``, already in ``factor``

    def scaled(self, scale: float) -> Dilation:
        """This dilation times ``scale`` (``network.dilation_scale``; > 0)."""
        if not scale > 0:
            raise ValueError(f"network.dilation_scale must be > 0, got {scale!r}")
        return replace(self, factor=self.factor * scale, scale=self.scale * scale)

    def as_params(self) -> dict[str, str]:
        """What a run records: the factor, its scale, and the compute times when calibrated."""
        out = {"dilation.factor": f"{self.factor:.6g}", "dilation.scale": f"{self.scale:.6g}"}
        if self.compute_here_s is not None and self.compute_target_s is not None:
            out["dilation.compute_here_ms"] = f"{1000 * self.compute_here_s:.4g}"
            out["dilation.compute_target_ms"] = f"{1000 * self.compute_target_s:.4g}"
        return out


def parse_dilation(value: object, key: str = "network.dilation") -> float | None:
    """A fixed factor, or ``None`` for ``auto``; anything else is refused, naming ``key``."""
    if isinstance(value, str) and value.strip().lower() == AUTO:
        return None
    try:
        factor = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"{key}: {value!r} is neither a number nor 'auto'") from None
    if not factor > 0:
        raise ValueError(f"{key} must be > 0 or 'auto', got {value!r}")
    return factor


def calibrated(
    model: ModelConfig, schema: DatasetSchema, topology: Topology, global_batch: int,
    torch_threads: int, cache_dir: Path, device: str = "cpu",
) -> Dilation:
    """``auto`` for this job: read from ``cache_dir`` if a job of the sweep measured it, else
    measure it now (under a lock, so concurrent jobs of one sweep measure once), on the
    ``device`` the run's trainers compute on."""
    trainers = topology.trainers
    per_trainer = global_batch // trainers
    cache_dir.mkdir(parents=True, exist_ok=True)
    # the dense part's size depends on the data's shape too (dense width, number of features)
    shape = f"d{schema.num_dense}-f{len(schema.table_sizes)}"
    path = cache_dir / f"{model.name}-{shape}-t{trainers}-b{global_batch}-{device}.json"
    with open(cache_dir / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.exists():
            return Dilation(**json.loads(path.read_text()))
        here_s, dense_params = measure_compute_s(model, schema, per_trainer, trainers,
                                                 torch_threads, device)
        target_s = topology.compute.step_time_s(dense_params, per_trainer)
        if target_s is None:
            raise ValueError(
                f"network.dilation=auto: topology {topology.name!r} has no compute estimate "
                "(topology.compute.peak_tflops); give a number instead"
            )
        dilation = Dilation(here_s / target_s, here_s, target_s)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(dilation)))
        tmp.replace(path)
        return dilation


def measure_compute_s(
    model: ModelConfig, schema: DatasetSchema, batch_per_trainer: int, trainers: int,
    torch_threads: int, device: str = "cpu",
) -> tuple[float, int]:
    """Median forward+backward time of one trainer's slice with ``trainers`` processes timing
    at once (as the run's trainers share these cores, or one GPU), and the dense model's
    parameter count."""
    context = multiprocessing.get_context("spawn")
    with context.Pool(trainers) as pool:
        results = pool.starmap(
            _time_slices, [(model, schema, batch_per_trainer, torch_threads, k, device)
                           for k in range(trainers)]
        )
    return statistics.median(t for t, _ in results), results[0][1]


def _time_slices(model_cfg: ModelConfig, schema: DatasetSchema, batch: int, torch_threads: int,
                 seed: int, device: str) -> tuple[float, int]:
    """In a worker: the median time of a slice's forward and backward on random inputs (host
    inputs, as a trainer gets them: on a GPU their copies count, and the timer waits for it)."""
    import torch

    from bagpipe.core.allocator import keep_freed_memory
    from bagpipe.core.device import trainer_device
    from bagpipe.core.meter import Meter
    from bagpipe.models import build_dense_model, table_dim
    from bagpipe.training.step import forward_backward

    torch.set_num_threads(torch_threads)
    keep_freed_memory()  # timed as a run's trainers run (bagpipe.core.allocator)
    on = trainer_device(device, 0, 1)
    model = build_dense_model(model_cfg, schema, seed).to(on)
    generator = torch.Generator().manual_seed(seed)
    dense = torch.rand(batch, schema.num_dense, generator=generator)
    rows = torch.randn(batch * schema.num_tables, table_dim(model_cfg), generator=generator)
    inverse = torch.arange(batch * schema.num_tables).view(batch, schema.num_tables)
    labels = torch.randint(0, 2, (batch,), generator=generator).float()
    meter = Meter()
    times = []
    for step in range(_WARMUP_STEPS + _TIMED_STEPS):
        start = time.perf_counter()
        forward_backward(model, dense, rows, inverse, labels, batch, meter)
        model.zero_grad(set_to_none=True)
        if on.type == "cuda":
            torch.cuda.synchronize(on)
        if step >= _WARMUP_STEPS:
            times.append(time.perf_counter() - start)
    return statistics.median(times), sum(p.numel() for p in model.parameters())
