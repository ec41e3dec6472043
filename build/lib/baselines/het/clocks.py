"""HET's server side: per-row version clocks, the bounded-staleness pull rule and additive pushes.

An embedding row's clock counts the updates applied to it (HET, appendix A.2). A worker sends, with
every read, the keys and the versions it holds; the server returns a row only where the worker has
never pulled it (version ``-1``) or where the server is more than ``bound`` updates ahead. Pushes
add SGD deltas (``W[k] += delta``) and advance the clock by the number of updates they carry.

:class:`VersionedRows` works on one block of rows (an embedding-server shard, or a whole table in
tests), addressed by row index into that block.
"""

from __future__ import annotations

import torch

from baselines.het.cache import PullReply

__all__ = ["VersionedRows", "stale_mask"]


def stale_mask(
    server_versions: torch.Tensor, local_versions: torch.Tensor, bound: int
) -> torch.Tensor:
    """Which rows the server must send: never pulled, or more than ``bound`` versions behind."""
    return (local_versions < 0) | (server_versions - local_versions > bound)


class VersionedRows:
    """Rows with version clocks, plus the histogram of staleness seen by hits at read time.

    ``staleness_hist[s]`` counts reads of cached rows (local version ``>= 0``) that were ``s``
    updates behind the server; the last bucket also holds everything beyond it.
    """

    def __init__(self, weights: torch.Tensor, staleness_buckets: int = 33) -> None:
        self.weights = weights
        self.versions = torch.zeros(len(weights), dtype=torch.int64)
        self.staleness_hist = torch.zeros(staleness_buckets, dtype=torch.int64)

    def pull(self, rows: torch.Tensor, local_versions: torch.Tensor, bound: int) -> PullReply:
        """Answer a read of ``rows`` (indices into this block) under staleness ``bound``."""
        server_versions = self.versions[rows]
        cached = local_versions >= 0
        lag = (server_versions[cached] - local_versions[cached]).clamp(
            0, len(self.staleness_hist) - 1
        )
        self.staleness_hist += torch.bincount(lag, minlength=len(self.staleness_hist))
        positions = torch.nonzero(stale_mask(server_versions, local_versions, bound)).flatten()
        return PullReply(
            positions=positions,
            rows=self.weights[rows[positions]],
            versions=server_versions[positions],
        )

    def push(self, rows: torch.Tensor, deltas: torch.Tensor, counts: torch.Tensor) -> None:
        """``W[rows] += deltas`` and ``version[rows] += counts`` (duplicates accumulate)."""
        self.weights.index_add_(0, rows, deltas)
        self.versions.index_add_(0, rows, counts)
