"""Bagpipe against the embedding-free bound: how much of its time embedding traffic still costs.

Issue #16 asks Bagpipe to come within :data:`GOAL` of the embedding-free bound (the system
``embedding_free``: the same trainers and dense synchronisation, with embedding traffic free).
Per model, this section takes Bagpipe's iteration time / the bound's within each block (seed) and
reports the geometric mean with its 95% interval (:mod:`bagpipe.harness.report.paired`). The goal
is *met* only where the whole interval lies at or below it, *missed* where the whole interval
lies above it, and *within noise of* it where the interval straddles it: a single block has no
interval and decides nothing.

The bound trains no exact model (its trainers' tables diverge), so it is a floor, never a
competitor: it stands in no "Bagpipe against each baseline" column and carries no AUC here.
"""

from __future__ import annotations

import pandas as pd

from bagpipe.harness.report.cells import cell, column_mean
from bagpipe.harness.report.head_to_head import SUBJECT
from bagpipe.harness.report.paired import PairedSpeedup, paired_speedup
from bagpipe.harness.track.sweeps import MODEL_ORDER, in_order

BOUND = "embedding_free"
#: Bagpipe's iteration time may be at most this multiple of the bound's (#16, expected outcome).
GOAL = 1.15
#: Trainer 0's phases (``bagpipe.core.meter.Phase``) the gap table compares.
GAP_PHASES = ("data", "fetch_wait", "forward", "backward", "sync", "optimizer")


def bound_lines(frame: pd.DataFrame) -> list[str]:
    """The markdown section (empty when the runs hold no Bagpipe or no embedding-free run)."""
    done = frame[frame["status"] == "FINISHED"]
    times = done.pivot_table(index=["model", "seed"], columns="system", values="iter_time_mean_s")
    if SUBJECT not in times or BOUND not in times:
        return []
    lines = ["## Bagpipe against the embedding-free bound", "",
             f"Per model: Bagpipe's iteration time / {BOUND}'s within each block, geometric mean "
             f"over blocks [95% interval], against the goal of at most {GOAL}x: *met* where the "
             f"interval's upper end is <= {GOAL}, *missed* where its lower end is above it, "
             f"*within noise of {GOAL}x* where it straddles it. {BOUND} is the same trainers and "
             "dense all-reduce with every table on every trainer: a lower bound on the time, "
             "not an exact trainer.", "",
             "| model | Bagpipe / bound [95% CI] | blocks | goal |", "|---|---|---|---|"]
    models = in_order(times.index.get_level_values("model"), MODEL_ORDER)
    for model in models:
        per_block = times.loc[model]
        ratio = paired_speedup((per_block[SUBJECT] / per_block[BOUND]).dropna().tolist())
        lines.append(f"| {model} | {cell(ratio.speedup, '.2f')}x [{cell(ratio.low, '.2f')}, "
                     f"{cell(ratio.high, '.2f')}] | {ratio.blocks} | {goal_verdict(ratio)} |")
    return [*lines, "", *_gap_lines(done, models)]


def _gap_lines(done: pd.DataFrame, models: list[str]) -> list[str]:
    """Where Bagpipe's time above the bound's goes: per model, Bagpipe's mean minus the bound's of
    each of trainer 0's phases, of the time no phase covers, and of a trainer's CPU (ms per
    iteration). ``sync`` beyond the bound's is the rows' all-reduce LRPP adds to the dense one;
    the rest is CPU work the bound does not do (the cache's upkeep, on these shared cores)."""
    present = [p for p in GAP_PHASES if f"time_{p}_s" in done]
    if not present:
        return []
    lines = [f"Where Bagpipe's time above {BOUND}'s goes, ms per iteration (Bagpipe's mean minus "
             "the bound's; trainer 0's phases, the time no phase covers, and a trainer's CPU):",
             "", f"| model | iteration | {' | '.join(present)} | other | a trainer's CPU |",
             "|---|---|" + "---|" * (len(present) + 2)]
    for model in models:
        runs = {system: done[(done["model"] == model) & (done["system"] == system)]
                for system in (SUBJECT, BOUND)}

        def gap(column: str, runs: dict[str, pd.DataFrame] = runs) -> float:
            return 1000 * (column_mean(runs[SUBJECT], column) - column_mean(runs[BOUND], column))

        phases = [gap(f"time_{p}_s") for p in present]
        other = gap("iter_time_mean_s") - sum(phases)
        lines.append(f"| {model} | {cell(gap('iter_time_mean_s'), '+.2f')} | "
                     f"{' | '.join(cell(v, '+.2f') for v in phases)} | {cell(other, '+.2f')} | "
                     f"{cell(gap('per_iter_trainer_cpu_s'), '+.2f')} |")
    return [*lines, ""]


def goal_verdict(ratio: PairedSpeedup, goal: float = GOAL) -> str:
    """``met``, ``missed`` or ``within noise of <goal>x`` for Bagpipe / bound ``ratio``
    (module docstring); ``one block`` or ``no pair`` where there is no interval."""
    if ratio.blocks < 2:
        return "one block" if ratio.blocks else "no pair"
    if ratio.high <= goal:  # at the goal counts as meeting it
        return "met"
    return "missed" if ratio.side_of(goal) == "above" else f"within noise of {goal}x"
