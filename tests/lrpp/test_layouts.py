"""Bagpipe in a layout other than two trainers over two shards: three trainers over three shards
(each row owned by the shard ``id % 3``, singletons owned by any of three trainers, write-backs
split three ways) trains exactly like ``local``, losses included."""

from __future__ import annotations

import pytest

from bagpipe.core.batch import DatasetSchema
from bagpipe.core.interface import System, TrainContext
from bagpipe.lrpp import Bagpipe
from bagpipe.training.local import LocalSystem
from tests.conftest import assert_states_close, equivalence_context

SCHEMA = DatasetSchema(
    name="bagpipe-3x3", num_dense=3, table_sizes=(40, 300, 12), feature_names=("a", "b", "c")
)
STEPS, BATCH = 14, 18  # three slices of 6 examples


def _context() -> TrainContext:
    return equivalence_context(SCHEMA, "dcn", BATCH, STEPS, seed=13)


def _train(system: System, ctx: TrainContext) -> list[float]:
    system.setup(ctx)
    return [system.train_step(step, ctx.source[step]).loss for step in range(STEPS)]


def test_three_trainers_over_three_shards_equal_local() -> None:
    local = LocalSystem()
    want_losses = _train(local, _context())
    bagpipe = Bagpipe(num_trainers=3, num_servers=3, lookahead=4, cache_capacity=None)
    try:
        losses = _train(bagpipe, _context())
        got, stats = bagpipe.full_state(), bagpipe.stats()
    finally:
        bagpipe.close()
    assert losses == pytest.approx(want_losses, rel=1e-6, abs=1e-7)
    assert_states_close(got, local.full_state())
    # every part of the design ran: singletons, deferred syncs, write-backs and refetches
    assert stats["total_rows_singleton"] > 0 and stats["total_rows_sync_later"] > 0
    assert stats["total_rows_written_back"] > 0
    assert stats["total_rows_prefetched"] > stats["total_rows_written_back"] / 2
    assert stats["total_round_cpu_s"] > 0  # the rounds' CPU is counted, for the bound's split
