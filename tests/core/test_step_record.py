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
