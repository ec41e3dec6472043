"""``python -m bagpipe.harness.report fig7``: the headline comparison as CSV, figure and markdown.

Reads the runs of the latest fig7 sweep (``multirun/fig7/<stamp>/``, or ``--sweep-dir``), or an
MLflow store (``--from-mlflow``), or a tidy CSV written earlier (``--csv``), and writes:

* ``results/fig7/runs.csv``: one row per run (system, model, seed, iteration time mean/p50/p90
  after warm-up, AUC, logloss, bytes per iteration per link, hit rate, time to target, speedup);
* ``results/fig7/mllog/``: the runs' MLPerf logs (``<system>-<model>/<benchmark>/result_<seed>.txt``);
* ``reports/fig7.png``: per-model iteration time and speedup by system, error bars over seeds;
* ``reports/fig7.md``: the table (each measured speedup beside the cost model's projection for
  the same dilated network, and whether every run's logloss beats the base rate), the paper's
  claim beside ours, Bagpipe against each baseline paired within blocks
  (:mod:`bagpipe.harness.report.head_to_head`), the regime the runs ran in, where the time and the CPU went
  (:mod:`bagpipe.harness.report.profile`), the checks Bagpipe's runs must pass, how our
  setting differs, and which machine and commit produced it.

A result set from several commits or a dirty tree, or whose Bagpipe runs fail a window check
(:mod:`bagpipe.harness.report.regime`), is refused unless ``allow_unclean`` draws a marked draft.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pandas as pd

from bagpipe.harness.report.bound import BOUND, bound_lines, bound_ratio
from bagpipe.harness.report.cells import cell, column_mean
from bagpipe.harness.report.head_to_head import head_to_head_lines
from bagpipe.harness.report.loading import (
    RunsTable,
    UncleanResultsError,
    require_one_clean_commit,
)
from bagpipe.harness.report.paired import paired_speedup
from bagpipe.harness.report.plotting import Outputs, provenance, pyplot, save_csv, save_figure
from bagpipe.harness.report.profile import profile_lines
from bagpipe.harness.report.regime import (
    AGREES,
    BEATS_BASE_RATE,
    Check,
    agreement,
    beats_base_rate,
    dilation_lines,
    projected_speedup,
    projected_speedup_key,
    require_passed,
    window_checks,
    with_projection,
)
from bagpipe.harness.track.mlperf import NOT_CONVERGED, olympic_score
from bagpipe.harness.track.sweeps import (
    MODEL_ORDER,
    RUNS_CSV,
    SYSTEM_ORDER,
    in_order,
    speedup_key,
    with_blocks,
)

SUITE = "fig7"
#: The same comparison at the paper's scale (``suite=fig7_paper``: DLRM, batch 16384, dim 48,
#: the paper's MLPs, 8 trainers), reported by the same rules as its own result set.
PAPER_SUITE = "fig7_paper"
#: What the paper claims for the headline comparison (bagpipe.md, "Figure numbering").
PAPER_CLAIM = "up to 5.6x faster training than state-of-the-art baselines (SOSP'23 abstract)"
_BASELINES = ("sync_ps", "fae", "het", "torchrec")
RESCALED_SUITE = "fig7_dilation"
#: The ``fig7_dilation`` runs (DLRM at d/2 and 2d), beside ``runs.csv`` in ``results/fig7``.
RESCALED_CSV = "runs_dilation.csv"


def report(runs: RunsTable, reference: str, out: Outputs, allow_unclean: bool = False,
           rescaled: RunsTable | None = None, suite: str = SUITE) -> None:
    """Write the runs table, the runs' mllog files, the figure and the page; refuse a result set
    that mixes commits, has uncommitted changes or fails a check unless ``allow_unclean`` (a
    marked draft). ``rescaled``: the ``fig7_dilation`` sweep (DLRM at d/2 and 2d), reported
    beside the fig7 runs at d and held to the same rules. ``suite``: which result set this is
    (``fig7``, or :data:`PAPER_SUITE`): the names of what is written."""
    both = runs.frame if rescaled is None else pd.concat([runs.frame, rescaled.frame])
    checks = window_checks(both)
    draft = _draft_reasons(both, checks, allow_unclean, suite)
    results = out.results_dir / suite
    results.mkdir(parents=True, exist_ok=True)
    if runs.sweep is not None and (runs.sweep / "results").is_dir():
        shutil.copytree(runs.sweep / "results", results / "mllog", dirs_exist_ok=True)
    runs_csv = out.table(suite, RUNS_CSV)
    if runs.csv is None or runs.csv.resolve() != runs_csv.resolve():
        save_csv(runs.frame, runs_csv)
    table = summary_table(runs.frame, reference)
    figure = draw(runs.frame, reference, out.figure(suite))
    page = markdown(runs.frame, table, reference, figure, runs.source, checks, suite)
    if rescaled is not None:
        save_csv(rescaled.frame, results / RESCALED_CSV)
        page += "\n".join(rescaled_lines(runs.frame, rescaled.frame, reference, rescaled.source))
    if draft:
        page = f"> **Draft:** {' '.join(draft)}\n\n{page}"
    out.page(suite).write_text(page)
    print(table.to_string(index=False))
    print(f"wrote {runs_csv}, {figure}, {out.page(suite)}")


def rescaled_lines(fig7_frame: pd.DataFrame, rescaled: pd.DataFrame, reference: str,
                   source: str) -> list[str]:
    """The "d/2 and 2d" section: per dilation scale and system, DLRM's measured speedup beside
    the projected one. ``d`` is derived from the topology's compute estimate, itself an
    estimate; if the cost model explains the measurements, both move together as ``d`` moves."""
    key, projected_key = speedup_key(reference), projected_speedup_key(reference)
    dlrm = fig7_frame[fig7_frame["model"] == "dlrm"].assign(**{"dilation.scale": 1.0})
    frames = pd.concat([dlrm, rescaled])
    lines = ["", "## d/2 and 2d (DLRM)", "",
             f"Source: {source} (`suite=fig7_dilation`), beside the fig7 runs at d.", "",
             f"| d | system | measured speedup vs {reference} [95% CI] | projected | "
             "agrees ±20% |", "|---|---|---|---|---|"]
    scales = sorted({float(v) for v in frames["dilation.scale"].dropna()})
    for scale in scales:
        runs = frames[frames["dilation.scale"].astype(float) == scale]
        factors = sorted({float(v) for v in runs["dilation.factor"].dropna()})
        label = f"{scale:g} d ({', '.join(f'{f:.3g}' for f in factors)})"
        for values in summary_table(runs, reference).to_dict("records"):
            if values["system"] in ("local", reference):
                continue
            lines.append(
                f"| {label} | {values['system']} | {cell(values[key], '.2f')}x "
                f"[{cell(values[key + '_ci_low'], '.2f')}, "
                f"{cell(values[key + '_ci_high'], '.2f')}] | "
                f"{cell(values[projected_key], '.2f', 'x')} | {values[AGREES] or '–'} |"
            )
    return [*lines, "", *_bound_by_scale(frames, scales)]


def _bound_by_scale(frames: pd.DataFrame, scales: list[float]) -> list[str]:
    """Bagpipe / the bound at each dilation, where the runs hold both: embedding traffic grows
    with d while the CPU does not, so how the ratio moves with d tells the two apart."""
    done = with_blocks(frames[frames["status"] == "FINISHED"])
    ratios = [(scale, bound_ratio(done[done["dilation.scale"].astype(float) == scale]))
              for scale in scales]
    if not any(ratio.blocks for _, ratio in ratios):
        return []
    lines = [f"Bagpipe / {BOUND} at each d (paired within blocks [95% CI]): the traffic grows "
             "with d, the CPU does not.", "", "| d | Bagpipe / bound |", "|---|---|"]
    lines += [f"| {scale:g} d | {cell(r.speedup, '.2f')}x [{cell(r.low, '.2f')}, "
              f"{cell(r.high, '.2f')}] |" for scale, r in ratios if r.blocks]
    return [*lines, ""]


def _draft_reasons(frame: pd.DataFrame, checks: list[Check], allow_unclean: bool,
                   suite: str) -> list[str]:
    """Why the result set is only a draft (empty: it is not). Each gate raises its
    :class:`UncleanResultsError` unless ``allow_unclean``, which turns it into a reason."""
    reasons = []
    gates = (lambda: require_one_clean_commit(frame, suite),
             lambda: require_passed(checks, suite))
    for gate in gates:
        try:
            gate()
        except UncleanResultsError as err:
            if not allow_unclean:
                raise
            print(f"[report] DRAFT: {err}")
            reasons.append(f"{err}.")
    return reasons


def summary_table(frame: pd.DataFrame, reference: str) -> pd.DataFrame:
    """Per (model, system): iteration time mean and sd over seeds, speedup measured and projected
    (and whether they agree), AUC and the target, logloss against the base rate, olympic time."""
    key, projected_key = speedup_key(reference), projected_speedup_key(reference)
    projected = with_projection(frame)
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
        projection = (projected_speedup(projected, str(model), str(system), reference)
                      if system != "local" else math.nan)
        rows.append(
            {
                "model": model, "system": system, "runs": len(group),
                "iter_ms_mean": group["iter_ms"].mean(), "iter_ms_sd": group["iter_ms"].std(),
                "iter_ms_p50": 1000 * group["iter_time_p50_s"].mean(),
                key: paired.speedup, f"{key}_ci_low": paired.low, f"{key}_ci_high": paired.high,
                "verdict": ("reference" if system == reference else
                            "bound, not exact" if system == BOUND else paired.verdict),
                projected_key: projection, AGREES: agreement(paired.speedup, projection),
                "auc": group["auc"].mean(),
                "target_auc": column_mean(group, "run.target_auc"),
                "logloss": group["logloss"].mean(),
                "base_rate_logloss": column_mean(group, "base_rate_logloss"),
                BEATS_BASE_RATE: beats_base_rate(group),
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
             source: str, checks: list[Check] | None = None, suite: str = SUITE) -> str:
    """The report: headline, table, the paper's claim beside ours, the regime, the checks,
    setting differences, provenance."""
    key, projected_key = speedup_key(reference), projected_speedup_key(reference)
    shas = sorted(set(frame.get("git_sha", pd.Series(["unknown"])).astype(str)))
    lines = [
        f"# {suite}: per-iteration time and speedup by system and model",
        "",
        f"![{suite}]({figure.name})",
        "",
        "| model | system | runs | iter ms (mean ± sd) | p50 ms | "
        f"speedup vs {reference} [95% CI] | verdict | projected | agrees ±20% | AUC | logloss | "
        "beats base rate (its logloss) | olympic time-to-target s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for values in table.to_dict("records"):
        lines.append(
            f"| {values['model']} | {values['system']} | {values['runs']} | "
            f"{values['iter_ms_mean']:.2f} ± {cell(values['iter_ms_sd'], '.2f')} | "
            f"{values['iter_ms_p50']:.2f} | {cell(values[key], '.2f')}x "
            f"[{cell(values[key + '_ci_low'], '.2f')}, {cell(values[key + '_ci_high'], '.2f')}] | "
            f"{values['verdict']} | {cell(values[projected_key], '.2f', 'x')} | "
            f"{values[AGREES] or '–'} | "
            f"{values['auc']:.4f} | {values['logloss']:.4f} | "
            f"{values[BEATS_BASE_RATE] or '–'} ({cell(values['base_rate_logloss'], '.4f')}) | "
            f"{cell(values['olympic_time_to_target_s'], '.2f')} |"
        )
    lines += ["", "## The paper's claim beside ours", "", f"* Paper: {PAPER_CLAIM}.",
              f"* Ours: {_our_claim(table)}", "",
              *head_to_head_lines(frame),
              *bound_lines(frame),
              *_regime_lines(frame, table, reference),
              *profile_lines(frame, reference),
              *_check_lines(checks or [], table),
              "## How our setting differs from the paper's", "",
              "* Roles are processes on one machine, each host of the described cluster an "
              "emulated host with its own NIC (README, *The emulated cluster*), not 8 p3.2xlarge "
              "trainers and their server.",
              "* Compute is CPU; the paper trains on V100 GPUs. Where the network is dilated "
              "(*The regime*, above), it is slowed by as much as compute is, so communication takes the share "
              "of an iteration it would take there; CPU work that the cluster runs on other "
              "machines (servers, the oracle) is not slowed and shares these cores.",
              "* Data is Criteo-Kaggle-*shaped* synthetic data (same table-size and skew shape, "
              "labels from a hidden teacher), scaled down; AUC values are not comparable to "
              "Criteo's.",
              "* Models and batch are CPU-sized unless the suite ran with `scale=paper`; runs are "
              "a few dozen iterations, so time-to-target uses the suite's low AUC target.",
              "", "## Provenance", "", f"* Source: {source}",
              *[f"* {line}" for line in provenance(suite, ", ".join(shas))], ""]
    return "\n".join(lines)


def _regime_lines(frame: pd.DataFrame, table: pd.DataFrame, reference: str) -> list[str]:
    """The regime the runs ran in, as the runs recorded it: cluster, back-end, dilation, design,
    size, the AUC target and the verdict rule."""
    seeds = sorted(set(frame["seed"].astype(int))) if "seed" in frame else []
    return [
        "## The regime", "",
        f"* Topology: {_distinct(frame, 'cluster')} (tag `cluster`); trainers: "
        f"{_distinct(frame, 'trainers')}; embedding-server hosts: "
        f"{_distinct(frame, 'topology.servers')}; network back-end: "
        f"{_distinct(frame, 'network.backend_used')} (asked: "
        f"{_distinct(frame, 'network.backend')}).",
        *dilation_lines(frame, "model"),
        f"* Design: {len(seeds)} blocks, one per seed ({', '.join(map(str, seeds))}); each block "
        "one run of every (system, model), one model's runs back to back, the models' order and "
        "the systems' order within each randomised per block (`hydra/sweeper=blocks`, "
        "`pair_key=model`).",
        f"* Size: steps: {_distinct(frame, 'run.steps')}, of them warm-up (not timed): "
        f"{_distinct(frame, 'run.warmup_steps')}; global batch: "
        f"{_distinct(frame, 'run.batch_size')}; trainers: {_distinct(frame, 'trainers')}.",
        f"* Wall time: {_wall_time(frame)}.",
        *_target_lines(frame, table),
        f"* Verdict: a speedup is the geometric mean over blocks of {reference}'s iteration time "
        "/ the system's, both from the same block, with a 95% Student-t interval on the log "
        "ratios; a system is *faster* or *slower* only where the interval excludes 1.",
        f"* Projected: {reference}'s cost-model iteration time / the system's, each run's "
        "measured bytes priced on the same topology with the network dilated by the runs' d, "
        "its trainer's own CPU per iteration as compute (`per_iter_trainer_cpu_s`; "
        "`dilation.compute_here_ms` where not recorded) and its servers' CPU per iteration "
        "(`per_iter_helpers_cpu_s`) on the lane of the traffic they answer; *agrees* where "
        "|measured / projected - 1| <= 0.2 (`bagpipe/harness/report/regime.py`).", "",
    ]


def _wall_time(frame: pd.DataFrame) -> str:
    """From the first run's start to the last run's end, as the runs recorded them."""
    if not {"start_ms", "end_ms"} <= set(frame) or frame["end_ms"].isna().all():
        return "not recorded"
    starts = frame["start_ms"][frame["start_ms"] > 0]
    if starts.empty:
        return "not recorded"
    minutes = (float(frame["end_ms"].max()) - float(starts.min())) / 60_000
    return f"{minutes:.1f} min for {len(frame)} runs (first start to last end)"


def _target_lines(frame: pd.DataFrame, table: pd.DataFrame) -> list[str]:
    """Per model, the AUC that time-to-target counts to, beside where local's curve ends."""
    if "run.target_auc" not in frame:
        return ["* Time to target: the runs did not record their AUC target."]
    local = {str(r["model"]): r["auc"] for r in table.to_dict("records") if r["system"] == "local"}
    return [f"* {model}: time to target = time to AUC {_distinct(group, 'run.target_auc')} "
            f"(`run.target_auc`; local's curve ends at AUC {cell(local.get(str(model)), '.4f')})."
            for model, group in frame.groupby("model", sort=False)]


def _check_lines(checks: list[Check], table: pd.DataFrame) -> list[str]:
    """Each check with its value and PASS/FAIL, then whether every model learns."""
    lines = ["## Checks", "", "Bagpipe's timed window (past the warm-up) must hold evictions, "
             "write-backs and background prefetches:", ""]
    lines += [f"* {check.line()}" for check in checks] or ["* no finished Bagpipe run."]
    lines += ["", "Every model learns: each run's eval logloss below the constant base-rate "
              "predictor's, -(p ln p + (1-p) ln(1-p)) with p the eval labels' positive rate:", ""]
    for values in table.to_dict("records"):
        verdict = values[BEATS_BASE_RATE] or "not recorded"
        lines.append(f"* {values['model']} / {values['system']}: logloss "
                     f"{values['logloss']:.4f} vs base rate "
                     f"{cell(values['base_rate_logloss'], '.4f')}: {verdict}.")
    return [*lines, ""]


def _distinct(frame: pd.DataFrame, column: str) -> str:
    """The distinct recorded values of ``column``, comma-joined (``not recorded`` if none)."""
    if column not in frame:
        return "not recorded"
    values = [str(v) for v in dict.fromkeys(frame[column].dropna()) if str(v) != ""]
    return ", ".join(values) or "not recorded"


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
