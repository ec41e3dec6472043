"""``small_pages``: numpy allocations without the advice to back them by transparent huge pages.

Why: numpy advises huge pages for every array of 4 MB or more, and where free memory is fragmented
(a shared machine that has run for a while) the kernel compacts memory to fault each one in. Code
that fills fresh arrays once, in bulk, then pays far more for the first touch than for the writes.
Measured on the 2-core machine, in alternating runs:

* filling a fresh 122 MB array: 250-330 ms with the advice, 80-90 ms without;
* the oracle planner on one thread, the Kaggle-shaped benchmark stream: 18.4-20.1 ms per batch
  with it, 13.5-16.5 ms without (3 runs each), most of the difference in the stage whose per-batch
  temporaries and growing arrays are fresh memory;
* reading the 500k-row Criteo TSV of ``bagpipe.bench.data`` once: 453k rows/s with it (2 runs),
  546k and 640k without.

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
