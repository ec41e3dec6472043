"""The oracle cacher's knobs, validated once, shared by the fast planner and the reference planner."""

from __future__ import annotations

from dataclasses import dataclass

#: The original's cleanup interval as a share of the lookahead (``ci = max(1, int(0.25 * L))``).
DEFAULT_CLEANUP_FRACTION = 0.25


def cleanup_interval_for(lookahead: int, cleanup_fraction: float = DEFAULT_CLEANUP_FRACTION) -> int:
    """The cleanup interval ``ci = max(1, int(cleanup_fraction * L))`` (steps per round)."""
    if not 0 < cleanup_fraction <= 0.5:
        raise ValueError(f"cleanup_fraction={cleanup_fraction} must be in (0, 0.5]")
    return max(1, int(cleanup_fraction * lookahead))


@dataclass(frozen=True)
class OracleConfig:
    """Lookahead ``L``, cleanup interval ``ci``, trainer count ``T`` and cache capacity (rows).

    Args:
        num_trainers: ``T``; trainer ``k`` trains on examples ``k*B/T .. (k+1)*B/T - 1``.
        lookahead: ``L`` (batches). A use at step ``i`` keeps its row's lease until its next use if
            that is within ``(i, i+L]``; a singleton must not be used again in ``(i, i+L]``.
        cleanup_interval: ``ci`` (steps per round); ``None`` = :func:`cleanup_interval_for` ``(L)``,
            as in the original. Must satisfy ``L >= 2*ci``: a singleton's row is stale on the non-owners and is
            evicted at the first round it is eligible for, whose steps start at most ``2*ci + 1`` steps
            after the singleton use; the next use comes ``> L`` steps after it, so it always finds the
            row written back and refetched only when ``L >= 2*ci``.
        capacity: cache capacity in rows (``None`` = unbounded: evictions follow expired leases only).
    """

    num_trainers: int
    lookahead: int = 200
    cleanup_interval: int | None = None
    capacity: int | None = None

    def __post_init__(self) -> None:
        if self.num_trainers < 1:
            raise ValueError(f"oracle config: num_trainers={self.num_trainers} must be >= 1")
        if self.lookahead < 2:
            raise ValueError(
                f"oracle config: lookahead={self.lookahead} must be >= 2 (a round needs L >= 2*ci >= 2)"
            )
        if self.cleanup_interval is None:
            object.__setattr__(self, "cleanup_interval", cleanup_interval_for(self.lookahead))
        ci = self.ci
        if ci < 1:
            raise ValueError(f"oracle config: cleanup_interval={ci} must be >= 1")
        if self.lookahead < 2 * ci:
            raise ValueError(
                f"oracle config: cleanup_interval={ci} too large for lookahead={self.lookahead}; "
                f"need lookahead >= 2*cleanup_interval so that a singleton's stale row is evicted "
                f"and refetched before its next use (use cleanup_interval <= {self.lookahead // 2})"
            )
        if self.capacity is not None and self.capacity < 1:
            raise ValueError(f"oracle config: capacity={self.capacity} must be >= 1 rows or None")

    @property
    def ci(self) -> int:
        """The cleanup interval as an int (resolved from the default in ``__post_init__``)."""
        assert self.cleanup_interval is not None
        return self.cleanup_interval

    def round_steps(self, round_index: int, num_steps: int | None) -> tuple[int, int]:
        """``(first_step, last_step)`` of a round, clipped to a stream of ``num_steps`` batches."""
        first = round_index * self.ci
        last = (round_index + 1) * self.ci - 1
        if num_steps is not None:
            last = min(last, num_steps - 1)
        return first, last

    def eviction_cutoff(self, round_index: int) -> int:
        """Rows whose latest use is ``<=`` this step may be evicted by round ``round_index``'s plan."""
        return (round_index - 1) * self.ci - 2
