"""The torchrec all-to-all byte model and plan helpers, by hand (no processes, no DMP)."""

from __future__ import annotations

import pytest
import torch

from baselines.torchrec_sharding.plan import column_split
from baselines.torchrec_sharding.traffic import (
    Shard,
    TableLayout,
    rank_load,
    step_exchanges,
)

ROW_WISE = TableLayout(
    "t_rw", 0, "row_wise", rows=10, dim=4, shards=(Shard(0, 0, 5, 0, 4), Shard(1, 5, 5, 0, 4))
)
TABLE_WISE = TableLayout("t_tw", 1, "table_wise", rows=6, dim=2, shards=(Shard(1, 0, 6, 0, 2),))
DATA_PARALLEL = TableLayout(
    "t_dp", 2, "data_parallel", rows=3, dim=2, shards=(Shard(0, 0, 3, 0, 2), Shard(1, 0, 3, 0, 2))
)
LAYOUTS = [ROW_WISE, TABLE_WISE, DATA_PARALLEL]
# Rank 0's slice: B = 3; row-wise ids 1 (own block), 7 and 8 (rank 1's block).
IDS = torch.tensor([[1, 0, 0], [7, 5, 1], [8, 2, 2]])


def test_rank0_sends_by_the_documented_formulas() -> None:
    sent = {x.name: x.bytes_to for x in step_exchanges(LAYOUTS, 0, 2, IDS, 8, 4)}
    assert sent == {
        # 2 ids in rank 1's block + bucketised lengths for all 3 examples
        "row_wise:input": {1: 2 * 8 + 3 * 4},
        "row_wise:grad": {1: 3 * 4 * 4},
        # rank 0 holds a block: its partial sums for rank 1's 3 examples (reduce-scatter)
        "row_wise:output": {1: 3 * 4 * 4},
        "table_wise:input": {1: 3 * (8 + 4)},
        "table_wise:grad": {1: 3 * 2 * 4},
    }


def test_owner_sends_pooled_output_and_nothing_for_its_own_tables() -> None:
    sent = {x.name: x.bytes_to for x in step_exchanges([TABLE_WISE], 1, 2, IDS, 8, 4)}
    assert sent == {"table_wise:output": {0: 3 * 2 * 4}}


def test_single_rank_moves_nothing() -> None:
    solo = TableLayout("t", 0, "row_wise", rows=4, dim=2, shards=(Shard(0, 0, 4, 0, 2),))
    assert all(x.total_bytes == 0 for x in step_exchanges([solo], 0, 1, IDS[:, :1], 8, 4))


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
