"""The parameter-server substrate: embedding-server shards, their layout, and the driver and trainer
base classes that ``sync_ps``, FAE, HET (and Bagpipe's server shards) are built from.

``layout`` says where each row lives (:class:`ShardLayout`); ``server`` holds the shard
(:class:`EmbeddingServer`, subclassed wherever a system adds server-side semantics); ``client`` the
trainer's side of it (:class:`ShardedTables`); ``system`` the driver and trainer that every
parameter-server system shares (:class:`ParameterServerSystem`, :class:`ParameterServerTrainer`).
"""

from bagpipe.paramserver.client import ShardedTables, wait_acks
from bagpipe.paramserver.layout import ShardLayout, server_role
from bagpipe.paramserver.server import EmbeddingServer, gather_rows, gather_tables, split_tables
from bagpipe.paramserver.system import ParameterServerSystem, ParameterServerTrainer

__all__ = [
    "EmbeddingServer",
    "ParameterServerSystem",
    "ParameterServerTrainer",
    "ShardLayout",
    "ShardedTables",
    "gather_rows",
    "gather_tables",
    "server_role",
    "split_tables",
    "wait_acks",
]
