"""Iteration time of every system on one workload, on the emulated paper cluster and network-off.

Workload: the paper's DLRM on the Kaggle-shaped synthetic dataset (``DatasetConfig(scale=0.001)``,
26 tables, ~127k rows, top 1% of rows taking ~92% of accesses), global batch ``BATCH``. Each system
in :data:`SYSTEMS` is set up, run ``WARMUP`` steps, then timed over the next steps (wall time of
``train_step`` as the driver sees it), once per network (the paper's topology emulated by this
machine's back-end, ``netns`` as root, else ``model``; and ``real``, nothing emulated), all in this
one process, so ratios compare like with like. Every system gets the topology's one server shard.
Rows (long format, one metric each):

* ``iter_time_p50_s`` / ``iter_time_mean_s``: driver-side step time;
* ``fetch_wait_s``: mean per-step time trainer 0 spent waiting for embedding rows;
* ``compute_s``: trainer 0's forward + backward per step; ``other_s``: the step time no phase
  of trainer 0 covers, and its three parts (``StepRecord.span_s``): ``other_between_phases_s``
  (trainer 0 between its phases), ``other_slower_peer_s`` (the slowest trainer's step beyond
  trainer 0's) and ``other_driver_rpc_s`` (the driver and the RPCs around the slowest step);
* ``emb_bytes_per_iter``: embedding traffic (pull + push + all-to-all) per step, all trainers;
* ``h2d_bytes_per_iter`` / ``d2h_bytes_per_iter``: host <-> device copies per step, all trainers;
* ``slowdown_vs_local``: p50 iteration time over ``local``'s on the same network.

FAE trains on its re-packed source (``prepare_dataset``), as the runner would have it.

To add a system, append a :class:`SystemSpec` to :data:`SYSTEMS` (its registry name and knobs).
"""

from __future__ import annotations

import statistics
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bagpipe.core.interface import OptimConfig, TrainContext
from bagpipe.core.meter import OTHER_TIME_PARTS, LinkKind, Phase, StepRecord, other_time_parts
from bagpipe.core.net import NetworkConfig, Topology, resolve_backend
from bagpipe.core.registry import load_system
from bagpipe.core.roles.cpu import CpuTally
from bagpipe.data import DatasetConfig, make_dataset
from bagpipe.models import paper_config

BATCH = 2048
WARMUP = 3
PAPER = Topology.load(Path(__file__).resolve().parents[2] / "suites" / "topology" / "paper.yaml")
NETWORKS = {
    "paper": NetworkConfig(resolve_backend("auto"), PAPER.with_counts(trainers=2)),
    "off": NetworkConfig("real", PAPER.with_counts(trainers=2)),
}
EMB_KINDS = (LinkKind.EMB_PULL, LinkKind.EMB_PUSH, LinkKind.ALLTOALL)


@dataclass(frozen=True)
class SystemSpec:
    """One column of the comparison: a registered system and the knobs it runs with."""

    label: str
    name: str
    knobs: dict[str, Any] = field(default_factory=dict)


SYSTEMS: list[SystemSpec] = [
    SystemSpec("local", "local"),
    SystemSpec("sync_ps", "sync_ps", {"num_trainers": 2, "num_servers": PAPER.servers}),
    # L = 10 (ci = 2) so that a 30-step run sees lease expiries, write-backs and refetches.
    SystemSpec(
        "bagpipe", "bagpipe", {"num_trainers": 2, "num_servers": PAPER.servers, "lookahead": 10}
    ),
    SystemSpec("torchrec", "torchrec", {"num_trainers": 2, "sharding": "auto"}),
    SystemSpec("het", "het", {"num_trainers": 2, "num_servers": PAPER.servers}),
    SystemSpec("fae", "fae", {"num_trainers": 2, "num_servers": PAPER.servers}),
]


def measure(spec: SystemSpec, ctx: TrainContext, steps: int) -> dict[str, float]:
    """``spec``'s system set up on ``ctx``, ``WARMUP`` steps, then ``steps`` timed: the metrics of
    the module docstring (the GPU check measures with it too, ``bagpipe.bench.gpu``)."""
    system = load_system(spec.name)(**spec.knobs)
    system.setup(ctx)
    try:
        source = system.prepare_dataset(ctx.source)  # FAE re-packs hot and cold batches
        times_s: list[float] = []
        records: list[StepRecord] = []
        cpu = CpuTally()
        for step in range(WARMUP + steps):
            batch = source[step % len(source)]
            with cpu.window() if step >= WARMUP else nullcontext():
                start = time.perf_counter()
                result = system.train_step(step, batch)
                elapsed_s = time.perf_counter() - start
            if step >= WARMUP:
                times_s.append(elapsed_s)
                records.append(result.record)
    finally:
        system.close()
    parts = [other_time_parts(t, sum(r.phase_s.values()), r.span_s, r.slowest_span_s)
             for t, r in zip(times_s, records, strict=True)]
    return {
        "iter_time_p50_s": statistics.median(times_s),
        "iter_time_mean_s": statistics.fmean(times_s),
        "fetch_wait_s": statistics.fmean(
            r.phase_s.get(str(Phase.FETCH_WAIT), 0.0) for r in records
        ),
        # trainer 0's forward and backward: the CPU a step's dense work got
        "compute_s": statistics.fmean(
            r.phase_s.get(str(Phase.FORWARD), 0.0) + r.phase_s.get(str(Phase.BACKWARD), 0.0)
            for r in records
        ),
        # the step time no phase covers (RPCs, the driver, waiting for a core), then its parts
        # (bagpipe.core.meter.other_time_parts), which add up to it
        "other_s": statistics.fmean(times_s) - statistics.fmean(
            sum(r.phase_s.values()) for r in records
        ),
        **{f"other_{name}_s": statistics.fmean(p[name] for p in parts) for name in OTHER_TIME_PARTS},
        "emb_bytes_per_iter": statistics.fmean(
            sum(r.bytes_sent.get(str(kind), 0) for kind in EMB_KINDS) for r in records
        ),
        # host <-> device copies, all trainers (0 where trainers compute on the host)
        "h2d_bytes_per_iter": statistics.fmean(r.bytes_sent.get(LinkKind.H2D, 0) for r in records),
        "d2h_bytes_per_iter": statistics.fmean(r.bytes_sent.get(LinkKind.D2H, 0) for r in records),
        # CPU per iteration: a trainer's (mean), that of every other role together (servers,
        # the oracle: work the target runs on hosts of its own, which dilation does not slow),
        # and the driver's (``local`` trains there)
        **cpu.per_window(),
    }


def run(quick: bool) -> list[dict]:
    steps = 5 if quick else 30
    dataset = make_dataset(DatasetConfig(scale=0.001))
    model = paper_config("dlrm")
    rows: list[dict] = []
    for network_label, network in NETWORKS.items():

        def context(network: NetworkConfig = network) -> TrainContext:
            return TrainContext(
                schema=dataset.schema,
                model=model,
                optim=OptimConfig(),
                global_batch_size=BATCH,
                seed=0,
                source=dataset.train(BATCH, WARMUP + steps),
                network=network,
            )

        measured = {spec.label: measure(spec, context(), steps) for spec in SYSTEMS}
        local_p50_s = measured["local"]["iter_time_p50_s"]
        for label, metrics in measured.items():
            metrics["slowdown_vs_local"] = metrics["iter_time_p50_s"] / local_p50_s
            config = {
                "benchmark": "systems",
                "system": label,
                "model": "dlrm",
                "network": network_label,
                "batch": BATCH,
                "steps": steps,
            }
            for metric, value in metrics.items():
                unit = "s" if metric.endswith("_s") else ("B" if "bytes" in metric else "x")
                rows.append({**config, "metric": metric, "value": value, "unit": unit})
    return rows
