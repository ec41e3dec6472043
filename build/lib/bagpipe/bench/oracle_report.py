"""``reports/oracle.{png,md}`` from the oracle benchmark's rows, whatever variants ran.

The figure puts the planning time per batch of each variant beside 5% of each iteration timed;
the text lists every row and states each target (TARGETS.md) that the rows hold a figure for.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path

import pandas as pd

from bagpipe.harness.track.workspace import git_sha, machine

__all__ = ["TARGET_SHARE", "report"]

TARGET_SHARE = 0.05  # TARGETS.md: planning time per batch <= 5% of the iteration time

#: The value of one (variant, metric) row, ``None`` if the benchmark did not measure it.
_Value = Callable[[str, str], float | None]


def report(frame: pd.DataFrame, reports_dir: Path) -> list[Path]:
    """``reports/oracle.{png,md}``: planning time per batch of each variant beside 5% of the two
    iterations, and the ratios the targets are stated in."""
    value = partial(_value, frame)
    figure = _figure(frame, value, reports_dir / "oracle.png")
    path = reports_dir / "oracle.md"
    path.write_text(_markdown(frame, value, figure))
    return [figure, path]


def _value(frame: pd.DataFrame, variant: str, metric: str) -> float | None:
    found = frame[(frame.variant == variant) & (frame.metric == metric)].value
    return float(found.iloc[0]) if len(found) else None


def _figure(frame: pd.DataFrame, value: _Value, path: Path) -> Path:
    """Bars of ms per batch (wall and CPU) per variant, with a line at 5% of each iteration."""
    import seaborn as sns

    # the one import of the shared plotting helpers
    from bagpipe.harness.report.plotting import pyplot, save_figure

    capped = next((v for v in frame.variant.unique() if v.startswith("oracle_cacher_capacity")), "")
    capped_share = value(capped, "capacity_over_uncapped_peak") or float("nan")
    bars = []
    for label, variant in (
        ("OracleCacher, whole stream", "oracle_cacher"),
        ("OracleCacher, steady state", "oracle_cacher_steady"),
        (f"OracleCacher, capacity {capped_share:.2f}x peak", capped),
        ("original (dense arrays) + unique", "original_dense_numpy_with_unique"),
    ):
        for clock in ("wall", "cpu"):
            ms = value(variant, f"ms_per_batch_{clock}")
            if ms is not None:
                bars.append({"variant": label, "clock": clock, "ms per batch": ms})
    fig, ax = pyplot().subplots(figsize=(8, 4.2))
    sns.barplot(pd.DataFrame(bars), y="variant", x="ms per batch", hue="clock", ax=ax)
    iterations = frame[frame.metric == "iteration_ms"]
    for (variant, ms), style in zip(
        iterations[["variant", "value"]].values, ("--", ":"), strict=False
    ):
        ax.axvline(TARGET_SHARE * ms, color="k", linestyle=style, label=f"5% of {variant}")
    ax.set_ylabel("")
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.4, -0.18), ncol=2)
    ax.set_title("Oracle planning per batch (Kaggle-shaped, B=16384, L=200, T=8)", fontsize=10)
    return save_figure(fig, path)


def _markdown(frame: pd.DataFrame, value: _Value, figure: Path) -> str:
    rows = ["| variant | metric | value | unit |", "|---|---|---|---|"]
    for record in frame.itertuples(index=False):
        rows.append(f"| {record.variant} | {record.metric} | {record.value:.4g} | {record.unit} |")
    text = [
        "# oracle: planning throughput against the original and against the iteration",
        "",
        f"![oracle]({figure.name})",
        "",
        *rows,
        "",
        "## Targets (TARGETS.md)",
        "",
        "* Planning time per batch <= 5% of the training iteration time of the same configuration.",
        "* At least the original implementation's speed on the same stream, while also enforcing "
        "the capacity and keeping memory proportional to rows seen; >= 1 M unique ids/s per core.",
        "",
        *_verdicts(value),
        "",
        "## Setting and provenance",
        "",
        f"* {frame.batches.iloc[0]} batches of {frame.batch_size.iloc[0]}, L = "
        f"{frame.lookahead.iloc[0]}, T = {frame.trainers.iloc[0]}; what each row measures: the "
        "docstring of `bagpipe/bench/oracle.py`.",
        f"* Machine: {machine()}",
        f"* Commit: {git_sha(Path.cwd())}",
        "* Regenerate: `nox -s bench -- --only oracle`.",
        "",
    ]
    return "\n".join(text)


def _verdicts(value: _Value) -> list[str]:
    """One line per target, from the rows: the measured figure and whether it meets the target."""
    lines = []
    share_metric = "oracle_cacher_wall_per_batch_over_local_dlrm_small_step_b16384_cpu"
    share = value("ratio", share_metric)
    if share is not None:
        low, high = value("ratio", f"{share_metric}_min"), value("ratio", f"{share_metric}_max")
        spread = f" (repetitions {low:.1%} to {high:.1%})" if low is not None and high is not None else ""
        verdict = "met" if share <= TARGET_SHARE else "not met"
        lines.append(
            f"* Measured: planning (planning thread, wall) per batch is {share:.1%} of a `local` "
            f"step{spread}: {verdict}."
        )
    for clock in ("wall", "cpu"):
        speedup = value("ratio", f"oracle_cacher_speed_over_original_with_unique_{clock}")
        if speedup is not None:
            verdict = "met" if speedup >= 1 else "not met"
            lines.append(
                f"* Measured: {speedup:.2f}x the original's speed by {clock} time: {verdict}."
            )
    ids_per_s = value("oracle_cacher", "unique_ids_per_s_cpu")
    if ids_per_s is not None:
        verdict = "met" if ids_per_s >= 1e6 else "not met"
        lines.append(f"* Measured: {ids_per_s / 1e6:.1f} M unique ids per CPU-second: {verdict}.")
    return lines
