"""TorchRec plan helpers, by hand (no processes, no DMP): per-rank load and column splits."""

from __future__ import annotations

import pytest

from baselines.torchrec_sharding.layout import (
    Shard,
    TableLayout,
    rank_load,
)
from baselines.torchrec_sharding.plan import column_split

ROW_WISE = TableLayout(
    "t_rw", 0, "row_wise", rows=10, dim=4, shards=(Shard(0, 0, 5, 0, 4), Shard(1, 5, 5, 0, 4))
)
TABLE_WISE = TableLayout("t_tw", 1, "table_wise", rows=6, dim=2, shards=(Shard(1, 0, 6, 0, 2),))
DATA_PARALLEL = TableLayout(
    "t_dp", 2, "data_parallel", rows=3, dim=2, shards=(Shard(0, 0, 3, 0, 2), Shard(1, 0, 3, 0, 2))
)
LAYOUTS = [ROW_WISE, TABLE_WISE, DATA_PARALLEL]


def test_rank_load_counts_replicas_on_every_rank() -> None:
    load = rank_load(LAYOUTS, 2)
    assert load["rows"] == [5 + 3, 5 + 6 + 3]
    assert load["bytes"] == [(5 * 4 + 3 * 2) * 4, (5 * 4 + 6 * 2 + 3 * 2) * 4]


def test_column_split_respects_min_partition() -> None:
    assert column_split(9, 2, None) == [5, 4]
    assert column_split(8, 4, 4) == [4, 4]
    assert column_split(3, 2, 4) == [3]


def test_column_split_in_blocks_for_the_fused_kernel() -> None:
    assert column_split(12, 2, None, block=4) == [8, 4]
    assert column_split(48, 2, 8, block=4) == [24, 24]
    with pytest.raises(ValueError, match="multiples of 4"):
        column_split(9, 2, None, block=4)
