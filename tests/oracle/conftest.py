"""The planners under test: each takes ``([B, F] global-id matrices, OracleConfig)`` and returns
``(plans in consumption order, OracleStats)``."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pytest

from bagpipe.oracle import OracleConfig, OracleStats, RoundPlan, StepPlan, plan_reference

Planner = Callable[
    [Sequence[np.ndarray], OracleConfig], tuple[list[StepPlan | RoundPlan], OracleStats]
]

PLANNERS: dict[str, Planner] = {"reference": plan_reference}


@pytest.fixture(params=sorted(PLANNERS))
def planner(request: pytest.FixtureRequest) -> Planner:
    return PLANNERS[request.param]
