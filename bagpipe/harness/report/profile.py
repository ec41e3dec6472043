"""Where an iteration's time and CPU went, per (model, system): the profile that explains a speedup.

Two cores run every role of a system here, so a system can be slower for a reason the target
cluster does not have: its helper roles (servers, the oracle) and its trainers' background threads
take CPU that its trainers' forward and backward then wait for. The runs record, per timed step,
the CPU seconds of a trainer, of every other role together and of the driver
(``per_iter_{trainer,helpers,driver}_cpu_s``, ``bagpipe.core.roles.cpu.CpuTally``), and trainer 0's
phases. This section sets them side by side:

* **cores busy**: (trainers x a trainer's CPU + the helpers' + the driver's) / iteration time; at 2
  the machine was saturated, and every helper CPU second was a trainer's lost second;
* **forward + backward vs the reference**: trainer 0's forward + backward against the reference
  system's in the same block (geometric mean over blocks), the CPU-share check of the issue that
  set the rules (goal: within 15%). Every system's phases follow one rule
  (``bagpipe.core.meter.Phase``): DDP's wait for its all-reduce at backward's end, with any rows
  riding in it (Bagpipe's sync-now rows, FAE's hot rows), is sync, and getting a step's rows is
  fetch, so the ratio compares the same dense work, slowed only by CPU taken from it. Beside it,
  the same ratio of the CPU the step's thread spent in forward + backward (``cpu_<phase>_s``):
  near 1 where the work is the same and only the waits for a core differ.

A second table gives those bytes: what every role together sent per timed iteration, as the
ledger booked it (``bytes_per_iter_<link>``). A cache trades rows pulled from and pushed to the
embedding servers (their NICs) for collectives among the trainers (theirs); where the trainers'
dense all-reduce already fills their NICs, the trade can cost as much as it saves.
"""

from __future__ import annotations

import math

import pandas as pd

from bagpipe.harness.report.cells import cell, column_mean
from bagpipe.harness.report.paired import paired_speedup
from bagpipe.harness.track.sweeps import BLOCK, MODEL_ORDER, SYSTEM_ORDER, in_order, with_blocks

CPU_COLUMNS = ("per_iter_trainer_cpu_s", "per_iter_helpers_cpu_s", "per_iter_driver_cpu_s")
#: Trainer 0's phases that hold a step's dense work (TorchRec's pipeline times none of them).
COMPUTE_PHASES = ("time_forward_s", "time_backward_s")
#: The CPU its step's thread spent in them (``bagpipe.core.meter``): the work itself, without the
#: waits for a core that the wall time holds.
COMPUTE_CPU = ("cpu_forward_s", "cpu_backward_s")
COMPUTE_TOLERANCE = 0.15  # the CPU-share check's goal: forward + backward within 15%
#: The system whose one process trains the whole global batch: its forward + backward is not a
#: trainer's slice, so it has no ratio (the check is among networked systems' trainers).
WHOLE_BATCH = "local"
#: The traffic table's columns: each a heading and the ``bytes_per_iter_<link>`` columns it sums.
TRAFFIC_COLUMNS = {
    "embedding rows pulled + pushed MB": ("bytes_per_iter_emb_pull", "bytes_per_iter_emb_push"),
    "all-reduce MB": ("bytes_per_iter_allreduce",),
    "all-to-all MB": ("bytes_per_iter_alltoall",),
}


def profile_lines(frame: pd.DataFrame, reference: str) -> list[str]:
    """The markdown section; says so where the runs did not record their CPU."""
    lines = ["## Where the time and the CPU went", ""]
    done = frame[frame["status"] == "FINISHED"]
    if done.empty or not set(CPU_COLUMNS) <= set(done) or done[list(CPU_COLUMNS)].isna().all().all():
        return [*lines, "* The runs did not record their CPU per iteration (older runs).", ""]
    lines += [
        "Per timed iteration, means over blocks (`bagpipe/harness/report/profile.py`):", "",
        f"| model | system | iter ms | a trainer's CPU ms | helpers' CPU ms | driver CPU ms | "
        f"cores busy | forward + backward ms | vs {reference} (same block) | its CPU vs "
        f"{reference}'s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    compute = _compute_ratios(done, reference, COMPUTE_PHASES)
    compute_cpu = _compute_ratios(done, reference, COMPUTE_CPU)
    for (model, system), group in _ordered_groups(done):
        trainers = pd.to_numeric(group["trainers"], errors="coerce").mean() if "trainers" in group \
            else math.nan
        iter_s, trainer_s, helpers_s, driver_s = (
            column_mean(group, c) for c in ("iter_time_mean_s", *CPU_COLUMNS))
        busy = (trainers * trainer_s + helpers_s + driver_s) / iter_s if iter_s > 0 else math.nan
        fwd_bwd_s = sum(column_mean(group, c) for c in COMPUTE_PHASES)
        ratio = compute.get((str(model), str(system)), math.nan)
        lines.append(
            f"| {model} | {system} | {_ms(iter_s)} | {_ms(trainer_s)} | {_ms(helpers_s)} | "
            f"{_ms(driver_s)} | {cell(busy, '.2f')} | {_ms(fwd_bwd_s) if fwd_bwd_s > 0 else '–'} | "
            f"{cell(ratio, '.2f', 'x')} | "
            f"{cell(compute_cpu.get((str(model), str(system)), math.nan), '.2f', 'x')} |"
        )
    return [*lines, "", *_compute_verdict(compute, reference), *_traffic_lines(done)]


def _compute_verdict(compute: dict[tuple[str, str], float], reference: str) -> list[str]:
    """One line: which (model, system) pairs' forward + backward is outside
    :data:`COMPUTE_TOLERANCE` of the reference's."""
    checked = {key: ratio for key, ratio in compute.items() if key[1] != reference}
    if not checked:
        return []
    outside = [f"{system} on {model} ({ratio:.2f}x)" for (model, system), ratio in checked.items()
               if abs(ratio - 1) > COMPUTE_TOLERANCE]
    verdict = "outside: " + ", ".join(outside) if outside else "every one within"
    return [f"* Forward + backward within {COMPUTE_TOLERANCE:.0%} of {reference}'s in the same "
            f"blocks: {len(checked) - len(outside)} of {len(checked)} (model, system) pairs; "
            f"{verdict}.", ""]


def _traffic_lines(done: pd.DataFrame) -> list[str]:
    """Per (model, system): :data:`TRAFFIC_COLUMNS`, means over blocks; nothing where the runs
    recorded no bytes."""
    if not any(c in done for columns in TRAFFIC_COLUMNS.values() for c in columns):
        return []
    lines = ["What crossed the network per timed iteration, every role together (MB):", "",
             f"| model | system | {' | '.join(TRAFFIC_COLUMNS)} |",
             "|---|---|" + "---|" * len(TRAFFIC_COLUMNS)]
    for (model, system), group in _ordered_groups(done):
        sums = [sum(column_mean(group, c) for c in columns if c in group) / 1e6
                for columns in TRAFFIC_COLUMNS.values()]
        lines.append(f"| {model} | {system} | {' | '.join(cell(v, '.2f') for v in sums)} |")
    return [*lines, ""]


def _compute_ratios(done: pd.DataFrame, reference: str,
                    columns: tuple[str, ...]) -> dict[tuple[str, str], float]:
    """Per (model, system): geometric mean over blocks (``with_blocks``) of trainer 0's forward + backward
    (the sum of ``columns``: its wall time, or its thread's CPU) over the reference's in the same
    block; absent where either recorded none."""
    if not set(columns) <= set(done):
        return {}
    fwd_bwd = with_blocks(done).assign(
        fwd_bwd_s=sum(pd.to_numeric(done[c], errors="coerce") for c in columns))
    by_block = fwd_bwd.pivot_table(index=["model", BLOCK], columns="system", values="fwd_bwd_s")
    if reference not in by_block:
        return {}
    ratios: dict[tuple[str, str], float] = {}
    for system in by_block.columns.drop(WHOLE_BATCH, errors="ignore"):
        for model, values in (by_block[system] / by_block[reference]).groupby(level="model"):
            paired = paired_speedup(values.dropna().tolist())
            if paired.blocks:
                ratios[(str(model), str(system))] = paired.speedup
    return ratios


def _ordered_groups(done: pd.DataFrame) -> list[tuple[tuple[object, object], pd.DataFrame]]:
    models = in_order(done["model"], MODEL_ORDER)
    systems = in_order(done["system"], SYSTEM_ORDER)
    groups = dict(iter(done.groupby(["model", "system"], sort=False)))
    return [((m, s), groups[(m, s)]) for m in models for s in systems if (m, s) in groups]


def _ms(seconds: float) -> str:
    return cell(1000 * seconds, ".1f")
