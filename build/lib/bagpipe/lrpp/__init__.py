"""Bagpipe's training system (SOSP'23): LRPP trainer caches driven by the oracle, disaggregated roles.

``system`` is the plugin (:class:`Bagpipe`, entry point ``bagpipe``) and its driver; the roles it
deploys are ``oracle_role`` (the oracle cacher's process, :class:`OracleRole`), ``server`` (the
embedding-server shards with the per-round read-after-write barrier, :class:`BagpipeServerShard`)
and ``trainer`` (:class:`BagpipeTrainer`: the critical path and the cache rounds behind it), whose
``cache`` is the logically replicated, physically partitioned trainer cache
(:class:`TrainerCache`). The planner itself, importable on its own, is ``bagpipe.oracle``.
"""

from bagpipe.lrpp.cache import CacheError, TrainerCache
from bagpipe.lrpp.oracle_role import OracleRole
from bagpipe.lrpp.server import BagpipeServerShard
from bagpipe.lrpp.system import Bagpipe
from bagpipe.lrpp.trainer import BagpipeTrainer, Design, reclassify

__all__ = [
    "Bagpipe",
    "BagpipeServerShard",
    "BagpipeTrainer",
    "CacheError",
    "Design",
    "OracleRole",
    "TrainerCache",
    "reclassify",
]
