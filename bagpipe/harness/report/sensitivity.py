"""Figures of the one-knob suites: a metric per value of the swept knob, one line per system.

Each suite (``suites/suite/<name>.yaml``) sweeps one configuration key; :data:`SENSITIVITIES`
says which key, which summary metrics to draw and what the paper's code evaluated there
(bagpipe.md §5.3: E5 lookahead, E6 capacity and cleanup interval, E7 ablations, E8 scaling, E9
skew). ``python -m bagpipe.harness.report <suite>`` reads the latest ``multirun/<suite>`` sweep and
writes ``results/<suite>/runs.csv`` and ``reports/<suite>.{png,md}``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from bagpipe.harness.report.loading import load_records
from bagpipe.harness.report.plotting import Outputs, pyplot, save_csv, save_figure, write_report
from bagpipe.harness.track.record import RunRecord, param_value
from bagpipe.harness.track.sweeps import SYSTEM_ORDER, in_order


@dataclass(frozen=True)
class Sensitivity:
    """One suite's figure: ``knob`` (a recorded param, or ``system`` for variants) on the x axis,
    each of ``metrics`` (summary key, axis label, scale) on its own panel, one line per system."""

    suite: str
    knob: str
    knob_label: str
    title: str
    family: str
    metrics: tuple[tuple[str, str, float], ...]
    #: The value of a knob as drawn (e.g. the hot share of a ``[k, u]`` hot set).
    shown: Callable[[Any], Any] = lambda value: value


_ITER = ("iter_time_mean_s", "ms / iteration", 1000.0)
_HIT = ("hit_rate", "cache hit rate", 1.0)
_STALL = ("time_fetch_wait_s", "row fetch wait (dedup, read, stall), ms / iteration", 1000.0)
_PULL = ("bytes_per_iter_emb_pull", "embedding bytes pulled / iteration (kB)", 1e-3)

SENSITIVITIES: dict[str, Sensitivity] = {
    s.suite: s
    for s in (
        Sensitivity("lookahead", "system.lookahead", "lookahead L", "Lookahead sensitivity",
                    "E5", (_ITER, _HIT, _STALL,
                           ("system_oracle_peak_resident_rows", "peak cached rows", 1.0))),
        Sensitivity("capacity", "system.cache_capacity", "cache capacity (rows; None: the "
                    "window's need)", "Cache capacity sensitivity", "E6",
                    (_ITER, _HIT, ("system_oracle_row_fetches", "rows fetched in the run", 1.0))),
        Sensitivity("cleanup", "system.cleanup_fraction", "cleanup interval / L",
                    "Prefetch/eviction batching interval", "E6",
                    (_ITER, _STALL, ("system_oracle_rounds", "rounds in the run", 1.0))),
        Sensitivity("skew_sensitivity", "dataset.hot_set", "share of lookups taken by the hot 1%",
                    "Skew sensitivity (hot-set mode)", "E9", (_ITER, _HIT, _PULL),
                    shown=lambda hot_set: hot_set[1]),
        Sensitivity("scaling", "trainers", "trainers T (global batch fixed)", "Scaling", "E8",
                    (_ITER, ("samples_per_s", "samples / s", 1.0),
                     ("bytes_per_iter_allreduce", "all-reduce bytes / iteration (kB)", 1e-3))),
        Sensitivity("ablation", "system", "variant", "Bagpipe ablations", "E7",
                    (_ITER, _STALL, ("time_sync_s", "sync phase, ms / iteration", 1000.0),
                     ("bytes_per_iter_allreduce", "all-reduce bytes / iteration (kB)", 1e-3))),
    )
}


def sweep_frame(spec: Sensitivity, records: list[RunRecord]) -> pd.DataFrame:
    """One row per finished run: its system, the knob's (shown) value and the metrics."""
    rows = []
    for record in records:
        if record.status != "FINISHED":
            continue
        system = record.tags.get("system", "?")
        knob = system if spec.knob == "system" else spec.shown(param_value(record.params.get(spec.knob)))
        rows.append({"system": system, spec.knob: "None" if knob is None else knob,
                     **{key: record.summary.get(key, float("nan")) * scale
                        for key, _, scale in spec.metrics}})
    return pd.DataFrame(rows)


def _order(values: pd.Series) -> list[Any]:
    """Knob values in order: numbers ascending, then anything else (``None``: unbounded) as met."""
    unique = list(dict.fromkeys(values))
    numbers = sorted(v for v in unique if isinstance(v, int | float))
    return numbers + [v for v in unique if not isinstance(v, int | float)]


def report(suite: str, sweep: Path, out: Outputs) -> None:
    """``results/<suite>/runs.csv`` and ``reports/<suite>.{png,md}`` for one of
    :data:`SENSITIVITIES`."""
    spec = SENSITIVITIES[suite]
    records = load_records([sweep])
    frame = sweep_frame(spec, records)
    if frame.empty:
        raise SystemExit(f"{sweep}: no finished runs")
    save_csv(frame, out.table(suite, "runs.csv"))
    order = _order(frame[spec.knob])
    frame["x"] = frame[spec.knob].map({v: i for i, v in enumerate(order)})
    systems = in_order(sorted(set(frame["system"])), SYSTEM_ORDER)

    fig, axes = pyplot().subplots(1, len(spec.metrics), figsize=(4.2 * len(spec.metrics), 3.6))
    for ax, (key, label, _) in zip(axes, spec.metrics, strict=True):
        if spec.knob == "system":
            means = frame.groupby("x")[key].mean()
            ax.bar([str(order[i]) for i in means.index], means.to_numpy())
            ax.tick_params(axis="x", rotation=30)
        else:
            for system in systems:
                mine = frame[frame["system"] == system].groupby("x")[key].mean()
                ax.plot(mine.index, mine.to_numpy(), marker="o", label=system)
            ax.set_xticks(range(len(order)), [str(v) for v in order])
            ax.set_xlabel(spec.knob_label)
        ax.set_ylabel(label)
    if spec.knob != "system" and len(systems) > 1:
        axes[0].legend(fontsize=8)
    fig.suptitle(spec.title)
    path = save_figure(fig, out.figure(suite))

    header = [spec.knob_label, "system", *(label for _, label, _ in spec.metrics)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    table = frame.groupby(["x", "system"])[[k for k, _, _ in spec.metrics]].mean()
    for index, row in table.iterrows():
        position, system = int(index[0]), str(index[1])  # type: ignore[index]
        lines.append(f"| {order[position]} | {system} | "
                     + " | ".join(f"{v:.4g}" for v in row) + " |")
    write_report(out, suite, spec.title, path, lines,
                 f"bagpipe.md §5.3 {spec.family}: the original code evaluated this family; the "
                 "paper's numbers for it are not verifiable (only its abstract is), so this "
                 "report states ours", [f"Sweep: {sweep}."], records)
