"""The run's headline statistics by value: iteration-time mean, p50 and p90, samples per second,
per-iteration bytes, rows, phase shares and hit rate over the measured window, the last losses.

Expected values are worked out by hand in each test (numpy's linear quantile: position
``q * (n - 1)`` between the two neighbouring sorted values), never by the code under test.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest

from bagpipe.core.batch import Batch
from bagpipe.core.interface import ModelState, StepResult, TrainContext
from bagpipe.core.meter import StepRecord
from bagpipe.harness.run import runner
from bagpipe.harness.run.runner import EvalPoint, RunConfig, run_training, summarize
from bagpipe.training.local import LocalSystem
from tests.conftest import TINY_SCHEMA, TinySource

ContextFactory = Callable[..., TrainContext]
#: Step times after a warm-up of 2, out of order: sorted they are 1, 2, ..., 10 seconds.
TIMES = [50.0, 40.0, 7.0, 2.0, 9.0, 1.0, 10.0, 4.0, 3.0, 8.0, 5.0, 6.0]


def _steps(times: list[float]) -> list[dict[str, float]]:
    return [{"step": float(i), "iter_time_s": t, "loss": float(i)} for i, t in enumerate(times)]


def test_summary_of_known_steps() -> None:
    records = [StepRecord(bytes_sent={"emb_pull": 1000}, rows_sent={"emb_pull": 10},
                          phase_s={"forward": 9.0}, cache_hits=9, cache_misses=1)] * 2 + [
        StepRecord(bytes_sent={"emb_pull": 100 * i, "data": 8}, rows_sent={"emb_pull": i},
                   phase_s={"forward": 0.5, "backward": 1.0}, cache_hits=i, cache_misses=1)
        for i in range(1, 11)
    ]
    evals = [EvalPoint(4, 0.6, 0.7, 0.5, 1.0), EvalPoint(12, 0.75, 0.5, 1.5, 2.0)]
    cfg = RunConfig(num_steps=12, eval_every=4, warmup_steps=2)
    s = summarize(_steps(TIMES), records, evals, cfg, batch_size=64)
    assert (s["steps"], s["measured_steps"]) == (12.0, 10.0)
    assert s["iter_time_mean_s"] == pytest.approx(5.5, rel=1e-12)
    assert s["iter_time_p50_s"] == pytest.approx(5.5, rel=1e-12)  # between 5 and 6
    assert s["iter_time_p90_s"] == pytest.approx(9.1, rel=1e-12)  # 9 + 0.1 * (10 - 9)
    assert s["samples_per_s"] == pytest.approx(64 / 5.5, rel=1e-12)
    assert s["train_loss_last"] == pytest.approx(6.5, rel=1e-12)  # steps 2..11
    # the warm-up's records are left out, the rest averaged over the 10 measured steps
    assert s["bytes_per_iter_emb_pull"] == pytest.approx(550.0, rel=1e-12)  # 100 * (1+..+10) / 10
    assert s["bytes_per_iter_data"] == 8.0
    assert s["rows_per_iter_emb_pull"] == 5.5 and s["rows_per_iter_emb_push"] == 0.0
    assert s["time_forward_s"] == 0.5 and s["time_backward_s"] == 1.0
    assert s["share_forward"] == pytest.approx(0.5 / 5.5, rel=1e-12)
    assert s["share_optimizer"] == 0.0
    assert s["hit_rate"] == pytest.approx(55 / 65, rel=1e-12)
    assert (s["auc"], s["logloss"], s["epoch_fraction"]) == (0.75, 0.5, 1.5)


@pytest.mark.parametrize(
    ("times", "p50", "p90"),
    [
        ([3.0], 3.0, 3.0),
        ([4.0, 2.0], 3.0, 3.8),  # positions 0.5 and 0.9 between 2 and 4
        ([8.0, 1.0, 2.0], 2.0, 6.8),  # p90 at position 1.8: 2 + 0.8 * (8 - 2)
        ([5.0, 1.0, 4.0, 2.0, 3.0], 3.0, 4.6),
    ],
)
def test_percentiles_interpolate_between_sorted_times(
    times: list[float], p50: float, p90: float
) -> None:
    cfg = RunConfig(num_steps=len(times), eval_every=0, warmup_steps=0)
    s = summarize(_steps(times), [StepRecord()] * len(times), [], cfg, batch_size=8)
    assert s["iter_time_p50_s"] == pytest.approx(p50, rel=1e-12)
    assert s["iter_time_p90_s"] == pytest.approx(p90, rel=1e-12)
    assert s["measured_steps"] == len(times)
    assert math.isnan(s["hit_rate"]) and math.isnan(s["auc"]) and math.isnan(s["epoch_fraction"])


def test_a_warm_up_as_long_as_the_run_measures_every_step() -> None:
    cfg = RunConfig(num_steps=3, eval_every=0, warmup_steps=3)
    s = summarize(_steps([1.0, 2.0, 6.0]), [StepRecord()] * 3, [], cfg, batch_size=9)
    assert s["measured_steps"] == 3.0 and s["iter_time_mean_s"] == 3.0
    assert s["samples_per_s"] == 3.0 and s["train_loss_last"] == 1.0


class _FakeClock:
    """``perf_counter`` that moves only when a step says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def perf_counter(self) -> float:
        return self.now


class _Clocked(LocalSystem):
    """LocalSystem whose step ``i`` takes ``durations[i]`` seconds and reports loss ``i``."""

    name = "clocked"

    def __init__(self, clock: _FakeClock, durations: list[float]) -> None:
        super().__init__()
        self.clock = clock
        self.durations = durations

    def train_step(self, step: int, batch: Batch) -> StepResult:
        result = super().train_step(step, batch)
        self.clock.now += self.durations[step]
        return StepResult(float(step), result.record)

    def stats(self) -> dict[str, Any]:
        return {"rows": 7, "ratio": 0.25, "flag": True, "label": "x"}

    def full_state(self) -> ModelState:
        """Read by the evaluation (and a checkpoint): a quarter of a second each."""
        self.clock.now += 0.25
        return super().full_state()


def test_run_training_reports_the_exact_statistics_of_its_step_times(
    tiny_context: ContextFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = _FakeClock()
    monkeypatch.setattr(runner, "time", clock)
    cfg = RunConfig(num_steps=12, eval_every=0, warmup_steps=2, progress=False)
    eval_source = TinySource(TINY_SCHEMA, batch_size=8, num_batches=1, seed=1)
    result = run_training(_Clocked(clock, TIMES), tiny_context(batch_size=8), eval_source, cfg)
    s = result.summary
    assert [m["iter_time_s"] for m in result.steps] == TIMES
    assert s["iter_time_mean_s"] == pytest.approx(5.5, rel=1e-12)
    assert s["iter_time_p50_s"] == pytest.approx(5.5, rel=1e-12)
    assert s["iter_time_p90_s"] == pytest.approx(9.1, rel=1e-12)
    assert s["samples_per_s"] == pytest.approx(8 / 5.5, rel=1e-12)
    assert s["train_loss_last"] == pytest.approx(6.5, rel=1e-12)
    assert s["system_rows"] == 7.0 and s["system_ratio"] == 0.25
    assert "system_flag" not in s and "system_label" not in s
    assert s["first_step"] == 0.0 and s["reorders_samples"] == 0.0
    assert s["init_time_s"] == 0.0 and s["checkpoint_wall_s"] == 0.0
    # one evaluation, at the end: its quarter second is evaluation time, not training time.
    # (The run's start is read from the real clock, so the total is taken from the evaluation
    # point, stamped as the run ends.)
    assert s["eval_wall_s"] == 0.25 and [p.step for p in result.evals] == [12]
    assert s["train_wall_s"] == pytest.approx(result.evals[-1].wall_s - 0.25, rel=1e-12)


def test_zero_and_subsecond_step_times() -> None:
    cfg = RunConfig(num_steps=2, eval_every=0, warmup_steps=0)
    s = summarize(_steps([0.0, 0.0]), [StepRecord(phase_s={"forward": 0.0})] * 2, [], cfg,
                  batch_size=8)
    assert s["samples_per_s"] == math.inf and s["share_forward"] == 0.0
    s = summarize(_steps([0.25, 0.75]), [StepRecord(phase_s={"forward": 0.25})] * 2, [], cfg,
                  batch_size=8)
    assert s["samples_per_s"] == 16.0 and s["share_forward"] == 0.5


def test_counters_are_averaged_over_the_window_and_the_base_rate_comes_with_the_last_eval() -> None:
    # the warm-up's write-backs are left out: a cache that cycled only while warming up shows 0
    records = [StepRecord(counters={"rows_written_back": 50.0})] * 2 + [
        StepRecord(counters={"rows_prefetched": float(i)}) for i in range(1, 5)]
    evals = [EvalPoint(6, 0.7, 0.5, 1.0, 1.0, positive_rate=0.25)]
    cfg = RunConfig(num_steps=6, eval_every=0, warmup_steps=2)
    s = summarize(_steps([1.0] * 6), records, evals, cfg, batch_size=8)
    assert s["per_iter_rows_written_back"] == 0.0
    assert s["per_iter_rows_prefetched"] == pytest.approx(2.5)  # (1 + 2 + 3 + 4) / 4
    assert s["eval_positive_rate"] == 0.25
    # -(p ln p + (1 - p) ln(1 - p)) at p = 1/4
    assert s["base_rate_logloss"] == pytest.approx(0.25 * math.log(4) + 0.75 * math.log(4 / 3))
