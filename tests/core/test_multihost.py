"""A launch across several emulated hosts works as it would across SLURM nodes.

Every rank -- the driver's rank 0 too -- lives on a host of its own (a ``netns`` namespace on the
switch) and learns its rank, the world and the rendezvous address only from the variables a
launcher sets; nothing is on the loopback. The kernel's counters of the hosts' NICs then show that
the trainers' all-reduce and their role-to-role RPC really crossed the network, not the driver.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from bagpipe.core.net import Nic, netns_available
from bagpipe.core.net.netns import NamespaceHosts
from bagpipe.core.roles import spawn

from .roles import launched_rank

pytestmark = pytest.mark.skipif(netns_available() is not None, reason=f"netns: {netns_available()}")

ROLES = ["trainer_0", "trainer_1"]
NODES = ["node0", "node1", "node2"]  # rank r runs on node<r>; node0 is the driver's
ELEMS = 1 << 20  # floats all-reduced, and pushed from trainer_0 to trainer_1: 4 MiB each
PAYLOAD_BYTES = 4 * ELEMS
_EXIT_S = 30.0


@pytest.mark.timeout(180)
@pytest.mark.parametrize("names_interface", [True, False], ids=["ifname-set", "address-only"])
def test_a_launch_across_emulated_hosts_meets_by_address_and_talks_over_their_nics(
    tmp_path: Path, names_interface: bool
) -> None:
    """``address-only``: the launcher sets no ``*_SOCKET_IFNAME`` (as SLURM does not), so each
    rank finds its interface from ``MASTER_ADDR``; the hosts' names would not lead there."""
    hosts = NamespaceHosts({node: Nic(10.0, 10.0, 0.0) for node in NODES})
    hosts.start()
    holders = [proc.pid for proc in hosts._holders.values()]
    ranks = []
    try:
        master = hosts.address("node0")
        env = {
            "MASTER_ADDR": master,
            "MASTER_PORT": "29500",  # a fixed port, as on real nodes: node0's ports are its own
            "WORLD_SIZE": str(len(NODES)),
        }
        if names_interface:
            env |= {"GLOO_SOCKET_IFNAME": hosts.host_ifname, "TP_SOCKET_IFNAME": hosts.host_ifname}
        report = tmp_path / "rank0.json"
        ctx = spawn.role_context()  # forks single-threaded children: they can enter their host
        for rank, node in enumerate(NODES):
            proc = ctx.Process(
                target=launched_rank,
                args=(hosts.view(node), {**env, "RANK": str(rank)}, ROLES, ELEMS, str(report)),
                name=f"rank-{rank}",
                daemon=True,
            )
            proc.start()
            ranks.append(proc)
        deadline = time.monotonic() + 150.0
        for proc in ranks:
            proc.join(max(0.0, deadline - time.monotonic()))
        assert [proc.exitcode for proc in ranks] == [0] * len(NODES)
        seen = json.loads(report.read_text())
        assert "error" not in seen, seen.get("error")
        counters = hosts.counters()
    finally:
        for proc in ranks:  # only the ranks this test started, by their handles
            if proc.is_alive():
                proc.kill()
                proc.join(_EXIT_S)
        hosts.close()
    assert not any(Path(f"/proc/{pid}").exists() for pid in holders + [p.pid for p in ranks])

    # Each trainer lives on its own host, at that host's address, apart from the driver's.
    netns_ids = [netns_id for netns_id, _ in seen["where"]]
    assert len({seen["driver_netns"], *netns_ids}) == len(NODES)
    assert [address for _, address in seen["where"]] == [hosts.address(n) for n in NODES[1:]]
    assert not any(address.startswith("127.") for _, address in seen["where"])
    assert seen["allreduce"] == [2.0 * ELEMS] * 2
    assert seen["pushed"] == ELEMS

    # The push crossed node1's NIC out and node2's in; the all-reduce at least half its payload
    # each way (each member sends its half). The driver only sent and got control messages.
    assert counters["node1"].tx_bytes >= PAYLOAD_BYTES + PAYLOAD_BYTES // 2, counters
    assert counters["node2"].rx_bytes >= PAYLOAD_BYTES + PAYLOAD_BYTES // 2, counters
    assert counters["node2"].tx_bytes >= PAYLOAD_BYTES // 2, counters
    assert counters["node0"].tx_bytes + counters["node0"].rx_bytes < PAYLOAD_BYTES // 4, counters
    assert all(c.dropped == 0 for c in counters.values()), counters
