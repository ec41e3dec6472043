"""The ``netns`` back-end leaves nothing behind: not when a deployment closes, and not when its
driver is killed (``SIGKILL``: no handler runs). What a run makes -- holder processes and their
namespaces, veths, qdiscs, the driver's port, the hosts' name table -- must go, or a sweep of
hundreds of runs would fill the machine with interfaces and stale routes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bagpipe.core.net import Nic, netns_available
from bagpipe.core.net.netns import NamespaceHosts, Switch

pytestmark = pytest.mark.skipif(netns_available() is not None, reason=f"netns: {netns_available()}")

HOSTS = {"trainer_0": Nic(1.0, 1.0, 0.0), "server_0": Nic(1.0, 1.0, 0.0)}

#: A driver that builds two hosts, says what it made, and waits to be killed.
_DRIVER = """
import json, sys, time
from bagpipe.core.net import Nic
from bagpipe.core.net.netns import NamespaceHosts
hosts = NamespaceHosts({"trainer_0": Nic(1.0, 1.0, 0.0), "server_0": Nic(1.0, 1.0, 0.0)})
hosts.start()
print(json.dumps({
    "holders": [p.pid for p in hosts._holders.values()] + [hosts.switch.holder.pid],
    "driver_port": hosts.driver_ifname,
    "name_table": str(hosts._hosts_file),
}), flush=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def _links(pid: int) -> str:
    return subprocess.run(["nsenter", "-t", str(pid), "-n", "ip", "-o", "link"], check=True,
                          capture_output=True, text=True).stdout


def _root_has_link(name: str) -> bool:
    return subprocess.run(["ip", "link", "show", name], capture_output=True).returncode == 0


@pytest.mark.timeout(60)
def test_closing_hosts_removes_their_namespaces_links_and_name_table() -> None:
    hosts = NamespaceHosts(HOSTS)
    hosts.start()
    switch = Switch.of_this_process()
    free_before_close = len(switch._free)
    holders = [proc.pid for proc in hosts._holders.values()]
    name_table = hosts._hosts_file
    switch_ends = list(hosts._switch_ends.values())
    assert name_table is not None and name_table.exists()
    assert all(end in _links(hosts.switch_pid) for end in switch_ends)
    hosts.close()
    assert not any(_alive(pid) for pid in holders)
    assert not name_table.exists()
    switch_links = _links(hosts.switch_pid)
    assert not any(end in switch_links for end in switch_ends), switch_links
    assert len(switch._free) == free_before_close + len(HOSTS)  # addresses handed back


@pytest.mark.timeout(60)
def test_a_killed_driver_leaves_no_process_link_or_file() -> None:
    driver = subprocess.Popen([sys.executable, "-c", _DRIVER], stdout=subprocess.PIPE, text=True,
                              cwd=Path(__file__).resolve().parents[2])
    assert driver.stdout is not None
    made = json.loads(driver.stdout.readline())
    assert all(_alive(pid) for pid in made["holders"]) and _root_has_link(made["driver_port"])
    driver.kill()
    driver.wait()  # reaped, as a driver's parent (a shell, SLURM) reaps it
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline and (
        any(_alive(pid) for pid in made["holders"]) or _root_has_link(made["driver_port"])
    ):
        time.sleep(0.1)
    assert not any(_alive(pid) for pid in made["holders"])
    assert not _root_has_link(made["driver_port"])  # the veth died with its namespaced peer
    assert Path(made["name_table"]).exists()  # no handler ran...
    with NamespaceHosts({"trainer_0": HOSTS["trainer_0"]}):  # ...the next start removes it
        assert not Path(made["name_table"]).exists()
    assert os.path.isdir(Path(made["name_table"]).parent)
