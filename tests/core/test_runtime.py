"""Runtime helpers: merged trainer records, and failures outside a deployment."""

from __future__ import annotations

import pytest

from bagpipe.core import runtime
from bagpipe.core.meter import Phase, StepRecord


def test_merged_records_sum_traffic_and_keep_trainer_0_phases() -> None:
    a = StepRecord(bytes_sent={"emb_pull": 10}, phase_s={str(Phase.FORWARD): 1.0})
    b = StepRecord(bytes_sent={"emb_pull": 5, "data": 1}, phase_s={str(Phase.FORWARD): 9.0})
    merged = runtime.merge_trainer_records([a, b])
    assert merged.bytes_sent == {"emb_pull": 15, "data": 1}
    assert merged.phase_s == {"forward": 1.0}


def test_background_failure_outside_a_deployment_is_raised() -> None:
    runtime.init("trainer_0")
    with pytest.raises(ZeroDivisionError):
        runtime.report_failure(ZeroDivisionError("no deployment to report to"))
