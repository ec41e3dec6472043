"""Every system on every device this machine has: its trainers' state lives on the run's device,
and every exact system trains the same model as ``local`` on that device.

The ``cuda`` cases skip without a GPU (``python -m bagpipe.bench --only gpu`` runs them where
there is one); the ``cpu`` cases run the same code everywhere, so the tests themselves are known
to work before they meet a GPU.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from bagpipe.core.batch import DatasetSchema
from bagpipe.core.device import own_gpus
from bagpipe.core.interface import ModelState, System, TrainContext
from bagpipe.core.registry import load_system
from bagpipe.training.local import LocalSystem
from tests.conftest import assert_states_close, equivalence_context

SCHEMA = DatasetSchema(
    name="devices", num_dense=3, table_sizes=(40, 300, 12), feature_names=("a", "b", "c")
)
STEPS, BATCH = 12, 16

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
DEVICES = ["cpu", pytest.param("cuda", marks=needs_gpu)]

#: The exact systems with the knobs that make them move rows every few steps, and the embedding
#: state each reports besides ``dense``. HET is exact with bound 0, BSP and a full cache.
EXACT: dict[str, tuple[dict[str, Any], set[str]]] = {
    "sync_ps": ({"num_trainers": 2, "num_servers": 2}, set()),
    "bagpipe": (
        {"num_trainers": 2, "num_servers": 2, "lookahead": 4, "cache_capacity": 120}, {"cache"}
    ),
    # The original batches (no re-packing); the tiny tables are all hot: hot steps on the replica.
    "fae": ({"num_trainers": 2, "num_servers": 1, "repack": False}, {"hot_replica"}),
    "het": (
        {"num_trainers": 2, "num_servers": 2, "bound": 0, "mode": "bsp", "cache_fraction": 1.0},
        {"cache"},
    ),
}


def _context(device: str, workdir: Path) -> TrainContext:
    return equivalence_context(
        SCHEMA, "dlrm", BATCH, STEPS, seed=11, device=device, workdir=workdir
    )


def _train(system: System, ctx: TrainContext) -> tuple[list[float], ModelState, dict[str, str]]:
    system.setup(ctx)
    try:
        source = system.prepare_dataset(ctx.source)
        losses = [system.train_step(step, source[step]).loss for step in range(STEPS)]
        return losses, system.full_state(), system.state_devices()
    finally:
        system.close()


def _where(device: str) -> str:
    """How torch names the device trainer 0 computes on."""
    return "cpu" if device == "cpu" else "cuda:0"


@pytest.fixture(scope="module", params=DEVICES)
def local_run(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, list[float], ModelState]:
    device = request.param
    losses, state, devices = _train(LocalSystem(), _context(device, tmp_path_factory.mktemp("l")))
    assert devices == {"dense": _where(device), "tables": _where(device)}
    return device, losses, state


@pytest.mark.parametrize("name", list(EXACT))
def test_exact_systems_keep_their_state_on_the_device_and_equal_local(
    name: str, local_run: tuple[str, list[float], ModelState], tmp_path: Path
) -> None:
    device, want_losses, want = local_run
    knobs, embedding_parts = EXACT[name]
    losses, got, devices = _train(load_system(name)(**knobs), _context(device, tmp_path))
    assert devices == dict.fromkeys({"dense", *embedding_parts}, _where(device))
    assert losses == pytest.approx(want_losses, rel=1e-4, abs=1e-6)
    assert_states_close(got, want, rtol=1e-5, atol=1e-5)
    assert all(t.device.type == "cpu" for t in [*got.tables.values(), *got.dense.values()])


@needs_gpu
def test_local_on_the_gpu_trains_the_cpu_model_to_float_tolerance(tmp_path: Path) -> None:
    cpu_losses, cpu_state, _ = _train(LocalSystem(), _context("cpu", tmp_path))
    gpu_losses, gpu_state, _ = _train(LocalSystem(), _context("cuda", tmp_path))
    assert gpu_losses == pytest.approx(cpu_losses, rel=1e-4, abs=1e-5)
    assert_states_close(gpu_state, cpu_state, rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(not own_gpus(2), reason="TorchRec on CUDA needs a GPU per trainer (NCCL)")
def test_torchrec_on_gpus_of_their_own_equals_local(tmp_path: Path) -> None:
    pytest.importorskip("baselines.torchrec_sharding", reason="torchrec does not import here")
    want_losses, want, _ = _train(LocalSystem(), _context("cuda", tmp_path))
    system = load_system("torchrec")(num_trainers=2, sharding="row_wise")
    losses, got, devices = _train(system, _context("cuda", tmp_path))
    assert devices == {"dense": "cuda:0", "tables": "cuda:0"}
    assert losses == pytest.approx(want_losses, rel=1e-4, abs=1e-6)
    assert_states_close(got, want, rtol=1e-5, atol=1e-5)


def test_torchrec_refuses_trainers_that_would_share_a_gpu() -> None:
    trainer = pytest.importorskip(
        "baselines.torchrec_sharding.trainer", reason="torchrec does not import here"
    )
    _device_for = trainer._device_for

    assert _device_for("cpu", 0, 2) == torch.device("cpu")
    if not own_gpus(2):
        with pytest.raises(ValueError, match="needs a GPU per trainer"):
            _device_for("cuda", 0, 2)
