"""HET as a multi-process system: equivalence with ``local`` where HET's semantics promise it."""

from __future__ import annotations

import dataclasses

import pytest

from bagpipe.core.batch import DatasetSchema
from bagpipe.core.interface import ModelState, System, TrainContext
from bagpipe.core.net import NetworkConfig, Topology
from bagpipe.core.registry import load_system
from bagpipe.training.local import LocalSystem
from baselines.het import HET
from tests.conftest import assert_states_close, equivalence_context

SCHEMA = DatasetSchema(
    name="het-eq", num_dense=3, table_sizes=(30, 200, 8), feature_names=("a", "b", "c")
)
STEPS, BATCH = 8, 16


def _context(model_name: str) -> TrainContext:
    return equivalence_context(SCHEMA, model_name, BATCH, STEPS, seed=5)


def _train(system: System, ctx: TrainContext) -> list[float]:
    system.setup(ctx)
    return [system.train_step(step, ctx.source[step]).loss for step in range(STEPS)]


def _local(model_name: str) -> tuple[list[float], ModelState]:
    local = LocalSystem()
    losses = _train(local, _context(model_name))
    return losses, local.full_state()



def test_registered_under_its_name() -> None:
    assert load_system("het") is HET


def test_bound0_bsp_full_cache_equals_local_with_two_trainers() -> None:
    want_losses, want = _local("dlrm")
    het = HET(num_trainers=2, num_servers=2, bound=0, mode="bsp", cache_fraction=1.0, policy="lru")
    try:
        losses = _train(het, _context("dlrm"))
        got = het.full_state()
        stats = het.stats()
    finally:
        het.close()
    assert losses == pytest.approx(want_losses, rel=1e-4, abs=1e-6)
    assert_states_close(got, want)
    # both trainers touch the hot rows, so reads saw the other worker's pushes and refreshed
    assert sum(stats["het_staleness_hist"][1:]) > 0
    assert stats["het_evictions_clean"] == stats["het_evictions_dirty"] == 0


def test_one_worker_with_prefetch_small_cache_and_stale_bound_equals_local() -> None:
    """One worker never reads another's writes: with prefetch, evictions and a bound of 2 its
    reads still see all its own updates, so it must train exactly like ``local``."""
    model_name = "deepfm"
    want_losses, want = _local(model_name)
    het = HET(num_trainers=1, num_servers=2, bound=2, policy="lfu", cache_rows_per_table=6)
    try:
        losses = _train(het, _context(model_name))
        got = het.full_state()
        stats = het.stats()
    finally:
        het.close()
    assert losses == pytest.approx(want_losses, rel=1e-4, abs=1e-6)
    assert_states_close(got, want)
    assert stats["het_evictions_dirty"] > 0 and 0 < stats["het_miss_rate"] < 1


def test_bytes_do_not_depend_on_when_the_channel_runs() -> None:
    """The channel thread pulls step i+1's rows and pushes step i's deltas while step i computes;
    on a slow network they finish a step later. The bytes are the same either way: every request
    and push in the step that sent it, every reply in the step it arrived in, so the run's total
    is the same up to the one prefetch still in flight after the last step. (One worker: with two,
    the rows a reply carries depend on how the workers' pulls and pushes interleave.)"""
    records = []
    slow = NetworkConfig("model", Topology.uniform(0.01, latency_us=30_000))
    for network in (NetworkConfig(), slow):
        ctx = dataclasses.replace(_context("dlrm"), network=network)
        het = HET(num_trainers=1, num_servers=2, bound=2, policy="lru", cache_rows_per_table=6)
        try:
            het.setup(ctx)
            records.append(
                [het.train_step(step, ctx.source[step]).record.bytes_sent for step in range(STEPS)]
            )
        finally:
            het.close()
    kinds = {kind for run in records for step in run for kind in step}
    totals = [{k: sum(step.get(k, 0) for step in run) for k in kinds} for run in records]
    # at most one reply (pull rows + its metadata) is still in flight after the last step
    in_flight = max(step.get("emb_pull", 0) + step.get("emb_meta", 0) for run in records
                    for step in run)
    for kind in kinds:
        assert abs(totals[0][kind] - totals[1][kind]) <= (in_flight if kind != "emb_push" else 0)
    assert totals[0]["emb_pull"] > 0 and totals[0]["emb_push"] > 0
