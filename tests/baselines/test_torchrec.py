"""``torchrec`` (TorchRec DMP over 2 trainers, gloo, CPU) equals ``local`` after k steps.

Each case spawns its own 2 trainer processes; tables are tiny (4 x 50 rows, dim 8) so a case takes
a few seconds. The ``dense`` kernel prints PyTorch's autograd-fallback warning for FBGEMM's dense
lookup (``baselines.md`` §3.2): the equality check below is what shows its gradients are right.
"""

from __future__ import annotations

import pytest
import torch
from conftest import TinySource

from bagpipe.core.batch import DatasetSchema
from bagpipe.core.link import LinkConfig
from bagpipe.core.system import ModelState, OptimConfig, System, TrainContext
from bagpipe.models.base import ModelConfig
from bagpipe.systems.local import LocalSystem
from baselines.torchrec_sharding import TorchRecSharding

SCHEMA = DatasetSchema(
    name="torchrec-tiny",
    num_dense=3,
    table_sizes=(50, 50, 50, 50),
    feature_names=("c0", "c1", "c2", "c3"),
)
DLRM = ModelConfig(name="dlrm", embedding_dim=8, bottom_mlp=(8, 8), top_mlp=(8, 1))
DCN = ModelConfig(name="dcn", embedding_dim=8, bottom_mlp=(8, 8), top_mlp=(8, 1), cross_rank=4)
GLOBAL_BATCH = 16
STEPS = 5
ATOL = 1e-5


def _context(model: ModelConfig, steps: int = STEPS) -> TrainContext:
    return TrainContext(
        schema=SCHEMA,
        model=model,
        optim=OptimConfig(embedding_lr=0.5, dense_lr=0.1),
        global_batch_size=GLOBAL_BATCH,
        seed=3,
        source=TinySource(SCHEMA, GLOBAL_BATCH, steps, seed=1),
        link=LinkConfig(enabled=False),
    )


def _train(system: System, ctx: TrainContext) -> tuple[list[float], ModelState]:
    system.setup(ctx)
    try:
        losses = [system.train_step(i, batch).loss for i, batch in enumerate(ctx.source)]
        return losses, system.full_state()
    finally:
        system.close()


def _assert_same(actual: ModelState, expected: ModelState) -> None:
    assert actual.tables.keys() == expected.tables.keys()
    for name, table in expected.tables.items():
        torch.testing.assert_close(actual.tables[name], table, atol=ATOL, rtol=0, msg=name)
    assert actual.dense.keys() == expected.dense.keys()
    for key, value in expected.dense.items():
        torch.testing.assert_close(actual.dense[key], value, atol=ATOL, rtol=0, msg=key)


@pytest.fixture(scope="module")
def local_dlrm() -> tuple[list[float], ModelState]:
    return _train(LocalSystem(), _context(DLRM))


@pytest.mark.parametrize(
    ("sharding", "kernel"),
    [
        ("table_wise", "fused"),
        ("row_wise", "fused"),
        ("column_wise", "fused"),
        ("data_parallel", "dense"),
        ("row_wise", "dense"),
    ],
)
def test_equals_local(
    sharding: str, kernel: str, local_dlrm: tuple[list[float], ModelState]
) -> None:
    expected_losses, expected_state = local_dlrm
    start = _context(DLRM)
    losses, state = _train(TorchRecSharding(2, sharding=sharding, kernel=kernel), start)
    initial = LocalSystem()
    initial.setup(start)
    moved = max(
        float((expected_state.tables[n] - t).abs().max())
        for n, t in initial.full_state().tables.items()
    )
    assert moved > 1e-3, "training must change the tables for the check to mean anything"
    assert losses == pytest.approx(expected_losses, abs=1e-5)
    _assert_same(state, expected_state)
