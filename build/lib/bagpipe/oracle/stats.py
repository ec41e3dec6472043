"""What the oracle cacher planned, summed over a stream (rows, not bytes: the Meter counts bytes)."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class OracleStats:
    """Counters over all plans emitted so far.

    ``row_fetches`` counts one fetch per trainer that fetches a row (``T`` for a replicated row, 1
    for a physically partitioned one); ``rows_prefetched`` counts rows once. ``capacity_evictions``
    are rows evicted only to make room (Belady's rule); ``lease_breaks`` are those of them whose lease
    was still valid (a use within ``L`` of their last use was pending, so they are refetched).
    """

    steps: int = 0
    rounds: int = 0
    unique_ids: int = 0
    sync_now_rows: int = 0
    sync_later_rows: int = 0
    singleton_rows: int = 0
    rows_prefetched: int = 0
    row_fetches: int = 0
    rows_evicted: int = 0
    rows_written_back: int = 0
    capacity_evictions: int = 0
    lease_breaks: int = 0
    peak_resident_rows: int = 0
    planning_time_s: float = 0.0

    def counts(self) -> dict[str, int]:
        """Every counter except the timing (what two planners on one stream must agree on)."""
        values = asdict(self)
        values.pop("planning_time_s")
        return values
