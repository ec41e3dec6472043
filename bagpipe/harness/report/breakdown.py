"""``python -m bagpipe.harness.report breakdown`` (E3): where an iteration's time goes, one stacked
bar per system, from the latest ``multirun/breakdown`` sweep (``python -m bagpipe.harness.run
suite=breakdown``). The paper's claim is about the share of embedding access and synchronisation,
so the table states that share per system beside the phases.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bagpipe.core.meter import Phase
from bagpipe.harness.report.loading import load_records
from bagpipe.harness.report.plotting import Outputs, pyplot, save_csv, save_figure, write_report
from bagpipe.harness.track.sweeps import SYSTEM_ORDER, in_order, runs_frame

SUITE = "breakdown"
CLAIM = ("around 75% of the iteration time is spent on embedding access and model "
         "synchronization in existing systems (SOSP'23 abstract)")
#: The phases the claim calls embedding access and model synchronisation.
_COMMUNICATION = ("fetch_wait", "sync")


def report(sweep: Path, out: Outputs) -> None:
    """``results/breakdown/{phases,runs}.csv`` and ``reports/breakdown.{png,md}``."""
    records = load_records([sweep])
    frame = runs_frame(records)
    done = frame[frame["status"] == "FINISHED"]
    phases = [str(p) for p in Phase]
    columns = [f"time_{p}_s" for p in phases]
    table = done.groupby("system")[["iter_time_mean_s", *columns]].mean()
    table["other"] = (table["iter_time_mean_s"] - table[columns].sum(axis=1)).clip(lower=0)
    table = table.reindex(in_order(table.index, SYSTEM_ORDER))
    save_csv(table.reset_index(), out.table(SUITE, "phases.csv"))
    save_csv(done, out.table(SUITE, "runs.csv"))
    fig, ax = pyplot().subplots(figsize=(7, 4.2))
    bottom = np.zeros(len(table))
    for column, name in [*zip(columns, phases, strict=True), ("other", "other")]:
        values = 1000 * table[column].to_numpy()
        ax.bar(table.index, values, bottom=bottom, label=name)
        bottom += values
    ax.set(ylabel="ms per iteration (trainer 0)", title="Where an iteration's time goes")
    ax.legend(fontsize=8)
    figure = save_figure(fig, out.figure(SUITE))
    lines = ["| system | iter ms | " + " | ".join(phases) + " | other | embedding access + sync |",
             "|---|---|" + "---|" * (len(phases) + 2)]
    for system, row in table.iterrows():
        share = sum(row[f"time_{p}_s"] for p in _COMMUNICATION) / row["iter_time_mean_s"]
        lines.append(f"| {system} | {1000 * row['iter_time_mean_s']:.1f} | " + " | ".join(
            f"{1000 * row[c]:.1f}" for c in [*columns, "other"]) + f" | {100 * share:.0f}% |")
    write_report(out, SUITE, "Per-iteration phase breakdown by system", figure, lines, CLAIM, [
        f"Sweep: {sweep}. Phases are trainer 0's (`bagpipe.core.meter.Phase`); "
        "'other' is the iteration time no phase covers (RPC, the driver).",
    ], records)
