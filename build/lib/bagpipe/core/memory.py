"""``small_pages``: numpy allocations without the advice to back them by transparent huge pages.

Why: numpy advises huge pages for every array of 4 MB or more. On the 2-core machine (a virtual
machine) the first touch of such memory cost several times more per byte than of small pages (each
fault zeroes 2 MB; the kernel's compaction counters stayed flat, so the cost is in the fault itself),
and code that fills fresh arrays once, in bulk, gains less from the larger pages' TLB reach than it
pays. Measured in alternating runs:

* filling a fresh 122 MB array: 250-330 ms with the advice, 80-90 ms without;
* the oracle planner on one thread, the Kaggle-shaped benchmark stream: 18.4-20.1 ms per batch
  with it, 13.5-16.5 ms without (3 runs each), most of the difference in the stage whose per-batch
  temporaries and growing arrays are fresh memory;
* reading the 500k-row Criteo TSV of ``bagpipe.bench.data`` once: 453k rows/s with it (2 runs),
  546k and 640k without; with ``read_examples`` under this switch, 470-659k (5 runs, median 639k).

The switch is process-wide while it lasts (numpy has no per-array one) and only ever changes speed,
never results.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

try:
    from numpy._core.multiarray import _set_madvise_hugepage  # type: ignore[attr-defined]
except ImportError:  # a numpy without the switch: its default advice stays
    _set_madvise_hugepage = None


@contextmanager
def small_pages() -> Iterator[None]:
    """Arrays numpy allocates meanwhile, in any thread, are not advised onto transparent huge
    pages; the advice in force before is restored after."""
    if _set_madvise_hugepage is None:
        yield
        return
    previous = _set_madvise_hugepage(False)
    try:
        yield
    finally:
        _set_madvise_hugepage(previous)
