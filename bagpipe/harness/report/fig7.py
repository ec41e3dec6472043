"""``python -m bagpipe.harness.report --suite fig7``: a suite's results as CSV, figure and markdown.

Reads the runs of the suite's latest sweep (``multirun/<suite>/<stamp>/``, or ``--sweep-dir``), or
an MLflow store (``--from-mlflow``), or a tidy CSV written earlier (``--csv``), and writes:

* ``results/<suite>/runs.csv``: one row per run (system, model, seed, iteration time mean/p50/p90
  after warm-up, AUC, logloss, bytes per iteration per link, hit rate, time to target, speedup);
* ``results/<suite>/mllog/``: the runs' MLPerf logs (``<system>-<model>/<benchmark>/result_<seed>.txt``);
* ``reports/<suite>.png``: per-model iteration time and speedup by system, error bars over seeds;
* ``reports/<suite>.md``: the table, the paper's claim beside ours, how our setting differs, and
  which machine and commit produced it.
"""

from __future__ import annotations

import argparse
import math
import shutil
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd

from bagpipe.harness.run.sweep import RUNS_CSV, add_speedups, runs_frame, speedup_key
from bagpipe.harness.track.mlperf import NOT_CONVERGED, olympic_score
from bagpipe.harness.track.record import RunRecord, find_records
from bagpipe.harness.track.workspace import machine

#: What the paper claims for the headline comparison (bagpipe.md, "Figure numbering").
PAPER_CLAIM = "up to 5.6x faster training than state-of-the-art baselines (SOSP'23 abstract)"
SYSTEM_ORDER = ("local", "sync_ps", "fae", "het", "torchrec", "bagpipe")
MODEL_ORDER = ("dlrm", "wdl", "deepfm", "dcn")
_BASELINES = ("sync_ps", "fae", "het", "torchrec")


def latest_sweep(root: Path, suite: str) -> Path:
    """The newest sweep directory of ``suite`` under ``root`` (``multirun/<suite>/<stamp>``)."""
    candidates = sorted(p for p in (root / suite).glob("*") if p.is_dir() and find_records(p))
    if not candidates:
        raise FileNotFoundError(f"no sweep of suite {suite!r} with run records under {root / suite}")
    return candidates[-1]


def frame_from_sweep(sweep_dir: Path, reference: str) -> pd.DataFrame:
    records = [RunRecord.load(d) for d in find_records(sweep_dir)]
    add_speedups(records, reference)
    return runs_frame(records)


def frame_from_mlflow(tracking_uri: str, experiment: str, suite: str) -> pd.DataFrame:
    """The runs of the suite's latest sweep in an MLflow store, in the CSV's shape."""
    import mlflow

    mlflow.set_tracking_uri(tracking_uri)
    runs = mlflow.search_runs(
        experiment_names=[experiment], filter_string=f"tags.suite = '{suite}'",
        output_format="pandas",
    )
    assert isinstance(runs, pd.DataFrame)
    runs = runs[runs["tags.sweep_id"] != "none"] if "tags.sweep_id" in runs else runs
    if runs.empty:
        raise LookupError(f"no runs of suite {suite!r} in {tracking_uri} ({experiment})")
    latest = runs.sort_values("start_time")["tags.sweep_id"].iloc[-1]
    runs = runs[(runs["tags.sweep_id"] == latest) & runs["tags.system"].notna()]
    frame = pd.DataFrame(
        {
            "system": runs["tags.system"], "model": runs["tags.model"],
            "dataset": runs["tags.dataset"], "seed": runs["params.seed"].astype(int),
            "suite": suite, "status": runs["status"], "run_name": runs["tags.mlflow.runName"],
            "git_sha": runs["tags.git_sha"],
        }
    )
    for column in runs.columns:
        if column.startswith("metrics."):
            frame[column[len("metrics."):]] = runs[column]
    return frame.sort_values(["model", "system", "seed"]).reset_index(drop=True)


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
        rows.append(
            {
                "model": model, "system": system, "runs": len(group),
                "iter_ms_mean": group["iter_ms"].mean(), "iter_ms_sd": group["iter_ms"].std(),
                "iter_ms_p50": 1000 * group["iter_time_p50_s"].mean(),
                key: group[key].mean(), "auc": group["auc"].mean(),
                "logloss": group["logloss"].mean(),
                "olympic_time_to_target_s": olympic_score(tta) if tta else None,
            }
        )
    table = pd.DataFrame(rows)
    if table.empty:
        return table
    table["model"] = pd.Categorical(table["model"], _order(table["model"], MODEL_ORDER))
    table["system"] = pd.Categorical(table["system"], _order(table["system"], SYSTEM_ORDER))
    return table.sort_values(["model", "system"]).reset_index(drop=True)


def _order(values: pd.Series, preferred: tuple[str, ...]) -> list[str]:
    present = list(dict.fromkeys(values))
    return [v for v in preferred if v in present] + [v for v in present if v not in preferred]


def draw(frame: pd.DataFrame, reference: str, path: Path) -> None:
    """Two panels: iteration time (ms) and speedup over ``reference``, by model and system."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns

    done = frame[frame["status"] == "FINISHED"].copy()
    done["iteration time (ms)"] = 1000 * done["iter_time_mean_s"]
    key = speedup_key(reference)
    hue_order = _order(done["system"], SYSTEM_ORDER)
    order = _order(done["model"], MODEL_ORDER)
    panels = 2 if key in done and done[key].notna().any() else 1
    fig, axes = plt.subplots(1, panels, figsize=(6.5 * panels, 4.2), squeeze=False)
    sns.barplot(data=done, x="model", y="iteration time (ms)", hue="system", order=order,
                hue_order=hue_order, errorbar="sd", ax=axes[0][0])
    axes[0][0].set_title("per-iteration time (mean over seeds, sd bars)")
    if panels == 2:
        sns.barplot(data=done, x="model", y=key, hue="system", order=order,
                    hue_order=hue_order, errorbar="sd", ax=axes[0][1])
        axes[0][1].axhline(1.0, color="grey", lw=0.8, ls="--")
        axes[0][1].set_title(f"speedup over {reference} (higher is better)")
        axes[0][1].set_ylabel(f"speedup vs {reference}")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=130)
    plt.close(fig)


def markdown(suite: str, frame: pd.DataFrame, table: pd.DataFrame, reference: str,
             figure: Path, source: str) -> str:
    """The report: headline, table, the paper's claim beside ours, setting differences, provenance."""
    key = speedup_key(reference)
    shas = sorted(set(frame.get("git_sha", pd.Series(["unknown"])).astype(str)))
    lines = [
        f"# {suite}: per-iteration time and speedup by system and model",
        "",
        f"![{suite}]({figure.name})",
        "",
        "| model | system | runs | iter ms (mean ± sd) | p50 ms | "
        f"speedup vs {reference} | AUC | logloss | olympic time-to-target s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for values in table.to_dict("records"):
        lines.append(
            f"| {values['model']} | {values['system']} | {values['runs']} | "
            f"{values['iter_ms_mean']:.2f} ± {_num(values['iter_ms_sd'], '.2f')} | "
            f"{values['iter_ms_p50']:.2f} | {_num(values[key], '.2f')}x | "
            f"{values['auc']:.4f} | {values['logloss']:.4f} | "
            f"{_num(values['olympic_time_to_target_s'], '.2f')} |"
        )
    lines += ["", "## The paper's claim beside ours", "", f"* Paper: {PAPER_CLAIM}.",
              f"* Ours: {_our_claim(table)}", "",
              "## How our setting differs from the paper's", "",
              "* Roles are processes on one machine; the network is the link model (every "
              "cross-role transfer delayed by latency + bytes / bandwidth, 10 Gbps unless "
              "overridden), not 8 p3.2xlarge trainers and their servers.",
              "* Compute is CPU; the paper trains on V100 GPUs, so compute is slower here and "
              "communication is a smaller share of an iteration.",
              "* Data is Criteo-Kaggle-*shaped* synthetic data (same table-size and skew shape, "
              "labels from a hidden teacher), scaled down; AUC values are not comparable to "
              "Criteo's.",
              "* Models and batch are CPU-sized unless the suite ran with `scale=paper`; runs are "
              "a few dozen iterations, so time-to-target uses the suite's low AUC target.",
              "", "## Provenance", "",
              f"* Machine: {machine()}",
              f"* Commit(s): {', '.join(shas)}",
              f"* Source: {source}",
              f"* Written: {datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}",
              f"* Regenerate: `python -m bagpipe.harness.report --suite {suite}`", ""]
    return "\n".join(lines)


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bagpipe.harness.report", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", required=True)
    parser.add_argument("--sweep-dir", type=Path, help="default: the latest under --multirun-root")
    parser.add_argument("--multirun-root", type=Path, default=Path("multirun"))
    parser.add_argument("--csv", type=Path, help="re-render from a tidy CSV written earlier")
    parser.add_argument("--from-mlflow", metavar="TRACKING_URI", help="read runs from MLflow")
    parser.add_argument("--experiment", default="bagpipe-harness")
    parser.add_argument("--reference", default="sync_ps", help="system speedups are measured against")
    parser.add_argument("--results-dir", type=Path, default=Path("results"))
    parser.add_argument("--reports-dir", type=Path, default=Path("reports"))
    args = parser.parse_args(argv)

    out = args.results_dir / args.suite
    out.mkdir(parents=True, exist_ok=True)
    if args.csv is not None:
        frame, source = pd.read_csv(args.csv), str(args.csv)
    elif args.from_mlflow:
        frame = frame_from_mlflow(args.from_mlflow, args.experiment, args.suite)
        source = f"MLflow {args.from_mlflow}"
    else:
        sweep_dir = args.sweep_dir or latest_sweep(args.multirun_root, args.suite)
        frame, source = frame_from_sweep(sweep_dir, args.reference), f"sweep {sweep_dir}"
        if (sweep_dir / "results").is_dir():
            shutil.copytree(sweep_dir / "results", out / "mllog", dirs_exist_ok=True)
    if args.csv is None or args.csv.resolve() != (out / RUNS_CSV).resolve():
        frame.to_csv(out / RUNS_CSV, index=False)
    table = summary_table(frame, args.reference)
    figure = args.reports_dir / f"{args.suite}.png"
    draw(frame, args.reference, figure)
    (args.reports_dir / f"{args.suite}.md").write_text(
        markdown(args.suite, frame, table, args.reference, figure, source)
    )
    print(table.to_string(index=False))
    print(f"wrote {out / RUNS_CSV}, {figure}, {args.reports_dir / f'{args.suite}.md'}")
    return 0

