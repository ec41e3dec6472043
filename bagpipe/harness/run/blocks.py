"""The order a sweep's jobs run in: randomised, interleaved blocks.

A shared machine's speed drifts by tens of percent within minutes. Run every seed of one system,
then every seed of the next, and the drift lands between systems, where it reads as a speedup.
So a sweep runs in *blocks*: one block per value of the block key (``seed`` by default), each
block one run of every other combination (every system on every model), in an order shuffled per
block; blocks run one after another. Runs of one block ran close together in time, so a speedup
is measured as a ratio *within* a block (a paired comparison) and its spread over blocks is the
noise (:mod:`bagpipe.harness.report.paired`).

The shuffle is seeded (``order_seed``), so a sweep's order is reproducible and recorded.
"""

from __future__ import annotations

import random
from collections.abc import Sequence


def interleaved_blocks(
    jobs: Sequence[Sequence[str]], block_key: str = "seed", order_seed: int = 0
) -> list[list[str]]:
    """``jobs`` (each a list of ``key=value`` overrides) grouped into blocks by their
    ``block_key`` value (in first-seen order) and shuffled within each block. Jobs without the
    key form one block."""
    blocks: dict[str | None, list[list[str]]] = {}
    for job in jobs:
        value = next((o.split("=", 1)[1] for o in job if o.split("=", 1)[0] == block_key), None)
        blocks.setdefault(value, []).append(list(job))
    ordered: list[list[str]] = []
    for index, block in enumerate(blocks.values()):
        random.Random(order_seed * 1_000_003 + index).shuffle(block)
        ordered += block
    return ordered
