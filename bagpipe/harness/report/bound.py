"""Bagpipe against the embedding-free bound: how much of its time embedding traffic still costs.

Issue #16 asks Bagpipe to come within :data:`GOAL` of the embedding-free bound (the system
``embedding_free``: the same trainers and dense synchronisation, with embedding traffic free).
Per model, this section takes Bagpipe's iteration time / the bound's within each block
(``bagpipe.harness.track.sweeps.with_blocks``: the seed and the regime) and
reports the geometric mean with its 95% interval (:mod:`bagpipe.harness.report.paired`). The goal
is *met* only where the whole interval lies at or below it, *missed* where the whole interval
lies above it, and *within noise of* it where the interval straddles it: a single block has no
interval and decides nothing.

Two tables then say where the gap comes from, so that a miss can be told apart as the
algorithm's or the implementation's:

* **Traffic or CPU.** The cost model (:mod:`bagpipe.harness.report.costmodel`, checked against
  these runs by the fig7 projection) prices each block's Bagpipe run three ways against its bound
  run: with each run's own trainer CPU (the projection of the measured ratio); with *the bound's*
  trainer CPU as Bagpipe's compute, which leaves only the traffic Bagpipe's algorithm moves (the
  rows' all-reduce on the critical path, the rounds and the sync-later all-reduce on their lanes);
  and on the undilated target network with the topology's compute for both. A gap that the
  second column does not show is CPU, not traffic.
* **Whose CPU.** Bagpipe's mean minus the bound's, per phase, of the time trainer 0 waited and
  of the CPU its step's thread spent (``cpu_<phase>_s``, ``bagpipe.core.meter``), and of a
  trainer's CPU outside its step's thread: its round thread's (evictions, write-backs,
  prefetches) and the other threads' (the collectives', RPC).

The bound trains no exact model (its trainers' tables diverge), so it is a floor, never a
competitor: it stands in no "Bagpipe against each baseline" column and carries no AUC here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import pandas as pd

from bagpipe.core.meter import OTHER_TIME_PARTS, other_time_parts
from bagpipe.core.net.topology import Compute
from bagpipe.harness.report.cells import cell, column_mean
from bagpipe.harness.report.costmodel import predict
from bagpipe.harness.report.head_to_head import SUBJECT
from bagpipe.harness.report.paired import PairedSpeedup, paired_speedup
from bagpipe.harness.report.regime import (
    ROUND_CPU,
    TRAINER_CPU,
    emulated_topology,
    run_topology,
    run_workload,
)
from bagpipe.harness.track.sweeps import BLOCK, MODEL_ORDER, in_order, with_blocks

BOUND = "embedding_free"
#: Bagpipe's iteration time may be at most this multiple of the bound's (#16, expected outcome).
GOAL = 1.15
#: Trainer 0's phases (``bagpipe.core.meter.Phase``) the gap table compares.
GAP_PHASES = ("data", "fetch_wait", "forward", "backward", "sync", "optimizer")


def bound_lines(frame: pd.DataFrame) -> list[str]:
    """The markdown section (empty when the runs hold no Bagpipe or no embedding-free run)."""
    done = with_blocks(frame[frame["status"] == "FINISHED"])
    if not {SUBJECT, BOUND} <= set(done["system"]):
        return []
    lines = ["## Bagpipe against the embedding-free bound", "",
             f"Per model: Bagpipe's iteration time / {BOUND}'s within each block, geometric mean "
             f"over blocks [95% interval], against the goal of at most {GOAL}x: *met* where the "
             f"interval's upper end is <= {GOAL}, *missed* where its lower end is above it, "
             f"*within noise of {GOAL}x* where it straddles it. {BOUND} is the same trainers and "
             "dense all-reduce with every table on every trainer: a lower bound on the time, "
             "not an exact trainer.", "",
             "| model | Bagpipe / bound [95% CI] | blocks | goal |", "|---|---|---|---|"]
    models = in_order(done["model"], MODEL_ORDER)
    for model in models:
        ratio = bound_ratio(done[done["model"] == model])
        lines.append(f"| {model} | {cell(ratio.speedup, '.2f')}x [{cell(ratio.low, '.2f')}, "
                     f"{cell(ratio.high, '.2f')}] | {ratio.blocks} | {goal_verdict(ratio)} |")
    return [*lines, "", *_traffic_lines(done, models), *gap_lines(done, models),
            *_other_lines(done, models)]


def bound_ratio(runs: pd.DataFrame) -> PairedSpeedup:
    """Bagpipe's iteration time / the bound's, paired within the blocks of ``runs`` (finished
    runs of one model, carrying their :func:`~bagpipe.harness.track.sweeps.with_blocks` column)
    and summarised over them."""
    return time_ratio(runs, SUBJECT, BOUND)


def time_ratio(runs: pd.DataFrame, system: str, under: str) -> PairedSpeedup:
    """``system``'s iteration time / ``under``'s, paired within the blocks of ``runs`` as
    :func:`bound_ratio` pairs them."""
    times = runs.pivot_table(index=BLOCK, columns="system", values="iter_time_mean_s")
    if system not in times or under not in times:
        return paired_speedup([])
    return paired_speedup((times[system] / times[under]).dropna().tolist())


#: The columns of the traffic-or-CPU table: a heading and how one block's pair is priced.
PRICINGS = ("own CPU", "the bound's CPU", "target")


def priced_ratios(bagpipe: Mapping[Any, Any], bound: Mapping[Any, Any]) -> dict[str, float]:
    """One block's Bagpipe / bound iteration time as the cost model prices it, per
    :data:`PRICINGS` (``nan`` where a run lacks what a pricing needs):

    * ``own CPU``: each run's bytes and its own trainer CPU on the run's dilated network;
    * ``the bound's CPU``: Bagpipe's bytes with the bound's trainer CPU as its compute, so only
      the traffic its algorithm moves separates the two;
    * ``target``: the topology's network undilated, both with the target's compute for this step
      (``dilation.compute_target_ms``); Bagpipe's servers keep the CPU they spent here, on the
      lane of its rounds (a charge no faster server can raise)."""
    out = dict.fromkeys(PRICINGS, math.nan)
    work, floor = run_workload(bagpipe), run_workload(bound)
    emulated = emulated_topology(bagpipe)
    if work is None or floor is None or emulated is None:
        return out
    floor_s = predict(floor, emulated).iter_s
    out["own CPU"] = predict(work, emulated).iter_s / floor_s
    out["the bound's CPU"] = predict(replace(work, compute_s=floor.compute_s), emulated).iter_s / floor_s
    target, target_ms = run_topology(bagpipe), bagpipe.get("dilation.compute_target_ms")
    if target is not None and target_ms is not None and not pd.isna(target_ms):
        target = replace(target, compute=Compute())
        compute_s = float(target_ms) / 1000
        out["target"] = (predict(replace(work, compute_s=compute_s), target).iter_s
                         / predict(replace(floor, compute_s=compute_s), target).iter_s)
    return out


def _traffic_lines(done: pd.DataFrame, models: list[str]) -> list[str]:
    """The traffic-or-CPU table (module docstring): per model, the measured ratio beside the
    three pricings of :func:`priced_ratios`, geometric means over the blocks."""
    if TRAINER_CPU not in done:
        return []
    lines = [f"Traffic or CPU: Bagpipe / {BOUND} as the cost model prices each block's pair, "
             "geometric mean over blocks. *Own CPU* prices each run's bytes with its own trainer "
             f"CPU; *{PRICINGS[1]}* gives Bagpipe the bound's trainer CPU, leaving only the traffic "
             "its algorithm moves; *target* is the topology's network undilated with the target's "
             "compute for both:", "",
             f"| model | measured | {' | '.join(PRICINGS)} |", "|---|---|" + "---|" * len(PRICINGS)]
    for model in models:
        runs = done[done["model"] == model]
        bounds = runs[runs["system"] == BOUND].drop_duplicates(BLOCK).set_index(BLOCK)
        pairs = [(row, bounds.loc[row[BLOCK]].to_dict())
                 for row in runs[runs["system"] == SUBJECT].to_dict("records")
                 if row[BLOCK] in bounds.index]
        if not pairs:
            continue
        priced = [priced_ratios(row, bound) for row, bound in pairs]
        measured = [row["iter_time_mean_s"] / bound["iter_time_mean_s"] for row, bound in pairs]
        cells = [paired_speedup([p[name] for p in priced]).speedup for name in PRICINGS]
        lines.append(f"| {model} | {cell(paired_speedup(measured).speedup, '.2f', 'x')} | "
                     + " | ".join(cell(v, ".2f", "x") for v in cells) + " |")
    return [*lines, ""]


def gap_lines(done: pd.DataFrame, models: list[str], system: str = SUBJECT,
               under: str = BOUND) -> list[str]:
    """Where ``system``'s time above ``under``'s goes (Bagpipe's above the bound's unless told):
    per model, the mean of ``system`` minus that of ``under`` (ms per iteration) of each of
    trainer 0's phases, of the time no phase covers and of a trainer's CPU; then, where the runs
    recorded it, of the CPU trainer 0's step thread spent in each phase and of a trainer's CPU
    outside it: its round thread's (a system without rounds spends none) and the other threads'
    (collectives, RPC)."""
    present = [p for p in GAP_PHASES if f"time_{p}_s" in done]
    if not present:
        return []
    header = f"| model | iteration | {' | '.join(present)} | other | a trainer's CPU |"
    lines = [f"Where {system}'s time above {under}'s goes, ms per iteration ({system}'s mean "
             f"minus {under}'s; trainer 0's phases, the time no phase covers, and a trainer's "
             "CPU):", "", header, "|---|---|" + "---|" * (len(present) + 2)]
    with_cpu = [p for p in present if f"cpu_{p}_s" in done]
    cpu_lines = [f"The CPU behind it, ms per iteration ({system}'s mean minus {under}'s): "
                 "trainer 0's step thread in each phase, and a trainer's CPU outside that thread: "
                 "its round thread (evictions, write-backs, prefetches) and the other threads "
                 "(the collectives', RPC):", "",
                 f"| model | {' | '.join(with_cpu)} | the round thread | other threads "
                 "| a trainer's CPU |",
                 "|---|" + "---|" * (len(with_cpu) + 3)]
    for model in models:
        runs = {name: done[(done["model"] == model) & (done["system"] == name)]
                for name in (system, under)}

        def gap(column: str, runs: dict[str, pd.DataFrame] = runs) -> float:
            return 1000 * (column_mean(runs[system], column) - column_mean(runs[under], column))

        phases = [gap(f"time_{p}_s") for p in present]
        other = gap("iter_time_mean_s") - sum(phases)
        trainer_cpu = gap(TRAINER_CPU)
        lines.append(f"| {model} | {cell(gap('iter_time_mean_s'), '+.2f')} | "
                     f"{' | '.join(cell(v, '+.2f') for v in phases)} | {cell(other, '+.2f')} | "
                     f"{cell(trainer_cpu, '+.2f')} |")
        step_cpu = [gap(f"cpu_{p}_s") for p in with_cpu]
        rounds = 1000 * (round_cpu(runs[system]) - round_cpu(runs[under]))
        cpu_lines.append(f"| {model} | {' | '.join(cell(v, '+.2f') for v in step_cpu)} | "
                         f"{cell(rounds, '+.2f')} | "
                         f"{cell(trainer_cpu - sum(step_cpu) - rounds, '+.2f')} | "
                         f"{cell(trainer_cpu, '+.2f')} |")
    recorded = with_cpu and not done[[f"cpu_{p}_s" for p in with_cpu]].isna().all().all()
    return [*lines, "", *([*cpu_lines, ""] if recorded else [])]


def round_cpu(runs: pd.DataFrame) -> float:
    """A trainer's round-thread CPU seconds per iteration (:data:`ROUND_CPU` over the trainers):
    0 where the runs recorded none (a system without rounds), NaN where none of them ran."""
    if runs.empty:
        return math.nan
    per_iteration = column_mean(runs, ROUND_CPU)
    return 0.0 if math.isnan(per_iteration) else per_iteration / column_mean(runs, "trainers")


#: The parts of the time no phase of trainer 0 covers (``OTHER_TIME_PARTS``): a heading each.
OTHER_PARTS = dict(zip(OTHER_TIME_PARTS, ("trainer 0 between its phases", "a slower trainer",
                                          "the driver and the RPCs"), strict=True))


def _other_lines(done: pd.DataFrame, models: list[str]) -> list[str]:
    """Bagpipe's mean minus the bound's of the three parts of the time no phase of trainer 0
    covers (:data:`OTHER_PARTS`), where the runs recorded their steps' spans."""
    if "slowest_step_span_s" not in done or not (done["slowest_step_span_s"] > 0).any():
        return []
    phases = sum((pd.to_numeric(done[f"time_{p}_s"], errors="coerce")
                  for p in GAP_PHASES if f"time_{p}_s" in done), pd.Series(0.0, index=done.index))
    parts = pd.DataFrame(other_time_parts(done["iter_time_mean_s"], phases, done["step_span_s"],
                                          done["slowest_step_span_s"]))
    parts = parts.assign(model=done["model"], system=done["system"])
    lines = ["The time no phase covers, split (ms per iteration, Bagpipe's mean minus the "
             "bound's): trainer 0 between its phases, the slowest trainer's step beyond trainer "
             "0's, and the driver with the RPCs around the slowest step:", "",
             f"| model | {' | '.join(OTHER_PARTS.values())} |",
             "|---|" + "---|" * len(OTHER_PARTS)]
    for model in models:
        runs = parts[parts["model"] == model]
        gaps = [1000 * (column_mean(runs[runs["system"] == SUBJECT], part)
                        - column_mean(runs[runs["system"] == BOUND], part))
                for part in OTHER_PARTS]
        lines.append(f"| {model} | {' | '.join(cell(v, '+.2f') for v in gaps)} |")
    return [*lines, ""]


def goal_verdict(ratio: PairedSpeedup, goal: float = GOAL) -> str:
    """``met``, ``missed`` or ``within noise of <goal>x`` for Bagpipe / bound ``ratio``
    (module docstring); ``one block`` or ``no pair`` where there is no interval."""
    if ratio.blocks < 2:
        return "one block" if ratio.blocks else "no pair"
    if ratio.high <= goal:  # at the goal counts as meeting it
        return "met"
    return "missed" if ratio.side_of(goal) == "above" else f"within noise of {goal}x"
