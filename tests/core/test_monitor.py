"""The driver's monitor reports each role failure once: a death already handled by a takeover is
not reported again by a poll that read it before the takeover and records it after."""

from __future__ import annotations

import threading

from bagpipe.core.roles.watch import Monitor


def test_a_death_read_before_a_takeover_is_not_reported_after_it() -> None:
    """The race CI met: the monitor's thread reads ``server_0`` dead, the driver's own poll
    records that death first, a standby takes the role over (``forget``), and only then does the
    monitor's thread record what it read. The role is alive now, so nothing may be reported."""
    exit_codes: dict[str, int | None] = {"server_0": 1, "trainer_0": None}
    read_by_monitor, recorded_by_driver = threading.Event(), threading.Event()

    def codes() -> dict[str, int | None]:
        snapshot = dict(exit_codes)
        if threading.current_thread().name == "monitor-poll":
            read_by_monitor.set()
            assert recorded_by_driver.wait(10)
        return snapshot

    monitor = Monitor(["server_0", "trainer_0"], codes, None)
    late_poll = threading.Thread(target=lambda: monitor.failure, name="monitor-poll")
    late_poll.start()
    assert read_by_monitor.wait(10)
    failure = monitor.failure  # the driver's wait sees the death and handles it
    assert failure is not None and failure.role == "server_0"
    exit_codes["server_0"] = None  # the standby serves server_0 now
    monitor.forget("server_0")
    recorded_by_driver.set()
    late_poll.join(10)
    assert monitor.failure is None


def test_a_death_after_a_takeover_is_reported() -> None:
    """Forgetting one death does not hide the next: the replacement's own death, or another
    role's."""
    exit_codes: dict[str, int | None] = {"server_0": 1, "trainer_0": None}
    monitor = Monitor(["server_0", "trainer_0"], lambda: dict(exit_codes), None)
    assert monitor.failure is not None
    exit_codes["server_0"] = None
    monitor.forget("server_0")
    assert monitor.failure is None
    exit_codes["trainer_0"] = -9
    failure = monitor.failure
    assert failure is not None and failure.role == "trainer_0" and "SIGKILL" in str(failure)
