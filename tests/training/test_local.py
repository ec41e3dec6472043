"""LocalSystem: the synchronous single-process ground truth."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

from bagpipe.core import runtime
from bagpipe.core.batch import global_ids
from bagpipe.core.interface import TrainContext
from bagpipe.core.meter import Phase
from bagpipe.core.registry import load_system
from bagpipe.models import MODELS, ReferenceModel, initial_tables, table_dim
from bagpipe.training.local import LocalSystem
from tests.conftest import TINY_MODEL

ContextFactory = Callable[..., TrainContext]


def test_registered_under_its_name() -> None:
    assert load_system("local") is LocalSystem


@pytest.mark.parametrize("name", sorted(MODELS))
def test_matches_autograd_sgd_on_the_reference_model(
    name: str, tiny_context: ContextFactory
) -> None:
    """Sparse row updates + manual dense SGD == torch SGD over the whole ReferenceModel."""
    cfg = dataclasses.replace(TINY_MODEL, name=name)
    ctx = tiny_context(model=cfg, batch_size=8, num_batches=3, lr=0.5)
    system = LocalSystem()
    system.setup(ctx)
    reference = ReferenceModel(cfg, ctx.schema, ctx.seed)
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.5)
    for step in range(3):
        batch = ctx.source[step]
        result = system.train_step(step, batch)
        optimizer.zero_grad()
        loss = F.binary_cross_entropy_with_logits(reference(batch), batch.labels)
        loss.backward()
        optimizer.step()
        assert result.loss == pytest.approx(loss.item(), rel=1e-5)
    got, want = system.full_state(), reference.state()
    for table in want.tables:
        torch.testing.assert_close(got.tables[table], want.tables[table], rtol=1e-5, atol=1e-6)
    for key in want.dense:
        torch.testing.assert_close(got.dense[key], want.dense[key], rtol=1e-5, atol=1e-6)


def test_sparse_sgd_touches_only_rows_in_the_batch(tiny_context: ContextFactory) -> None:
    ctx = tiny_context(batch_size=4, num_batches=1)
    system = LocalSystem()
    system.setup(ctx)
    batch = ctx.source[0]
    before = torch.cat(list(system.full_state().tables.values()))
    system.train_step(0, batch)
    after = torch.cat(list(system.full_state().tables.values()))
    changed = (after != before).any(dim=1)
    used = torch.zeros(ctx.schema.total_rows, dtype=torch.bool)
    used[global_ids(batch, ctx.schema).reshape(-1)] = True
    assert not changed[~used].any()
    assert changed[used].any()


def test_loss_decreases_on_a_learnable_dataset(tiny_context: ContextFactory) -> None:
    ctx = tiny_context(batch_size=64, num_batches=4, lr=0.5)
    system = LocalSystem()
    system.setup(ctx)
    losses = [system.train_step(step, ctx.source[step % 4]).loss for step in range(60)]
    assert sum(losses[-4:]) < 0.7 * sum(losses[:4])


def test_full_state_starts_at_the_seeded_init_and_round_trips(
    tiny_context: ContextFactory,
) -> None:
    ctx = tiny_context()
    system = LocalSystem()
    system.setup(ctx)
    start = system.full_state()
    init = initial_tables(ctx.schema, table_dim(ctx.model), ctx.seed)
    assert all(torch.equal(start.tables[k], init[k]) for k in init)
    system.train_step(0, ctx.source[0])
    trained = system.full_state()
    reference = ReferenceModel(ctx.model, ctx.schema, seed=99)
    reference.load_state(trained)
    again = reference.state()
    assert all(torch.equal(trained.tables[k], again.tables[k]) for k in trained.tables)
    assert all(torch.equal(trained.dense[k], again.dense[k]) for k in trained.dense)
    # full_state is a copy: training on does not change what was returned
    system.train_step(1, ctx.source[1])
    assert all(torch.equal(trained.tables[k], again.tables[k]) for k in trained.tables)


def test_step_record_has_phases_and_no_traffic(tiny_context: ContextFactory) -> None:
    ctx = tiny_context()
    system = LocalSystem()
    system.setup(ctx)
    record = system.train_step(0, ctx.source[0]).record
    assert {Phase.FORWARD, Phase.BACKWARD, Phase.OPTIMIZER} <= set(record.phase_s)
    assert record.total_bytes == 0
    assert record.counters["unique_rows"] > 0
    assert len(runtime.current().meter.records) == 1


def test_rejects_a_batch_of_the_wrong_size(tiny_context: ContextFactory) -> None:
    ctx = tiny_context(batch_size=8)
    system = LocalSystem()
    system.setup(ctx)
    other = tiny_context(batch_size=4).source[0]
    with pytest.raises(ValueError, match="global_batch_size"):
        system.train_step(0, other)
    with pytest.raises(RuntimeError, match="before setup"):
        LocalSystem().full_state()
