"""``python -m bagpipe.harness.report convergence`` (E13): AUC against steps and against wall time
per system, from the latest ``multirun/convergence`` sweep and, when it has run, the latest
``multirun/convergence_het`` one (HET at several staleness bounds).

Exact systems must follow ``local``'s curve: the table states each system's largest AUC
difference from ``local`` at the same seed and step, and the MLPerf time to the target AUC.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from bagpipe.harness.report.loading import load_records
from bagpipe.harness.report.plotting import Outputs, pyplot, save_csv, save_figure, write_report
from bagpipe.harness.track.mlperf import olympic_score
from bagpipe.harness.track.record import RunRecord

SUITE = "convergence"
#: Suites whose latest sweep is drawn beside the convergence sweep when they have run.
COMPANIONS = ("convergence_het",)
CLAIM = ("Bagpipe keeps the convergence and reproducibility guarantees of synchronous "
         "training (SOSP'23 abstract); HET trades them for bounded staleness")


def label(record: RunRecord) -> str:
    """The run's curve: its system, and HET's staleness bound (one curve per bound)."""
    system = record.tags.get("system", "?")
    bound = record.params.get("system.bound")
    return f"het bound={bound}" if system == "het" and bound is not None else system


def report(sweeps: Sequence[Path], out: Outputs) -> None:
    """``results/convergence/evals.csv`` and ``reports/convergence.{png,md}``."""
    records = [r for r in load_records(sweeps) if r.status == "FINISHED"]
    rows = [{"system": label(r), "seed": r.params.get("seed", "0"), **point}
            for r in records for point in r.evals]
    frame = pd.DataFrame(rows)
    save_csv(frame, out.table(SUITE, "evals.csv"))
    figure = _draw(frame, out.figure(SUITE))
    write_report(out, SUITE, "Convergence: AUC vs steps and vs wall time", figure,
                 _table(frame, records), CLAIM, [
                     "Sweeps: " + ", ".join(str(s) for s in sweeps) + ".",
                     "max |AUC - local|: the largest difference from `local`'s AUC at the same "
                     "seed and step (0 for an exact system, up to fp32 summation order).",
                     "Time to target: MLPerf olympic mean over the seeds (fastest and slowest "
                     "dropped; one run that never reaches the target may be the dropped "
                     "slowest), wall time from the run's start, evaluation included.",
                 ])


def _draw(frame: pd.DataFrame, path: Path) -> Path:
    """AUC (mean over seeds) against steps and against wall time, one line per curve."""
    fig, axes = pyplot().subplots(1, 2, figsize=(12, 4.2))
    styles = ["-", "--", ":", "-."]
    for index, (system, group) in enumerate(frame.groupby("system", sort=True)):
        mean = group.groupby("step")[["auc", "wall_s"]].mean()
        style = styles[index % 4]
        axes[0].plot(mean.index, mean["auc"], style, label=str(system), marker="o", ms=3)
        axes[1].plot(mean["wall_s"], mean["auc"], style, label=str(system), marker="o", ms=3)
    axes[0].set(xlabel="step", ylabel="eval AUC (mean over seeds)", title="AUC vs iterations")
    axes[1].set(xlabel="wall time (s)", ylabel="eval AUC (mean over seeds)",
                title="AUC vs wall time")
    axes[0].legend(fontsize=8)
    return save_figure(fig, path)


def _table(frame: pd.DataFrame, records: Sequence[RunRecord]) -> list[str]:
    """Per curve: seeds, final AUC, the gap to ``local`` and the olympic time to the target."""
    local = frame[frame["system"] == "local"].set_index(["seed", "step"])["auc"]
    target = records[0].params.get("run.target_auc", "?") if records else "?"
    lines = [f"| system | seeds | final step | AUC (mean) | max \\|AUC - local\\| | olympic "
             f"time to AUC {target} (s) |", "|---|---|---|---|---|---|"]
    for system, group in frame.groupby("system", sort=True):
        last = group[group["step"] == group["step"].max()]
        paired = group.set_index(["seed", "step"])["auc"]
        common = paired.index.intersection(local.index)
        gap = (paired[common] - local[common]).abs().max() if len(common) else float("nan")
        times = [r.summary.get("time_to_target_s", float("nan")) for r in records
                 if label(r) == system]
        score = olympic_score([t if t == t else float("inf") for t in times])
        lines.append(
            f"| {system} | {group['seed'].nunique()} | {int(last['step'].iloc[0])} | "
            f"{last['auc'].mean():.5f} | {gap:.2e} | "
            f"{'not reached' if score is None else f'{score:.2f}'} |")
    return lines
