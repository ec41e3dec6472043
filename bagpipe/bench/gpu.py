"""The GPU check: the device tests, then fig7's DLRM comparison with every trainer on the GPU.

``python -m bagpipe.bench --only gpu`` (``nox -s gpu_check`` where nox works) is written for a
bare NVIDIA machine: Python, torch with CUDA, numpy, pandas, pyarrow, pyyaml, rich, tqdm and
pytest, and nothing else. It imports neither Hydra, OmegaConf, MLflow nor submitit, and it needs
neither torchrec nor fbgemm-gpu (``bagpipe.core.torchrec_api``); it runs from the checkout
without installing it (``bagpipe.core.registry``). No wheel has to come along.

1. **Device tests** (``tests/core/test_device.py``, ``tests/training/test_devices.py``) in a
   pytest child: every exact system equals ``local`` on the GPU, its trainers' state is there,
   and Bagpipe's background installs are ordered by events (a side stream slowed with
   ``torch.cuda._sleep``). Rows ``tests_passed`` / ``tests_failed`` / ``tests_skipped``.
2. **fig7's DLRM comparison** at the paper's scale (batch 16384, dim 48, the paper's MLPs) on
   the Kaggle-shaped synthetic data (``SCALE``), :data:`TRAINERS` trainers sharing the GPU,
   each system timed as ``bagpipe.bench.systems`` times it: on the paper's topology emulated
   by the ``model`` back-end (no root needed) and with the network off. TorchRec runs where
   torchrec and fbgemm-gpu import and every trainer has a GPU of its own (NCCL); otherwise its
   row says why it was skipped.

Every row names the machine: GPU, driver, torch and CUDA versions, whether torchrec imported.
``--device cpu`` runs the same on the host (CI runs it with ``--quick`` under an import guard
that makes Hydra, MLflow and torchrec unimportable: ``tests/harness/test_gpu_check.py``).
The per-step compute measured on a GPU belongs in a topology file for that GPU
(``suites/topology/<gpu>.yaml``), not in the V100 paper file, whose compute is an estimate.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from bagpipe.bench.systems import PAPER, WARMUP, SystemSpec, measure
from bagpipe.core.device import own_gpus, resolve_device
from bagpipe.core.interface import OptimConfig, TrainContext
from bagpipe.core.net import NetworkConfig
from bagpipe.core.torchrec_api import TORCHREC
from bagpipe.data import DatasetConfig, make_dataset
from bagpipe.models import paper_config

#: Where ``python -m bagpipe.bench --only gpu`` writes by default.
RESULTS = Path("results/gpu")
BATCH, TRAINERS, STEPS, SCALE = 16384, 4, 20, 0.01
#: ``--quick`` (CI, on the host): small enough for two cores.
QUICK_BATCH, QUICK_TRAINERS, QUICK_STEPS, QUICK_SCALE = 512, 2, 3, 0.001
DEVICE_TESTS = ("tests/core/test_device.py", "tests/training/test_devices.py")
ROOT = Path(__file__).resolve().parents[2]


def systems(trainers: int) -> list[SystemSpec]:
    """fig7's systems with ``trainers`` trainers and the paper topology's server count."""
    shards = {"num_trainers": trainers, "num_servers": PAPER.servers}
    return [
        SystemSpec("local", "local"),
        SystemSpec("sync_ps", "sync_ps", shards),
        SystemSpec("bagpipe", "bagpipe", {**shards, "lookahead": 10}),
        SystemSpec("het", "het", shards),
        SystemSpec("fae", "fae", shards),
    ]


def machine() -> dict[str, Any]:
    """The columns that name where the rows were measured."""
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    return {
        "gpu": gpu,
        "driver": _driver_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda or "none",
        "torchrec": TORCHREC,
    }


def _driver_version() -> str:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30, check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return "none"
    return out.stdout.strip().splitlines()[0] if out.stdout.strip() else "none"


def device_tests(device: str) -> list[dict[str, Any]]:
    """Run the device tests in a pytest child; one row per outcome count."""
    started_s = time.perf_counter()
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *DEVICE_TESTS]
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, check=False)
    if done.returncode not in (0, 1):  # 1: some test failed; anything else: pytest itself did
        raise RuntimeError(f"pytest exited {done.returncode}:\n{done.stdout[-4000:]}{done.stderr}")
    if done.returncode == 1:
        print(done.stdout[-8000:], file=sys.stderr)
    counts = {kind: int(n) for n, kind in re.findall(r"(\d+) (passed|failed|skipped|error)",
                                                     done.stdout.splitlines()[-1])}
    config = {"benchmark": "gpu", "part": "device_tests", "system": "all", "network": "none",
              "device": device}
    rows = [
        {**config, "metric": f"tests_{kind}", "value": float(counts.get(kind, 0)), "unit": "n"}
        for kind in ("passed", "failed", "skipped", "error")
    ]
    rows.append({**config, "metric": "tests_wall_s",
                 "value": time.perf_counter() - started_s, "unit": "s"})
    return rows


def _torchrec_spec(device: str, trainers: int) -> tuple[SystemSpec | None, str]:
    if not TORCHREC:
        return None, "torchrec (or the fbgemm-gpu it needs) does not import here"
    if device == "cuda" and not own_gpus(trainers):
        return None, f"torchrec on CUDA needs a GPU per trainer: {trainers} trainers, " \
                     f"{torch.cuda.device_count()} GPUs"
    return SystemSpec("torchrec", "torchrec", {"num_trainers": trainers, "sharding": "auto"}), ""


def comparison(device: str, quick: bool) -> list[dict[str, Any]]:
    """fig7's DLRM comparison (module docstring, 2.) on ``device``."""
    batch, trainers, steps, scale = (
        (QUICK_BATCH, QUICK_TRAINERS, QUICK_STEPS, QUICK_SCALE) if quick
        else (BATCH, TRAINERS, STEPS, SCALE)
    )
    dataset = make_dataset(DatasetConfig(scale=scale))
    topology = PAPER.with_counts(trainers=trainers)
    networks = {"paper": NetworkConfig("model", topology), "off": NetworkConfig("real", topology)}
    if quick:
        networks = {"off": networks["off"]}
    specs = systems(trainers)
    torchrec, skipped_why = _torchrec_spec(device, trainers)
    if torchrec is not None:
        specs.append(torchrec)
    rows: list[dict[str, Any]] = []
    config = {"benchmark": "gpu", "part": "dlrm", "device": device, "batch": batch,
              "trainers": trainers, "steps": steps, "dataset_scale": scale}
    for network_label, network in networks.items():
        measured: dict[str, dict[str, float]] = {}
        for spec in specs:
            with tempfile.TemporaryDirectory(prefix="bagpipe-gpu-") as workdir:
                ctx = TrainContext(
                    schema=dataset.schema, model=paper_config("dlrm"), optim=OptimConfig(),
                    global_batch_size=batch, seed=0,
                    source=dataset.train(batch, WARMUP + steps), network=network,
                    workdir=Path(workdir), device=device,
                )
                measured[spec.label] = measure(spec, ctx, steps)
        base_s = measured["sync_ps"]["iter_time_p50_s"]
        for label, metrics in measured.items():
            metrics["speedup_vs_sync_ps"] = base_s / metrics["iter_time_p50_s"]
            for metric, value in metrics.items():
                unit = "s" if metric.endswith("_s") else ("B" if "bytes" in metric else "x")
                rows.append({**config, "system": label, "network": network_label,
                             "metric": metric, "value": value, "unit": unit})
        if torchrec is None:
            rows.append({**config, "system": "torchrec", "network": network_label,
                         "metric": "skipped", "value": float("nan"), "unit": skipped_why})
    return rows


def run(quick: bool, device: str = "auto") -> list[dict]:
    device = resolve_device(device, key="--device")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the driver's rule in every run (RunConfig.torch_threads)
    try:
        rows = device_tests(device) + comparison(device, quick)
    finally:
        torch.set_num_threads(threads)
    named = machine()
    return [{**named, **row} for row in rows]
