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


def _local_on(source, model_name: str, tmp_path) -> tuple[list[float], ModelState]:
    local = LocalSystem()
    local.setup(_context(model_name, tmp_path))
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
