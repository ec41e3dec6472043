"""The batches a system peeks at, produced before the step that peeks, outside its timed window.

The runner times ``train_step`` alone and produces each step's batch before it (the paper's
prototype pre-loaded its batches). A system that also reads *upcoming* batches during a step (HET
prefetches the next batch's rows; TorchRec's pipeline holds batches ahead) would otherwise produce
them inside its timed step and pay for data generation the others do not. :class:`ReadAhead`
wraps the training source so that the runner produces batch ``i .. i + ahead`` before step
``i`` (:meth:`prepare`) and the system's reads of them are cache hits: the same data path, the
same cost, for every system.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from bagpipe.core.batch import Batch
from bagpipe.core.source import BatchSource

__all__ = ["ReadAhead"]


class ReadAhead:
    """``source`` with batches ``step .. step + ahead`` made ahead of time (a BatchSource).

    Only the window is kept, so memory stays a few batches. Attributes other than the sequence
    protocol are the wrapped source's; pickling drops the window (a role that plans over the
    stream, Bagpipe's oracle, reads its own).
    """

    def __init__(self, source: BatchSource, ahead: int) -> None:
        if ahead < 0:
            raise ValueError(f"read-ahead must be >= 0 batches, got {ahead}")
        self.source = source
        self.ahead = ahead
        self._window: dict[int, Batch] = {}

    def prepare(self, step: int) -> Batch:
        """Make step ``step``'s batch and the ``ahead`` after it (wrapping at the source's end);
        return step ``step``'s."""
        count = len(self.source)
        wanted = [(step + k) % count for k in range(self.ahead + 1)]
        self._window = {i: self._window.get(i) or self.source[i] for i in wanted}
        return self._window[wanted[0]]

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, index: int) -> Batch:
        cached = self._window.get(index)
        return cached if cached is not None else self.source[index]

    def __iter__(self) -> Iterator[Batch]:
        return iter(self.source)

    def __getattr__(self, name: str) -> Any:
        if name in ("source", "_window"):  # not set yet (unpickling)
            raise AttributeError(name)
        return getattr(self.source, name)

    def __getstate__(self) -> dict[str, Any]:
        return {"source": self.source, "ahead": self.ahead, "_window": {}}
