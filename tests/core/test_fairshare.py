"""The model back-end's NICs: concurrent transfers share a NIC as TCP flows do (max-min fair), not
first come, first served; flows on different NICs do not slow each other; processes share one
state. Payloads are sized so each transfer takes a tenth of a second: scheduling noise on a loaded
2-core machine stays small beside it."""

from __future__ import annotations

import multiprocessing
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from bagpipe.core.net.fairshare import SharedNics
from bagpipe.core.net.topology import Nic
from bagpipe.core.roles.spawn import role_context

MB = 1_000_000
RATE = 0.08  # Gbps: 10 MB/s, so 1 MB takes 0.1 s
ONE_S = MB / (RATE * 1e9 / 8)


def _nics(**ingress_gbps: float) -> SharedNics:
    hosts = {h: Nic(RATE, ingress_gbps.get(h, RATE), 0.0) for h in ("a", "b", "c", "d")}
    return SharedNics(hosts, multiprocessing.get_context("fork"))


def _concurrently(*calls: Callable[[], float]) -> tuple[float, list[float]]:
    """Run ``calls`` at once; the wall time and each call's own time."""
    results: list[float] = [0.0] * len(calls)

    def run(k: int) -> None:
        results[k] = calls[k]()

    threads = [threading.Thread(target=run, args=(k,)) for k in range(len(calls))]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - start, results


def test_one_flow_takes_bytes_over_the_rate() -> None:
    nics = _nics()
    took = nics.transfer("a", [("b", MB)])
    assert ONE_S <= took < 1.3 * ONE_S


def test_two_flows_leaving_one_nic_share_it_and_take_the_sum() -> None:
    nics = _nics()
    wall, each = _concurrently(lambda: nics.transfer("a", [("b", MB)]),
                               lambda: nics.transfer("a", [("c", MB)]))
    assert 2 * ONE_S <= wall < 2.4 * ONE_S
    assert all(t >= 1.9 * ONE_S for t in each)  # fair: neither is served first


def test_a_short_flow_beside_a_long_one_finishes_first_then_the_long_one_speeds_up() -> None:
    nics = _nics()
    _, (long_s, short_s) = _concurrently(lambda: nics.transfer("a", [("b", MB)]),
                                            lambda: nics.transfer("a", [("c", MB / 2)]))
    assert 1.0 * ONE_S <= short_s < 1.25 * ONE_S  # half the NIC for 0.5 MB
    assert 1.5 * ONE_S <= long_s < 1.8 * ONE_S  # the sum of both, not twice the long one


def test_flows_on_different_nics_do_not_slow_each_other() -> None:
    nics = _nics()
    wall, _ = _concurrently(lambda: nics.transfer("a", [("b", MB)]),
                            lambda: nics.transfer("c", [("d", MB)]))
    assert ONE_S <= wall < 1.4 * ONE_S


def test_the_bottleneck_gives_its_leftover_to_the_other_flow() -> None:
    # b receives at a quarter of the rate: a -> b gets 1/4 and a -> c takes the other 3/4.
    nics = _nics(b=RATE / 4)
    _, (to_b, to_c) = _concurrently(lambda: nics.transfer("a", [("b", MB / 4)]),
                                    lambda: nics.transfer("a", [("c", 3 * MB / 4)]))
    # (the two threads start a moment apart on a busy host; whichever starts first has the NIC to
    # itself that long, so it may finish a little early: alone, a -> c would take 3/4 of ONE_S)
    assert 0.95 * ONE_S <= to_b < 1.3 * ONE_S and 0.95 * ONE_S <= to_c < 1.3 * ONE_S


def _send_from(nics: SharedNics, src: str, ready: Any, out: multiprocessing.Queue) -> None:
    ready.wait()  # both processes start their transfer together
    out.put(nics.transfer(src, [("c", MB)]))


@pytest.mark.timeout(120)
def test_processes_share_one_nic_state() -> None:
    ctx = role_context()  # the processes roles run in
    nics = SharedNics({h: Nic(RATE, RATE, 0.0) for h in ("a", "b", "c")}, ctx)
    out, ready = ctx.Queue(), ctx.Barrier(2)
    procs = [ctx.Process(target=_send_from, args=(nics, src, ready, out)) for src in ("a", "b")]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(90)
    took = sorted(out.get(timeout=5) for _ in procs)
    assert all(1.9 * ONE_S <= t < 2.5 * ONE_S for t in took), took  # c's ingress was shared
