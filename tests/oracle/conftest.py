"""The planners under test: each takes ``([B, F] global-id matrices, OracleConfig)`` and returns
``(plans in consumption order, OracleStats)``."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pytest

from bagpipe.core.batch import DatasetSchema
from bagpipe.oracle import (
    OracleCacher,
    OracleConfig,
    OracleStats,
    RoundPlan,
    StepPlan,
    plan_reference,
)

Plans = list[StepPlan | RoundPlan]
Planner = Callable[[Sequence[np.ndarray], OracleConfig], tuple[Plans, OracleStats]]


def plan_fast(matrices: Sequence[np.ndarray], config: OracleConfig) -> tuple[Plans, OracleStats]:
    cacher = OracleCacher(None, config)
    return list(cacher.plan(matrices)), cacher.stats


def plan_fast_with_tables(
    matrices: Sequence[np.ndarray],
    config: OracleConfig,
    table_sizes: Sequence[int],
    direct_rows_max: int,
) -> tuple[Plans, OracleStats]:
    """The fast planner told each column's table: tables up to ``direct_rows_max`` rows skip the hash."""
    schema = DatasetSchema(
        "test", 0, tuple(table_sizes), tuple(f"f{i}" for i in range(len(table_sizes)))
    )
    cacher = OracleCacher(schema, config, direct_rows_max=direct_rows_max)
    return list(cacher.plan(matrices)), cacher.stats


PLANNERS: dict[str, Planner] = {"reference": plan_reference, "fast": plan_fast}


@pytest.fixture(params=sorted(PLANNERS))
def planner(request: pytest.FixtureRequest) -> Planner:
    return PLANNERS[request.param]
