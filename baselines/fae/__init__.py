"""FAE (VLDB'22): hot-embedding aware data layout.

``hotset`` (sampled access counts, threshold search / top-N under a budget), ``layout`` (input
classification, re-packing into all-hot and all-cold mini-batches, the cached plan) and
``scheduler`` (the Shuffle Scheduler) are the offline and scheduling logic of the system plugin.
"""

from baselines.fae.hotset import HotSet, choose_hot_rows, sample_access_counts
from baselines.fae.layout import (
    Examples,
    FaeLayout,
    FaeSettings,
    FaeSource,
    build_layout,
    cached_layout,
    load_examples,
)
from baselines.fae.scheduler import ShuffleScheduler

__all__ = [
    "Examples",
    "FaeLayout",
    "FaeSettings",
    "FaeSource",
    "HotSet",
    "ShuffleScheduler",
    "build_layout",
    "cached_layout",
    "choose_hot_rows",
    "load_examples",
    "sample_access_counts",
]
