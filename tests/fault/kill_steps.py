"""Kill steps drawn at random on every run of the fault tests, and reproducible when one fails.

The draw's seed is ``BAGPIPE_KILL_SEED`` if set, else a fresh one per pytest session; pytest prints
it in its header (``tests/conftest.py``) and every test names its kills in its failure messages, so
``BAGPIPE_KILL_SEED=<seed> pytest tests/fault/...`` replays a failing draw.
"""

from __future__ import annotations

import os
import random
import secrets

SEED = int(os.environ.get("BAGPIPE_KILL_SEED") or secrets.randbelow(1 << 32))


def draw(test: str) -> random.Random:
    """The random draws of ``test`` for this session's seed."""
    return random.Random(f"{SEED}:{test}")


def killable(steps: int, every: int) -> list[int]:
    """The steps of a ``steps``-step run with a checkpoint every ``every`` steps that a kill may
    land on. Two kinds are left out on purpose: a step that ends with a checkpoint, where the kill
    races the checkpoint and either outcome is right, and the last step, after which no step
    would notice the death."""
    return [step for step in range(steps - 1) if (step + 1) % every]


def resumed_step(killed_at: int, every: int) -> int:
    """The step a rollback resumes from after a kill at the end of step ``killed_at``: the newest
    checkpoint (one every ``every`` steps) taken by then."""
    return (killed_at + 1) // every * every
