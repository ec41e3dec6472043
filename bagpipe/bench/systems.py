"""Iteration time of every system on one workload, with the link model on (10 Gbps) and off.

Workload: the paper's DLRM on the Kaggle-shaped synthetic dataset (``DatasetConfig(scale=0.001)``,
26 tables, ~127k rows, top 1% of rows taking ~92% of accesses), global batch ``BATCH``. Each system
in :data:`SYSTEMS` is set up, run ``WARMUP`` steps, then timed over the next steps (wall time of
``train_step`` as the driver sees it), once per link setting, all in this one process, so ratios
compare like with like. Rows (long format, one metric each):

* ``iter_time_p50_s`` / ``iter_time_mean_s``: driver-side step time;
* ``fetch_wait_s``: mean per-step time trainer 0 spent waiting for embedding rows;
* ``emb_bytes_per_iter``: embedding traffic (pull + push + all-to-all) per step, all trainers;
* ``slowdown_vs_local``: p50 iteration time over ``local``'s under the same link setting.

FAE trains on its re-packed source (``prepare_dataset``), as the runner would have it.

To add a system, append a :class:`SystemSpec` to :data:`SYSTEMS` (its registry name and knobs).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from bagpipe.core.interface import OptimConfig, TrainContext
from bagpipe.core.link import LinkConfig
from bagpipe.core.meter import LinkKind, Phase, StepRecord
from bagpipe.core.registry import load_system
from bagpipe.data import DatasetConfig, make_dataset
from bagpipe.models import paper_config

BATCH = 2048
WARMUP = 3
LINKS = {
    "10gbps": LinkConfig(bandwidth_gbps=10.0, latency_us=50.0),
    "off": LinkConfig(enabled=False),
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
    SystemSpec("sync_ps", "sync_ps", {"num_trainers": 2, "num_servers": 2}),
    # L = 10 (ci = 2) so that a 30-step run sees lease expiries, write-backs and refetches.
    SystemSpec("bagpipe", "bagpipe", {"num_trainers": 2, "num_servers": 2, "lookahead": 10}),
    SystemSpec("torchrec", "torchrec", {"num_trainers": 2, "sharding": "auto"}),
    SystemSpec("het", "het", {"num_trainers": 2, "num_servers": 2}),
    SystemSpec("fae", "fae", {"num_trainers": 2, "num_servers": 2}),
]


def _measure(spec: SystemSpec, ctx: TrainContext, steps: int) -> dict[str, float]:
    system = load_system(spec.name)(**spec.knobs)
    system.setup(ctx)
    try:
        source = system.prepare_dataset(ctx.source)  # FAE re-packs hot and cold batches
        times_s: list[float] = []
        records: list[StepRecord] = []
        for step in range(WARMUP + steps):
            batch = source[step % len(source)]
            start = time.perf_counter()
            result = system.train_step(step, batch)
            if step >= WARMUP:
                times_s.append(time.perf_counter() - start)
                records.append(result.record)
    finally:
        system.close()
    return {
        "iter_time_p50_s": statistics.median(times_s),
        "iter_time_mean_s": statistics.fmean(times_s),
        "fetch_wait_s": statistics.fmean(
            r.phase_s.get(str(Phase.FETCH_WAIT), 0.0) for r in records
        ),
        "emb_bytes_per_iter": statistics.fmean(
            sum(r.bytes_sent.get(str(kind), 0) for kind in EMB_KINDS) for r in records
        ),
    }


def run(quick: bool) -> list[dict]:
    steps = 5 if quick else 30
    dataset = make_dataset(DatasetConfig(scale=0.001))
    model = paper_config("dlrm")
    rows: list[dict] = []
    for link_label, link in LINKS.items():

        def context(link: LinkConfig = link) -> TrainContext:
            return TrainContext(
                schema=dataset.schema,
                model=model,
                optim=OptimConfig(),
                global_batch_size=BATCH,
                seed=0,
                source=dataset.train(BATCH, WARMUP + steps),
                link=link,
            )

        measured = {spec.label: _measure(spec, context(), steps) for spec in SYSTEMS}
        local_p50_s = measured["local"]["iter_time_p50_s"]
        for label, metrics in measured.items():
            metrics["slowdown_vs_local"] = metrics["iter_time_p50_s"] / local_p50_s
            config = {
                "benchmark": "systems",
                "system": label,
                "model": "dlrm",
                "link": link_label,
                "batch": BATCH,
                "steps": steps,
            }
            for metric, value in metrics.items():
                unit = "s" if metric.endswith("_s") else ("B" if "bytes" in metric else "x")
                rows.append({**config, "metric": metric, "value": value, "unit": unit})
    return rows
