"""FAE (VLDB'22): hot-embedding aware data layout.

``hotset`` (sampled access counts, threshold search / top-N under a budget), ``layout`` (input
classification, re-packing into all-hot and all-cold mini-batches, the cached plan) and
``scheduler`` (the Shuffle Scheduler) are the offline and scheduling logic; ``roles`` (trainers
with a hot-row replica, over the shared embedding-server shards) and ``system`` (the :class:`FAE`
plugin, entry point ``fae``) run them as processes.
"""

from baselines.fae.hotset import HotSet, choose_hot_rows, sample_access_counts
from baselines.fae.layout import (
    FaeLayout,
    FaeSettings,
    FaeSource,
    build_layout,
    cached_layout,
)
from baselines.fae.scheduler import ShuffleScheduler
from baselines.fae.system import FAE

__all__ = [
    "FAE",
    "FaeLayout",
    "FaeSettings",
    "FaeSource",
    "HotSet",
    "ShuffleScheduler",
    "build_layout",
    "cached_layout",
    "choose_hot_rows",
    "sample_access_counts",
]
