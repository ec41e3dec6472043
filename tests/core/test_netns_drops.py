"""The ``netns`` back-end's drop count can fail: a packet the emulated network loses is counted on
the host it was going to.

The network checks assert that no host dropped a packet (``tests/harness/test_network_checks.py``);
that is only a check if a drop shows. Here host ``b``'s NIC takes frames of at most 1,000 bytes, so
the switch's veth end must drop every 1,400-byte datagram ``a`` sends it, where a starved host's
full backlog would drop them in a real run.
"""

from __future__ import annotations

import subprocess
import time

import pytest

from bagpipe.core.net import Nic, netns_available
from bagpipe.core.net.netns import NamespaceHosts

pytestmark = pytest.mark.skipif(netns_available() is not None, reason=f"netns: {netns_available()}")

DATAGRAMS = 5
_SEND = """
import socket, sys, time
sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for _ in range({count}):
    sock.sendto(b"x" * 1400, (sys.argv[1], 9))
    time.sleep(0.05)
"""


@pytest.mark.timeout(60)
def test_a_host_counts_the_packets_its_veth_dropped_and_only_those() -> None:
    hosts = NamespaceHosts({"a": Nic(10.0, 10.0, 0.0), "b": Nic(10.0, 10.0, 0.0)})
    hosts.start()
    try:
        subprocess.run(["nsenter", f"--net={hosts.view('b').netns_path}",
                        "ip", "link", "set", "dev", hosts.host_ifname, "mtu", "1000"], check=True)
        subprocess.run(["nsenter", f"--net={hosts.view('a').netns_path}", "python3", "-c",
                        _SEND.format(count=DATAGRAMS), hosts.address("b")], check=True)
        time.sleep(0.2)
        counters = hosts.counters()
    finally:
        hosts.close()
    assert counters["a"].dropped == 0, counters
    assert counters["b"].dropped == DATAGRAMS, counters  # once each, not once per veth end
    assert counters["a"].tx_bytes >= DATAGRAMS * 1400, counters  # they left a's NIC
