"""MLPerf conventions: one ``mllog`` file per run, time-to-target, and olympic scoring.

A run's log follows the reference DLRMv2 timeline (harness.md §1.5, STYLE.md §3): ``cache_clear``,
``init_start``, submission fields and hyperparameters, ``init_stop``, ``run_start``,
``train_samples``, evaluations (``eval_start``/``eval_accuracy``/``eval_stop`` with the fraction of
an epoch as ``epoch_num``) inside one ``epoch_start``/``epoch_stop`` (a run trains at most one
epoch), ``run_stop`` with its status. The clock stops (``run_stop`` with
``success``) at the first evaluation that reaches the target AUC; the runner keeps training after
that to measure iteration time, but the MLPerf result is the time to the target.

Files are laid out as ``<results>/<system>-<model>/<benchmark>/result_<seed>.txt``: one MLPerf
"system" per (training system, model) pair, the seeds being its runs, so the upstream compliance
checker and result summarizer run on the tree unchanged.
"""

from __future__ import annotations

import json
import logging
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlperf_logging.mllog import constants as C
from mlperf_logging.mllog.mllog import MLLogger

#: Where the time-to-target of a run that never reached the target counts: it is non-converged.
NOT_CONVERGED = math.inf


def result_path(results_dir: Path, system: str, model: str, benchmark: str, seed: int) -> Path:
    """``<results_dir>/<system>-<model>/<benchmark>/result_<seed>.txt``."""
    return results_dir / f"{system}-{model}" / benchmark / f"result_{seed}.txt"


@dataclass(frozen=True)
class Submission:
    """The submission fields every log carries (``open`` division: semantics differ per system)."""

    benchmark: str
    division: str
    org: str
    platform: str


class MllogRecorder:
    """Writes one run's ``mllog`` file; used as a runner callback (``on_run_start``,
    ``on_eval_start``, ``on_eval``, ``on_run_end``).

    Only the process that drives the run logs (rank 0, as in the reference). Each recorder has its
    own ``logging.Logger`` and file, so runs in one process never write into each other's logs.
    """

    def __init__(self, path: Path, submission: Submission, target_auc: float) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.target_auc = target_auc
        self.status: str | None = None
        self.time_to_target_s: float | None = None
        self._logger = logging.getLogger(f"bagpipe.mllog.{id(self)}")
        self._logger.propagate = False
        self._logger.setLevel(logging.INFO)
        self._handler = logging.FileHandler(path, mode="w")
        self._logger.addHandler(self._handler)
        self._mllog = MLLogger(logger=self._logger, default_stack_offset=1)
        self._submission = submission
        self._run_started = False
        self._epoch_fraction = 0.0
        self._samples = (0, 0)

    def init_start(self, seed: int, global_batch_size: int, hyperparameters: dict[str, Any]) -> None:
        """Open the log: cache clear, init start, submission fields and hyperparameters."""
        log = self._mllog
        log.event(C.CACHE_CLEAR, True)
        log.start(C.INIT_START)
        log.event(C.SUBMISSION_ORG, self._submission.org)
        log.event(C.SUBMISSION_PLATFORM, self._submission.platform)
        log.event(C.SUBMISSION_DIVISION, self._submission.division)
        log.event(C.SUBMISSION_STATUS, "research")
        log.event(C.SUBMISSION_BENCHMARK, self._submission.benchmark)
        log.event(C.GLOBAL_BATCH_SIZE, global_batch_size)
        log.event(C.GRADIENT_ACCUMULATION_STEPS, 1)
        log.event(C.SEED, seed)
        log.event(C.OPT_NAME, "sgd")
        for key, value in hyperparameters.items():
            log.event(f"harness_{key}", value)

    def set_samples(self, train_samples: int, eval_samples: int) -> None:
        """The sample counts ``on_run_start`` logs (known once the data sources exist)."""
        self._samples = (train_samples, eval_samples)

    def on_run_start(self, ctx: Any = None) -> None:
        """The system is set up: the clock starts (the runner calls this after ``setup``)."""
        self._mllog.end(C.INIT_STOP)
        self._mllog.start(C.RUN_START)
        self._run_started = True
        self._mllog.event(C.TRAIN_SAMPLES, self._samples[0])
        self._mllog.event(C.EVAL_SAMPLES, self._samples[1])
        self._mllog.start(C.EPOCH_START, metadata={C.EPOCH_NUM: 0.0})
        self._epoch_fraction = 0.0

    def on_eval_start(self, step: int, epoch_fraction: float) -> None:
        """The evaluation after ``step`` steps begins (the runner calls this before it scores, so
        ``eval_start``/``eval_stop`` bracket the evaluation as in the reference)."""
        if self.status is not None:
            return
        self._epoch_fraction = float(epoch_fraction)
        self._mllog.start(C.EVAL_START, metadata={C.EPOCH_NUM: self._epoch_fraction})

    def on_eval(self, point: Any) -> None:
        """Log the evaluation's accuracy and its end; stop the MLPerf clock at the first one that
        reaches the target."""
        if self.status is not None:
            return
        meta = {C.EPOCH_NUM: self._epoch_fraction}
        self._mllog.event(C.EVAL_ACCURACY, float(point.auc), metadata=meta)
        self._mllog.end(C.EVAL_STOP, metadata=meta)
        if point.auc >= self.target_auc:
            self.time_to_target_s = float(point.wall_s)
            self._stop(C.SUCCESS)

    def on_run_end(self, result: Any = None) -> None:
        if self.status is None:
            self._stop(C.ABORTED)
        self.close()

    def fail(self) -> None:
        """The run raised: close the log as aborted (a failed run counts as non-converged)."""
        if self.status is None:
            if not self._run_started:
                self.on_run_start()
            self._stop(C.ABORTED)
        self.close()

    def close(self) -> None:
        self._logger.removeHandler(self._handler)
        self._handler.close()

    def _stop(self, status: str) -> None:
        self.status = status
        self._mllog.end(C.EPOCH_STOP, metadata={C.EPOCH_NUM: self._epoch_fraction})
        self._mllog.end(C.RUN_STOP, metadata={C.STATUS: status})


def read_mllog(path: Path) -> list[dict[str, Any]]:
    """The events of an ``mllog`` file, as dicts (``key``, ``value``, ``time_ms``, ``metadata``)."""
    events = []
    for line in path.read_text().splitlines():
        if line.startswith(":::MLLOG "):
            events.append(json.loads(line[len(":::MLLOG ") :]))
    return events


def time_to_train_min(path: Path) -> float:
    """``run_stop - run_start`` in minutes if the run succeeded, else :data:`NOT_CONVERGED`."""
    start = stop = None
    status = None
    for event in read_mllog(path):
        if event["key"] == C.RUN_START:
            start = event["time_ms"]
        elif event["key"] == C.RUN_STOP:
            stop = event["time_ms"]
            status = event["metadata"].get(C.STATUS)
    if start is None or stop is None or status != C.SUCCESS:
        return NOT_CONVERGED
    return (stop - start) / 60_000.0


def olympic_score(times: Sequence[float], max_dropped: int = 1) -> float | None:
    """MLPerf's olympic mean: drop the fastest and slowest ``max_dropped`` runs, average the rest.

    Non-converged runs (``inf``) stand in for the slowest; with more of them than ``max_dropped``
    the result is invalid (``None``), as it is when nothing is left to average.
    """
    converged = sorted(t for t in times if math.isfinite(t))
    dropped = len(times) - len(converged)
    if dropped > max_dropped:
        return None
    kept = converged[max_dropped : len(converged) - (max_dropped - dropped)]
    return statistics.fmean(kept) if kept else None


def score_results_dir(folder: Path) -> float | None:
    """Olympic time-to-train (minutes) over every ``result_*.txt`` in one benchmark folder."""
    return olympic_score([time_to_train_min(p) for p in sorted(folder.glob("result_*.txt"))])


def check_compliance(path: Path, ruleset: str = "6.0.0") -> bool:
    """Whether ``path`` passes the upstream MLPerf training compliance checker (``ruleset``)."""
    from mlperf_logging.compliance_checker import mlp_compliance

    checker = mlp_compliance.make_checker(usage="training", ruleset=ruleset, quiet=True, werror=False)
    valid, *_ = mlp_compliance.main(str(path), f"training_{ruleset}/common.yaml", checker)
    return bool(valid)


def main(argv: list[str] | None = None) -> int:
    """``python -m bagpipe.harness.track.mlperf <results dir>``: check every log, print olympic scores."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m bagpipe.harness.track.mlperf", description=main.__doc__)
    parser.add_argument("results_dir", type=Path)
    parser.add_argument("--ruleset", default="6.0.0")
    args = parser.parse_args(argv)
    logs = sorted(args.results_dir.rglob("result_*.txt"))
    failed = [p for p in logs if not check_compliance(p, args.ruleset)]
    for folder in sorted({p.parent for p in logs}):
        score = score_results_dir(folder)
        shown = "invalid (needs >= 3 runs, at most one not converged)" if score is None else f"{score:.4f} min"
        print(f"{folder.relative_to(args.results_dir)}: olympic time-to-train {shown}")
    print(f"{len(logs) - len(failed)}/{len(logs)} logs pass the compliance checker ({args.ruleset})")
    for path in failed:
        print(f"FAILED: {path}")
    return 1 if failed or not logs else 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
