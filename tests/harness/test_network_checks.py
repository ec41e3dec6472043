"""The network's checks that can fail (``bagpipe.bench.network``), asserted per system on ``netns``.

* **Kernel vs wire.** Every networked system trains the benchmark's network-bound workload on
  ``netns``; on every host NIC that carries at least a megabyte per iteration, the bytes the
  kernel counted agree with the bytes the roles' ledgers booked within 10% and TCP resent at most
  1% of them (late ACKs on a loaded host); on every host, no shaped queue and no veth end
  dropped a packet.
* **The check catches a cheat**: a plugin that sends a tensor around the wire, and one that charges
  a transfer but moves it through shared memory, both fail it.
* **netns vs model.** Each back-end's network time per iteration (iteration minus network-off)
  agrees within 15%.

They need root (namespaces): CI runs them; elsewhere they are skipped, and the ``model`` back-end's
own tests (``tests/core/test_emulation.py``, ``test_wire.py``, ``test_fairshare.py``) still run.
"""

from __future__ import annotations

import functools

import pytest

from bagpipe.bench.network import SYSTEMS, Measured, agreement_row, kernel_rows, measure
from bagpipe.core.interface import System
from bagpipe.core.net import netns_available

from .misbehaving import ShmSender, UnchargedSender

pytestmark = pytest.mark.skipif(
    netns_available() is not None, reason=f"netns back-end: {netns_available()}"
)
# Means of 16 steps (see ``Measured``): with fewer, one of Bagpipe's longer round steps more or less
# moved a back-end's network time by several percent. Bagpipe's netns/model ratio sits highest
# (1.10 in the bench, the others 1.02-1.05; it alone sends background rounds beside the critical
# path, and why the kernel charges it more is not yet measured); over 8 steps it ranged 1.04-1.16
# in four runs, the last under the full suite, past the target.
STEPS, WARMUP = 16, 2
# A judged host's resent share: late ACKs on a loaded host resend a little (under the full suite on
# 2 cores: 0.1% of a trainer's bytes). It is judged where the bytes are, on the NICs the kernel's
# count is judged on: on a host that moves a few hundred kB an iteration, a few dozen late ACKs
# are a share of over 1% (CI, HET's server: 31 segments, 1.2%) and say nothing of the emulation,
# whose losses the drop counters of every host's queues and veth ends catch directly.
MAX_RETRANSMITTED_SHARE = 0.01


@functools.cache
def _runs(system: str) -> dict[str, Measured]:
    """The system with the network off, on netns and on model (shared by the tests below)."""
    return {backend: measure(system, backend, STEPS, WARMUP)
            for backend in ("real", "netns", "model")}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("system", SYSTEMS)
def test_the_kernel_counts_what_the_wire_booked_on_every_busy_nic(system: str) -> None:
    rows = kernel_rows(system, _runs(system)["netns"])
    judged = [row for row in rows if row["judged"]]
    assert {row["host"] for row in judged} >= {"trainer_0", "trainer_1"}, rows
    assert all(row["within_10pct"] for row in judged), judged
    # Neither shaping nor the veths ever drop; a resend is a late ACK on a loaded host, never a loss
    # the emulation made.
    losses = [(row["host"], {k: v for k, v in row.items()
                             if k in ("dropped", "retransmits", "retransmitted_share")})
              for row in rows]
    assert all(row["dropped"] == 0 for row in rows), losses
    assert all(row["retransmitted_share"] <= MAX_RETRANSMITTED_SHARE for row in judged), losses


@pytest.mark.timeout(600)
@pytest.mark.parametrize("system", SYSTEMS)
def test_netns_and_model_charge_the_same_network_time(system: str) -> None:
    runs = _runs(system)
    row = agreement_row(system, runs["real"], runs["netns"], runs["model"])
    assert row["model_net_s"] > row["off_iter_s"], row  # network-bound, as the check needs
    assert row["within_15pct"], row


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("plugin", "kernel_reads"),
    [(UnchargedSender, "more"), (ShmSender, "less")],
    ids=["uncharged-rpc", "charged-via-shm"],
)
def test_a_plugin_moving_bytes_around_the_wire_fails_the_check(
    plugin: type[System], kernel_reads: str
) -> None:
    rows = kernel_rows(plugin.__name__, measure(plugin, "netns", STEPS, WARMUP))
    trainers = [row for row in rows if row["host"].startswith("trainer_")]
    assert trainers and not any(row["within_10pct"] for row in trainers), rows
    for row in trainers:
        assert (row["kernel_over_wire"] > 1.1) if kernel_reads == "more" else (
            row["kernel_over_wire"] < 0.9
        ), row
