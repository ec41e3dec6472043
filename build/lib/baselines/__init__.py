"""The systems Bagpipe is measured against, each a plugin behind ``bagpipe.core.System``.

``sync_ps`` (synchronous parameter server, no cache, no prefetch), ``fae`` (hot-embedding data
layout), ``het`` (per-worker cache with bounded staleness) and ``torchrec_sharding``
(DistributedModelParallel). Each registers under the ``bagpipe.systems`` entry-point group.
"""
