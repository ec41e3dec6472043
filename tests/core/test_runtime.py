"""Runtime helpers: merged trainer records, failures outside a deployment, background threads."""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from bagpipe.core import runtime
from bagpipe.core.meter import Phase, StepRecord


def test_merged_records_sum_traffic_and_keep_trainer_0_phases() -> None:
    a = StepRecord(bytes_sent={"emb_pull": 10}, phase_s={str(Phase.FORWARD): 1.0})
    b = StepRecord(bytes_sent={"emb_pull": 5, "data": 1}, phase_s={str(Phase.FORWARD): 9.0})
    a.span_s, b.span_s = 1.5, 9.5
    merged = runtime.merge_trainer_records([a, b])
    assert merged.bytes_sent == {"emb_pull": 15, "data": 1}
    assert merged.phase_s == {"forward": 1.0}
    assert (merged.span_s, merged.slowest_span_s) == (1.5, 9.5)  # trainer 0's, the slowest's


def test_background_failure_outside_a_deployment_is_raised() -> None:
    runtime.init("trainer_0")
    with pytest.raises(ZeroDivisionError):
        runtime.report_failure(ZeroDivisionError("no deployment to report to"))


def test_a_background_thread_runs_below_its_processs_priority() -> None:
    """``start_thread(background=True)`` (Bagpipe's rounds) and a pool initialised with
    ``run_in_background`` (HET's channel) nice only their own thread."""
    def own_nice() -> int:
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    process_nice = own_nice()
    seen: dict[str, int] = {}
    for name, background in (("fore", False), ("back", True)):
        thread = runtime.start_thread(lambda n=name: seen.__setitem__(n, own_nice()), name,
                                      background=background)
        thread.join(5)
    with ThreadPoolExecutor(1, initializer=runtime.run_in_background) as pool:
        seen["pool"] = pool.submit(own_nice).result()
    assert seen == {"fore": process_nice, "back": process_nice + runtime.BACKGROUND_NICE,
                    "pool": process_nice + runtime.BACKGROUND_NICE}
    assert own_nice() == process_nice  # the caller's own thread untouched
