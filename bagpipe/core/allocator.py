"""One memory-allocator rule for every process that trains or times a step: freed memory stays.

glibc's ``malloc`` hands large blocks back to the kernel. A block above the *mmap threshold* (which
starts at 128 KiB and creeps up to 32 MiB as blocks are freed) is its own ``mmap`` and is unmapped
when freed; free memory at the top of a heap above the *trim threshold* is returned as well; and a
thread allocating beside others gets an arena of its own, whose heaps are unmapped whenever they
empty, whatever the thresholds say. Every step allocates the same large tensors again (a slice's
gathered rows, their gradients, the activations, the collectives' buffers), and it runs in an RPC
thread, so a process can pay for fresh, zero-filled pages on every step, one page fault per 4 KiB,
counted as the step's CPU. How often depends on the process's threads and on what else it holds,
so the charge differs from system to system for the same work. Measured at ``d05c9d5``'s code
(``suite=bound_split``, W&D, one trainer, network off, two seeds): Bagpipe's trainer spent 5.7-6.1
ms of CPU in a forward that took the embedding-free bound's 3.6 ms, on the same model and rows;
under this rule, 3.2 ms against 3.2-3.4 ms, and Bagpipe's iteration went from 1.45-1.51x the
bound's to 1.08-1.16x.

A long-running trainer on the target reaches a steady state in which its step's memory is reused,
not refaulted. :func:`keep_freed_memory` puts every process there from its start: no block below
:data:`KEEP_BYTES` is mapped on its own, no free memory below it is handed back, and every thread
allocates from the one main arena (``M_ARENA_MAX`` = 1; small blocks still come from each thread's
own cache, without the arena's lock). It is called where every process of a run starts
(``bagpipe.core.runtime.init``: every role and the driver of its deployment, beside the GIL's rule;
the runner, for a system that runs in its driver alone; the dilation calibration's workers, which
time a step as a run's trainers do), so no system can opt out of it. The cost is resident memory:
a process keeps its peak. Elsewhere than glibc there is nothing to do, and nothing is done.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
from collections.abc import Callable

#: Blocks below this many bytes come from the heap, and free memory below it stays there.
KEEP_BYTES = 1 << 30
#: ``mallopt`` parameters (glibc's ``malloc.h``).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8


@functools.cache
def _mallopt() -> Callable[[int, int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        return getattr(ctypes.CDLL(name), "mallopt", None)
    except OSError:
        return None


#: The same rule as glibc's environment variables, read when a process starts: a process started
#: with them (the roles' fork server, whose image every local role is forked from) never makes a
#: second arena, which ``mallopt`` in a forked child could not undo.
KEEP_FREED_MEMORY_ENV = {"MALLOC_MMAP_THRESHOLD_": str(KEEP_BYTES),
                         "MALLOC_TRIM_THRESHOLD_": str(KEEP_BYTES), "MALLOC_ARENA_MAX": "1"}


def keep_freed_memory_in_children() -> None:
    """Start every child of this process under the rule (:data:`KEEP_FREED_MEMORY_ENV`)."""
    os.environ.update(KEEP_FREED_MEMORY_ENV)


def keep_freed_memory() -> bool:
    """Apply the rule of the module docstring to this process; whether the allocator took it
    (``False`` where ``malloc`` is not glibc's). Idempotent."""
    mallopt = _mallopt()
    if mallopt is None:
        return False
    settings = ((_M_MMAP_THRESHOLD, KEEP_BYTES), (_M_TRIM_THRESHOLD, KEEP_BYTES), (_M_ARENA_MAX, 1))
    return all(mallopt(param, value) == 1 for param, value in settings)
