"""HET with two trainers, small caches (evictions) and every policy, where its semantics promise
exactly ``local``'s model.

* ``asp`` with a staleness bound of 2 (HET's default mode, as fig7 runs it) on data whose two
  halves of every batch use disjoint rows: a trainer never reads the other's rows, so however late
  it pushes, its reads see all its own updates (prefetched pulls included) and nothing is missing.
* ``bsp`` with bound 0 on data whose halves share rows: every line is pushed after every step and
  every read behind the server is refreshed, so both trainers read every row fresh.

The embedding learning rate is large (8) so that one missed update of a row moves the model well
past the tolerance: at the shared 0.5, a server that let reads fall one clock behind under bound 0
stayed within it.

The staleness bound itself, with trainers that do share rows, is checked at the cache level by
``test_het_staleness`` (hypothesis, 2-3 workers).
"""

from __future__ import annotations

import dataclasses
import time
from concurrent.futures import Future

import pytest
import torch

from bagpipe.core.batch import Batch, DatasetSchema, batch_from_arrays, global_ids
from bagpipe.core.interface import ModelState, System, TrainContext
from bagpipe.training.local import LocalSystem
from baselines.het import HET
from baselines.het.cache import PushBatch
from baselines.het.roles import HetTrainer
from tests.conftest import TinySource, assert_states_close, equivalence_context

SCHEMA = DatasetSchema(
    name="het-two", num_dense=3, table_sizes=(30, 200, 8), feature_names=("a", "b", "c")
)
STEPS, BATCH = 6, 16
POLICIES = ["lru", "lfu", "lfuopt"]
EMBEDDING_LR = 8.0


class _HalvedSource(TinySource):
    """``TinySource`` whose first half of every batch (trainer 0's slice) uses only the lower half
    of each table's rows and the second half only the upper half."""

    def __getitem__(self, index: int) -> Batch:
        batch = super().__getitem__(index)
        ids = global_ids(batch, self.schema) - torch.as_tensor(self.schema.table_offsets)
        sizes = torch.tensor(self.schema.table_sizes)
        lower = sizes // 2
        upper_half = torch.arange(self.batch_size)[:, None] >= self.batch_size // 2
        halved = torch.where(upper_half, lower + ids % (sizes - lower), ids % lower)
        return batch_from_arrays(batch.dense_features, halved, batch.labels,
                                 self.schema.feature_names)


def _context(halved: bool) -> TrainContext:
    ctx = equivalence_context(SCHEMA, "dlrm", BATCH, STEPS, seed=11)
    ctx = dataclasses.replace(ctx, optim=dataclasses.replace(ctx.optim, embedding_lr=EMBEDDING_LR))
    if halved:
        ctx = dataclasses.replace(ctx, source=_HalvedSource(SCHEMA, BATCH, STEPS, seed=ctx.seed))
    return ctx


def _train(system: System, ctx: TrainContext) -> tuple[list[float], ModelState]:
    system.setup(ctx)
    losses = [system.train_step(step, ctx.source[step]).loss for step in range(STEPS)]
    return losses, system.full_state()


def _check_against_local(het: HET, halved: bool) -> dict:
    want_losses, want = _train(LocalSystem(), _context(halved))
    try:
        losses, got = _train(het, _context(halved))
        stats = het.stats()
    finally:
        het.close()
    assert losses == pytest.approx(want_losses, rel=1e-5, abs=1e-6)
    assert_states_close(got, want)
    assert stats["het_evictions_clean"] + stats["het_evictions_dirty"] + stats["het_not_admitted"] > 0
    assert 0 < stats["het_miss_rate"] < 1
    return stats


def test_the_halved_source_gives_the_trainers_disjoint_rows() -> None:
    source = _HalvedSource(SCHEMA, BATCH, STEPS, seed=11)
    for step in range(STEPS):
        ids = global_ids(source[step], SCHEMA)
        first, second = set(ids[: BATCH // 2].flatten().tolist()), set(ids[BATCH // 2 :].flatten().tolist())
        assert not first & second
        assert (ids >= torch.as_tensor(SCHEMA.table_offsets)).all()
        assert (ids < torch.as_tensor(SCHEMA.table_offsets) + torch.tensor(SCHEMA.table_sizes)).all()


@pytest.mark.parametrize("policy", POLICIES)
def test_asp_with_bound_2_and_evictions_equals_local_when_trainers_share_no_row(policy: str) -> None:
    het = HET(num_trainers=2, num_servers=2, bound=2, mode="asp", policy=policy,
              cache_rows_per_table=3)
    stats = _check_against_local(het, halved=True)
    assert stats["het_mode"] == "asp" and stats["het_bound"] == 2


@pytest.mark.parametrize("policy", POLICIES)
def test_bsp_with_bound_0_and_evictions_equals_local(policy: str) -> None:
    het = HET(num_trainers=2, num_servers=2, bound=0, mode="bsp", policy=policy,
              cache_rows_per_table=3)
    stats = _check_against_local(het, halved=False)
    # the trainers share rows: reads saw the other trainer's pushes and were refreshed
    assert sum(stats["het_staleness_hist"][1:]) > 0
    assert stats["het_evictions_dirty"] == 0  # bound 0: every line is pushed after every step


SEND_S = 0.05


class SlowSendingTrainer(HetTrainer):
    """A :class:`HetTrainer` whose every push takes ``SEND_S`` to send."""

    def _send_push(self, push: PushBatch) -> Future[None]:
        time.sleep(SEND_S)
        return super()._send_push(push)


class HETSlowSending(HET):
    """HET whose trainers are :class:`SlowSendingTrainer`."""

    trainer_class = SlowSendingTrainer


@pytest.mark.parametrize("mode", ["asp", "bsp"])
def test_sending_a_push_is_timed_as_sync_in_either_mode(mode: str) -> None:
    """The same rule as sync_ps's pushes and Bagpipe's sync-later all-reduce: a step's push is sync
    work whether the step waits for it (bsp) or only sends it (asp), never unexplained time."""
    het = HETSlowSending(num_trainers=2, num_servers=2, bound=2, mode=mode,
                         cache_rows_per_table=3)
    ctx = _context(halved=False)
    het.setup(ctx)
    try:
        records = [het.train_step(step, ctx.source[step]).record for step in range(STEPS)]
    finally:
        het.close()
    assert all(record.phase_s.get("sync", 0.0) >= SEND_S for record in records)
