"""HET's per-worker embedding cache on its own: milliseconds per step of request, install, update.

HET's cache is C++; ours must not make HET look slow for a reason of our own, so its per-step cost
is measured here, apart from the model and the network. Workload: one trainer's share of the
Kaggle-shaped synthetic stream (``DatasetConfig(scale=SCALE)``, 26 tables, ~127k rows), ``BATCH``
examples per step, HET's cache of 10% of every table (``rows // 10`` lines), bound 100 (HET's
defaults, ``HetSettings``), for every policy. Steps run in a HET trainer's order (asp with prefetch,
``baselines/het/roles.py``): install step i's reply, request step i+1's keys, update step i's rows.
The server's side (``VersionedRows.pull`` / ``push``) runs in between, untimed. ``WARMUP`` steps
fill the cache first. Torch runs on one thread, as in every role process (``Deployment``'s
``threads_per_role``). Rows per policy:

* ``cache_ms_per_step`` (mean) and ``cache_ms_per_step_p50``: the three cache calls of one step;
* ``cache_cpu_ms_per_step``: their CPU time (this process), the figure that compares across runs
  on a shared, oversubscribed machine;
* ``unique_keys_per_step`` and ``miss_rate``: the work they had.
"""

from __future__ import annotations

import statistics
import time

import torch

from bagpipe.core.batch import global_ids
from bagpipe.data import DatasetConfig, make_dataset
from bagpipe.models import paper_config, table_dim
from baselines.het.cache import HetCache, table_capacities
from baselines.het.clocks import VersionedRows
from baselines.het.policies import POLICIES
from baselines.het.roles import HetSettings

BATCH = 1024
SCALE = 0.001
WARMUP = 30


def _key_stream(steps: int) -> tuple[tuple[int, ...], list[torch.Tensor]]:
    """Table sizes and each step's sorted unique global ids (one trainer's batch)."""
    dataset = make_dataset(DatasetConfig(scale=SCALE))
    source = dataset.train(BATCH, steps)
    keys = [torch.unique(global_ids(source[step], dataset.schema)) for step in range(steps)]
    return dataset.schema.table_sizes, keys


class _Stopwatch:
    """Wall and CPU time (this process) spent inside ``with`` blocks, in ms."""

    def __init__(self) -> None:
        self.wall_ms = self.cpu_ms = 0.0

    def __enter__(self) -> None:
        self._wall, self._cpu = time.perf_counter(), time.process_time()

    def __exit__(self, *_: object) -> None:
        self.wall_ms += 1e3 * (time.perf_counter() - self._wall)
        self.cpu_ms += 1e3 * (time.process_time() - self._cpu)


def _run_cache(
    policy: str, table_sizes: tuple[int, ...], keys: list[torch.Tensor], dim: int
) -> tuple[list[_Stopwatch], HetCache]:
    """Run ``keys`` through a fresh cache; the cache calls' time of every step after warmup."""
    settings = HetSettings(policy=policy)
    cache = HetCache(
        table_sizes,
        table_capacities(table_sizes, settings.cache_fraction),
        dim,
        settings.bound,
        policy,
    )
    server = VersionedRows(torch.zeros(sum(table_sizes), dim))
    request = cache.request(keys[0])
    reply = server.pull(request.keys, request.local_versions, cache.bound)
    steps: list[_Stopwatch] = []
    for step, step_keys in enumerate(keys[:-1]):
        deltas = torch.full((len(step_keys), dim), -0.01)
        watch = _Stopwatch()
        with watch:
            cache.install(request, reply)
            request = cache.request(keys[step + 1])
        reply = server.pull(request.keys, request.local_versions, cache.bound)
        with watch:
            push = cache.update(step_keys, deltas)
        server.push(push.keys, push.deltas, push.counts)
        if step >= WARMUP:
            steps.append(watch)
    return steps, cache


def run(quick: bool) -> list[dict]:
    steps = 10 if quick else 100
    table_sizes, keys = _key_stream(WARMUP + steps + 1)
    dim = table_dim(paper_config("dlrm"))
    rows: list[dict] = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        measured = {p: _run_cache(p, table_sizes, keys, dim) for p in POLICIES}
    finally:
        torch.set_num_threads(threads)
    for policy, (watches, cache) in measured.items():
        config = {"benchmark": "het_cache", "policy": policy, "batch": BATCH, "steps": steps}
        wall_ms = [w.wall_ms for w in watches]
        metrics = {
            "cache_ms_per_step": (statistics.fmean(wall_ms), "ms"),
            "cache_ms_per_step_p50": (statistics.median(wall_ms), "ms"),
            "cache_cpu_ms_per_step": (statistics.fmean(w.cpu_ms for w in watches), "ms"),
            "unique_keys_per_step": (statistics.fmean(len(k) for k in keys), "keys"),
            "miss_rate": (cache.stats["misses"] / cache.stats["lookups"], "x"),
        }
        for metric, (value, unit) in metrics.items():
            rows.append({**config, "metric": metric, "value": value, "unit": unit})
    return rows
