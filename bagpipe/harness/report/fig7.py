"""``python -m bagpipe.harness.report fig7``: the headline comparison as CSV, figure and markdown.

Reads the runs of the latest fig7 sweep (``multirun/fig7/<stamp>/``, or ``--sweep-dir``), or an
MLflow store (``--from-mlflow``), or a tidy CSV written earlier (``--csv``), and writes:

* ``results/fig7/runs.csv``: one row per run (system, model, seed, iteration time mean/p50/p90
  after warm-up, AUC, logloss, bytes per iteration per link, hit rate, time to target, speedup);
* ``results/fig7/mllog/``: the runs' MLPerf logs (``<system>-<model>/<benchmark>/result_<seed>.txt``);
* ``reports/fig7.png``: per-model iteration time and speedup by system, error bars over seeds;
* ``reports/fig7.md``: the table, the paper's claim beside ours, how our setting differs, and
  which machine and commit produced it.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pandas as pd

from bagpipe.harness.report.loading import (
    RunsTable,
    UncleanResultsError,
    require_one_clean_commit,
)
from bagpipe.harness.report.paired import paired_speedup
from bagpipe.harness.report.plotting import Outputs, provenance, pyplot, save_csv, save_figure
from bagpipe.harness.track.mlperf import NOT_CONVERGED, olympic_score
from bagpipe.harness.track.sweeps import (
    MODEL_ORDER,
    RUNS_CSV,
    SYSTEM_ORDER,
    in_order,
    speedup_key,
)

SUITE = "fig7"
#: What the paper claims for the headline comparison (bagpipe.md, "Figure numbering").
PAPER_CLAIM = "up to 5.6x faster training than state-of-the-art baselines (SOSP'23 abstract)"
_BASELINES = ("sync_ps", "fae", "het", "torchrec")


def report(runs: RunsTable, reference: str, out: Outputs, allow_unclean: bool = False) -> None:
    """Write the runs table, the runs' mllog files, the figure and the page; refuse a result set
    that mixes commits or has uncommitted changes unless ``allow_unclean`` (a marked draft)."""
    draft = False
    try:
        require_one_clean_commit(runs.frame, SUITE)
    except UncleanResultsError as err:
        if not allow_unclean:
            raise
        print(f"[report] DRAFT: {err}")
        draft = True
    results = out.results_dir / SUITE
    results.mkdir(parents=True, exist_ok=True)
    if runs.sweep is not None and (runs.sweep / "results").is_dir():
        shutil.copytree(runs.sweep / "results", results / "mllog", dirs_exist_ok=True)
    runs_csv = out.table(SUITE, RUNS_CSV)
    if runs.csv is None or runs.csv.resolve() != runs_csv.resolve():
        save_csv(runs.frame, runs_csv)
    table = summary_table(runs.frame, reference)
    figure = draw(runs.frame, reference, out.figure(SUITE))
    page = markdown(runs.frame, table, reference, figure, runs.source)
    if draft:
        page = f"> **Draft:** these runs do not come from one clean commit.\n\n{page}"
    out.page(SUITE).write_text(page)
    print(table.to_string(index=False))
    print(f"wrote {runs_csv}, {figure}, {out.page(SUITE)}")


def summary_table(frame: pd.DataFrame, reference: str) -> pd.DataFrame:
    """Per (model, system): iteration time mean and sd over seeds, speedup, AUC, olympic time."""
    key = speedup_key(reference)
    done = frame[frame["status"] == "FINISHED"].copy()
    done["iter_ms"] = 1000 * done["iter_time_mean_s"]
    if key not in done:
        done[key] = math.nan
    rows = []
    for (model, system), group in done.groupby(["model", "system"], sort=False):
        all_seeds = frame[(frame["model"] == model) & (frame["system"] == system)]
        tta = [t if (isinstance(t, float) and math.isfinite(t)) else NOT_CONVERGED
               for t in all_seeds.get("time_to_target_s", pd.Series(dtype=float)).tolist()]
        paired = paired_speedup(group[key].dropna().tolist())  # one ratio per block (seed)
        rows.append(
            {
                "model": model, "system": system, "runs": len(group),
                "iter_ms_mean": group["iter_ms"].mean(), "iter_ms_sd": group["iter_ms"].std(),
                "iter_ms_p50": 1000 * group["iter_time_p50_s"].mean(),
                key: paired.speedup, f"{key}_ci_low": paired.low, f"{key}_ci_high": paired.high,
                "verdict": paired.verdict if system != reference else "reference",
                "auc": group["auc"].mean(),
                "logloss": group["logloss"].mean(),
                "olympic_time_to_target_s": olympic_score(tta) if tta else None,
            }
        )
    table = pd.DataFrame(rows)
    if table.empty:
        return table
    table["model"] = pd.Categorical(table["model"], in_order(table["model"], MODEL_ORDER))
    table["system"] = pd.Categorical(table["system"], in_order(table["system"], SYSTEM_ORDER))
    return table.sort_values(["model", "system"]).reset_index(drop=True)


def draw(frame: pd.DataFrame, reference: str, path: Path) -> Path:
    """Two panels: iteration time (ms) and speedup over ``reference``, by model and system."""
    import seaborn as sns

    done = frame[frame["status"] == "FINISHED"].copy()
    done["iteration time (ms)"] = 1000 * done["iter_time_mean_s"]
    key = speedup_key(reference)
    hue_order = in_order(done["system"], SYSTEM_ORDER)
    order = in_order(done["model"], MODEL_ORDER)
    panels = 2 if key in done and done[key].notna().any() else 1
    fig, axes = pyplot().subplots(1, panels, figsize=(6.5 * panels, 4.2), squeeze=False)
    sns.barplot(data=done, x="model", y="iteration time (ms)", hue="system", order=order,
                hue_order=hue_order, errorbar="sd", ax=axes[0][0])
    axes[0][0].set_title("per-iteration time (mean over seeds, sd bars)")
    if panels == 2:
        sns.barplot(data=done, x="model", y=key, hue="system", order=order,
                    hue_order=hue_order, errorbar="sd", ax=axes[0][1])
        axes[0][1].axhline(1.0, color="grey", lw=0.8, ls="--")
        axes[0][1].set_title(f"speedup over {reference} (higher is better)")
        axes[0][1].set_ylabel(f"speedup vs {reference}")
    return save_figure(fig, path)


def markdown(frame: pd.DataFrame, table: pd.DataFrame, reference: str, figure: Path,
             source: str) -> str:
    """The report: headline, table, the paper's claim beside ours, setting differences, provenance."""
    key = speedup_key(reference)
    shas = sorted(set(frame.get("git_sha", pd.Series(["unknown"])).astype(str)))
    lines = [
        f"# {SUITE}: per-iteration time and speedup by system and model",
        "",
        f"![{SUITE}]({figure.name})",
        "",
        "| model | system | runs | iter ms (mean ± sd) | p50 ms | "
        f"speedup vs {reference} [95% CI] | verdict | AUC | logloss | olympic time-to-target s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for values in table.to_dict("records"):
        lines.append(
            f"| {values['model']} | {values['system']} | {values['runs']} | "
            f"{values['iter_ms_mean']:.2f} ± {_num(values['iter_ms_sd'], '.2f')} | "
            f"{values['iter_ms_p50']:.2f} | {_num(values[key], '.2f')}x "
            f"[{_num(values[key + '_ci_low'], '.2f')}, {_num(values[key + '_ci_high'], '.2f')}] | "
            f"{values['verdict']} | "
            f"{values['auc']:.4f} | {values['logloss']:.4f} | "
            f"{_num(values['olympic_time_to_target_s'], '.2f')} |"
        )
    lines += ["", "## The paper's claim beside ours", "", f"* Paper: {PAPER_CLAIM}.",
              f"* Ours: {_our_claim(table)}", "",
              "## How our setting differs from the paper's", "",
              "* Roles are processes on one machine, each host of the described cluster an "
              "emulated host with its own NIC (README, *The emulated cluster*), not 8 p3.2xlarge "
              "trainers and their server.",
              "* Compute is CPU; the paper trains on V100 GPUs. Where the network is dilated "
              "(below), it is slowed by as much as compute is, so communication takes the share "
              "of an iteration it would take there; CPU work that the cluster runs on other "
              "machines (servers, the oracle) is not slowed and shares these cores.",
              "* Data is Criteo-Kaggle-*shaped* synthetic data (same table-size and skew shape, "
              "labels from a hidden teacher), scaled down; AUC values are not comparable to "
              "Criteo's.",
              "* Models and batch are CPU-sized unless the suite ran with `scale=paper`; runs are "
              "a few dozen iterations, so time-to-target uses the suite's low AUC target.",
              "", "## How it was measured", "",
              "* The sweep ran in randomised, interleaved blocks, one per seed: each block one run "
              "of every (system, model) in a shuffled order (`hydra/sweeper=blocks`). A speedup is "
              f"the geometric mean over blocks of {reference}'s iteration time / the system's, "
              "both from the same block, with a 95% Student-t interval on the log ratios; a "
              "system is *faster* or *slower* only where the interval excludes 1.",
              *_dilation_lines(frame),
              "", "## Provenance", "", f"* Source: {source}",
              *[f"* {line}" for line in provenance(SUITE, ", ".join(shas))], ""]
    return "\n".join(lines)


def _dilation_lines(frame: pd.DataFrame) -> list[str]:
    """The network's dilation per model, with the compute times ``auto`` calibrated it from."""
    if "dilation.factor" not in frame:
        return []
    lines = []
    columns = ["model", "dilation.factor", "dilation.compute_here_ms", "dilation.compute_target_ms"]
    present = frame[[c for c in columns if c in frame]].drop_duplicates()
    for values in present.to_dict("records"):
        here, target = values.get("dilation.compute_here_ms"), values.get("dilation.compute_target_ms")
        detail = (f" (a trainer's step: {here} ms here, {target} ms on the topology's device)"
                  if pd.notna(here) and pd.notna(target) else "")
        lines.append(f"* {values['model']}: network dilated {values['dilation.factor']}x{detail}.")
    return lines


def _our_claim(table: pd.DataFrame) -> str:
    rows = table.to_dict("records")
    bagpipe = {str(r["model"]): float(r["iter_ms_mean"]) for r in rows if r["system"] == "bagpipe"}
    ratios = {
        (str(r["model"]), str(r["system"])): float(r["iter_ms_mean"]) / bagpipe[str(r["model"])]
        for r in rows if r["system"] in _BASELINES and str(r["model"]) in bagpipe
    }
    if not ratios:
        return "no Bagpipe-vs-baseline pair in this sweep (a system did not run)."
    (model, system), best = max(ratios.items(), key=lambda item: item[1])
    worst = min(ratios.values())
    return (f"Bagpipe is up to {best:.2f}x faster per iteration (over {system} on {model}); "
            f"the smallest ratio over any baseline is {worst:.2f}x.")


def _num(value: object, fmt: str) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    return format(value, fmt)

