"""The allocator's rule (``bagpipe.core.allocator``): a process reuses the memory it freed instead
of faulting fresh pages in for every step's tensors, in every role of every system alike."""

from __future__ import annotations

import os
import subprocess
import sys

from bagpipe.core.allocator import KEEP_FREED_MEMORY_ENV
from bagpipe.core.roles import Deployment

from .roles import Accumulator

#: Above glibc's largest dynamic mmap threshold (32 MiB): without the rule, every such block is
#: mapped afresh and each of its pages faults in again when filled.
MEGABYTES = 48
PAGES = MEGABYTES * 2**20 // 4096


def _in_a_fresh_process(probe: str, apply_rule: bool) -> int:
    """``tests.core.roles.<probe>(MEGABYTES)`` in a new interpreter, with or without the rule."""
    rule = "from bagpipe.core.allocator import keep_freed_memory; assert keep_freed_memory(); "
    script = ((rule if apply_rule else "") + f"from tests.core.roles import {probe}; "
              f"print({probe}({MEGABYTES}))")
    # Without the rule's variables, which a driver that started roles passes to its children.
    env = {k: v for k, v in os.environ.items() if k not in KEEP_FREED_MEMORY_ENV}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, check=True, env=env)
    return int(done.stdout.split()[-1])


def test_without_the_rule_a_large_block_faults_in_again_and_with_it_it_is_reused() -> None:
    assert _in_a_fresh_process("allocation_refaults", apply_rule=False) >= PAGES * 0.9
    assert _in_a_fresh_process("allocation_refaults", apply_rule=True) < PAGES * 0.05


def test_every_role_runs_under_the_rule_whoever_spawned_it() -> None:
    """Also a role forked from a fork server that started before this test: the server itself
    runs under the rule from its start (``KEEP_FREED_MEMORY_ENV``).

    The rule's own effect is checked, not the page faults: in a role, whose other threads
    allocate beside the step's, a freed block can be left just too small for the next
    64-byte-aligned request of the same size (torch's), so the heap grows instead of reusing it.
    That happened in about one role in two of a loop allocating one 48 MB tensor, with the rule
    in force (the main arena grew by 48 MB a round); how often a step's blocks meet it is not
    measured here."""
    assert _in_a_fresh_process("blocks_mapped_alone", apply_rule=False) >= 1
    assert _in_a_fresh_process("blocks_mapped_alone", apply_rule=True) == 0
    with Deployment(["trainer_0", "server_0"]) as deployment:
        refs = [deployment.remote(role, Accumulator, 0.0) for role in ("trainer_0", "server_0")]
        mapped = [deployment.wait(ref.rpc_async().blocks_mapped_alone(MEGABYTES), timeout_s=60)
                  for ref in refs]
    assert mapped == [0, 0], mapped
