"""The allocator's rule (``bagpipe.core.allocator``): a process reuses the memory it freed instead
of faulting fresh pages in for every step's tensors, in every role of every system alike."""

from __future__ import annotations

import subprocess
import sys

from bagpipe.core.roles import Deployment

from .roles import Accumulator

#: Above glibc's largest dynamic mmap threshold (32 MiB): without the rule, every such block is
#: mapped afresh and each of its pages faults in again when filled.
MEGABYTES = 48
PAGES = MEGABYTES * 2**20 // 4096


def _refaults_in_a_fresh_process(apply_rule: bool) -> int:
    script = ("import sys; from bagpipe.core.allocator import keep_freed_memory; "
              "from tests.core.roles import allocation_refaults; "
              f"assert keep_freed_memory() if {apply_rule} else True; "
              f"print(allocation_refaults({MEGABYTES}))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, check=True)
    return int(done.stdout.split()[-1])


def test_without_the_rule_a_large_block_faults_in_again_and_with_it_it_is_reused() -> None:
    assert _refaults_in_a_fresh_process(apply_rule=False) >= PAGES * 0.9
    assert _refaults_in_a_fresh_process(apply_rule=True) < PAGES * 0.05


def test_every_role_runs_under_the_rule_whoever_spawned_it() -> None:
    with Deployment(["trainer_0", "server_0"]) as deployment:
        refs = [deployment.remote(role, Accumulator, 0.0) for role in ("trainer_0", "server_0")]
        refaults = [deployment.wait(ref.rpc_async().refaults(MEGABYTES), timeout_s=60)
                    for ref in refs]
    assert max(refaults) < PAGES * 0.05, refaults
