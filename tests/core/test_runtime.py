"""Runtime helpers: the link model's delays on the sender, and exact byte counts in the Meter."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from bagpipe.core import runtime
from bagpipe.core.link import LinkConfig
from bagpipe.core.meter import LinkKind, Phase, StepRecord

# Slow link, long transfers: timing noise on a loaded 2-core machine stays small beside them.
SLOW = LinkConfig(bandwidth_gbps=0.2, latency_us=0.0)
PAYLOAD = torch.zeros(625_000, dtype=torch.float32)  # 2.5 MB = 0.1 s at 0.2 Gbit/s
PAYLOAD_S = PAYLOAD.numel() * 4 * 8 / 0.2e9


@pytest.fixture(autouse=True)
def _fresh_runtime() -> None:
    runtime.init("trainer_0", SLOW)


def test_transfer_takes_at_least_bytes_over_bandwidth_and_counts_exact_bytes() -> None:
    ids = torch.arange(10)
    start = time.perf_counter()
    held_s = runtime.transfer("server_0", LinkKind.EMB_PUSH, ids, PAYLOAD, rows=10)
    elapsed_s = time.perf_counter() - start
    assert elapsed_s >= held_s >= (ids.numel() * 8 + PAYLOAD.numel() * 4) * 8 / 0.2e9
    record = runtime.current().meter.end_step()
    assert record.bytes_sent == {"emb_push": 80 + 2_500_000}
    assert record.rows_sent == {"emb_push": 10}


def test_two_concurrent_transfers_on_one_link_take_twice_as_long() -> None:
    def send() -> None:
        runtime.delay("server_0", PAYLOAD)

    threads = [threading.Thread(target=send) for _ in range(2)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed_s = time.perf_counter() - start
    assert elapsed_s >= 2 * PAYLOAD_S
    assert elapsed_s < 4 * PAYLOAD_S  # serialised, not worse


def test_sends_to_different_roles_overlap() -> None:
    start = time.perf_counter()
    runtime.delay_parallel([("server_0", [PAYLOAD]), ("server_1", [PAYLOAD])])
    elapsed_s = time.perf_counter() - start
    assert PAYLOAD_S <= elapsed_s < 1.6 * PAYLOAD_S


def test_charge_counts_without_delay_and_delay_without_count() -> None:
    start = time.perf_counter()
    assert runtime.charge(LinkKind.DATA, PAYLOAD, torch.ones(3, dtype=torch.int64)) == 2_500_024
    assert time.perf_counter() - start < PAYLOAD_S / 2
    runtime.delay("server_0", torch.ones(4))
    assert runtime.current().meter.end_step().bytes_sent == {"data": 2_500_024}


def test_link_model_off_costs_nothing() -> None:
    runtime.init("trainer_0", LinkConfig(enabled=False))
    start = time.perf_counter()
    runtime.transfer("server_0", LinkKind.EMB_PULL, PAYLOAD)
    assert time.perf_counter() - start < PAYLOAD_S / 2


def test_merged_records_sum_traffic_and_keep_trainer_0_phases() -> None:
    a = StepRecord(bytes_sent={"emb_pull": 10}, phase_s={str(Phase.FORWARD): 1.0})
    b = StepRecord(bytes_sent={"emb_pull": 5, "data": 1}, phase_s={str(Phase.FORWARD): 9.0})
    merged = runtime.merge_trainer_records([a, b])
    assert merged.bytes_sent == {"emb_pull": 15, "data": 1}
    assert merged.phase_s == {"forward": 1.0}


def test_background_failure_outside_a_deployment_is_raised() -> None:
    with pytest.raises(ZeroDivisionError):
        runtime.report_failure(ZeroDivisionError("no deployment to report to"))
