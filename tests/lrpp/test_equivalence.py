"""THE key test: Bagpipe (T=2 trainers, S=2 server shards, oracle, LRPP caches) trains exactly like
``local`` with plain SGD, past several lease expiries, evictions, write-backs and refetches; so does
each ablation of it (``sync_later``, ``prefetch``, ``partition`` off), whose Meter shows the cost it
moves."""

from __future__ import annotations

from typing import Any

import pytest

from bagpipe.core.batch import DatasetSchema
from bagpipe.core.interface import ModelState, System, TrainContext
from bagpipe.core.registry import load_system
from bagpipe.lrpp import Bagpipe
from bagpipe.training.local import LocalSystem
from tests.conftest import assert_states_close, equivalence_context

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


def _total(stats: dict[str, Any], key: str) -> float:
    """A run's total of a Meter key (0 when no step counted it)."""
    return float(stats.get(f"total_{key}", 0.0))


def _bagpipe_vs_local(
    model_name: str, capacity: int | None = None, **design: bool
) -> dict[str, Any]:
    """Train ``local`` and Bagpipe on the same stream, assert the same model, return Bagpipe's stats."""
    ctx = _context(model_name)
    local_losses, local = _train(LocalSystem(), ctx)
    want = local.full_state()
    bagpipe = Bagpipe(
        num_trainers=2, num_servers=2, lookahead=LOOKAHEAD, cache_capacity=capacity, **design
    )
    try:
        losses, _ = _train(bagpipe, _context(model_name))
        got = bagpipe.full_state()
        stats = bagpipe.stats()
    finally:
        bagpipe.close()
    assert losses == pytest.approx(local_losses, rel=1e-4, abs=1e-6)
    assert_states_close(got, want)
    # The run really exercised the cache: rows were written back and fetched again.
    assert stats["total_rows_written_back"] > 0
    fetched = _total(stats, "rows_prefetched") + _total(stats, "rows_fetched_on_demand")
    assert fetched > stats["total_rows_written_back"] / 2
    assert 0.0 < stats["total_hit_rate"] < 1.0
    return stats


@pytest.fixture(scope="module")
def full_design_stats() -> dict[str, Any]:
    """The paper's design on DLRM, unbounded cache: the baseline every ablation is compared with."""
    return _bagpipe_vs_local("dlrm")


def test_bagpipe_matches_local(full_design_stats: dict[str, Any]) -> None:
    stats = full_design_stats
    assert stats["total_rows_singleton"] > 0
    assert stats["total_allreduce_bytes_later"] > 0
    assert _total(stats, "rows_fetched_on_demand") == 0.0


@pytest.mark.parametrize(("model_name", "capacity"), [("wdl", None), ("dlrm", TIGHT_CAPACITY)])
def test_bagpipe_matches_local_other_model_and_tight_cache(
    model_name: str, capacity: int | None
) -> None:
    stats = _bagpipe_vs_local(model_name, capacity)
    assert stats["total_rows_singleton"] > 0
    if capacity is not None:  # the window did not fit: Belady's rule chose what to keep
        assert stats["oracle_capacity_evictions"] > 0


@pytest.mark.parametrize("knob", ["sync_later", "prefetch", "partition"])
def test_ablation_matches_local_and_moves_its_cost(
    knob: str, full_design_stats: dict[str, Any]
) -> None:
    """Each ablation trains the same model; its Meter shows where the cost went (same stream)."""
    full = full_design_stats
    stats = _bagpipe_vs_local("dlrm", **{knob: False})
    assert stats[knob] == 0.0
    rows = full["total_rows_sync_now"] + full["total_rows_sync_later"]
    if knob == "sync_later":  # the later rows join the critical all-reduce; nothing overlaps
        assert _total(stats, "allreduce_bytes_later") == 0.0
        assert _total(stats, "rows_sync_later") == 0.0
        assert _total(stats, "rows_sync_now") == rows
        assert _total(stats, "allreduce_bytes_critical") > _total(full, "allreduce_bytes_critical")
        assert _total(stats, "bytes_allreduce") == _total(full, "bytes_allreduce")
    elif knob == "prefetch":  # the same rows come from the servers, but on the critical path
        assert _total(stats, "rows_prefetched") == 0.0 and _total(stats, "prefetch_s") == 0.0
        assert _total(stats, "rows_fetched_on_demand") == _total(full, "rows_prefetched")
        assert _total(stats, "bytes_emb_pull") == _total(full, "bytes_emb_pull")
        assert _total(stats, "time_fetch_wait_s") > 0.0
    else:  # singletons are all-reduced, and fetched by every trainer
        assert _total(stats, "rows_singleton") == 0.0
        assert _total(stats, "rows_sync_now") + _total(stats, "rows_sync_later") > rows
        assert _total(stats, "bytes_allreduce") > _total(full, "bytes_allreduce")
        assert _total(stats, "rows_prefetched") > _total(full, "rows_prefetched")


def _local_and_probe(**probe: bool) -> tuple[ModelState, ModelState, dict[str, Any]]:
    """``local``'s final model on DLRM, and a Bagpipe timing probe's (``probe``: its knob) with
    its stats, on the same stream."""
    _, local = _train(LocalSystem(), _context("dlrm"))
    system = Bagpipe(num_trainers=2, num_servers=2, lookahead=LOOKAHEAD, **probe)
    try:
        _train(system, _context("dlrm"))
        return local.full_state(), system.full_state(), system.stats()
    finally:
        system.close()


def test_the_row_sync_probe_moves_no_row_between_trainers_and_is_not_exact(
    full_design_stats: dict[str, Any]
) -> None:
    """``row_sync=False`` (``suite=bound_split``'s probe): the oracle's plans, the fetches and the
    dense all-reduce are the design's, no row rides in any collective, and since each trainer
    applies only its own gradients to shared rows, the model is not ``local``'s."""
    want, got, stats = _local_and_probe(row_sync=False)
    full = full_design_stats
    assert stats["row_sync"] == 0.0
    dense_bytes = sum(t.numel() * t.element_size() for t in want.dense.values())
    assert _total(stats, "allreduce_bytes_later") == 0.0
    assert _total(stats, "allreduce_bytes_critical") == 2 * STEPS * dense_bytes  # 2 trainers
    assert _total(full, "allreduce_bytes_critical") > 2 * STEPS * dense_bytes
    assert _total(stats, "bytes_emb_pull") == _total(full, "bytes_emb_pull")
    assert _total(stats, "rows_prefetched") == _total(full, "rows_prefetched")
    with pytest.raises(AssertionError):
        assert_states_close(got, want)


def test_the_row_layout_probe_runs_the_designs_collectives_with_nothing_in_them(
    full_design_stats: dict[str, Any]
) -> None:
    """``row_layout=False`` (``suite=bound_split``'s second probe): every collective of row
    synchronisation is the design's, at the same sizes, on the same steps, but carries zeros, so
    shared rows never learn and the model is not ``local``'s."""
    want, got, stats = _local_and_probe(row_layout=False)
    full = full_design_stats
    assert stats["row_layout"] == 0.0 and stats["row_sync"] == 1.0
    for moved in ("allreduce_bytes_critical", "allreduce_bytes_later", "bytes_allreduce",
                  "rows_sync_now", "rows_sync_later", "rows_singleton", "rows_prefetched"):
        assert _total(stats, moved) == _total(full, moved) > 0, moved
    with pytest.raises(AssertionError):
        assert_states_close(got, want)


@pytest.mark.parametrize("probe", ["row_sync", "row_layout"])
def test_a_probe_refuses_standbys(probe: str) -> None:
    with pytest.raises(ValueError, match=rf"system\.{probe}=false.*system\.standby_trainers"):
        Bagpipe(**{probe: False}, standby_trainers=1)


def test_the_layout_probe_needs_row_sync() -> None:
    with pytest.raises(ValueError, match=r"system\.row_layout=false needs system\.row_sync=true"):
        Bagpipe(row_sync=False, row_layout=False)


class _FinalState:
    """Runner callback: the system's state when the run ends (before the runner closes it)."""

    def __init__(self, system: System) -> None:
        self.system = system
        self.state: Any = None

    def on_run_end(self, result: object) -> None:
        self.state = self.system.full_state()


def test_runs_longer_than_the_source_plan_every_epoch() -> None:
    """The runner trains ``source[step % len]`` past the end of its source; the oracle must plan
    that same wrapped stream (it used to stop at the source's end and leave trainers waiting)."""
    from bagpipe.harness.run.runner import RunConfig, run_training

    cfg = RunConfig(num_steps=2 * 6 + 3, eval_every=0, warmup_steps=0, progress=False)
    eval_source = equivalence_context(SCHEMA, "dlrm", BATCH, 1, seed=9).source
    finals = []
    for system in (LocalSystem(), Bagpipe(num_trainers=2, num_servers=2, lookahead=4)):
        final = _FinalState(system)
        ctx = equivalence_context(SCHEMA, "dlrm", BATCH, 6, seed=3)  # 6 batches, 15 steps
        run_training(system, ctx, eval_source, cfg, [final])
        finals.append(final.state)
    want, got = finals
    assert_states_close(got, want)
