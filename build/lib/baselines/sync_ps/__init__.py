"""``sync_ps``: the synchronous parameter-server baseline with no cache and no prefetch.

``trainer`` holds the trainer role, ``system`` the :class:`SyncPS` plugin (entry point ``sync_ps``),
``server`` the shards: the shared :class:`bagpipe.paramserver.EmbeddingServer` with each
step's pushes applied as one sum in trainer order (bit-reproducible).
"""

from baselines.sync_ps.system import SyncPS
from baselines.sync_ps.trainer import SyncPSTrainer

__all__ = ["SyncPS", "SyncPSTrainer"]
