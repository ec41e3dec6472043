"""What the ``replace`` path costs in steady state: the recovery logs and agreements, on and off in one run.

Workload: the fault benchmark's (``bagpipe.bench.fault``), with the standbys of its
:data:`~bagpipe.bench.fault.STANDBYS`, for ``bagpipe`` and ``sync_ps``. The work measured is the
logs a replacement is built from (Bagpipe's update log of the rows only a trainer holds,
``bagpipe.lrpp.updatelog``, and its write-back log; ``sync_ps``'s push logs,
``baselines.sync_ps.pushlog``) and the trainers' agreements (Bagpipe's on each round,
``sync_ps``'s once a step, after the acks).

Between two runs this machine's speed drifts by more than the 3% goal, so one run switches that
work off and on between steps (:class:`~bagpipe.core.recovery.PausableRecoveryLogs`) in windows of
:data:`WINDOW` steps, in pairs ordered on-off, off-on, ... (a drift within a pair cancels over
pairs), after a warm-up of one window. A window is one of Bagpipe's rounds, so each holds one
agreement. Rows per system:

* ``log_overhead_pct``: each pair gives the ratio of its windows' mean iteration times; the row is
  their geometric mean minus 1, with a 95% interval (``ci_low_pct``, ``ci_high_pct``:
  ``bagpipe.harness.report.paired``) over ``pairs`` pairs;
* the parts measured directly, as shares of the unlogged windows' mean iteration:
  ``log_cpu_share_pct``, the CPU time a logged step spends on its logs on the critical path
  (``recovery_log_cpu_s`` per trainer: Bagpipe's log entry, sync_ps's push-log appends; and
  Bagpipe's driver recording the entries); ``agree_wall_share_pct``, a trainer's wall time in
  the agreements (``recovery_agree_s``, waiting for the slower peer included);
* ``log_extra_phase_s``, per trainer phase (``phase``): the logged windows' mean time less the
  unlogged ones' (where the rest lands: contention for the cores shows in ``forward`` and
  ``backward``);
* ``log_bytes_per_iter``: what the entries add to the replies (the wire charges them as ``data``
  traffic on emulated runs).
"""

from __future__ import annotations

import statistics

from bagpipe.bench.fault import STANDBYS, TRAINERS, fault_row, system_factory, workload
from bagpipe.core.recovery import PausableRecoveryLogs
from bagpipe.harness.report.paired import paired_speedup
from bagpipe.harness.run.runner import RunConfig, run_training

WINDOW = 10  # steps with the logs on (or off): one of Bagpipe's rounds (ci = 10 here)
PAIRS = {True: 6, False: 120}  # pairs of windows on and off, in quick mode and in full


def _row(metric: str, value: float, unit: str, **config: object) -> dict:
    return {**fault_row(metric, value, unit, **config), "benchmark": "fault_logs"}


class LogWindows:
    """Runner callback: the system's recovery logs on and off in windows (module docstring),
    and each measured step's metrics by window."""

    def __init__(self, system: PausableRecoveryLogs, pairs: int) -> None:
        self.system = system
        self.windows: list[list[dict[str, float]]] = [[] for _ in range(2 * pairs)]

    @staticmethod
    def logged(window: int) -> bool:
        """Pairs on-off, off-on, on-off, ...: windows 0, 3, 4, 7, ... are logged."""
        return window % 4 in (0, 3)

    def on_step(self, step: int, metrics: dict[str, float]) -> None:
        window = step // WINDOW - 1  # window -1 is the warm-up, logged
        if 0 <= window < len(self.windows):
            self.windows[window].append(metrics)
        if (step + 1) % WINDOW == 0 and window + 1 < len(self.windows):
            self.system.pause_recovery_logs(not self.logged(window + 1))

    def mean(self, logged: bool, key: str) -> float:
        """The mean of ``key`` over the steps of the windows with the logs ``logged``."""
        return statistics.mean(m.get(key, 0.0) for w, window in enumerate(self.windows)
                               if self.logged(w) == logged for m in window)


def _system_rows(name: str, quick: bool) -> list[dict]:
    system = system_factory(name, **STANDBYS[name])()
    assert isinstance(system, PausableRecoveryLogs)
    windows = LogWindows(system, PAIRS[quick])
    steps = WINDOW * (1 + len(windows.windows))
    context, eval_source, rows_total = workload(steps)
    run_training(system, context(), eval_source, RunConfig(steps, eval_every=0, progress=False),
                 [windows])
    config = {"system": name, "model": "dlrm", "rows": rows_total, "steps": steps}

    def mean_s(window: list[dict[str, float]]) -> float:
        return statistics.mean(m["iter_time_s"] for m in window)

    pairs = list(zip(windows.windows[::2], windows.windows[1::2], strict=True))
    slowdown = paired_speedup([mean_s(first) / mean_s(second) if windows.logged(2 * k)
                               else mean_s(second) / mean_s(first)
                               for k, (first, second) in enumerate(pairs)])
    plain_s = windows.mean(False, "iter_time_s")
    critical_s = (windows.mean(True, "recovery_log_cpu_s") / TRAINERS
                  + windows.mean(True, "recovery_log_record_cpu_s"))
    agree_s = windows.mean(True, "recovery_agree_s") / TRAINERS
    phases = sorted({key for window in windows.windows for m in window for key in m
                     if key.startswith("time_")})
    return [
        _row("log_overhead_pct", 100.0 * (slowdown.speedup - 1.0), "%",
             ci_low_pct=100.0 * (slowdown.low - 1.0), ci_high_pct=100.0 * (slowdown.high - 1.0),
             pairs=slowdown.blocks, window_steps=WINDOW, plain_iter_time_s=plain_s, **config),
        _row("log_cpu_share_pct", 100.0 * critical_s / plain_s, "%", **config),
        _row("agree_wall_share_pct", 100.0 * agree_s / plain_s, "%", **config),
        *(_row("log_extra_phase_s",
               (windows.mean(True, key) - windows.mean(False, key)) / TRAINERS, "s",
               phase=key.removeprefix("time_").removesuffix("_s"), **config) for key in phases),
        _row("log_bytes_per_iter",
             windows.mean(True, "bytes_data") - windows.mean(False, "bytes_data"), "B", **config),
    ]


def run(quick: bool) -> list[dict]:
    return [row for name in STANDBYS for row in _system_rows(name, quick)]
