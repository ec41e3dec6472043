"""FAE as a multi-process system: it must train exactly like ``local`` on the batches it runs.

FAE changes only *which examples share a batch* and where the rows live during a phase, so
``local`` trained on FAE's (re-packed) source is the reference, through every hot/cold swap.
"""

from __future__ import annotations

import pytest
import torch

from bagpipe.core.batch import DatasetSchema, global_ids
from bagpipe.core.interface import ModelState, TrainContext
from bagpipe.core.registry import load_system
from bagpipe.models import initial_tables, table_dim
from bagpipe.training.local import LocalSystem
from baselines.fae import FAE
from tests.conftest import TINY_MODEL, TinySource, assert_states_close, equivalence_context

SCHEMA = DatasetSchema(
    name="fae-eq", num_dense=3, table_sizes=(30, 200, 8), feature_names=("a", "b", "c")
)
BATCHES, BATCH = 8, 16


def _context(model_name: str, tmp_path) -> TrainContext:
    return equivalence_context(SCHEMA, model_name, BATCH, BATCHES, seed=7, workdir=tmp_path)


def _local_on(
    source, model_name: str, tmp_path, schema: DatasetSchema = SCHEMA
) -> tuple[list[float], ModelState]:
    local = LocalSystem()
    local.setup(equivalence_context(schema, model_name, BATCH, BATCHES, seed=7, workdir=tmp_path))
    losses = [local.train_step(step, source[step]).loss for step in range(len(source))]
    return losses, local.full_state()



def _budget_leaving_cold(rows_left_cold: int) -> int:
    """Bytes for every accessed row of the data but the ``rows_left_cold`` least accessed."""
    source = TinySource(SCHEMA, BATCH, BATCHES, seed=7)
    accessed = torch.unique(torch.cat([global_ids(b, SCHEMA).flatten() for b in source]))
    return (len(accessed) - rows_left_cold) * table_dim(TINY_MODEL) * 4


def test_registered_under_its_name() -> None:
    assert load_system("fae") is FAE
    assert FAE.reorders_samples
    with pytest.raises(ValueError, match=r"fae\.scheduler"):
        FAE(scheduler="random")


def test_every_row_hot_without_split_equals_local(tmp_path) -> None:
    """Budget over all rows (tiny tables are all hot anyway), original batches: all hot steps."""
    fae = FAE(num_trainers=2, num_servers=1, repack=False)
    ctx = _context("wdl", tmp_path)
    try:
        fae.setup(ctx)
        source = fae.prepare_dataset(ctx.source)
        losses = [fae.train_step(step, source[step]).loss for step in range(len(source))]
        got, stats = fae.full_state(), fae.stats()
    finally:
        fae.close()
    want_losses, want = _local_on(ctx.source, "wdl", tmp_path)
    assert losses == pytest.approx(want_losses, rel=1e-4, abs=1e-6)
    assert_states_close(got, want)
    assert stats["fae_hot_input_share"] == 1.0 and stats["fae_hot_steps"] == BATCHES
    assert stats["fae_swaps"] == 1  # the initial cold -> hot


def test_repacked_hot_and_cold_phases_equal_local_on_the_same_batches(tmp_path) -> None:
    model_name = "dcn"
    settings = {
        "sample_rate": 1.0,
        "min_table_bytes": 0,
        "hot_budget_bytes": _budget_leaving_cold(40),
        "threshold_mode": "code",
        "initial_rate": 50,
        "drop_last": True,
    }
    fae = FAE(num_trainers=2, num_servers=2, **settings)
    ctx = _context(model_name, tmp_path)
    try:
        fae.setup(ctx)
        source = fae.prepare_dataset(ctx.source)
        initial = fae.full_state()
        # a swap in and out without training round-trips the hot rows exactly
        fae._deployment.wait([t.rpc_async().swap("hot") for t in fae._trainers])
        fae._deployment.wait([t.rpc_async().swap("cold") for t in fae._trainers])
        round_trip = fae.full_state()
        losses = [fae.train_step(step, source[step]).loss for step in range(len(source))]
        got, stats = fae.full_state(), fae.stats()
    finally:
        fae.close()
    tables = initial_tables(SCHEMA, table_dim(ctx.model), ctx.seed)
    for name, table in tables.items():
        assert torch.equal(initial.tables[name], table)
        assert torch.equal(round_trip.tables[name], table)
    want_losses, want = _local_on(source, model_name, tmp_path)
    assert losses == pytest.approx(want_losses, rel=1e-4, abs=1e-6)
    assert_states_close(got, want)
    assert stats["fae_hot_steps"] > 0 and stats["fae_cold_steps"] > 0
    assert stats["fae_swaps"] >= 2 and 0 < stats["fae_hot_input_share"] < 1


#: One table over FAE's 1 MiB bar (70 000 rows of 4 floats), so the paper's threshold search runs
#: on it; the two others stay under it and are hot entirely.
LARGE = DatasetSchema(
    name="fae-paper", num_dense=3, table_sizes=(30, 70_000, 8), feature_names=("a", "b", "c")
)
#: Rows of the large table the budget leaves room for: fewer than it has accessed rows, more than
#: that less the small tables' rows (so their bytes must come out of the budget first).
ROOM_IN_LARGE = 30


def _paper_hot_rows(counts: torch.Tensor, room: int) -> set[int]:
    """The paper's pick, counted here without FAE's search: every row at or above the lowest
    access count whose rows (all of them, ties included) still fit ``room``."""
    taken: set[int] = set()
    for level in sorted(set(counts[counts > 0].tolist()), reverse=True):
        at_or_above = set(torch.nonzero(counts >= level).flatten().tolist())
        if len(at_or_above) > room:
            break
        taken = at_or_above
    return taken


def test_paper_mode_searches_the_threshold_on_a_large_table_and_trains_like_local(
    tmp_path,
) -> None:
    model_name = "dlrm"
    small_rows = LARGE.table_sizes[0] + LARGE.table_sizes[2]
    fae = FAE(num_trainers=2, num_servers=2, sample_rate=1.0, threshold_mode="paper",
              hot_budget_bytes=(small_rows + ROOM_IN_LARGE) * table_dim(TINY_MODEL) * 4,
              initial_rate=50, drop_last=True)
    ctx = equivalence_context(LARGE, model_name, BATCH, BATCHES, seed=7, workdir=tmp_path)
    try:
        fae.setup(ctx)
        source = fae.prepare_dataset(ctx.source)
        losses = [fae.train_step(step, source[step]).loss for step in range(len(source))]
        got, stats = fae.full_state(), fae.stats()
        hot = fae._require_layout().hot.rows
    finally:
        fae.close()
    # sampling every example: the counts are exact, Eq. 1's T_z * x is the number of examples
    offset, last = (int(o) for o in LARGE.table_offsets[1:])
    large_ids = torch.cat([global_ids(batch, LARGE)[:, 1] for batch in ctx.source])
    counts = torch.bincount(large_ids - offset, minlength=LARGE.table_sizes[1])
    want_large = _paper_hot_rows(counts, ROOM_IN_LARGE)
    assert 0 < len(want_large) < ROOM_IN_LARGE  # whole count levels: fewer rows than the room
    assert int((counts > 0).sum()) in range(ROOM_IN_LARGE + 1, ROOM_IN_LARGE + small_rows + 1)
    want = set(range(offset)) | {offset + row for row in want_large} | set(
        range(last, LARGE.total_rows))
    assert set(hot.tolist()) == want
    assert stats["fae_threshold_mode"] == "paper"
    # Eq. 1 with x = 1: hot when count >= t * N; t sits between the coldest hot and hottest cold
    cold = torch.ones_like(counts, dtype=torch.bool)
    cold[sorted(want_large)] = False
    hottest_cold, coldest_hot = int(counts[cold].max()), int(counts[~cold].min())
    assert hottest_cold / len(large_ids) < stats["fae_threshold"] <= coldest_hot / len(large_ids)
    assert list(stats["fae_hot_rows_per_table"].values()) == [30, len(want_large), 8]

    want_losses, want_state = _local_on(source, model_name, tmp_path, LARGE)
    assert losses == pytest.approx(want_losses, rel=1e-5, abs=1e-6)
    assert_states_close(got, want_state)
    assert stats["fae_hot_steps"] > 0 and stats["fae_cold_steps"] > 0
