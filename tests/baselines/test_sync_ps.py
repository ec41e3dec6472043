"""sync_ps: exactly synchronous SGD (equal to ``local``), with every byte it moves counted."""

from __future__ import annotations

import pytest
import torch

from bagpipe.core import runtime
from bagpipe.core.batch import DatasetSchema, global_ids, split_batch
from bagpipe.core.interface import TrainContext
from bagpipe.core.meter import LinkKind, StepRecord
from bagpipe.core.registry import load_system
from bagpipe.models import build_dense_model, initial_tables, table_dim
from bagpipe.training.local import LocalSystem
from baselines.sync_ps import SyncPS
from baselines.sync_ps.server import StepOrderedServer
from tests.conftest import assert_states_close, equivalence_context

SCHEMA = DatasetSchema(
    name="sync-ps-eq", num_dense=3, table_sizes=(30, 200, 8), feature_names=("a", "b", "c")
)
STEPS, BATCH = 20, 16


def _context(model_name: str) -> TrainContext:
    return equivalence_context(SCHEMA, model_name, BATCH, STEPS, seed=3)


def _expected_bytes(ctx: TrainContext, step: int, trainers: int) -> dict[str, int]:
    """What trainers must count for one step, from first principles (int64 ids, fp32 values)."""
    dim = table_dim(ctx.model)
    dense_params = sum(p.numel() for p in build_dense_model(ctx.model, SCHEMA, 0).parameters())
    out = dict.fromkeys(map(str, (LinkKind.DATA, LinkKind.EMB_PULL, LinkKind.EMB_PUSH)), 0)
    for part in split_batch(ctx.source[step], trainers):
        unique = torch.unique(global_ids(part, SCHEMA)).numel()
        out[str(LinkKind.DATA)] += part.labels.numel() * 4 * (1 + SCHEMA.num_dense) + (
            part.labels.numel() * SCHEMA.num_tables * 8
        )
        out[str(LinkKind.EMB_PULL)] += unique * 8 + unique * dim * 4  # ids asked + rows back
        out[str(LinkKind.EMB_PUSH)] += unique * 8 + unique * dim * 4  # ids + gradients
    out[str(LinkKind.ALLREDUCE)] = trainers * dense_params * 4
    return out



def test_registered_under_its_name() -> None:
    assert load_system("sync_ps") is SyncPS


@pytest.mark.parametrize("model_name", ["dlrm", "dcn"])
def test_two_trainers_two_servers_equal_local_after_20_steps(model_name: str) -> None:
    local, local_ctx = LocalSystem(), _context(model_name)
    local.setup(local_ctx)
    want_losses = [local.train_step(step, local_ctx.source[step]).loss for step in range(STEPS)]
    want = local.full_state()

    ctx = _context(model_name)
    system = SyncPS(num_trainers=2, num_servers=2)
    system.setup(ctx)
    try:
        results = [system.train_step(step, ctx.source[step]) for step in range(STEPS)]
        got = system.full_state()
    finally:
        system.close()

    torch.testing.assert_close([r.loss for r in results], want_losses, rtol=0, atol=1e-5)
    assert_states_close(got, want, rtol=0, atol=1e-5)
    start = initial_tables(SCHEMA, table_dim(ctx.model), ctx.seed)
    assert not torch.allclose(got.tables["t_b"], start["t_b"])  # updates reached the servers
    for step in (0, STEPS - 1):
        record: StepRecord = results[step].record
        assert record.bytes_sent == _expected_bytes(ctx, step, trainers=2)
        assert set(record.phase_s) >= {"fetch_wait", "forward", "backward", "sync", "optimizer"}


def test_bad_batch_split_is_rejected_before_any_process_starts() -> None:
    ctx = _context("dlrm")
    with pytest.raises(ValueError, match="global_batch_size 16 does not split into 3 trainers"):
        SyncPS(num_trainers=3).setup(ctx)


def _pushes(seed: int) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """Rank -> (unique ids, gradients) for one step; ranks overlap on ids 2 and 4, magnitudes
    differ by ~1e8 so that the order of the fp additions shows in the last bits."""
    gen = torch.Generator().manual_seed(seed)
    dim = 4
    return {
        0: (torch.tensor([0, 2, 4]), torch.randn(3, dim, generator=gen) * 1e4),
        1: (torch.tensor([4, 2, 6]), torch.randn(3, dim, generator=gen) * 1e-4),
    }


def _server() -> StepOrderedServer:
    runtime.init("server_0")
    return StepOrderedServer(0, 1, SCHEMA, 4, seed=3)


def test_server_sums_a_step_in_rank_order_whatever_the_arrival_order() -> None:
    lr = 0.37
    pushes = _pushes(seed=5)
    rows = {}
    for arrival in ([0, 1], [1, 0]):
        server = _server()
        for rank in arrival:
            server.push_at(0, rank, *pushes[rank], lr)
        rows[tuple(arrival)] = server.state()[1]
    assert torch.equal(rows[(0, 1)], rows[(1, 0)])

    want = _server().state()[1]
    total = torch.zeros(SCHEMA.total_rows, 4)
    for rank in (0, 1):
        total[pushes[rank][0]] += pushes[rank][1]
    touched = torch.tensor([0, 2, 4, 6])
    want.index_add_(0, touched, total[touched], alpha=-lr)  # one SGD update with the sum
    assert torch.equal(rows[(1, 0)], want)


def test_server_reads_of_a_step_see_earlier_steps_only() -> None:
    """A fast trainer's step-1 push must not reach a slow trainer's step-1 read."""
    server = _server()
    ids = torch.tensor([0, 2, 4, 6])
    start = server.fetch_rows_at(0, ids)
    step0, step1 = _pushes(seed=5), _pushes(seed=6)
    for rank in (1, 0):
        server.push_at(0, rank, *step0[rank], 0.5)
    assert torch.equal(server.fetch_rows_at(0, ids), start)  # step 0: not yet applied
    server.push_at(1, 0, *step1[0], 0.5)  # trainer 0 ran ahead into step 1
    after_step0 = server.fetch_rows_at(1, ids)
    assert not torch.equal(after_step0, start)
    assert torch.equal(server.fetch_rows_at(1, ids), after_step0)
    with pytest.raises(ValueError, match="trainer 0 pushed step 1 twice"):
        server.push_at(1, 0, *step1[0], 0.5)
    server.push_at(1, 1, *step1[1], 0.5)
    assert not torch.equal(server.fetch_rows_at(2, ids), after_step0)
    with pytest.raises(ValueError, match="step 1 arrived after step 1 was applied"):
        server.push_at(1, 1, *step1[1], 0.5)
