"""Equal CPU and Bagpipe's own overhead, network off, measured in interleaved blocks.

Two rules of a fair comparison on a shared machine, checked where nothing else moves:

* **CPU is shared equally.** A trainer's forward + backward (the same dense work in every system)
  must take as long inside every networked system as inside ``sync_ps``'s trainers: a system
  whose helper roles (servers, the oracle, communication threads) take CPU from its trainers would
  otherwise look slower for a reason the target cluster does not have. Row ``compute_vs_sync_ps``
  (goal: within 15%); TorchRec's pipeline times its forward, backward and exchanges as one phase,
  so it has no such row.
* **Bagpipe's implementation costs no more than the work.** With the network off, Bagpipe does
  the same step work as ``sync_ps`` without the traffic, so its iteration should be at most
  1.15x ``sync_ps``'s (row ``iter_vs_sync_ps``) and its time outside every phase at most
  ``sync_ps``'s + 1 ms (row ``other_minus_sync_ps_ms``). Three rows say where that difference
  lies (:data:`OTHER_PARTS`): trainer 0 between its phases, waiting for a slower trainer, and the
  driver with the RPCs around the step.
* **What dilation does not slow.** Each system's CPU per iteration in a trainer
  (``trainer_cpu_ms``) and in every other role together (``helpers_cpu_ms``: servers, the oracle),
  work the target runs on hosts of its own. The rule that shares the cores
  (``bagpipe.core.roles.spawn.yield_cpu_to_trainers``) runs helpers below the trainers' priority.

Each block runs every system once, in a shuffled order, on the workload of
:mod:`bagpipe.bench.systems` with nothing emulated; ratios are taken within a block and their
geometric mean over blocks is reported with the per-block spread.
"""

from __future__ import annotations

import math
import random
import statistics

from bagpipe.bench.systems import BATCH, NETWORKS, SYSTEMS, WARMUP, measure
from bagpipe.core.interface import OptimConfig, TrainContext
from bagpipe.core.meter import OTHER_TIME_PARTS
from bagpipe.data import DatasetConfig, make_dataset
from bagpipe.models import paper_config

REFERENCE = "sync_ps"
NETWORKED = [spec for spec in SYSTEMS if spec.label != "local"]
#: The parts of a step's "other" time (``bagpipe.core.meter.OTHER_TIME_PARTS``): trainer 0
#: between its phases, the slowest trainer's longer step, the driver and the RPCs around the step.
OTHER_PARTS = tuple(f"other_{name}" for name in OTHER_TIME_PARTS)


def run(quick: bool) -> list[dict]:
    steps, blocks = (5, 1) if quick else (30, 3)
    dataset = make_dataset(DatasetConfig(scale=0.001))
    model = paper_config("dlrm")
    per_block: list[dict[str, dict[str, float]]] = []
    for block in range(blocks):
        order = NETWORKED[:]
        random.Random(block).shuffle(order)
        measured = {}
        for spec in order:
            ctx = TrainContext(schema=dataset.schema, model=model, optim=OptimConfig(),
                               global_batch_size=BATCH, seed=0,
                               source=dataset.train(BATCH, WARMUP + steps),
                               network=NETWORKS["off"])
            measured[spec.label] = measure(spec, ctx, steps)
        per_block.append(measured)
    rows: list[dict] = []
    config = {"benchmark": "fairness", "model": "dlrm", "network": "off", "batch": BATCH,
              "steps": steps, "blocks": blocks}

    def add(system: str, metric: str, values: list[float], unit: str, goal: str | None = None,
            met: bool | None = None) -> None:
        rows.append({**config, "system": system, "metric": metric,
                     "value": _geomean(values) if unit == "x" else statistics.fmean(values),
                     "low": min(values), "high": max(values), "unit": unit, "goal": goal,
                     "met": met})

    for spec in NETWORKED:
        if spec.label == REFERENCE or not all(b[spec.label]["compute_s"] > 0 for b in per_block):
            continue  # TorchRec's pipeline times forward, backward and its exchanges as one phase
        ratios = [b[spec.label]["compute_s"] / b[REFERENCE]["compute_s"] for b in per_block]
        add(spec.label, "compute_vs_sync_ps", ratios, "x", "within 15%",
            abs(_geomean(ratios) - 1) <= 0.15)
    iters = [b["bagpipe"]["iter_time_mean_s"] / b[REFERENCE]["iter_time_mean_s"]
             for b in per_block]
    add("bagpipe", "iter_vs_sync_ps", iters, "x", "<= 1.15x", _geomean(iters) <= 1.15)
    other_ms = [1000 * (b["bagpipe"]["other_s"] - b[REFERENCE]["other_s"]) for b in per_block]
    add("bagpipe", "other_minus_sync_ps_ms", other_ms, "ms", "<= 1 ms",
        statistics.fmean(other_ms) <= 1.0)
    for part in OTHER_PARTS:  # where that difference lies (bagpipe.bench.systems.measure)
        add("bagpipe", f"{part}_minus_sync_ps_ms",
            [1000 * (b["bagpipe"][f"{part}_s"] - b[REFERENCE][f"{part}_s"]) for b in per_block],
            "ms")
    for spec in NETWORKED:
        for metric in ("iter_time_mean_s", "compute_s", "other_s",
                       *(f"{part}_s" for part in OTHER_PARTS), "trainer_cpu_s", "helpers_cpu_s"):
            values = [1000 * b[spec.label][metric] for b in per_block]
            add(spec.label, metric.removesuffix("_s") + "_ms", values, "ms")
    return rows


def _geomean(values: list[float]) -> float:
    return math.exp(statistics.fmean(math.log(v) for v in values))
