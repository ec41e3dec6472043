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


def _overlaid(logs: UpdateLogs, trainer: int) -> torch.Tensor:
    table = torch.full((6, 2), -1.0)
    logs.overlay(trainer, table)
    return table[:, 0]


def test_a_held_step_is_recorded_before_a_log_is_read() -> None:
    logs = UpdateLogs(trainers=2, total_rows=6, dim=2)
    logs.hold([_entry([1, 2], 1.0), _entry([4], 2.0)])
    assert _overlaid(logs, 0).tolist() == [-1, 1, 1, -1, -1, -1]
    assert _overlaid(logs, 1).tolist() == [-1, -1, -1, -1, 2, -1]


def test_a_row_a_peer_updates_alone_leaves_the_log_it_was_in() -> None:
    """Trainer 0 updated row 1; a later step's singleton owner of row 1 is trainer 1, so trainer
    0's copy is stale: its log must not bring back the older value."""
    logs = UpdateLogs(trainers=2, total_rows=6, dim=2)
    logs.hold([_entry([1, 2], 1.0), _entry([], 0.0)])
    logs.hold([_entry([], 0.0), _entry([1], 3.0)])
    assert logs.flush() >= 0.0
    assert _overlaid(logs, 0).tolist() == [-1, -1, 1, -1, -1, -1]
    assert _overlaid(logs, 1).tolist() == [-1, 3, -1, -1, -1, -1]


def test_an_acknowledged_eviction_leaves_the_log_and_a_later_update_returns() -> None:
    logs = UpdateLogs(trainers=2, total_rows=6, dim=2)
    logs.hold([_entry([3], 1.0), _entry([], 0.0)])
    logs.hold([_entry([], 0.0, dropped=[3]), _entry([], 0.0)])
    assert _overlaid(logs, 0).tolist() == [-1] * 6
    logs.hold([_entry([3], 5.0), _entry([], 0.0)])
    assert _overlaid(logs, 0).tolist() == [-1, -1, -1, 5, -1, -1]


def test_paused_steps_record_nothing_and_a_partial_step_is_refused() -> None:
    logs = UpdateLogs(trainers=2, total_rows=6, dim=2)
    logs.hold([None, None])
    assert _overlaid(logs, 0).tolist() == [-1] * 6
    with pytest.raises(ValueError, match="every trainer or from none"):
        logs.hold([_entry([1], 1.0), None])
