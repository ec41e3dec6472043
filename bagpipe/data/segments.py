"""Whole-line segments of a text file, parsed in parallel and handed out in file order.

pyarrow's streaming CSV reader parses one block at a time on one core and does not number rows when
threaded. The readers instead cut the (decompressed) input into segments of whole lines themselves,
count the lines of each (so a row maps back to its physical line without a rescan), parse every
segment with a serial ``read_csv`` on a small thread pool (pyarrow and the numpy decoding release the
GIL) and yield the results strictly in order, holding at most a few segments in memory.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Generator, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import pyarrow as pa

from bagpipe.data.errors import DataFormatError

READ_THREADS = 2  # the target machine's cores; more only adds memory in flight
_S = TypeVar("_S")
_T = TypeVar("_T")


@dataclass(frozen=True)
class Segment:
    """Whole lines of the input (ending with a newline except at the end of the file).

    ``has_header``: the first row is the file's header, not data.
    """

    data: bytes
    first_line: int
    has_header: bool

    def num_lines(self) -> int:
        """Physical lines in this segment (``\\n``, ``\\r\\n`` and a lone ``\\r`` end a line)."""
        lines = self.data.count(b"\n")
        if b"\r" in self.data:
            lines = len(self.data.splitlines())
        elif self.data and not self.data.endswith(b"\n"):
            lines += 1  # the file's last line has no newline
        return lines

    def nonempty_lines(self) -> np.ndarray:
        """Error path: the physical line of every non-empty line, i.e. of each row pyarrow numbers.

        pyarrow skips empty lines and numbers rows (``InvalidRow.number``, 1-based) over the
        non-empty ones, the header included.
        """
        nonempty = np.flatnonzero([len(line) > 0 for line in self.data.splitlines()])
        return self.first_line + nonempty


def iter_segments(path: str, block_bytes: int, skip_header: bool) -> Generator[Segment, None, None]:
    """``path`` (a ``.gz`` is decompressed) as segments of about ``block_bytes`` of whole lines.

    A read failure (a truncated or corrupt compressed stream) raises ``DataFormatError`` naming the
    first line not yet handed out. Segments are cut after a ``\n``, so a file whose lines end with a
    lone ``\r`` is read as one segment.
    """
    next_line = 1
    carry = b""
    try:
        stream = pa.input_stream(path)  # compression detected from the extension, like open_csv
    except (OSError, pa.ArrowInvalid) as err:
        raise DataFormatError(path, next_line, f"unreadable input (truncated or corrupt?): {err}") from err
    with stream:
        while True:
            try:
                chunk = stream.read(block_bytes)
            except (OSError, pa.ArrowInvalid) as err:
                raise DataFormatError(path, next_line,
                                      f"unreadable input (truncated or corrupt?): {err}") from err
            if not chunk:
                break
            cut = chunk.rfind(b"\n") + 1
            if cut == 0:  # no line ends in this chunk: a line longer than block_bytes
                carry += chunk
                continue
            data = chunk if cut == len(chunk) and not carry else carry + memoryview(chunk)[:cut]  # one copy
            segment = Segment(data, next_line, skip_header and next_line == 1)
            carry = chunk[cut:]
            next_line += segment.num_lines()
            yield segment
    if carry:
        yield Segment(carry, next_line, skip_header and next_line == 1)


def ordered_map(work: Callable[[_S], _T], segments: Generator[_S, None, None]) -> Iterator[_T]:
    """``work(segment)`` for every item of ``segments`` (segments, or the blocks parsed from them)
    on ``READ_THREADS`` threads, results in input order.

    An error of an item's work is raised in its turn; a ``DataFormatError`` of ``segments`` itself
    is raised after the results of every item before it, so errors surface in file order.
    """
    pool = ThreadPoolExecutor(READ_THREADS, thread_name_prefix="bagpipe-read")
    pending: deque[Future[_T]] = deque()
    read_error: DataFormatError | None = None
    try:
        while True:
            try:
                segment = next(segments, None)
            except DataFormatError as err:
                read_error = err
                segment = None
            if segment is None:
                break
            pending.append(pool.submit(work, segment))
            if len(pending) > READ_THREADS:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
        if read_error is not None:
            raise read_error
    finally:  # also when the consumer stops early: no thread or open file outlives the reader
        pool.shutdown(wait=True, cancel_futures=True)
        segments.close()
