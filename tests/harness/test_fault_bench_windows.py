"""The fault bench's in-run A/B of the recovery logs: which steps run with them, and when it switches.

The logs' cost is measured from windows of steps with the logs on and off in one run
(``bagpipe.bench.fault_logs``). A window that ran in the wrong state, or a switch between the wrong
steps, would silently mix the two samples, so the schedule is checked step by step here against a
system that only records the calls.
"""

from __future__ import annotations

from bagpipe.bench.fault_logs import WINDOW, LogWindows
from bagpipe.core.recovery import PausableRecoveryLogs


class _Recorder:
    """A :class:`PausableRecoveryLogs` that keeps each call with the step it followed."""

    def __init__(self) -> None:
        self.after_step = -1
        self.calls: list[tuple[int, bool]] = []

    def pause_recovery_logs(self, paused: bool) -> None:
        self.calls.append((self.after_step, paused))


def test_windows_alternate_in_pairs_on_off_off_on_after_a_logged_warm_up() -> None:
    system = _Recorder()
    assert isinstance(system, PausableRecoveryLogs)
    windows = LogWindows(system, pairs=3)
    steps = WINDOW * (1 + 6)
    paused = False  # the system starts with its logs on (the warm-up window)
    state_by_step = []
    for step in range(steps):
        state_by_step.append(not paused)
        system.after_step = step
        windows.on_step(step, {"step": float(step), "iter_time_s": 0.1})
        if system.calls and system.calls[-1][0] == step:
            paused = system.calls[-1][1]

    expected = [True, False, False, True, True, False]  # on-off, off-on, on-off
    assert [windows.logged(w) for w in range(6)] == expected
    # a switch after the last step of every window but the last, to the next window's state
    assert system.calls == [(WINDOW * (w + 1) - 1, not expected[w]) for w in range(6)]
    # every step in a measured window ran in that window's state, and the warm-up is not kept
    for w, window in enumerate(windows.windows):
        assert [int(m["step"]) for m in window] == list(
            range(WINDOW * (w + 1), WINDOW * (w + 2)))
        assert {state_by_step[int(m["step"])] for m in window} == {expected[w]}
    assert all(state_by_step[:WINDOW])
