"""``kernel=auto`` picks TorchRec's fused kernel wherever FBGEMM accepts the table width."""

from __future__ import annotations

import pytest

from baselines.torchrec_sharding.plan import ShardingKnobs


@pytest.mark.parametrize(
    ("dim", "sharding", "kernel"),
    [
        (16, "auto", "fused"),  # DLRM, W&D, DCN at the default width
        (17, "row_wise", "dense"),  # DeepFM: one first-order column on top of 16
        (17, "data_parallel", "fused"),  # DP tables are dense in TorchRec whatever is asked
    ],
)
def test_auto_kernel_follows_the_width(dim: int, sharding: str, kernel: str) -> None:
    resolved = ShardingKnobs(sharding, "auto").for_table_dim(dim)
    assert (resolved.sharding, resolved.kernel) == (sharding, kernel)


def test_planner_choice_with_a_dense_width_becomes_a_manual_table_wise_plan() -> None:
    resolved = ShardingKnobs("auto", "auto").for_table_dim(17)
    assert (resolved.sharding, resolved.kernel, resolved.uses_planner) == (
        "table_wise",
        "dense",
        False,
    )


def test_explicit_kernel_is_kept_and_checked() -> None:
    fused = ShardingKnobs("table_wise", "fused")
    assert fused.for_table_dim(17) is fused
    with pytest.raises(ValueError, match="divisible by 4"):
        fused.check_table_dim(17, world=2)
