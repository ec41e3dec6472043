"""The runner (data order, eval cadence, warm-up exclusion, summary, close on error) and evaluation."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch

from bagpipe.core import runtime
from bagpipe.core.batch import Batch
from bagpipe.core.interface import ModelState, PhaseInfo, StepResult, TrainContext
from bagpipe.core.meter import LinkKind, Phase
from bagpipe.harness.run import leftovers
from bagpipe.harness.run.evaluate import evaluate, roc_auc
from bagpipe.harness.run.leftovers import LeftoverWorkError
from bagpipe.harness.run.runner import EvalPoint, RunConfig, RunResult, run_training
from bagpipe.models import ReferenceModel
from bagpipe.training.local import LocalSystem
from tests.conftest import TINY_MODEL, TINY_SCHEMA, TinySource

ContextFactory = Callable[..., TrainContext]


class Recorder:
    """A callback that records what it saw, in order."""

    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []

    def on_run_start(self, ctx: TrainContext) -> None:
        self.events.append(("start", ctx.seed))

    def on_step(self, step: int, metrics: dict[str, float]) -> None:
        self.events.append(("step", step))

    def on_eval_start(self, step: int, epoch_fraction: float) -> None:
        self.events.append(("eval_start", step))

    def on_eval(self, point: EvalPoint) -> None:
        self.events.append(("eval", point.step))

    def on_run_end(self, result: RunResult) -> None:
        self.events.append(("end", len(result.steps)))


class Probe(LocalSystem):
    """LocalSystem that records the batches and boundaries it is given, can fail, and charges traffic on its first steps."""

    name = "probe"

    def __init__(self, fail_at: int | None = None, traffic_steps: int = 0) -> None:
        super().__init__()
        self.fail_at = fail_at
        self.traffic_steps = traffic_steps
        self.seen_labels: list[torch.Tensor] = []
        self.boundaries: list[PhaseInfo] = []
        self.closed = 0

    def train_step(self, step: int, batch: Batch) -> StepResult:
        if step == self.fail_at:
            raise RuntimeError("boom")
        if step < self.traffic_steps:
            runtime.current().meter.add_traffic(LinkKind.EMB_PULL, 1000, rows=10)
        self.seen_labels.append(batch.labels.clone())
        return super().train_step(step, batch)

    def on_phase_boundary(self, info: PhaseInfo) -> None:
        self.boundaries.append(info)

    def close(self) -> None:
        self.closed += 1


def test_summary_evals_and_callbacks(tiny_context: ContextFactory) -> None:
    ctx = tiny_context(batch_size=8, num_batches=3)
    system, recorder = Probe(), Recorder()
    eval_source = TinySource(TINY_SCHEMA, batch_size=16, num_batches=2, seed=1)
    cfg = RunConfig(num_steps=7, eval_every=3, warmup_steps=2, progress=False)
    result = run_training(system, ctx, eval_source, cfg, callbacks=[recorder])

    assert [p.step for p in result.evals] == [3, 6, 7]
    assert [p.epoch_fraction for p in result.evals] == pytest.approx([1.0, 2.0, 7 / 3])
    assert all(0.0 <= p.auc <= 1.0 and p.logloss > 0 and p.wall_s > 0 for p in result.evals)
    assert result.evals[0].wall_s < result.evals[1].wall_s
    # data order: step s trains on source[s % len]; boundaries after wraps and after each eval
    for step, labels in enumerate(system.seen_labels):
        assert torch.equal(labels, ctx.source[step % 3].labels)
    kinds = [(b.step, b.kind) for b in system.boundaries]
    assert kinds == [(3, "epoch"), (3, "eval"), (6, "epoch"), (6, "eval"), (7, "eval")]
    assert system.boundaries[1].eval_logloss == result.evals[0].logloss
    assert system.closed == 1
    assert recorder.events[0] == ("start", ctx.seed)
    assert recorder.events[-1] == ("end", 7)
    assert [e for e in recorder.events if e[0].startswith("eval")] == [
        ("eval_start", 3), ("eval", 3), ("eval_start", 6), ("eval", 6), ("eval_start", 7), ("eval", 7)
    ]
    assert recorder.events.index(("eval_start", 3)) == recorder.events.index(("step", 2)) + 1

    s = result.summary
    for key in (
        "steps", "iter_time_mean_s", "iter_time_p50_s", "iter_time_p90_s", "auc", "logloss",
        "hit_rate", "init_time_s", "train_wall_s", "eval_wall_s", "reorders_samples",
    ):  # fmt: skip
        assert key in s, key
    for kind in LinkKind:
        assert f"bytes_per_iter_{kind}" in s
    for phase in Phase:
        assert f"time_{phase}_s" in s and f"share_{phase}" in s
    assert s["steps"] == 7 and s["measured_steps"] == 5
    assert s["auc"] == result.evals[-1].auc
    assert math.isnan(s["hit_rate"])
    assert s["reorders_samples"] == 0.0
    assert s["system_table_bytes"] == TINY_SCHEMA.total_rows * 4 * 4  # rows x dim x fp32
    assert s["share_forward"] + s["share_backward"] + s["share_optimizer"] <= 1.0
    assert result.steps[0]["loss"] > 0 and "time_forward_s" in result.steps[0]


def test_warmup_steps_are_excluded_from_statistics(tiny_context: ContextFactory) -> None:
    """The first two steps move bytes; with warm-up 2 they must not show in per-iteration means."""
    source = TinySource(TINY_SCHEMA, batch_size=8, num_batches=2, seed=1)
    with_warmup = run_training(
        Probe(traffic_steps=2),
        tiny_context(),
        source,
        RunConfig(4, 0, warmup_steps=2, progress=False),
    )
    without = run_training(
        Probe(traffic_steps=2),
        tiny_context(),
        source,
        RunConfig(4, 0, warmup_steps=0, progress=False),
    )
    assert with_warmup.summary["bytes_per_iter_emb_pull"] == 0.0
    assert without.summary["bytes_per_iter_emb_pull"] == pytest.approx(2 * 1000 / 4)
    assert without.summary["rows_per_iter_emb_pull"] == pytest.approx(2 * 10 / 4)
    times = [m["iter_time_s"] for m in with_warmup.steps[2:]]
    assert with_warmup.summary["iter_time_mean_s"] == pytest.approx(sum(times) / 2)


def test_the_summary_holds_the_cpu_of_the_timed_steps_by_kind_of_process(
    tiny_context: ContextFactory,
) -> None:
    """``local`` trains in the driver: its timed steps' CPU is the driver's, no role's; a run
    no longer than its warm-up has no timed CPU to report."""
    source = TinySource(TINY_SCHEMA, batch_size=8, num_batches=2, seed=1)
    summary = run_training(LocalSystem(), tiny_context(), source,
                           RunConfig(6, 0, warmup_steps=2, progress=False)).summary
    assert summary["per_iter_driver_cpu_s"] > 0
    assert summary["per_iter_trainer_cpu_s"] == 0 and summary["per_iter_helpers_cpu_s"] == 0
    short = run_training(LocalSystem(), tiny_context(), source,
                         RunConfig(2, 0, warmup_steps=2, progress=False)).summary
    assert math.isnan(short["per_iter_driver_cpu_s"])


def test_close_is_called_even_when_a_step_fails(tiny_context: ContextFactory) -> None:
    system, recorder = Probe(fail_at=2), Recorder()
    source = TinySource(TINY_SCHEMA, batch_size=8, num_batches=1, seed=1)
    with pytest.raises(RuntimeError, match="boom"):
        run_training(system, tiny_context(), source, RunConfig(5, 1, progress=False), [recorder])
    assert system.closed == 1
    assert ("end", 2) not in recorder.events and recorder.events[-1][0] == "eval"


class LeavesAThread(LocalSystem):
    """LocalSystem with a background thread that its ``close`` stops, or (``stops=False``) not."""

    name = "leaves_a_thread"

    def __init__(self, stops: bool) -> None:
        super().__init__()
        self.stops = stops
        self.stop = threading.Event()
        self.worker = threading.Thread(target=self.stop.wait, name="leftover-worker", daemon=True)

    def setup(self, ctx: TrainContext) -> None:
        super().setup(ctx)
        self.worker.start()

    def close(self) -> None:
        if self.stops:
            threading.Timer(0.05, self.stop.set).start()  # ends a moment after close returns


@pytest.mark.parametrize("stops", [True, False])
def test_a_run_that_leaves_a_thread_running_fails(
    tiny_context: ContextFactory, monkeypatch: pytest.MonkeyPatch, stops: bool
) -> None:
    """Runs sharing a process (the in-process launcher) must not share the CPU with an earlier
    run's threads: a thread still alive after the grace period fails the run; one that ends
    within it does not."""
    monkeypatch.setattr(leftovers, "GRACE_S", 0.5)
    system, recorder = LeavesAThread(stops), Recorder()
    source = TinySource(TINY_SCHEMA, batch_size=8, num_batches=1, seed=1)
    try:
        if stops:
            run_training(system, tiny_context(), source, RunConfig(2, 0, progress=False), [recorder])
            assert recorder.events[-1] == ("end", 2)
        else:
            with pytest.raises(LeftoverWorkError, match=r"'leaves_a_thread' left thread "
                                                        r"'leftover-worker' running"):
                run_training(system, tiny_context(), source, RunConfig(2, 0, progress=False),
                             [recorder])
    finally:
        system.stop.set()
        system.worker.join()


def test_training_on_local_improves_auc(tiny_context: ContextFactory) -> None:
    ctx = tiny_context(batch_size=64, num_batches=4, lr=0.5)
    eval_source = TinySource(TINY_SCHEMA, batch_size=128, num_batches=2, seed=1)  # held out
    result = run_training(LocalSystem(), ctx, eval_source, RunConfig(40, 20, progress=False))
    first, last = result.evals[0], result.evals[-1]
    assert last.auc > 0.8 and last.logloss < first.logloss + 1e-9
    assert result.evals[-1].step == 40


def test_run_config_rejects_bad_values() -> None:
    with pytest.raises(ValueError, match=r"run\.num_steps"):
        RunConfig(num_steps=0, eval_every=1)
    with pytest.raises(ValueError, match=r"run\.eval_every"):
        RunConfig(num_steps=1, eval_every=-1)


def test_roc_auc_matches_pair_counting_with_ties() -> None:
    gen = torch.Generator().manual_seed(0)
    scores = torch.randint(0, 5, (60,), generator=gen).float()  # many ties
    labels = (torch.rand(60, generator=gen) < 0.4).float()
    pos, neg = scores[labels == 1], scores[labels == 0]
    pairs = (pos[:, None] > neg[None, :]).float() + 0.5 * (pos[:, None] == neg[None, :]).float()
    assert roc_auc(scores, labels) == pytest.approx(float(pairs.mean()))
    assert roc_auc(torch.tensor([0.1, 0.9]), torch.tensor([0.0, 1.0])) == 1.0
    assert math.isnan(roc_auc(torch.tensor([0.1, 0.2]), torch.tensor([1.0, 1.0])))


def test_evaluate_scores_the_given_state() -> None:
    model = ReferenceModel(TINY_MODEL, TINY_SCHEMA, seed=4)
    state: ModelState = model.state()
    source = TinySource(TINY_SCHEMA, batch_size=16, num_batches=2, seed=2)
    auc, logloss = evaluate(state, TINY_MODEL, TINY_SCHEMA, source)
    with torch.no_grad():
        logits = torch.cat([model(b) for b in source])
    labels = torch.cat([b.labels for b in source])
    assert auc == pytest.approx(roc_auc(logits, labels))
    want = float(torch.nn.functional.binary_cross_entropy_with_logits(logits, labels))
    assert logloss == pytest.approx(want, rel=1e-6)


class ThreadProbe(Probe):
    """Probe that records the driver's torch threads at every step."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: list[int] = []

    def train_step(self, step: int, batch: Batch) -> StepResult:
        self.threads.append(torch.get_num_threads())
        return super().train_step(step, batch)


def test_the_driver_trains_with_the_configured_threads_and_gets_its_own_back(
    tiny_context: ContextFactory,
) -> None:
    """A benchmark that drives a system itself gets the harness's one thread, not its own two."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        system = ThreadProbe()
        eval_source = TinySource(TINY_SCHEMA, batch_size=16, num_batches=1, seed=1)
        run_training(system, tiny_context(batch_size=8, num_batches=2), eval_source,
                     RunConfig(num_steps=2, eval_every=0, progress=False))
        assert system.threads == [1, 1]
        assert torch.get_num_threads() == 2
        with pytest.raises(ValueError, match=r"run\.torch_threads"):
            RunConfig(num_steps=2, eval_every=0, torch_threads=0)
    finally:
        torch.set_num_threads(before)
