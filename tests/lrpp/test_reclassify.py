"""How an ablated trainer re-reads the oracle's step plan (``bagpipe.lrpp.trainer.reclassify``)."""

from __future__ import annotations

import pytest
import torch

from bagpipe.lrpp.trainer import Design, reclassify
from bagpipe.oracle.plan import StepPlan

PLAN = StepPlan(
    step=4,
    sync_now=torch.tensor([1, 7]),
    sync_later=torch.tensor([3, 9]),
    singleton=torch.tensor([2, 8]),
    singleton_owner=torch.tensor([0, 1]),
)


def _lists(plan: StepPlan) -> tuple[list[int], list[int], list[int], list[int]]:
    return (plan.sync_now.tolist(), plan.sync_later.tolist(), plan.singleton.tolist(),
            plan.singleton_owner.tolist())


@pytest.mark.parametrize(
    ("design", "expected"),
    [
        (Design(), ([1, 7], [3, 9], [2, 8], [0, 1])),
        (Design(sync_later=False), ([1, 3, 7, 9], [], [2, 8], [0, 1])),
        (Design(partition=False), ([1, 7], [2, 3, 8, 9], [], [])),
        (Design(sync_later=False, partition=False), ([1, 2, 3, 7, 8, 9], [], [], [])),
        (Design(prefetch=False), ([1, 7], [3, 9], [2, 8], [0, 1])),  # fetching only
    ],
)
def test_reclassify_moves_rows_between_lists_and_keeps_them_sorted(
    design: Design, expected: tuple[list[int], ...]
) -> None:
    plan = reclassify(PLAN, design)
    assert _lists(plan) == expected
    assert plan.step == PLAN.step
    every = torch.cat([plan.sync_now, plan.sync_later, plan.singleton]).sort().values
    assert every.tolist() == [1, 2, 3, 7, 8, 9]  # the batch's rows, each in exactly one list
