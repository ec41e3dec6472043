"""How an ablated trainer re-reads the oracle's step plan (``bagpipe.lrpp.trainer.reclassify``),
lays its gradients on a plan's rows (``scatter_rows``) and waits for plans (``_Board``)."""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest
import torch

from bagpipe.lrpp.trainer import Design, _Board, reclassify, scatter_rows
from bagpipe.oracle.plan import RoundPlan, StepPlan

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
        (Design(row_sync=False), ([1, 3, 7, 9], [], [2, 8], [0, 1])),  # each row in its step
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


# -- laying out gradients on the plan's rows, and the board of plans ---------------------------


def test_scatter_rows_puts_each_value_at_its_ids_place_and_ignores_the_rest() -> None:
    target = torch.tensor([2, 5, 9])
    values = torch.tensor([[1.0, 1.5], [2.0, 2.5], [3.0, 3.5], [4.0, 4.5]], dtype=torch.float64)
    out = scatter_rows(target, torch.tensor([9, 2, 7, 12]), values)  # 7 and 12 are not listed
    assert out.dtype == torch.float64
    assert out.tolist() == [[2.0, 2.5], [0.0, 0.0], [1.0, 1.5]]
    assert scatter_rows(target, torch.tensor([5]), values[:1]).tolist() == [
        [0.0, 0.0], [1.0, 1.5], [0.0, 0.0]]  # a single id
    assert scatter_rows(target[:0], torch.tensor([1]), values[:1]).shape == (0, 2)
    assert scatter_rows(target, torch.tensor([], dtype=torch.int64), values[:0]).tolist() == [
        [0.0, 0.0]] * 3


def _round(index: int) -> RoundPlan:
    empty = torch.empty(0, dtype=torch.int64)
    return RoundPlan(index, 2 * index, 2 * index + 1, empty, empty, empty, empty)


def test_the_board_hands_out_each_plan_once_and_waits_for_one_not_posted_yet() -> None:
    board = _Board()
    third = _round(3)
    board.post([PLAN, third])
    assert board.take_step(4) is PLAN and board.take_round(3) is third
    assert board.steps == {} and board.rounds == {}
    later = replace(PLAN, step=5)
    poster = threading.Timer(0.05, board.post, args=([later],))
    poster.start()
    assert board.take_step(5) is later  # blocked until the plan arrived
    poster.join()


def test_a_closed_board_ends_every_wait() -> None:
    board = _Board()
    closer = threading.Timer(0.05, lambda: (setattr(board, "closed", True),
                                            board.post([])))
    closer.start()
    with pytest.raises(RuntimeError, match=r"^trainer closed while waiting for a step plan$"):
        board.take_step(0)
    closer.join()
    assert board.take_round(0) is None
