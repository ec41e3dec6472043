"""``torchrec`` (TorchRec DMP over 2 trainers, gloo, CPU) equals ``local`` after k steps.

Each case spawns its own 2 trainer processes; tables are tiny (4 x 50 rows, dim 8) so a case takes
a few seconds. The ``dense`` kernel prints PyTorch's autograd-fallback warning for FBGEMM's dense
lookup (``baselines.md`` §3.2): the equality check below is what shows its gradients are right.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from bagpipe.core.batch import DatasetSchema
from bagpipe.core.interface import (
    ModelConfig,
    ModelState,
    OptimConfig,
    ResumePoint,
    System,
    TrainContext,
)
from bagpipe.core.meter import LinkKind, StepRecord
from bagpipe.models import build_dense_model
from bagpipe.training.local import LocalSystem
from baselines.torchrec_sharding import TorchRecSharding
from tests.conftest import TinySource, assert_states_close, assert_states_equal

SCHEMA = DatasetSchema(
    name="torchrec-tiny",
    num_dense=3,
    table_sizes=(50, 50, 50, 50),
    feature_names=("c0", "c1", "c2", "c3"),
)
DLRM = ModelConfig(name="dlrm", embedding_dim=8, bottom_mlp=(8, 8), top_mlp=(8, 1))
DCN = ModelConfig(name="dcn", embedding_dim=8, bottom_mlp=(8, 8), top_mlp=(8, 1), cross_rank=4)
DEEPFM = ModelConfig(name="deepfm", embedding_dim=8, bottom_mlp=(8, 8), top_mlp=(8, 1))
GLOBAL_BATCH = 16
STEPS = 5
ATOL = 1e-5


@dataclass
class Run:
    losses: list[float]
    records: list[StepRecord]
    state: ModelState
    stats: dict


def _context(model: ModelConfig) -> TrainContext:
    return TrainContext(
        schema=SCHEMA,
        model=model,
        optim=OptimConfig(embedding_lr=0.5, dense_lr=0.1),
        global_batch_size=GLOBAL_BATCH,
        seed=3,
        source=TinySource(SCHEMA, GLOBAL_BATCH, STEPS, seed=1),
    )


def _train(system: System, model: ModelConfig, resume: ResumePoint | None = None,
           stop: int = STEPS) -> Run:
    """Train ``system`` on batches ``[resume.step or 0, stop)`` of the context's source."""
    ctx = _context(model)
    ctx.resume = resume
    system.setup(ctx)
    try:
        first = resume.step if resume is not None else 0
        results = [system.train_step(i, ctx.source[i]) for i in range(first, stop)]
        return Run(
            [r.loss for r in results],
            [r.record for r in results],
            system.full_state(),
            system.stats(),
        )
    finally:
        system.close()


_LOCAL_RUNS: dict[str, Run] = {}


def _assert_equals_local(run: Run, model: ModelConfig) -> None:
    if model.name not in _LOCAL_RUNS:
        _LOCAL_RUNS[model.name] = _train(LocalSystem(), model)
    expected = _LOCAL_RUNS[model.name]
    initial = LocalSystem()
    initial.setup(_context(model))
    moved = max(
        float((expected.state.tables[n] - t).abs().max())
        for n, t in initial.full_state().tables.items()
    )
    assert moved > 1e-3, "training must change the tables for the check to mean anything"
    assert run.losses == pytest.approx(expected.losses, abs=ATOL)
    assert_states_close(run.state, expected.state, rtol=0, atol=ATOL)


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
def test_each_sharding_equals_local(sharding: str, kernel: str) -> None:
    run = _train(TorchRecSharding(2, sharding=sharding, kernel=kernel), DLRM)
    _assert_equals_local(run, DLRM)
    assert all(f"{sharding}/" in desc for desc in run.stats["plan"].values()), run.stats["plan"]
    assert sum(run.stats["bytes_per_rank"]) >= sum(SCHEMA.table_sizes) * 8 * 4


def test_table_wise_alltoall_bytes_follow_the_formula() -> None:
    """TW, 4 tables round-robin on 2 ranks, B = 8 per rank, D = 8, int64 ids, int32 lengths.

    Per rank and step, counted from the tensors TorchRec's collectives send: ids+lengths for its
    2 remote tables ``2 * 8 * (8 + 4)``, pooled output of its 2 tables to the peer ``2 * 8 * 8 * 4``,
    gradients for the 2 remote tables ``2 * 8 * 8 * 4``, and the splits TorchRec's KJT all-to-all
    sends ahead of the ids (the lengths' and values' counts and the batch size, an int64 each:
    ``3 * 8``), which a formula over the ids alone leaves out.
    """
    run = _train(TorchRecSharding(2, sharding="table_wise", use_pipeline=False), DLRM)
    per_rank = 2 * 8 * (8 + 4) + 2 * (2 * 8 * 8 * 4) + 3 * 8
    dense_bytes = sum(p.numel() * 4 for p in build_dense_model(DLRM, SCHEMA, 3).parameters())
    for record in run.records:
        assert record.bytes_sent[str(LinkKind.ALLTOALL)] == 2 * per_rank
        assert record.bytes_sent[str(LinkKind.ALLREDUCE)] == 2 * dense_bytes
    assert run.stats["rows_per_rank"] == [100, 100]
    # The pipeline sends a batch's ids a step early, so its steps differ; the run's bytes do not.
    piped = _train(TorchRecSharding(2, sharding="table_wise", use_pipeline=True), DLRM)
    assert sum(r.bytes_sent[str(LinkKind.ALLTOALL)] for r in piped.records) == (
        len(run.records) * 2 * per_rank
    )


def test_one_rank_moves_no_bytes() -> None:
    run = _train(TorchRecSharding(1, sharding="table_wise"), DLRM, stop=2)
    for record in run.records:
        assert record.bytes_sent.get(str(LinkKind.ALLREDUCE), 0) == 0
        assert record.bytes_sent.get(str(LinkKind.ALLTOALL), 0) == 0


def test_pipeline_with_dcn_equals_local() -> None:
    run = _train(TorchRecSharding(2, sharding="table_wise", use_pipeline=True), DCN)
    _assert_equals_local(run, DCN)
    assert run.stats["pipelined_modules"] >= 1, "TrainPipelineSparseDist fell back to plain calls"


def test_deepfm_uneven_column_split_equals_local() -> None:
    """DeepFM tables are ``dim + 1 = 9`` wide: column-wise (dense kernel) splits them 5 + 4."""
    run = _train(TorchRecSharding(2, sharding="column_wise", kernel="dense"), DEEPFM)
    _assert_equals_local(run, DEEPFM)
    assert all("ranks=[" in desc and "," in desc for desc in run.stats["plan"].values())


def test_planner_with_cpu_sharder_plans_row_wise_and_trains() -> None:
    run = _train(TorchRecSharding(2, sharding="row_wise", planner=True), DLRM)
    assert all(d.startswith("row_wise/fused ranks=[0, 1]") for d in run.stats["plan"].values())
    _assert_equals_local(run, DLRM)


def test_auto_plan_trains_like_local() -> None:
    run = _train(TorchRecSharding(2, sharding="auto"), DLRM)
    assert set(run.stats["plan"]) == set(SCHEMA.table_names)
    _assert_equals_local(run, DLRM)


@pytest.mark.parametrize(
    ("sharding", "kernel", "use_pipeline"),
    [("row_wise", "fused", False), ("table_wise", "fused", True)],
)
def test_resumed_run_ends_bit_identical(sharding: str, kernel: str, use_pipeline: bool) -> None:
    """2 steps, a checkpoint's state, a fresh system resumed from it, 3 more: what 5 straight give.

    Bit for bit, with the fused (FBGEMM) kernel: reloading the shards and the dense part from the
    state ``full_state`` returned changes nothing, and the step counters (and, with the pipeline,
    the batches sent ahead) continue at the resumed step.
    """

    def make() -> TorchRecSharding:
        return TorchRecSharding(2, sharding=sharding, kernel=kernel, use_pipeline=use_pipeline)

    straight = _train(make(), DLRM)
    first = _train(make(), DLRM, stop=2)
    rest = _train(make(), DLRM, resume=ResumePoint(2, first.state))
    assert first.losses + rest.losses == straight.losses
    assert_states_equal(rest.state, straight.state)
    assert not torch.equal(first.state.tables["t_c0"], straight.state.tables["t_c0"])


def test_bad_knobs_name_the_key() -> None:
    with pytest.raises(ValueError, match=r"system\.sharding"):
        TorchRecSharding(sharding="diagonal")
    with pytest.raises(ValueError, match=r"system\.kernel"):
        TorchRecSharding(kernel="fused_uvm")


def test_fused_kernel_rejects_widths_fbgemm_cannot_take() -> None:
    """FBGEMM's fused kernel needs widths divisible by 4; DeepFM's 9 fails before any spawn."""
    with pytest.raises(ValueError, match=r"system\.kernel=fused.*9 wide"):
        TorchRecSharding(2, sharding="table_wise", kernel="fused").setup(_context(DEEPFM))
