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


class CacheDirError(OSError):
    """The prepared-data cache directory cannot take the dataset: not writable, or too full.

    Raised before preprocessing starts when it can be foreseen, so no work is lost; the message
    names the directory and the config key that chooses another (``dataset.cache_dir``).
    """

    def __init__(self, directory: str, reason: str) -> None:
        self.directory = directory
        super().__init__(f"dataset cache directory {directory}: {reason}; choose another with "
                         "dataset.cache_dir=<dir> (or BAGPIPE_DATA_CACHE)")
