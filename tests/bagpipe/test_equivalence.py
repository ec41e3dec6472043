"""THE key test: Bagpipe (T=2 trainers, S=2 server shards, oracle, LRPP caches) trains exactly like
``local`` with plain SGD, past several lease expiries, evictions, write-backs and refetches."""

from __future__ import annotations

import pytest
import torch

from bagpipe.core.batch import DatasetSchema
from bagpipe.core.registry import load_system
from bagpipe.core.system import System, TrainContext
from bagpipe.system import Bagpipe
from bagpipe.systems.local import LocalSystem
from tests.conftest import equivalence_context

SCHEMA = DatasetSchema(
    name="bagpipe-eq", num_dense=3, table_sizes=(40, 300, 12, 500), feature_names=("a", "b", "c", "d")
)
LOOKAHEAD, STEPS, BATCH = 8, 20, 16  # ci = 2: 10 rounds, > 2*L steps
# On this seeded stream the lease-only resident set peaks at 131 rows and two rounds need up to 130
# at once: 130 rows forces Belady evictions (one of them breaks a lease, so a row is refetched).
TIGHT_CAPACITY = 130


def _context(model_name: str) -> TrainContext:
    return equivalence_context(SCHEMA, model_name, BATCH, STEPS, seed=3)


def _train(system: System, ctx: TrainContext) -> tuple[list[float], System]:
    system.setup(ctx)
    losses = [system.train_step(step, ctx.source[step]).loss for step in range(STEPS)]
    return losses, system


def test_registered_under_its_name() -> None:
    assert load_system("bagpipe") is Bagpipe


@pytest.mark.parametrize(
    ("model_name", "capacity"), [("dlrm", None), ("wdl", None), ("dlrm", TIGHT_CAPACITY)]
)
def test_bagpipe_matches_local(model_name: str, capacity: int | None) -> None:
    ctx = _context(model_name)
    local_losses, local = _train(LocalSystem(), ctx)
    want = local.full_state()
    bagpipe = Bagpipe(num_trainers=2, num_servers=2, lookahead=LOOKAHEAD, cache_capacity=capacity)
    try:
        losses, _ = _train(bagpipe, _context(model_name))
        got = bagpipe.full_state()
        stats = bagpipe.stats()
    finally:
        bagpipe.close()
    assert losses == pytest.approx(local_losses, rel=1e-4, abs=1e-6)
    for table in want.tables:
        torch.testing.assert_close(got.tables[table], want.tables[table], rtol=1e-5, atol=1e-6)
    for key in want.dense:
        torch.testing.assert_close(got.dense[key], want.dense[key], rtol=1e-5, atol=1e-6)
    # The run really exercised the cache: rows were written back and fetched again.
    assert stats["total_rows_written_back"] > 0
    assert stats["total_rows_prefetched"] > stats["total_rows_written_back"] / 2
    assert stats["total_rows_singleton"] > 0
    assert 0.0 < stats["total_hit_rate"] < 1.0
    if capacity is not None:  # the window did not fit: Belady's rule chose what to keep
        assert stats["oracle_capacity_evictions"] > 0
