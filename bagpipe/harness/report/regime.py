"""fig7 in the paper's regime (#16): what the report sets beside each measured speedup.

* **Projection.** Each run's measured bytes, priced by the cost model on the topology the run used
  with the network dilated by the run's factor ``d`` (:meth:`Topology.dilated`), beside the CPU
  its trainers and servers spent per iteration (:func:`run_workload`), is the speedup the
  emulation *should* have shown; a measured speedup far from it means the emulation, the cost
  model or the run is off.
* **Checks that can fail.** Bagpipe's timed window (past the warm-up) must hold evictions,
  write-backs and background prefetches; a run without them measured a cache that never cycled,
  not Bagpipe.
* **Learning.** Every run's eval logloss against the constant base-rate predictor's.

Everything reads the tidy runs table (:func:`~bagpipe.harness.track.sweeps.runs_frame`), so a CSV
written earlier reports the same way; a value the runs did not record leaves its cell empty.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import pandas as pd

from bagpipe.core.net.topology import Compute, Topology
from bagpipe.harness.report.costmodel import SYSTEM_RULES, Workload, predict
from bagpipe.harness.report.loading import UncleanResultsError
from bagpipe.harness.track.record import param_value

#: A projection agrees with a measurement when ``|measured / projected - 1|`` is at most this.
AGREEMENT_TOLERANCE = 0.2
#: Per-run projected iteration time (ms) on the run's dilated topology (runs table column).
PROJECTED_ITER_MS = "projected_iter_ms"
AGREES = "agrees_within_20pct"
BEATS_BASE_RATE = "logloss_beats_base_rate"
_BYTES = "bytes_per_iter_"
_PER_ITER = "per_iter_"
#: A trainer role's CPU seconds per timed iteration (the mean over trainers), from /proc.
TRAINER_CPU = "per_iter_trainer_cpu_s"
#: Every other role's CPU seconds per timed iteration, together (servers, the oracle, standbys).
HELPERS_CPU = "per_iter_helpers_cpu_s"
#: The driver's CPU seconds per timed iteration.
DRIVER_CPU = "per_iter_driver_cpu_s"
#: Bagpipe's round threads' CPU seconds per timed iteration, summed over its trainers (evictions,
#: write-backs, prefetches: ``bagpipe.lrpp.trainer``); absent in systems without rounds.
ROUND_CPU = "per_iter_round_cpu_s"
#: Bagpipe's window checks: what must happen after the warm-up -> the runs-table column holding it.
WINDOW_CHECKS = {
    "evictions": "per_iter_rows_evicted",
    "write-backs": "per_iter_rows_written_back",
    "background prefetches": "per_iter_rows_prefetched",
}


def projected_speedup_key(reference: str) -> str:
    return f"projected_speedup_vs_{reference}"


def _number(row: Mapping[Any, Any], key: str) -> float | None:
    """``row[key]`` as a finite float, or ``None`` where the run did not record it."""
    try:
        value = float(row.get(key))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def _missing(value: object) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def run_topology(row: Mapping[Any, Any]) -> Topology | None:
    """The topology a run used, rebuilt from its ``topology.*`` params with the run's trainer
    count (as the runner builds it); ``None`` when they were not recorded or do not parse."""
    nested: dict[str, Any] = {}
    for key, value in row.items():
        if not str(key).startswith("topology.") or _missing(value):
            continue
        *path, leaf = str(key).split(".")[1:]
        node = nested
        for part in path:
            node = node.setdefault(part, {})
        node[leaf] = param_value(str(value))
    trainers = _number(row, "trainers")
    try:
        topology = Topology.from_dict(nested) if nested else None
    except (TypeError, ValueError):
        return None
    if topology is None or trainers is None:
        return topology
    return topology.with_counts(trainers=int(trainers))


def emulated_topology(row: Mapping[Any, Any]) -> Topology | None:
    """The network the run trained on: its topology dilated by its factor, with compute left to
    the measurement (no device estimate, so :func:`~.costmodel.predict` takes the workload's)."""
    topology, factor = run_topology(row), _number(row, "dilation.factor")
    if topology is None or factor is None:
        return None
    return replace(topology.dilated(factor), compute=Compute())


def run_workload(row: Mapping[Any, Any]) -> Workload | None:
    """A run's measured window as a cost-model workload: its bytes and counters, its trainer's CPU
    per iteration as compute, its servers' CPU per iteration beside.

    The cost model wants one trainer's step with no wire time in it. The run's iteration time holds
    the (dilated) wire time and the waits, so it is not used: no measured iteration time of any
    system enters the projection. The compute term is the run's own trainer CPU per iteration
    (:data:`TRAINER_CPU`): the work its trainer really did (forward, backward, the optimizer, and
    the system's own bookkeeping, such as a cache's lookups), which under dilation stands for the
    target's work scaled by ``d``. A bare forward + backward timed alone
    (``dilation.compute_here_ms``, what ``d`` was calibrated from) was about half of that on the
    fig7 runs: charged to every system alike, it left the rest unpriced and pulled projected
    speedups away from 1, as if the network were a larger share of each iteration than it was.
    The network stays priced by the topology and each system's overlap rule, and the servers' CPU
    (:data:`HELPERS_CPU`) is charged on the lane of the traffic it answers
    (:attr:`~.costmodel.Workload.server_cpu_s`): one rule for every system.

    Caveat: CPU seconds can include busy-waiting (a collective polling while bytes are on the
    wire), which then counts twice, once as CPU and once as wire time.

    A run that did not record its trainer CPU (an older record) falls back to
    ``dilation.compute_here_ms``. ``None`` when the run has neither, or lacks its model's row size
    or a counter its system's rule prices."""
    from bagpipe.models import ModelConfig, table_dim

    system = str(row.get("system"))
    trainer_cpu_s, compute_ms = _number(row, TRAINER_CPU), _number(row, "dilation.compute_here_ms")
    if trainer_cpu_s is not None and trainer_cpu_s <= 0:
        trainer_cpu_s = None  # no trainer role was measured
    compute_s = trainer_cpu_s if trainer_cpu_s is not None else (
        None if compute_ms is None else compute_ms / 1000)
    dim, trainers = _number(row, "model.embedding_dim"), _number(row, "trainers")
    rule = SYSTEM_RULES.get(system)
    if rule is None or compute_s is None or dim is None or trainers is None:
        return None
    counters = {str(k)[len(_PER_ITER):]: float(v) for k, v in row.items()
                if str(k).startswith(_PER_ITER) and not _missing(v)}
    if any(f.rows_counter not in counters for f in rule.flows if f.rows_counter is not None):
        return None
    interval = _number(row, "system_cleanup_interval")
    return Workload(
        system=system,
        bytes_per_iter={str(k)[len(_BYTES):]: float(v) for k, v in row.items()
                        if str(k).startswith(_BYTES) and not _missing(v)},
        counters=counters,
        compute_s=compute_s,
        trainers=int(trainers),
        servers=int(_number(row, "topology.servers") or 1),
        row_bytes=4 * table_dim(ModelConfig(name=str(row.get("model")), embedding_dim=int(dim))),
        knobs={} if interval is None else {"cleanup_interval": interval},
        server_cpu_s=_number(row, HELPERS_CPU) or 0.0,
    )


def projected_iter_ms(row: Mapping[Any, Any]) -> float:
    """The run's projected iteration time on its emulated network (``nan``: not projectable)."""
    work, topology = run_workload(row), emulated_topology(row)
    if work is None or topology is None:
        return math.nan
    return 1000 * predict(work, topology).iter_s


def with_projection(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with :data:`PROJECTED_ITER_MS` for every finished run but ``local``'s."""
    out = frame.copy()
    projectable = (out["status"] == "FINISHED") & (out["system"] != "local")
    out[PROJECTED_ITER_MS] = [projected_iter_ms(row) if ok else math.nan
                              for row, ok in zip(out.to_dict("records"), projectable, strict=True)]
    return out


def projected_speedup(frame: pd.DataFrame, model: str, system: str, reference: str) -> float:
    """``reference``'s mean projected time over ``system``'s, on ``model`` (``nan`` if either is
    missing). Projections are priced from byte counts that barely vary between blocks, so the
    ratio of means is the projection; the blocks' noise lives in the measured side."""
    if PROJECTED_ITER_MS not in frame:
        return math.nan
    rows = frame[frame["model"] == model]
    ref = rows.loc[rows["system"] == reference, PROJECTED_ITER_MS].mean()
    own = rows.loc[rows["system"] == system, PROJECTED_ITER_MS].mean()
    return float(ref / own) if own > 0 and math.isfinite(ref) else math.nan


def agreement(measured: float, projected: float) -> str:
    """``yes``/``no``: measured within :data:`AGREEMENT_TOLERANCE` of projected; ``""`` when
    either is missing."""
    if not (math.isfinite(measured) and math.isfinite(projected)) or projected <= 0:
        return ""
    return "yes" if abs(measured / projected - 1) <= AGREEMENT_TOLERANCE else "no"


def beats_base_rate(runs: pd.DataFrame) -> str:
    """``yes`` when every run's eval logloss is below its base-rate logloss, ``no`` when one is
    not, ``""`` when the runs did not record the base rate."""
    if "base_rate_logloss" not in runs or runs["base_rate_logloss"].isna().all():
        return ""
    return "yes" if bool((runs["logloss"] < runs["base_rate_logloss"]).all()) else "no"


@dataclass(frozen=True)
class Check:
    """One check of one run: ``value`` is what the run recorded (``None``: nothing recorded)."""

    run: str
    name: str
    column: str
    value: float | None

    @property
    def passed(self) -> bool:
        return self.value is not None and self.value > 0

    def line(self) -> str:
        shown = "not recorded" if self.value is None else f"{self.value:.4g} rows/iteration"
        return (f"{self.run}: {self.name} in the timed window (`{self.column}`) = {shown}: "
                f"{'PASS' if self.passed else 'FAIL'}")


class FailedCheckError(UncleanResultsError):
    """A run failed a check the report states. An unclean result like a dirty tree, so the same
    ``--allow-unclean`` draws it as a marked draft, FAIL shown."""


def dilation_lines(frame: pd.DataFrame, by: str) -> list[str]:
    """The network's dilation per ``by`` (a sweep's model or dataset: ``auto`` sets one factor
    per (sweep, model)), with the compute times it was calibrated from."""
    if "dilation.factor" not in frame:
        return []
    lines = []
    columns = [by, "dilation.factor", "dilation.compute_here_ms", "dilation.compute_target_ms"]
    present = frame[[c for c in columns if c in frame]].drop_duplicates()
    for values in present.to_dict("records"):
        here, target = values.get("dilation.compute_here_ms"), values.get("dilation.compute_target_ms")
        detail = (f" (a trainer's step: {here} ms here, {target} ms on the topology's device)"
                  if pd.notna(here) and pd.notna(target) else "")
        lines.append(f"* {values[by]}: network dilated {values['dilation.factor']}x{detail}.")
    return lines


def window_checks(frame: pd.DataFrame) -> list[Check]:
    """:data:`WINDOW_CHECKS` for every finished Bagpipe run."""
    runs = frame[(frame["system"] == "bagpipe") & (frame["status"] == "FINISHED")]
    return [Check(_run_label(row), name, column, _number(row, column))
            for row in runs.to_dict("records") for name, column in WINDOW_CHECKS.items()]


def _run_label(row: Mapping[Any, Any]) -> str:
    """The run's name, and its dilation's scale where that is not 1: fig7_dilation's runs at d/2
    and 2d carry the same names as fig7's at d."""
    scale = _number(row, "dilation.scale")
    name = str(row["run_name"])
    return name if scale is None or scale == 1.0 else f"{name} at {scale:g} d"


def require_passed(checks: list[Check], what: str) -> None:
    """Raise :class:`FailedCheckError` naming every failed check's run and check."""
    failed = [check for check in checks if not check.passed]
    if failed:
        raise FailedCheckError(
            f"{what}: {len(failed)} check(s) failed: "
            + "; ".join(f"{c.run}: {c.name} ({c.column} = "
                        f"{'not recorded' if c.value is None else c.value})" for c in failed)
            + " (--allow-unclean draws a draft marked as such)")
