"""FAE's Shuffle Scheduler: in which order all-hot and all-cold mini-batches run.

The rate ``R(p)`` runs ``p%`` of one kind's mini-batches before swapping to the other kind
(``R(100)``: all cold, then all hot; FAE, Eq. 5). Training starts with cold batches.

* ``adaptive`` (the paper): start at ``R(50)``; after each observed test loss, halve the rate on a
  rise (floor 1) and double it after ``window`` (4) consecutive falls (cap 100).
  *Deviation:* the paper evaluates at every swap; here the loss comes from the runner's evaluations
  (``System.on_phase_boundary`` with ``eval_logloss``), whatever their cadence.
* ``fixed`` (the released code): ``R(100)`` every epoch, never changed.

One epoch runs every hot and every cold batch once; the next epoch starts with cold again.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

__all__ = ["SCHEDULERS", "ShuffleScheduler"]

SCHEDULERS = ("adaptive", "fixed")
HOT = "hot"
COLD = "cold"


@dataclass
class ShuffleScheduler:
    """Hands out ``(kind, index)`` for every step; ``observe_loss`` adapts the rate."""

    num_hot: int
    num_cold: int
    mode: str = "adaptive"
    initial_rate: int = 50
    window: int = 4
    rate: int = field(init=False)
    rate_trace: list[int] = field(init=False)
    swaps: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if self.mode not in SCHEDULERS:
            raise ValueError(f"fae.scheduler: unknown {self.mode!r}; choose one of {SCHEDULERS}")
        if not 1 <= self.initial_rate <= 100:
            raise ValueError(f"fae.initial_rate must be in [1, 100], got {self.initial_rate}")
        if self.num_hot + self.num_cold == 0:
            raise ValueError("fae: the re-packed data set has no full mini-batch")
        self.rate = 100 if self.mode == "fixed" else self.initial_rate
        self.rate_trace = [self.rate]
        self._last_loss: float | None = None
        self._falls = 0
        self._new_epoch()
        self._last_kind: str | None = None

    def _new_epoch(self) -> None:
        self._next = {HOT: 0, COLD: 0}
        self._kind = COLD if self.num_cold else HOT
        self._run_left = self._run_length(self._kind)

    def _total(self, kind: str) -> int:
        return self.num_hot if kind == HOT else self.num_cold

    def _run_length(self, kind: str) -> int:
        return max(1, math.ceil(self.rate / 100 * self._total(kind)))

    def next_batch(self) -> tuple[str, int]:
        """The kind of the next step and the index of its batch among that kind's batches."""
        other = COLD if self._kind == HOT else HOT
        exhausted = self._next[self._kind] >= self._total(self._kind)
        if exhausted and self._next[other] >= self._total(other):
            self._new_epoch()
        elif exhausted or (self._run_left <= 0 and self._next[other] < self._total(other)):
            self._kind = other
            self._run_left = self._run_length(other)
        kind = self._kind
        index = self._next[kind]
        self._next[kind] += 1
        self._run_left -= 1
        if self._last_kind is not None and kind != self._last_kind:
            self.swaps += 1
        self._last_kind = kind
        return kind, index

    def observe_loss(self, logloss: float) -> None:
        """Adapt the rate to a new test loss (adaptive mode only)."""
        if self.mode != "adaptive":
            return
        if self._last_loss is not None:
            if logloss > self._last_loss:
                self.rate = max(1, self.rate // 2)
                self._falls = 0
            elif logloss < self._last_loss:
                self._falls += 1
                if self._falls >= self.window:
                    self.rate = min(100, self.rate * 2)
                    self._falls = 0
        self._last_loss = logloss
        self.rate_trace.append(self.rate)
