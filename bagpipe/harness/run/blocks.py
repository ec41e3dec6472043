"""The order a sweep's jobs run in: randomised, interleaved blocks.

A shared machine's speed drifts by tens of percent within minutes. Run every seed of one system,
then every seed of the next, and the drift lands between systems, where it reads as a speedup.
So a sweep runs in *blocks*: one block per value of the block key (``seed`` by default), each
block one run of every other combination (every system on every model), in an order shuffled per
block; blocks run one after another. Runs of one block ran close together in time, so a speedup
is measured as a ratio *within* a block (a paired comparison) and its spread over blocks is the
noise (:mod:`bagpipe.harness.report.paired`).

A block of several models still spans many minutes (fig7's: 24 runs), and a ratio compares two
runs of one model. So within a block the runs of one value of the *pair key* (``model`` by
default) run back to back, the groups in a shuffled order and the runs in each group shuffled
too: the runs a ratio pairs are at most one group apart in time, not one block.

The shuffle is seeded (``order_seed``), so a sweep's order is reproducible and recorded.
"""

from __future__ import annotations

import random
from collections.abc import Sequence


def interleaved_blocks(
    jobs: Sequence[Sequence[str]], block_key: str = "seed", order_seed: int = 0,
    pair_key: str = "model",
) -> list[list[str]]:
    """``jobs`` (each a list of ``key=value`` overrides) grouped into blocks by their
    ``block_key`` value (in first-seen order); within each block, grouped by their ``pair_key``
    value, the groups and the jobs of each group shuffled. Jobs without a key form one block (or
    one group)."""
    ordered: list[list[str]] = []
    for index, block in enumerate(_grouped(jobs, block_key).values()):
        shuffle = random.Random(order_seed * 1_000_003 + index).shuffle
        groups = list(_grouped(block, pair_key).values())
        shuffle(groups)
        for group in groups:
            shuffle(group)
            ordered += group
    return ordered


def _grouped(jobs: Sequence[Sequence[str]], key: str) -> dict[str | None, list[list[str]]]:
    """``jobs`` by their ``key=`` value, in first-seen order (``None``: jobs without the key)."""
    groups: dict[str | None, list[list[str]]] = {}
    for job in jobs:
        value = next((o.split("=", 1)[1] for o in job if o.split("=", 1)[0] == key), None)
        groups.setdefault(value, []).append(list(job))
    return groups
