"""HET (VLDB'22): a per-worker embedding cache with per-row version clocks (bounded staleness).

``policies`` (LRU, LFU, LFUOpt), ``cache`` (the worker's :class:`HetCache`) and ``clocks`` (the
server's pull rule and additive pushes) are pure logic; ``roles`` (server shards, trainers) and
``system`` (the :class:`HET` plugin, entry point ``het``) run them as processes.
"""

from baselines.het.cache import HetCache, PullReply, PullRequest, PushBatch, table_capacities
from baselines.het.clocks import VersionedRows, stale_mask
from baselines.het.policies import LFUOptPolicy, LFUPolicy, LRUPolicy, make_policy
from baselines.het.roles import HetSettings
from baselines.het.system import HET

__all__ = [
    "HET",
    "HetCache",
    "HetSettings",
    "LFUOptPolicy",
    "LFUPolicy",
    "LRUPolicy",
    "PullReply",
    "PullRequest",
    "PushBatch",
    "VersionedRows",
    "make_policy",
    "stale_mask",
    "table_capacities",
]
