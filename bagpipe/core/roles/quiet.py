"""While a world is being left: TensorPipe's notice about each connection closing, dropped.

A TensorPipe agent prints "RPC agent for A encountered error when reading incoming request from B:
pipe closed" (or ``eof``) from its C++ threads, straight to file descriptor 2, for every connection
that closes while it is not marked as shutting down, whoever closed it. Its own way to be marked,
``agent.join(shutdown=True)`` (what a graceful ``rpc.shutdown`` uses), is a barrier whose store keys
are numbered by a process-wide C++ counter that nothing resets: a driver that already ran one
Deployment uses key numbers its freshly started roles never reach, and the barrier hangs. So the
processes of a world leave in an order in which such a notice cannot mean anything but that orderly
departure (``spawn.leave_rpc_world``: no call is in flight anywhere once every process has arrived),
and while they do, :class:`DepartureNoticeFilter` removes exactly that notice from the process's
stderr. Every other line written to stderr then still gets through.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
from collections.abc import Iterator

__all__ = ["DEPARTURE_NOTICE", "DepartureNoticeFilter", "departure_notices_dropped"]

#: The notice, as the C++ logger prints it (with or without its ``[rankN]:`` prefix).
DEPARTURE_NOTICE = re.compile(
    rb"tensorpipe_agent\.cpp:\d+\] RPC agent for \S+ encountered error when reading incoming "
    rb"request from \S+: (pipe closed|eof|EOF: end of file) "
)
_JOIN_S = 5.0  # a pump still reading after this long is left behind (a forked child holds the pipe)


class DepartureNoticeFilter:
    """File descriptor 2 of this process led through a pipe whose lines are copied to the real
    stderr, except the departure notice; :meth:`stop` restores descriptor 2 and drains the pipe."""

    def __init__(self) -> None:
        self._stderr = -1
        self._pump: threading.Thread | None = None

    def start(self) -> None:
        """Lead descriptor 2 through the filter (a process without one is left as it is)."""
        sys.stderr.flush()
        try:
            self._stderr = os.dup(2)
        except OSError:
            return
        read_end, write_end = os.pipe()
        os.dup2(write_end, 2)
        os.close(write_end)
        self._pump = threading.Thread(
            target=self._copy, args=(read_end,), name="bagpipe-stderr-filter", daemon=True
        )
        self._pump.start()

    def stop(self) -> None:
        if self._pump is None:
            return
        sys.stderr.flush()
        os.dup2(self._stderr, 2)  # the pipe's last write end closes: the pump reads to its end
        self._pump.join(_JOIN_S)
        self._pump = None
        os.close(self._stderr)

    def _copy(self, read_end: int) -> None:
        pending = b""
        while chunk := os.read(read_end, 65536):
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                self._forward(line + b"\n")
        if pending:
            self._forward(pending)
        os.close(read_end)

    def _forward(self, line: bytes) -> None:
        if DEPARTURE_NOTICE.search(line):
            return
        view = memoryview(line)
        while view:
            view = view[os.write(self._stderr, view):]


@contextlib.contextmanager
def departure_notices_dropped() -> Iterator[None]:
    """The filter around a block (the driver's side of leaving a world)."""
    notices = DepartureNoticeFilter()
    notices.start()
    try:
        yield
    finally:
        notices.stop()
