"""What a gloo all-reduce costs on this machine's cores: per collective, and per byte.

``suite=bound_split`` puts Bagpipe's misses of the bound in LRPP's row synchronisation, and most
of that in CPU outside the trainers' step threads (the collectives' threads). LRPP issues two
collectives a step where the embedding-free bound issues one: the dense gradients with the
sync-now rows in their last bucket on the critical path, and the sync-later rows, started after
the optimizer and waited at the next step. This benchmark prices the two apart, with nothing else
running: two processes on loopback (gloo, no emulation), each doing a step of busy work on one
thread and then the collectives of a :data:`PATTERNS` entry, at W&D's per-trainer sizes in fig7
(:data:`DENSE_BYTES`, :data:`NOW_BYTES`, :data:`LATER_BYTES`):

* ``work``: no collective (the baseline every other pattern is read against);
* ``bound``: one all-reduce of the dense gradients;
* ``fused``: one all-reduce of the dense gradients and the sync-now rows (the bytes of LRPP's
  critical path, in the bound's one collective);
* ``lrpp``: that one, and the sync-later rows' all-reduce, async, waited after the next step's work.

Rows, each paired within blocks (every pattern once per block, in a shuffled order; both processes'
blocks are samples) with its mean and 95% interval, for the process's CPU per step (every thread,
gloo's included) and the wall time per step: ``bound`` minus ``work`` (the bound's one collective),
``fused`` minus ``bound`` (what the rows' bytes add to it) and ``lrpp`` minus ``fused`` (what the
second collective adds).
"""

from __future__ import annotations

import random
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from bagpipe.core.roles.spawn import LOCALHOST, free_port
from bagpipe.harness.report.paired import mean_and_half_interval

#: fig7's W&D, per trainer and step (``results/bound_split``): the dense gradients, the sync-now
#: rows and the sync-later rows (dim 48, float32).
DENSE_BYTES = 17_000
NOW_BYTES = 200_000
LATER_BYTES = 195_000
PATTERNS = ("work", "bound", "fused", "lrpp")
#: What each row prices: a name, the pattern over, the pattern under.
COMPARISONS = (("of_the_dense_collective", "bound", "work"),
               ("of_the_rows_bytes", "fused", "bound"),
               ("of_a_second_collective", "lrpp", "fused"))
#: The busy work of a step: this many 256x256 matmuls on one thread (about 12 ms here, a W&D
#: trainer's step CPU in fig7).
WORK_MATMULS = 16


def _step_work(a: torch.Tensor) -> None:
    for _ in range(WORK_MATMULS):
        torch.mm(a, a)


def _run_pattern(pattern: str, steps: int, a: torch.Tensor) -> tuple[float, float]:
    """CPU seconds of this process and wall seconds, per step, of ``steps`` steps of ``pattern``."""
    dense = torch.zeros(DENSE_BYTES // 4)
    fused = torch.zeros((DENSE_BYTES + NOW_BYTES) // 4)
    later = torch.zeros(LATER_BYTES // 4)
    pending = None
    dist.barrier()
    started_cpu, started = time.process_time(), time.perf_counter()
    for _ in range(steps):
        _step_work(a)
        if pattern == "bound":
            dist.all_reduce(dense)
        elif pattern in ("fused", "lrpp"):
            dist.all_reduce(fused)
        if pending is not None:
            pending.wait()
            pending = None
        if pattern == "lrpp":
            pending = dist.all_reduce(later, async_op=True)
    if pending is not None:
        pending.wait()
    return ((time.process_time() - started_cpu) / steps, (time.perf_counter() - started) / steps)


def _member(rank: int, port: int, order: list[list[str]], steps: int, results: Any) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://{LOCALHOST}:{port}", rank=rank,
                            world_size=2)
    a = torch.randn(256, 256)
    _run_pattern("lrpp", max(5, steps // 5), a)  # warm-up: connections, allocator, caches
    measured = [[(pattern, *_run_pattern(pattern, steps, a)) for pattern in block]
                for block in order]
    results.put((rank, measured))
    dist.destroy_process_group()


def run(quick: bool) -> list[dict]:
    steps, blocks = (10, 1) if quick else (300, 6)
    shuffle = random.Random(0)
    order = [shuffle.sample(PATTERNS, len(PATTERNS)) for _ in range(blocks)]
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    members = [ctx.Process(target=_member, args=(rank, port, order, steps, results))
               for rank in range(2)]
    for member in members:
        member.start()
    by_rank = dict(results.get(timeout=600) for _ in members)
    for member in members:
        member.join(timeout=60)
    blocks_measured = [block for rank_blocks in by_rank.values() for block in rank_blocks]
    rows = []
    for index, measure in enumerate(("cpu", "wall")):
        for name, over, under in COMPARISONS:
            gaps = []  # ms per step, over minus under, in the same block and process
            for block in blocks_measured:
                ms = {pattern: 1000 * measured[index] for pattern, *measured in block}
                gaps.append(ms[over] - ms[under])
            mean, half = mean_and_half_interval(gaps)
            rows.append({"benchmark": "collectives", "metric": f"{measure}_ms_{name}",
                         "pattern": f"{over} - {under}", "value": mean, "low": mean - half,
                         "high": mean + half, "samples": len(gaps), "unit": "ms per step"})
    return rows
