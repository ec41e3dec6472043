"""``python -m bagpipe.harness.report datasets``: E2, every system on the paper's three datasets.

The ``datasets`` suite trains DLRM on Criteo Kaggle, Criteo Terabyte and Avazu (their synthetic
shapes, or the real files: one sweep per dataset with ``dataset=<group option>``). This report
takes, for every dataset, its runs from the newest sweep under ``multirun/datasets/`` that has
any (so separate real-data sweeps add up), or every run of ``--sweep-dir``, and writes:

* ``results/datasets/runs.csv``: one row per run (the sweep table's columns, speedups included);
* ``reports/datasets.png``: iteration time and speedup over the reference system, by dataset and
  system, error bars over seeds;
* ``reports/datasets.md``: per dataset and system: runs, iteration time mean ± sd, the paired
  speedup with its 95% interval and verdict, AUC.

The rules are fig7's: a result set from several commits or a dirty tree is refused (a draft with
``--allow-unclean``), and a speedup is called faster or slower only where its interval excludes 1.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from bagpipe.harness.report.loading import (
    UncleanResultsError,
    load_records,
    require_one_clean_commit,
)
from bagpipe.harness.report.paired import paired_speedup
from bagpipe.harness.report.plotting import Outputs, pyplot, save_csv, save_figure, write_report
from bagpipe.harness.report.regime import dilation_lines
from bagpipe.harness.track.record import RunRecord, find_records
from bagpipe.harness.track.sweeps import (
    RUNS_CSV,
    SYSTEM_ORDER,
    add_speedups,
    in_order,
    runs_frame,
    speedup_key,
)

SUITE = "datasets"
#: The synthetic shapes first, in the paper's order, then real-file options as met.
DATASET_ORDER = ("synthetic_kaggle", "synthetic_terabyte", "synthetic_avazu", "criteo_tsv",
                 "terabyte_tsv", "avazu_csv")
CLAIM = ("bagpipe.md §5.3 E2: the paper compares every system on three datasets (Criteo Kaggle, "
         "Avazu, Criteo Terabyte); its per-dataset speedups are not verifiable (only its abstract "
         "is), so this report states ours")


def newest_runs(multirun_root: Path, sweep_dir: Path | None) -> tuple[list[RunRecord], list[Path]]:
    """The runs to report and the sweeps they came from: every run of ``sweep_dir``, else each
    dataset's runs from the newest ``multirun_root/datasets/<stamp>`` holding any."""
    if sweep_dir is not None:
        return load_records([sweep_dir]), [sweep_dir]
    sweeps = sorted(p for p in (multirun_root / SUITE).glob("*") if p.is_dir() and find_records(p))
    if not sweeps:
        raise FileNotFoundError(f"no sweep of suite {SUITE!r} under {multirun_root / SUITE}")
    newest: dict[str, tuple[Path, list[RunRecord]]] = {}
    for sweep in sweeps:  # oldest first: a newer sweep of a dataset replaces its runs
        by_dataset: dict[str, list[RunRecord]] = {}
        for record in load_records([sweep]):
            by_dataset.setdefault(record.tags.get("dataset", "?"), []).append(record)
        newest.update({name: (sweep, runs) for name, runs in by_dataset.items()})
    records = [r for _, runs in newest.values() for r in runs]
    return records, sorted({sweep for sweep, _ in newest.values()})


def summary(frame: pd.DataFrame, reference: str) -> pd.DataFrame:
    """Per (dataset, system) over finished runs: runs, iteration time mean and sd (ms), the paired
    speedup over ``reference`` with its 95% interval and verdict (fig7's rule: one ratio per
    block), and mean AUC, datasets and systems in display order."""
    key = speedup_key(reference)
    done = frame[frame["status"] == "FINISHED"].assign(
        iter_ms=lambda f: 1000 * f["iter_time_mean_s"],
        speedup=lambda f: f.get(key, math.nan))
    rows = []
    for (dataset, system), group in done.groupby(["dataset", "system"], sort=False):
        paired = paired_speedup(group["speedup"].dropna().tolist())
        rows.append({"dataset": dataset, "system": system, "runs": len(group),
                     "iter_ms": group["iter_ms"].mean(), "iter_ms_sd": group["iter_ms"].std(),
                     "speedup": paired.speedup, "ci_low": paired.low, "ci_high": paired.high,
                     "verdict": paired.verdict if system != reference else "reference",
                     "auc": group["auc"].mean()})
    table = pd.DataFrame(rows)
    for column, order in (("dataset", DATASET_ORDER), ("system", SYSTEM_ORDER)):
        table[column] = pd.Categorical(table[column], in_order(table[column], order))
    return table.sort_values(["dataset", "system"]).reset_index(drop=True)


def draw(frame: pd.DataFrame, reference: str, path: Path) -> Path:
    """Iteration time and speedup over ``reference``: x the dataset, bars the systems."""
    import seaborn as sns

    done = frame[frame["status"] == "FINISHED"].assign(
        iter_ms=lambda f: 1000 * f["iter_time_mean_s"])
    key = speedup_key(reference)
    layout = {"x": "dataset", "hue": "system", "order": in_order(done["dataset"], DATASET_ORDER),
              "hue_order": in_order(done["system"], SYSTEM_ORDER), "errorbar": "sd"}
    fig, (time_ax, speed_ax) = pyplot().subplots(1, 2, figsize=(13, 4.2))
    sns.barplot(data=done, y="iter_ms", ax=time_ax, **layout)
    time_ax.set(ylabel="iteration time (ms)", title="per-iteration time (mean over seeds)")
    if key in done and done[key].notna().any():
        sns.barplot(data=done, y=key, ax=speed_ax, **layout)
        speed_ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    speed_ax.set(ylabel=f"speedup vs {reference}", title=f"speedup over {reference}")
    if speed_ax.get_legend() is not None:  # one legend: both panels share the hues
        speed_ax.get_legend().remove()
    time_ax.set_ylim(top=1.3 * time_ax.get_ylim()[1])  # room for it above the bars
    time_ax.legend(loc="upper center", ncol=6, fontsize="small", frameon=False)
    return save_figure(fig, path)


def report(records: list[RunRecord], sweeps: list[Path], reference: str, out: Outputs,
           allow_unclean: bool = False) -> None:
    """Write the runs table, the figure and the page (module docstring) from ``records``, read
    from ``sweeps``; refuse runs from several commits or a dirty tree unless ``allow_unclean``
    (then the page is a marked draft), as fig7 does."""
    source = "sweeps " + ", ".join(str(sweep) for sweep in sweeps)
    if not records:
        raise SystemExit(f"{source}: no runs")
    add_speedups(records, reference)
    frame = runs_frame(records)
    draft = ""
    try:
        require_one_clean_commit(frame, SUITE)
    except UncleanResultsError as err:
        if not allow_unclean:
            raise
        draft = f"> **Draft:** {err}.\n\n"
    save_csv(frame, out.table(SUITE, RUNS_CSV))
    table = summary(frame, reference)
    lines = [f"| dataset | system | runs | iter ms (mean ± sd) | speedup vs {reference} [95% CI] "
             "| verdict | AUC |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {r.dataset} | {r.system} | {r.runs} | {r.iter_ms:.2f} ± {_or_dash(r.iter_ms_sd)} "
              f"| {_or_dash(r.speedup)}x [{_or_dash(r.ci_low)}, {_or_dash(r.ci_high)}] "
              f"| {r.verdict} | {_or_dash(r.auc, '.4f')} |"
              for r in table.itertuples(index=False)]
    page = write_report(out, SUITE, "every system on the three datasets", draw(frame, reference,
                        out.figure(SUITE)), lines, CLAIM, [
                            f"Runs: {source}.",
                            "DLRM with fig7's settings and rules (its steps, batch, topology and "
                            "dilation; seeds run as interleaved blocks; a speedup is the geometric "
                            "mean of within-block ratios, called faster or slower only where its "
                            f"95% interval excludes 1); network: {_network(records)}; the datasets "
                            "are the generator's Kaggle-, Terabyte- and Avazu-shaped data unless a "
                            "sweep switched the dataset group to the real files.",
                            *[line.removeprefix("* ") for line in dilation_lines(frame, "dataset")]],
                        records)
    if draft:
        page.write_text(draft + page.read_text())


def _network(records: list[RunRecord]) -> str:
    """How the runs' traffic was carried: netns runs record the kernel's NIC counters."""
    networked = [r for r in records if r.tags.get("system") != "local"]  # local sends nothing
    netns = sum(any(key.endswith("_kernel_bytes") for key in r.summary) for r in networked)
    kind = "the netns back-end (kernel networking between namespaces, tc-shaped NICs)"
    if netns == len(networked):
        return f"{kind} for every run but the local system's"
    return f"{kind} for {netns} of {len(networked)} networked runs, the model back-end or none else"


def _or_dash(value: object, fmt: str = ".2f") -> str:
    return format(value, fmt) if isinstance(value, float) and math.isfinite(value) else "–"
