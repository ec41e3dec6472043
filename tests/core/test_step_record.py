"""The Meter's records: exact counting, merging across roles, flat export."""

from __future__ import annotations

import time

import torch

from bagpipe.core.meter import LinkKind, Meter, Phase, StepRecord


def test_traffic_counts_are_the_tensor_sizes() -> None:
    meter = Meter()
    rows = torch.zeros(37, 16, dtype=torch.float32)
    meter.add_traffic(LinkKind.EMB_PULL, rows.numel() * rows.element_size(), rows=37)
    meter.add_traffic(LinkKind.EMB_PULL, 8, rows=1)
    record = meter.end_step()
    assert record.bytes_sent == {"emb_pull": 37 * 16 * 4 + 8}
    assert record.rows_sent == {"emb_pull": 38}


def test_end_step_starts_a_fresh_iteration() -> None:
    meter = Meter()
    meter.add_cache(hits=3, misses=1)
    first = meter.end_step()
    second = meter.end_step()
    assert first.hit_rate == 0.75
    assert second.hit_rate is None
    assert meter.records == [first, second]


def test_phase_timer_measures_wall_time() -> None:
    meter = Meter()
    with meter.phase(Phase.FORWARD):
        time.sleep(0.02)
    assert meter.end_step().phase_s["forward"] >= 0.02


def test_a_phases_cpu_is_its_threads_work_not_its_waiting() -> None:
    meter = Meter()
    with meter.phase(Phase.SYNC):
        time.sleep(0.05)
    with meter.phase(Phase.FORWARD):
        until = time.thread_time() + 0.05
        while time.thread_time() < until:
            pass
    record = meter.end_step()
    assert record.phase_cpu_s["sync"] < 0.01 < 0.05 <= record.phase_s["sync"]
    assert 0.05 <= record.phase_cpu_s["forward"] <= record.phase_s["forward"]


def test_the_span_runs_from_the_first_phase_to_the_end_of_the_step() -> None:
    """Time between phases is in the span and in no phase; time before the first phase (waiting
    for the step to arrive) is in neither."""
    meter = Meter()
    time.sleep(0.05)  # before the step: not the role's
    with meter.phase(Phase.FETCH_WAIT):
        time.sleep(0.02)
    time.sleep(0.03)  # between phases
    meter.add_phase_time(Phase.FORWARD, 0.0)
    record = meter.end_step()
    between_s = record.span_s - sum(record.phase_s.values())
    assert 0.05 <= record.span_s < 0.09
    assert 0.03 <= between_s < 0.06
    assert meter.end_step().span_s == 0.0  # no phase, no span


def test_records_of_two_roles_sum() -> None:
    a = StepRecord(bytes_sent={"emb_pull": 10}, cache_hits=1, counters={"rows_sync_now": 2})
    b = StepRecord(bytes_sent={"emb_pull": 5, "allreduce": 7}, cache_misses=1)
    total = a + b
    assert total.bytes_sent == {"emb_pull": 15, "allreduce": 7}
    assert total.total_bytes == 22
    assert total.hit_rate == 0.5
    assert total.flat()["rows_sync_now"] == 2


def test_total_over_iterations() -> None:
    meter = Meter()
    for _ in range(3):
        meter.add_traffic(LinkKind.ALLREDUCE, 100)
        meter.end_step()
    assert meter.total().bytes_sent == {"allreduce": 300}


def test_sums_and_flat_export_by_value() -> None:
    a = StepRecord(bytes_sent={"emb_pull": 10}, rows_sent={"emb_pull": 2}, phase_s={"forward": 0.5},
                   phase_cpu_s={"forward": 0.25}, cache_hits=3, cache_misses=1,
                   counters={"rows_sync_now": 2.0})
    b = StepRecord(bytes_sent={"emb_push": 4}, rows_sent={"emb_pull": 5, "emb_push": 1},
                   phase_s={"forward": 0.25}, phase_cpu_s={"forward": 0.125}, cache_hits=1,
                   cache_misses=3)
    assert (a + b).flat() == {
        "bytes_emb_pull": 10.0, "bytes_emb_push": 4.0,
        "rows_emb_pull": 7.0, "rows_emb_push": 1.0,
        "time_forward_s": 0.75, "cpu_forward_s": 0.375,
        "rows_sync_now": 2.0,
        "cache_hits": 4.0, "cache_misses": 4.0, "hit_rate": 0.5,
    }
    # no lookup: no cache columns at all (a system without a cache)
    assert StepRecord(bytes_sent={"allreduce": 8}).flat() == {"bytes_allreduce": 8.0}


def test_the_meter_accumulates_within_a_step() -> None:
    meter = Meter()
    meter.add_traffic(LinkKind.ALLREDUCE, 100)  # no rows: no rows column
    meter.add_cache(hits=2, misses=1)
    meter.add_cache(hits=4, misses=1)
    meter.count("rows_sync_now")
    meter.count("rows_sync_now")
    meter.count("rows_sync_now", 2.5)
    meter.add_phase_time(Phase.FORWARD, 0.25)
    meter.add_phase_time(Phase.FORWARD, 0.5)
    record = meter.end_step()
    assert record.rows_sent == {}
    assert (record.cache_hits, record.cache_misses) == (6, 2)
    assert record.counters == {"rows_sync_now": 4.5}
    assert record.phase_s["forward"] == 0.75
