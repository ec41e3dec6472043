"""``python -m bagpipe.harness.report.figures <suite>``: the figures of the paper's other experiment families.

Suites (bagpipe.md §5.3):

* ``skew`` (E4, pure data, no training): share of accesses held by the most accessed share of rows,
  per dataset preset and for the hot-set mode (the paper: ~1% of rows take >92% of accesses).
  ``--file kind:path[:preset]`` adds a real file read by the project's readers.
* ``breakdown`` (E3): where an iteration's time goes, one stacked bar per system, from the latest
  ``multirun/breakdown`` sweep (``python -m bagpipe.harness.run suite=breakdown``).
* ``convergence`` (E13): AUC against steps and against wall time per system, from the latest
  ``multirun/convergence`` sweep.
* ``lookahead``, ``capacity``, ``cleanup``, ``skew_sensitivity``, ``scaling``, ``ablation``: one
  swept knob each (:mod:`bagpipe.harness.report.sensitivity`).
* ``costmodel``: every system's exact bytes at the paper's setting priced on a described cluster
  (:mod:`bagpipe.harness.report.projection`), from the latest ``multirun/costmodel`` sweep.

Each writes ``results/<suite>/*.csv`` and ``reports/<suite>.{png,md}`` stating machine and commit.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd

from bagpipe.core.meter import Phase
from bagpipe.harness.report.fig7 import SYSTEM_ORDER, latest_sweep
from bagpipe.harness.run.sweep import runs_frame
from bagpipe.harness.track.record import RunRecord, find_records
from bagpipe.harness.track.workspace import git_sha, machine

#: Points of the CDF's x axis (share of rows, most accessed first), log-spaced.
ROW_SHARES = np.unique(np.concatenate([np.logspace(-5, 0, 61), [0.001, 0.01, 0.1]]))
SKEW_CLAIM = "around 1% of embeddings take more than 92% of all accesses (SOSP'23 abstract)"
BREAKDOWN_CLAIM = ("around 75% of the iteration time is spent on embedding access and model "
                   "synchronization in existing systems (SOSP'23 abstract)")
CONVERGENCE_CLAIM = ("Bagpipe keeps the convergence and reproducibility guarantees of synchronous "
                     "training (SOSP'23 abstract); HET trades them for bounded staleness")


def access_cdf(ids: np.ndarray, table_sizes: Sequence[int]) -> np.ndarray:
    """Share of all accesses held by the top ``ROW_SHARES`` of all rows (tables ranked together)."""
    offsets = np.concatenate([[0], np.cumsum(table_sizes)[:-1]])
    counts = np.bincount((ids + offsets).ravel(), minlength=int(sum(table_sizes)))
    ranked = np.sort(counts)[::-1].astype(np.float64)
    cumulative = np.cumsum(ranked) / ranked.sum()
    top = np.maximum(1, np.round(ROW_SHARES * ranked.size).astype(int))
    return cumulative[np.minimum(top, ranked.size) - 1]


def _skew_sources(args: argparse.Namespace) -> list[tuple[str, np.ndarray, tuple[int, ...]]]:
    from bagpipe.data import DatasetConfig, make_dataset
    from bagpipe.data.dataset import SyntheticDataset

    out = []
    configs = [(f"{p} (synthetic)", DatasetConfig(preset=p, scale=args.scale))
               for p in ("criteo_kaggle", "avazu", "criteo_terabyte")]
    configs.append(("criteo_kaggle hot-set 1%/90%",
                    DatasetConfig(preset="criteo_kaggle", scale=args.scale, hot_set=(0.01, 0.9))))
    for spec in args.file:
        kind, path, *preset = spec.split(":")
        configs.append((f"{Path(path).name} ({kind})", DatasetConfig(
            kind=kind, path=path, preset=preset[0] if preset else "criteo_kaggle")))
    for label, cfg in configs:
        dataset = make_dataset(cfg)
        if isinstance(dataset, SyntheticDataset):
            ids = dataset.generator.examples("train", 0, args.samples).ids
        else:
            ids = dataset.train_examples.ids  # type: ignore[attr-defined]
        out.append((label, np.asarray(ids, dtype=np.int64), tuple(dataset.schema.table_sizes)))
    return out


def skew(args: argparse.Namespace) -> None:
    rows = []
    for label, ids, sizes in _skew_sources(args):
        for share, accesses in zip(ROW_SHARES, access_cdf(ids, sizes), strict=True):
            rows.append({"dataset": label, "row_share": share, "access_share": accesses,
                         "table_rows": sum(sizes), "lookups": ids.size})
    frame = pd.DataFrame(rows)
    _save_csv(frame, args.results_dir / "skew" / "cdf.csv")
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for dataset, group in frame.groupby("dataset", sort=False):
        ax.plot(100 * group["row_share"], 100 * group["access_share"], label=str(dataset))
    ax.axvline(1.0, color="grey", lw=0.8, ls="--")
    ax.axhline(92.0, color="grey", lw=0.8, ls=":")
    ax.set(xscale="log", xlabel="most accessed rows (% of all rows)",
           ylabel="accesses (% of all lookups)", title="Access skew (CDF)")
    ax.legend(fontsize=8)
    figure = save_figure(fig, args.reports_dir / "skew.png")
    at_1pct = frame[np.isclose(frame["row_share"], 0.01)]
    table = ["| dataset | table rows | lookups sampled | accesses to top 1% of rows |",
             "|---|---|---|---|"]
    table += [
        f"| {r['dataset']} | {int(r['table_rows']):,} | {int(r['lookups']):,} | "
        f"{100 * float(r['access_share']):.1f}% |"
        for r in at_1pct.to_dict("records")
    ]
    _write_report(args, "skew", "Access skew: share of lookups vs share of rows", figure, table,
                  SKEW_CLAIM, [
                      f"Synthetic presets at scale {args.scale} (table sizes scaled down, the "
                      "generator calibrated to the paper's skew at that size), "
                      f"{args.samples:,} training examples each; all tables ranked together.",
                      "Regenerate: `python -m bagpipe.harness.report.figures skew` "
                      "(`nox -s reproduce -- skew`).",
                  ])


def breakdown(args: argparse.Namespace) -> None:
    sweep = args.sweep_dir or latest_sweep(args.multirun_root, "breakdown")
    frame = runs_frame([RunRecord.load(d) for d in find_records(sweep)])
    done = frame[frame["status"] == "FINISHED"]
    phases = [str(p) for p in Phase]
    columns = [f"time_{p}_s" for p in phases]
    table = done.groupby("system")[["iter_time_mean_s", *columns]].mean()
    table["other"] = (table["iter_time_mean_s"] - table[columns].sum(axis=1)).clip(lower=0)
    table = table.reindex([s for s in SYSTEM_ORDER if s in table.index]
                          + [s for s in table.index if s not in SYSTEM_ORDER])
    _save_csv(table.reset_index(), args.results_dir / "breakdown" / "phases.csv")
    _save_csv(done, args.results_dir / "breakdown" / "runs.csv")
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    bottom = np.zeros(len(table))
    for column, name in [*zip(columns, phases, strict=True), ("other", "other")]:
        values = 1000 * table[column].to_numpy()
        ax.bar(table.index, values, bottom=bottom, label=name)
        bottom += values
    ax.set(ylabel="ms per iteration (trainer 0)", title="Where an iteration's time goes")
    ax.legend(fontsize=8)
    figure = save_figure(fig, args.reports_dir / "breakdown.png")
    comm = ["fetch_wait", "sync"]
    lines = ["| system | iter ms | " + " | ".join(phases) + " | other | embedding access + sync |",
             "|---|---|" + "---|" * (len(phases) + 2)]
    for system, row in table.iterrows():
        share = sum(row[f"time_{p}_s"] for p in comm) / row["iter_time_mean_s"]
        lines.append(f"| {system} | {1000 * row['iter_time_mean_s']:.1f} | " + " | ".join(
            f"{1000 * row[c]:.1f}" for c in [*columns, "other"]) + f" | {100 * share:.0f}% |")
    _write_report(args, "breakdown", "Per-iteration phase breakdown by system", figure, lines,
                  BREAKDOWN_CLAIM, [
                      f"Sweep: {sweep}. Phases are trainer 0's (`bagpipe.core.meter.Phase`); "
                      "'other' is the iteration time no phase covers (RPC, the driver).",
                      "Regenerate: `nox -s reproduce -- breakdown`.",
                  ])


def _convergence_records(args: argparse.Namespace) -> tuple[list[Path], list[RunRecord]]:
    """The latest convergence sweep, plus the latest HET-bounds sweep if there is one."""
    sweeps = [args.sweep_dir or latest_sweep(args.multirun_root, "convergence")]
    if args.sweep_dir is None and (args.multirun_root / "convergence_het").is_dir():
        sweeps.append(latest_sweep(args.multirun_root, "convergence_het"))
    return sweeps, [RunRecord.load(d) for sweep in sweeps for d in find_records(sweep)]


def _convergence_label(record: RunRecord) -> str:
    label = record.tags.get("system", "?")
    bound = record.params.get("system.bound")
    return f"het bound={bound}" if label == "het" and bound is not None else label


def convergence(args: argparse.Namespace) -> None:
    from bagpipe.harness.track.mlperf import olympic_score

    sweeps, records = _convergence_records(args)
    records = [r for r in records if r.status == "FINISHED"]
    rows = [{"system": _convergence_label(r), "seed": r.params.get("seed", "0"), **point}
            for r in records for point in r.evals]
    frame = pd.DataFrame(rows)
    _save_csv(frame, args.results_dir / "convergence" / "evals.csv")
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
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
    figure = save_figure(fig, args.reports_dir / "convergence.png")

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
                 if _convergence_label(r) == system]
        score = olympic_score([t if t == t else float("inf") for t in times])
        lines.append(
            f"| {system} | {group['seed'].nunique()} | {int(last['step'].iloc[0])} | "
            f"{last['auc'].mean():.5f} | {gap:.2e} | "
            f"{'not reached' if score is None else f'{score:.2f}'} |")
    _write_report(args, "convergence", "Convergence: AUC vs steps and vs wall time", figure, lines,
                  CONVERGENCE_CLAIM, [
                      "Sweeps: " + ", ".join(str(s) for s in sweeps) + ".",
                      "max |AUC - local|: the largest difference from `local`'s AUC at the same "
                      "seed and step (0 for an exact system, up to fp32 summation order).",
                      "Time to target: MLPerf olympic mean over the seeds (fastest and slowest "
                      "dropped; one run that never reaches the target may be the dropped "
                      "slowest), wall time from the run's start, evaluation included.",
                      "Regenerate: `nox -s reproduce -- convergence`."])


def pyplot():  # type: ignore[no-untyped-def]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save_csv(frame: pd.DataFrame, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(path, index=False)


def save_figure(fig: object, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()  # type: ignore[attr-defined]
    fig.savefig(path, dpi=130)  # type: ignore[attr-defined]
    pyplot().close(fig)
    return path


def _write_report(args: argparse.Namespace, suite: str, title: str, figure: Path,
                  table: list[str], claim: str, notes: list[str]) -> None:
    text = [f"# {suite}: {title}", "", f"![{suite}]({figure.name})", "", *table, "",
            "## The paper's claim", "", f"* {claim}.", "", "## Setting and provenance", "",
            *[f"* {note}" for note in notes],
            f"* Machine: {machine()}", f"* Commit: {git_sha(Path.cwd())}",
            f"* Written: {datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}", ""]
    path = args.reports_dir / f"{suite}.md"
    path.write_text("\n".join(text))
    print(f"wrote {figure}, {path}, results/{suite}/")


def costmodel(args: argparse.Namespace) -> None:
    from bagpipe.harness.report.projection import report

    report(args, _write_report, save_figure, pyplot)


def _sensitivity(suite: str) -> Callable[[argparse.Namespace], None]:
    def draw(args: argparse.Namespace) -> None:
        from bagpipe.harness.report.sensitivity import figure

        figure(args, suite, _write_report, save_figure, pyplot)

    return draw


SUITES = {"skew": skew, "breakdown": breakdown, "convergence": convergence,
          "costmodel": costmodel,
          **{name: _sensitivity(name) for name in ("lookahead", "capacity", "cleanup",
                                                   "skew_sensitivity", "scaling", "ablation")}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bagpipe.harness.report.figures", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("suite", choices=sorted(SUITES))
    parser.add_argument("--scale", type=float, default=0.001, help="skew: synthetic scale")
    parser.add_argument("--samples", type=int, default=65536, help="skew: examples per dataset")
    parser.add_argument("--file", action="append", default=[], metavar="KIND:PATH[:PRESET]",
                        help="skew: also a real file (kind criteo_tsv, avazu_csv, jsonl)")
    parser.add_argument("--cluster", action="append", type=Path, metavar="YAML",
                        help="costmodel: a cluster file to project onto (repeatable; default: "
                             "suites/topology/paper.yaml and g5.yaml)")
    parser.add_argument("--sweep-dir", type=Path)
    parser.add_argument("--multirun-root", type=Path, default=Path("multirun"))
    parser.add_argument("--results-dir", type=Path, default=Path("results"))
    parser.add_argument("--reports-dir", type=Path, default=Path("reports"))
    args = parser.parse_args(argv)
    SUITES[args.suite](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
