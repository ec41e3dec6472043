"""The driver's update logs (``bagpipe.lrpp.updatelog``): what a dead trainer's log rebuilds."""

from __future__ import annotations

import pytest
import torch

from bagpipe.lrpp.updatelog import LogEntry, UpdateLogs


def _entry(ids: list[int], value: float, dropped: list[int] | None = None) -> LogEntry:
    return LogEntry(
        dropped=torch.tensor(dropped or [], dtype=torch.int64),
        ids=torch.tensor(ids, dtype=torch.int64),
        rows=torch.full((len(ids), 2), value),
    )


def _overlaid(logs: UpdateLogs, trainer: int) -> list[float]:
    table = torch.full((6, 2), -1.0)
    logs.overlay(trainer, table)
    return table[:, 0].tolist()


def test_a_kept_step_is_folded_in_before_a_log_is_read() -> None:
    logs = UpdateLogs(trainers=2, dim=2)
    logs.append([_entry([1, 2], 1.0), _entry([4], 2.0)])
    assert _overlaid(logs, 0) == [-1, 1, 1, -1, -1, -1]
    assert _overlaid(logs, 1) == [-1, -1, -1, -1, 2, -1]


def test_a_row_a_peer_updates_alone_leaves_the_log_it_was_in() -> None:
    """Trainer 0 updated row 1; a later step's singleton owner of row 1 is trainer 1, so trainer
    0's copy is stale: its log must not bring back the older value."""
    logs = UpdateLogs(trainers=2, dim=2)
    logs.append([_entry([1, 2], 1.0), _entry([], 0.0)])
    logs.append([_entry([], 0.0), _entry([1], 3.0)])
    assert _overlaid(logs, 0) == [-1, -1, 1, -1, -1, -1]
    assert _overlaid(logs, 1) == [-1, 3, -1, -1, -1, -1]


def test_an_acknowledged_eviction_leaves_the_log_and_a_later_update_returns() -> None:
    logs = UpdateLogs(trainers=2, dim=2)
    logs.append([_entry([3], 1.0), _entry([], 0.0)])
    logs.append([_entry([], 0.0, dropped=[3]), _entry([], 0.0)])
    assert _overlaid(logs, 0) == [-1] * 6
    logs.append([_entry([3], 5.0, dropped=[3]), _entry([], 0.0)])  # the drop applies first
    assert _overlaid(logs, 0) == [-1, -1, -1, 5, -1, -1]


def test_paused_steps_record_nothing_and_a_partial_step_is_refused() -> None:
    logs = UpdateLogs(trainers=2, dim=2)
    logs.append([None, None])
    assert _overlaid(logs, 0) == [-1] * 6
    with pytest.raises(ValueError, match="every trainer or from none"):
        logs.append([_entry([1], 1.0), None])


@pytest.mark.parametrize("fold", ["every step", "when due", "when read"])
def test_folding_steps_at_once_equals_recording_them_one_by_one(fold: str) -> None:
    """The batched fold against the rule applied step by step (the executable spec), over random
    steps of three trainers: disjoint singletons a step, random acknowledged evictions."""
    rows, dim, trainers = 40, 3, 3
    g = torch.Generator().manual_seed(7)
    logs = UpdateLogs(trainers, dim, fold_min_rows=20)
    held = torch.zeros(trainers, rows, dtype=torch.bool)
    folds = 0
    values = torch.zeros(trainers, rows, dim)
    for _ in range(23):
        owner = torch.randint(0, trainers + 2, (rows,), generator=g)  # >= trainers: no one's
        entries = []
        for k in range(trainers):
            dropped = torch.nonzero(torch.rand(rows, generator=g) < 0.1).flatten()
            ids = torch.nonzero(owner == k).flatten()
            entries.append(LogEntry(dropped, ids, torch.randn(ids.numel(), dim, generator=g)))
        for k, entry in enumerate(entries):  # the spec: drops, then peers' singletons, then own
            held[k, entry.dropped] = False
            for j, peer in enumerate(entries):
                if j != k:
                    held[k, peer.ids] = False
            held[k, entry.ids] = True
            values[k, entry.ids] = entry.rows
        logs.append(list(entries))
        if fold != "when read":
            folds += logs.compact(force=fold == "every step") > 0
    assert (folds == 0) == (fold == "when read")
    for k in range(trainers):
        table = torch.full((rows, dim), float("nan"))
        assert logs.overlay(k, table) == int(held[k].sum())
        expected = torch.where(held[k].unsqueeze(1), values[k], torch.full_like(values[k], float("nan")))
        assert torch.equal(table.isnan(), expected.isnan())
        assert torch.equal(table[held[k]], expected[held[k]])
