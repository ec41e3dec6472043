"""The oracle cacher: plans which rows each Bagpipe trainer prefetches, evicts and synchronises.

``plan`` holds the contract (``StepPlan``, ``RoundPlan``, ``CapacityError``); ``config`` the knobs;
``cacher`` the fast streaming planner (``OracleCacher``); ``reference`` a slow set-based planner that is the executable specification.
"""

from bagpipe.oracle.cacher import OracleCacher
from bagpipe.oracle.config import OracleConfig
from bagpipe.oracle.plan import CapacityError, RoundPlan, StepPlan
from bagpipe.oracle.reference import plan_reference
from bagpipe.oracle.stats import OracleStats

__all__ = [
    "CapacityError",
    "OracleCacher",
    "OracleConfig",
    "OracleStats",
    "RoundPlan",
    "StepPlan",
    "plan_reference",
]
