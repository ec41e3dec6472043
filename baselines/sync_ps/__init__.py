"""``sync_ps``: the synchronous parameter-server baseline with no cache and no prefetch.

``trainer`` holds the trainer role, ``system`` the :class:`SyncPS` plugin (entry point ``sync_ps``).
Embedding-server shards are the shared :class:`bagpipe.core.embedding_server.EmbeddingServer`.
"""

from baselines.sync_ps.system import SyncPS
from baselines.sync_ps.trainer import SyncPSTrainer

__all__ = ["SyncPS", "SyncPSTrainer"]
