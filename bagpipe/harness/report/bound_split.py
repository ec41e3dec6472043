"""``python -m bagpipe.harness.report bound_split``: Bagpipe's time over the embedding-free bound,
split into our layout of row gradients, LRPP's row synchronisation itself, and the rest.

Issue #16 asks Bagpipe to come within :data:`~bagpipe.harness.report.bound.GOAL` of the
embedding-free bound, or for a miss to be shown to lie in the algorithm rather than in our code.
The bound's trainers never synchronise rows (their tables diverge); every exact data-parallel
system must, and Bagpipe's algorithm prescribes which rows and when (LRPP: the rows the next batch
uses, summed in DDP's last bucket on the critical path; the other shared rows summed by a
collective overlapping the next step). ``suite=bound_split`` runs, in fig7's regime and blocks,
Bagpipe, the bound and two probes between them (``bagpipe.lrpp.trainer``; neither is exact):

* :data:`LAYOUT_PROBE` keeps row synchronisation whole (the same collectives at the plan's sizes,
  every replica updated) but lays no gradient out on the plan's shared lists: they carry zeros
  (``row_layout=False``);
* :data:`PROBE` makes row synchronisation free and changes nothing else (``row_sync=False``).

Within each block:

* Bagpipe / layout probe is what our code that lays gradients out on the shared rows costs: an
  implementation's choice;
* layout probe / probe is what the algorithm's row synchronisation costs: the bytes its plan
  prescribes, moved by the collective the dense part uses, and the update of every replica;
* probe / bound is everything else Bagpipe adds: the oracle, the cache and its rounds, the servers
  and their traffic, the RPCs. This is the part the goal can hold an implementation to;
* their product is Bagpipe / bound, and layout probe / bound is Bagpipe with its layout code free:
  where that misses the goal, cutting the layout code cannot meet it.

Where row synchronisation's cost is CPU (the collectives' threads), ``python -m bagpipe.bench
--only collectives`` tells a collective's own cost from its bytes' on these cores.

Each is a paired ratio with its interval (:mod:`bagpipe.harness.report.paired`), and the page
then shows where each part's milliseconds go, phase by phase, and Bagpipe against the bound as
fig7's report shows it. A result set from several commits or a dirty tree is refused unless drawn
as a marked draft.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from bagpipe.harness.report.bound import (
    BOUND,
    GOAL,
    bound_lines,
    gap_lines,
    goal_verdict,
    time_ratio,
)
from bagpipe.harness.report.cells import cell, column_mean
from bagpipe.harness.report.head_to_head import SUBJECT
from bagpipe.harness.report.loading import (
    UncleanResultsError,
    load_records,
    require_one_clean_commit,
)
from bagpipe.harness.report.paired import PairedSpeedup
from bagpipe.harness.report.plotting import Outputs, pyplot, save_csv, save_figure, write_report
from bagpipe.harness.report.regime import DRIVER_CPU, HELPERS_CPU, TRAINER_CPU
from bagpipe.harness.track.sweeps import MODEL_ORDER, in_order, runs_frame, with_blocks

SUITE = "bound_split"
#: Bagpipe with no gradient laid out on the shared rows (``suites/system/<LAYOUT_PROBE>.yaml``).
LAYOUT_PROBE = "bagpipe_free_row_layout"
#: Bagpipe with its trainers' row synchronisation made free (``suites/system/<PROBE>.yaml``).
PROBE = "bagpipe_free_row_sync"
#: The systems of the suite, from the most work to the least.
SYSTEMS = (SUBJECT, LAYOUT_PROBE, PROBE, BOUND)
#: The parts of Bagpipe / bound: a heading, the system over, the system under (module docstring).
PARTS = (("our row layout: Bagpipe / layout probe", SUBJECT, LAYOUT_PROBE),
         ("row synchronisation: layout probe / probe", LAYOUT_PROBE, PROBE),
         ("the rest: probe / bound", PROBE, BOUND))
#: The ratios the table and the figure show: Bagpipe / bound, its parts, and Bagpipe with its
#: layout code free.
SPLIT = (("Bagpipe / bound", SUBJECT, BOUND), *PARTS,
         ("without our layout: layout probe / bound", LAYOUT_PROBE, BOUND))
CLAIM = ("Bagpipe's LRPP cache synchronises only the rows trainers share, those the next batch "
         "uses on the critical path with the dense all-reduce and the others overlapped with the "
         "next iteration, so that embedding traffic stays off the critical path (SOSP'23)")


def split_ratios(done: pd.DataFrame, model: str) -> list[PairedSpeedup]:
    """The :data:`SPLIT` ratios of ``model``'s finished runs (with their block column)."""
    runs = done[done["model"] == model]
    return [time_ratio(runs, over, under) for _, over, under in SPLIT]


def split_lines(done: pd.DataFrame) -> list[str]:
    """The split table, the by-system means and a gap table per part (module docstring)."""
    models = in_order(done["model"], MODEL_ORDER)
    headings = " | ".join(f"{name} [95% CI]" for name, _, _ in SPLIT)
    lines = [f"Per model, paired within blocks: geometric mean over blocks [95% interval]. The "
             f"goal ({GOAL}x) is judged on Bagpipe / bound; on Bagpipe with our layout code free "
             "(where that misses, no cut of the layout code meets the goal); and on the rest "
             "alone: what the implementation adds beyond row synchronisation.", "",
             f"| model | {headings} | blocks | Bagpipe vs goal | without our layout vs goal | "
             "the rest vs goal |", "|---|" + "---|" * (len(SPLIT) + 4)]
    for model in models:
        ratios = split_ratios(done, model)
        bagpipe, _layout, _row_sync, rest, without_layout = ratios
        cells = " | ".join(f"{cell(r.speedup, '.2f')}x [{cell(r.low, '.2f')}, "
                           f"{cell(r.high, '.2f')}]" for r in ratios)
        lines.append(f"| {model} | {cells} | {bagpipe.blocks} | {goal_verdict(bagpipe)} | "
                     f"{goal_verdict(without_layout)} | {goal_verdict(rest)} |")
    lines += ["", *by_system_lines(done, models)]
    for heading, over, under in PARTS:
        lines += [f"### {heading[0].upper()}{heading[1:]}", "", *gap_lines(done, models, over, under)]
    return lines


def all_roles_cpu(runs: pd.DataFrame) -> float:
    """CPU seconds per iteration of every process of the runs (the mean): the trainers, the other
    roles and the driver, which all share this machine's cores."""
    return (column_mean(runs, "trainers") * column_mean(runs, TRAINER_CPU)
            + column_mean(runs, HELPERS_CPU) + column_mean(runs, DRIVER_CPU))


def by_system_lines(done: pd.DataFrame, models: list[str]) -> list[str]:
    """Per model and system, the means behind the split: iteration time, all-reduce payload, a
    trainer's CPU, and every process's CPU with the cores it kept busy; then each system's
    iteration and every-process CPU over the bound's. On a machine whose cores the runs keep
    busy, the two ratios move together where the extra time is extra CPU, not waiting."""
    lines = ["Means per iteration, by system. Every process's CPU is the trainers', the other "
             "roles' and the driver's together, all on this machine's cores; cores busy is that "
             "CPU over the iteration time.", "",
             "| model | system | iteration (ms) | all-reduce (kB) | a trainer's CPU (ms) | every "
             "process's CPU (ms) | cores busy | iteration / bound's | every process's CPU / "
             "bound's |", "|---|---|---|---|---|---|---|---|---|"]
    for model in models:
        runs = {system: done[(done["model"] == model) & (done["system"] == system)]
                for system in SYSTEMS}
        for system, these in runs.items():
            iteration_s = column_mean(these, "iter_time_mean_s")
            cpu_s = all_roles_cpu(these)
            lines.append(
                f"| {model} | {system} | {cell(1000 * iteration_s, '.2f')} | "
                f"{cell(column_mean(these, 'bytes_per_iter_allreduce') / 1000, '.0f')} | "
                f"{cell(1000 * column_mean(these, TRAINER_CPU), '.2f')} | "
                f"{cell(1000 * cpu_s, '.2f')} | {cell(cpu_s / iteration_s, '.2f')} | "
                f"{cell(iteration_s / column_mean(runs[BOUND], 'iter_time_mean_s'), '.2f', 'x')} | "
                f"{cell(cpu_s / all_roles_cpu(runs[BOUND]), '.2f', 'x')} |")
    return [*lines, ""]


def draw(done: pd.DataFrame, path: Path) -> Path:
    """Per model, the :data:`SPLIT` ratios as bars with their intervals, the goal as a line."""
    models = in_order(done["model"], MODEL_ORDER)
    fig, ax = pyplot().subplots(figsize=(9, 4))
    width = 0.8 / len(SPLIT)
    by_model = [split_ratios(done, model) for model in models]
    for i, (name, _, _) in enumerate(SPLIT):
        ratios = [split[i] for split in by_model]
        xs = [m + (i - (len(SPLIT) - 1) / 2) * width for m in range(len(models))]
        ys = [r.speedup for r in ratios]
        errors = [[y - r.low if r.blocks > 1 else 0 for y, r in zip(ys, ratios, strict=True)],
                  [r.high - y if r.blocks > 1 else 0 for y, r in zip(ys, ratios, strict=True)]]
        ax.bar(xs, ys, width, yerr=errors, capsize=3, label=name)
    ax.axhline(GOAL, color="black", linestyle="--", linewidth=1, label=f"goal {GOAL}x")
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xticks(range(len(models)), models)
    ax.set(ylabel="iteration time ratio (paired, 95% CI)",
           title="Bagpipe over the embedding-free bound, split")
    ax.set_ylim(bottom=0.8)
    ax.legend(fontsize=7)
    return save_figure(fig, path)


def report(sweep: Path, out: Outputs, allow_unclean: bool = False) -> None:
    """``results/bound_split/runs.csv`` and ``reports/bound_split.{png,md}`` from ``sweep``."""
    records = load_records([sweep])
    frame = runs_frame(records)
    draft = []
    try:
        require_one_clean_commit(frame, SUITE)
    except UncleanResultsError as err:
        if not allow_unclean:
            raise
        draft += [f"> **Draft:** {err}.", ""]
    done = with_blocks(frame[frame["status"] == "FINISHED"])
    missing = set(SYSTEMS) - set(done["system"])
    if missing:
        raise SystemExit(f"{sweep}: no finished runs of {', '.join(sorted(missing))}")
    save_csv(frame, out.table(SUITE, "runs.csv"))
    figure = draw(done, out.figure(SUITE))
    table = [*draft, *split_lines(done),
             *bound_lines(done[~done["system"].isin([PROBE, LAYOUT_PROBE])])]
    write_report(out, SUITE, "Bagpipe's time over the embedding-free bound, split", figure, table,
                 CLAIM, [f"Sweep: {sweep} (`suite=bound_split`: fig7's regime, each model's own "
                         "auto dilation). The probes are not exact: their AUC is not compared."],
                 records)
