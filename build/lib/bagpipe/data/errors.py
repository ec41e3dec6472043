"""Errors raised by the data layer."""

from __future__ import annotations


class DataFormatError(ValueError):
    """A malformed input file: names the file and the (1-based, physical) line where it went wrong.

    ``line`` is ``None`` only when the position is unknown; for a truncated compressed stream it is
    the first line that could not be read.
    """

    def __init__(self, path: str, line: int | None, reason: str) -> None:
        self.path = path
        self.line = line
        self.reason = reason
        where = f"{path}:{line}" if line is not None else path
        super().__init__(f"{where}: {reason}")
