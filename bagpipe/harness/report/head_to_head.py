"""Bagpipe against each baseline, paired within blocks: the claim the paper makes, checked as one.

The fig7 table sets every system against one reference (``sync_ps``). The paper's claim is about
Bagpipe against *every* baseline, so this section takes, per model and baseline, the ratio
baseline time / Bagpipe's time within each block and reports its geometric mean with the same
95% interval and verdict rule (:mod:`bagpipe.harness.report.paired`). The exact baselines
(``sync_ps``, FAE, TorchRec) train the same model as Bagpipe; HET trains with bounded staleness, so
its column carries its AUC beside Bagpipe's.
"""

from __future__ import annotations

import pandas as pd

from bagpipe.harness.report.cells import cell
from bagpipe.harness.report.paired import PairedSpeedup, paired_speedup
from bagpipe.harness.track.sweeps import BLOCK, MODEL_ORDER, in_order, with_blocks

SUBJECT = "bagpipe"
EXACT_BASELINES = ("sync_ps", "fae", "torchrec")
STALE_BASELINE = "het"


def head_to_head_lines(frame: pd.DataFrame) -> list[str]:
    """The markdown section (empty when the runs hold no Bagpipe run)."""
    done = with_blocks(frame[frame["status"] == "FINISHED"])
    times = done.pivot_table(index=["model", BLOCK], columns="system", values="iter_time_mean_s")
    if SUBJECT not in times:
        return []
    baselines = [b for b in (*EXACT_BASELINES, STALE_BASELINE) if b in times]
    auc = done.groupby(["model", "system"])["auc"].mean()
    lines = ["## Bagpipe against each baseline", "",
             "Per model: the baseline's iteration time / Bagpipe's within each block, geometric "
             "mean over blocks [95% interval], and the verdict (*faster* where the interval "
             f"excludes 1). {STALE_BASELINE} trains with bounded staleness, not exactly: its AUC "
             "stands beside Bagpipe's.", "",
             "| model | " + " | ".join(f"vs {b}" for b in baselines) + " |",
             "|---|" + "---|" * len(baselines)]
    for model in in_order(times.index.get_level_values("model"), MODEL_ORDER):
        per_block = times.loc[model]
        cells = []
        for baseline in baselines:
            paired = paired_speedup((per_block[baseline] / per_block[SUBJECT]).dropna().tolist())
            text = _speedup(paired)
            if baseline == STALE_BASELINE:
                text += (f"; AUC {cell(auc.get((model, baseline)), '.4f')} vs "
                         f"{cell(auc.get((model, SUBJECT)), '.4f')}")
            cells.append(text)
        lines.append(f"| {model} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def _speedup(paired: PairedSpeedup) -> str:
    return (f"{cell(paired.speedup, '.2f')}x [{cell(paired.low, '.2f')}, "
            f"{cell(paired.high, '.2f')}] {paired.verdict}")
