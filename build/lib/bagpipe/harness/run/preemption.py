"""Hold a preemption signal until the next step boundary, so the job can checkpoint exactly there.

SLURM warns a job before preempting it or at its time limit (``--signal``; submitit asks for
SIGUSR2), and submitit's handler then resubmits the callable and requeues the job at once. Taken
mid-step, that loses every step since the last periodic checkpoint. :class:`DeferredSignal`
replaces the handler while training runs: the signal only sets a flag, the runner
(``stop_requested``) saves a checkpoint after the step in flight and raises
:class:`~bagpipe.harness.run.runner.Preempted`, and on leaving the block the original handler gets the
signal after all (submitit requeues; with no handler installed, the default action ends the
process as it would have). The requeued job resumes from that checkpoint, losing nothing.

Signal handlers can only be set from the main thread; elsewhere the block does nothing.
"""

from __future__ import annotations

import os
import signal
import threading
from types import FrameType, TracebackType

__all__ = ["DeferredSignal"]


class DeferredSignal:
    """Context manager: within it, ``signum`` is noted (see :meth:`requested`), not acted on."""

    def __init__(self, signum: signal.Signals = signal.SIGUSR2) -> None:
        self.signum = signum
        self._pending = False
        self._installed = False
        self._previous: signal._HANDLER = signal.SIG_DFL

    def requested(self) -> bool:
        """True once the signal arrived inside the block."""
        return self._pending

    def _note(self, signum: int, frame: FrameType | None) -> None:
        self._pending = True

    def __enter__(self) -> DeferredSignal:
        if threading.current_thread() is threading.main_thread():
            previous = signal.signal(self.signum, self._note)
            self._previous = signal.SIG_DFL if previous is None else previous  # None: set in C
            self._installed = True
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if not self._installed:
            return
        signal.signal(self.signum, self._previous)
        self._installed = False
        if self._pending:  # deliver it now to whoever had it (submitit: checkpoint and requeue)
            os.kill(os.getpid(), self.signum)
