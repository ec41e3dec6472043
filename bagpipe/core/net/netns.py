"""The ``netns`` back-end: every emulated host a Linux network namespace, every NIC shaped by ``tc``.

This is the Mininet approach (``reference/emulation.md``): the kernel, not the application, carries
and delays every byte a role sends, whatever sends it (TensorPipe RPC, gloo collectives, TorchRec's
all-to-alls, DDP's buckets), so no system can move a byte without paying for it::

         host trainer_0            switch (a namespace of its own)        host server_0
    [ role ]--eth0 ==(veth)== [ vs0 ]--+                         +--[ vs2 ] ==(veth)== eth0--[ role ]
                egress shaped          |  br0 (Linux bridge)     |   ingress of server_0 shaped here
                                       +--[ vsd ] ==(veth)== [ driver, root namespace ]

* **Egress** of a host is shaped on its ``eth0`` (inside its namespace), **ingress** on the
  switch-side end of its veth. Each direction is an ``htb`` class at the NIC's rate with a large
  packet FIFO behind it (``pfifo limit 100000``), so shaping delays packets and never drops them;
  retransmits are read per host and should stay 0.
* **The driver's control path is not shaped**: packets to or from the driver's address go to a
  second class at a very high rate. The driver only starts steps and gathers results and state;
  the roles talk to each other on the shaped classes, and the byte checks count those classes only.
* **Latency** is not emulated here: this kernel has no ``netem``. The accounting layer charges
  each message's latency in both back-ends (``bagpipe.core.net.wire``).
* **Lifetime.** Namespaces are anonymous and held by small holder processes that exit as soon as
  the driver process is gone (checked every 0.2 s), even after a ``SIGKILL``. A namespace dies
  with the last process in it, taking its interfaces, qdiscs and the bridge with it, and the
  driver's veth end dies with its peer. Nothing is named in ``/run/netns`` and nothing outlives
  the run. Addresses are private (``10.200.0.0/13``), picked so as not to overlap any route of
  this machine, and used only inside these namespaces.

Role processes enter their host with :func:`enter`, before they open any socket.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import ipaddress
import itertools
import os
import random
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from bagpipe.core.net.topology import Nic

__all__ = ["NamespaceHosts", "NetnsUnavailableError", "NicCounters", "enter", "netns_available"]

_CLONE_NEWNET = 0x40000000
_LOCK_PATH = Path("/run/bagpipe-netns.lock")
_HOLDER = "while kill -0 $0 2>/dev/null; do sleep 0.2; done"
_DATA_CLASS, _CONTROL_CLASS = "1:10", "1:20"
_CONTROL_RATE = "40gbit"
_FIFO_PACKETS = 100_000
_TOOLS = ("ip", "tc", "unshare", "nsenter")
_IDS = itertools.count()


class NetnsUnavailableError(RuntimeError):
    """The ``netns`` back-end cannot run here (not root, or a tool missing)."""


@dataclass(frozen=True)
class NicCounters:
    """What the kernel saw on one host's shaped NIC classes during a run.

    ``tx_bytes``/``rx_bytes`` count what crossed the host's shaped classes (frames: payload plus
    TCP/IP and Ethernet headers, ACKs included); ``control_bytes`` what went to or came from the
    driver; ``retransmits`` the host's TCP retransmitted segments; ``dropped`` packets its shaped
    queues dropped (0 by construction; a check, not an assumption).
    """

    tx_bytes: int
    rx_bytes: int
    control_bytes: int
    retransmits: int
    dropped: int = 0

    def __sub__(self, other: NicCounters) -> NicCounters:
        return NicCounters(
            self.tx_bytes - other.tx_bytes,
            self.rx_bytes - other.rx_bytes,
            self.control_bytes - other.control_bytes,
            self.retransmits - other.retransmits,
            self.dropped - other.dropped,
        )


def netns_available() -> str | None:
    """``None`` when this process can build namespaces, else the reason it cannot."""
    if os.geteuid() != 0:
        return "not root"
    missing = [tool for tool in _TOOLS if shutil.which(tool) is None]
    if missing:
        return f"missing tools {missing}"
    return None


def enter(netns_path: str) -> None:
    """Move the calling (still single-threaded) process into the namespace at ``netns_path``.

    Threads started afterwards inherit it, so a role calls this before it starts any thread or
    opens any socket.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(netns_path, os.O_RDONLY)
    try:
        if libc.setns(fd, _CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({netns_path}): {os.strerror(err)}")
    finally:
        os.close(fd)


class NamespaceHosts:
    """Emulated hosts on one private bridge (module docstring). A context manager.

    Args:
        hosts: host name -> its NIC (bandwidths each way; latency is charged elsewhere).
    """

    def __init__(self, hosts: Mapping[str, Nic]) -> None:
        reason = netns_available()
        if reason is not None:
            raise NetnsUnavailableError(f"the netns back-end needs root and {_TOOLS}: {reason}")
        if not hosts:
            raise ValueError("NamespaceHosts needs at least one host")
        if len(hosts) > 250:
            raise ValueError(f"{len(hosts)} hosts do not fit one /24 subnet")
        self.nics = dict(hosts)
        self._tag = f"bq{os.getpid() % 46656:03x}{next(_IDS) % 36:x}"[:8]
        self._holders: dict[str, subprocess.Popen[bytes]] = {}
        self._addresses: dict[str, str] = {}
        self._switch_ends: dict[str, str] = {}
        self._subnet: ipaddress.IPv4Network | None = None
        self._baseline: dict[str, NicCounters] = {}
        self._closed = False

    # ------------------------------------------------------------------ public
    @property
    def driver_address(self) -> str:
        return str(self._require_subnet()[254])

    @property
    def driver_ifname(self) -> str:
        return f"{self._tag}d"

    @property
    def host_ifname(self) -> str:
        """The NIC's name inside every host namespace."""
        return "eth0"

    def address(self, host: str) -> str:
        return self._addresses[host]

    def netns_path(self, host: str) -> str:
        """``/proc/<holder>/ns/net``: what a role process :func:`enter`\\ s."""
        return f"/proc/{self._holders[host].pid}/ns/net"

    def __enter__(self) -> NamespaceHosts:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def start(self) -> None:
        """Build the switch, the hosts and the driver's port; on any failure, remove them all."""
        try:
            with _machine_lock():
                self._subnet = _free_subnet()
                self._holders["switch"] = _holder()
                for index, host in enumerate(self.nics):
                    self._holders[host] = _holder()
                    self._addresses[host] = str(self._subnet[index + 1])
                self._wait_for_holders()
                self._in("switch", "ip", "link", "add", "br0", "type", "bridge")
                self._in("switch", "ip", "link", "set", "br0", "up")
                self._add_driver_port()
            for index, host in enumerate(self.nics):
                self._add_host(index, host)
            self._baseline = self.counters(since_start=False)
        except BaseException:
            self.close()
            raise

    def counters(self, since_start: bool = True) -> dict[str, NicCounters]:
        """Per host, the kernel's counts since :meth:`start` (or absolute)."""
        out = {}
        for host in self.nics:
            egress = self._in(host, "tc", "-s", "class", "show", "dev", self.host_ifname)
            ingress = self._in("switch", "tc", "-s", "class", "show", "dev",
                               self._switch_ends[host])
            now = NicCounters(
                tx_bytes=_class_stat(egress, _DATA_CLASS, "bytes"),
                rx_bytes=_class_stat(ingress, _DATA_CLASS, "bytes"),
                control_bytes=_class_stat(egress, _CONTROL_CLASS, "bytes")
                + _class_stat(ingress, _CONTROL_CLASS, "bytes"),
                retransmits=_retransmits(self._holders[host].pid),
                dropped=_class_stat(egress, _DATA_CLASS, "dropped")
                + _class_stat(ingress, _DATA_CLASS, "dropped"),
            )
            base = self._baseline.get(host) if since_start else None
            out[host] = now - base if base is not None else now
        return out

    def close(self) -> None:
        """End the holders: the namespaces, their interfaces, qdiscs and the bridge go with them.

        Role processes must have left first (a namespace lives while any process is in it).
        """
        if self._closed:
            return
        self._closed = True
        for proc in self._holders.values():
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        for proc in self._holders.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        with contextlib.suppress(subprocess.CalledProcessError):
            # Gone with its peer already, unless the switch namespace is still held somewhere.
            if Path(f"/sys/class/net/{self.driver_ifname}").exists():
                _run("ip", "link", "del", self.driver_ifname)

    # ------------------------------------------------------------------ building
    def _add_driver_port(self) -> None:
        subnet = self._require_subnet()
        inside = f"{self._tag}s"
        _run("ip", "link", "add", self.driver_ifname, "type", "veth", "peer", "name", inside)
        _run("ip", "link", "set", inside, "netns", str(self._holders["switch"].pid))
        self._in("switch", "ip", "link", "set", inside, "master", "br0")
        self._in("switch", "ip", "link", "set", inside, "up")
        _run("ip", "addr", "add", f"{self.driver_address}/{subnet.prefixlen}", "dev",
             self.driver_ifname)
        _run("ip", "link", "set", self.driver_ifname, "up")

    def _add_host(self, index: int, host: str) -> None:
        nic = self.nics[host]
        outside, switch_end = f"{self._tag}h{index}", f"{self._tag}s{index}"
        self._switch_ends[host] = switch_end
        _run("ip", "link", "add", outside, "type", "veth", "peer", "name", switch_end)
        _run("ip", "link", "set", outside, "netns", str(self._holders[host].pid))
        _run("ip", "link", "set", switch_end, "netns", str(self._holders["switch"].pid))
        prefix = self._require_subnet().prefixlen
        self._in(host, "ip", "link", "set", outside, "name", self.host_ifname)
        self._in(host, "ip", "addr", "add", f"{self._addresses[host]}/{prefix}", "dev",
                 self.host_ifname)
        self._in(host, "ip", "link", "set", self.host_ifname, "up")
        self._in(host, "ip", "link", "set", "lo", "up")
        self._in("switch", "ip", "link", "set", switch_end, "master", "br0")
        self._in("switch", "ip", "link", "set", switch_end, "up")
        self._shape(host, self.host_ifname, nic.egress_bytes_per_s, "dst")
        self._shape("switch", switch_end, nic.ingress_bytes_per_s, "src")

    def _shape(self, namespace: str, dev: str, bytes_per_s: float, driver_field: str) -> None:
        """``htb``: the data class at the NIC's rate, the driver's control class unshaped."""
        rate = f"{int(bytes_per_s * 8)}bit"
        burst = str(max(64 * 1024, int(bytes_per_s / 1000)))  # at least 1 ms of sending
        tc = ("tc",)
        self._in(namespace, *tc, "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb",
                 "default", "10")
        self._in(namespace, *tc, "class", "add", "dev", dev, "parent", "1:", "classid",
                 _DATA_CLASS, "htb", "rate", rate, "ceil", rate, "burst", burst, "cburst", burst,
                 "quantum", "60000")
        self._in(namespace, *tc, "class", "add", "dev", dev, "parent", "1:", "classid",
                 _CONTROL_CLASS, "htb", "rate", _CONTROL_RATE, "ceil", _CONTROL_RATE,
                 "quantum", "200000")
        for leaf, parent in (("10:", _DATA_CLASS), ("20:", _CONTROL_CLASS)):
            self._in(namespace, *tc, "qdisc", "add", "dev", dev, "parent", parent, "handle",
                     leaf, "pfifo", "limit", str(_FIFO_PACKETS))
        self._in(namespace, *tc, "filter", "add", "dev", dev, "parent", "1:", "protocol", "ip",
                 "prio", "1", "u32", "match", "ip", driver_field, f"{self.driver_address}/32",
                 "flowid", _CONTROL_CLASS)

    # ------------------------------------------------------------------ helpers
    def _in(self, namespace: str, *cmd: str) -> str:
        return _run("nsenter", f"--net=/proc/{self._holders[namespace].pid}/ns/net", *cmd)

    def _wait_for_holders(self) -> None:
        """A holder has unshared once its ``net`` namespace differs from ours."""
        mine = os.readlink("/proc/self/ns/net")
        deadline = time.monotonic() + 10.0
        for name, proc in self._holders.items():
            while True:
                with contextlib.suppress(FileNotFoundError):
                    if os.readlink(f"/proc/{proc.pid}/ns/net") != mine:
                        break
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise NetnsUnavailableError(f"namespace holder for {name} did not start")
                time.sleep(0.005)

    def _require_subnet(self) -> ipaddress.IPv4Network:
        if self._subnet is None:
            raise RuntimeError("NamespaceHosts used before start()")
        return self._subnet


def _run(*cmd: str) -> str:
    """Run a command; its failure names the command and what it printed."""
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise subprocess.CalledProcessError(
            done.returncode, cmd, done.stdout, f"{' '.join(cmd)}: {done.stderr.strip()}"
        )
    return done.stdout


def _holder() -> subprocess.Popen[bytes]:
    """A process in a new, anonymous network namespace that lives as long as this process."""

    def die_with_parent() -> None:
        with contextlib.suppress(OSError):
            ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG

    return subprocess.Popen(
        ["unshare", "--net", "sh", "-c", _HOLDER, str(os.getpid())],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        preexec_fn=die_with_parent,
    )


@contextlib.contextmanager
def _machine_lock() -> Iterator[None]:
    """Serialise subnet choice and root-namespace changes among concurrent runs on this machine."""
    with open(_LOCK_PATH, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _free_subnet() -> ipaddress.IPv4Network:
    """A /24 in 10.200.0.0/13 that overlaps no address or route of the root namespace."""
    used = [
        ipaddress.ip_network(word, strict=False)
        for line in (_run("ip", "-4", "-o", "addr", "show") + _run("ip", "-4", "route")).splitlines()
        for word in line.split()
        if re.fullmatch(r"\d+\.\d+\.\d+\.\d+(/\d+)?", word)
    ]
    pool = ipaddress.IPv4Network("10.200.0.0/13")
    candidates: list[ipaddress.IPv4Network] = list(pool.subnets(new_prefix=24))
    random.Random(os.getpid() ^ time.monotonic_ns()).shuffle(candidates)
    for subnet in candidates:
        if not any(subnet.overlaps(net) for net in used):
            return subnet
    raise NetnsUnavailableError(f"no free /24 left in {pool}")


def _class_stat(tc_output: str, classid: str, stat: str) -> int:
    """``bytes`` (``Sent N bytes``) or ``dropped`` of class ``classid`` in ``tc -s class show``."""
    match = re.search(
        rf"class htb {re.escape(classid)} .*?\n\s*Sent (\d+) bytes \d+ pkt \(dropped (\d+)",
        tc_output,
    )
    if match is None:
        raise RuntimeError(f"tc: no class {classid} in:\n{tc_output}")
    return int(match.group(1) if stat == "bytes" else match.group(2))


def _retransmits(pid: int) -> int:
    """``Tcp: RetransSegs`` of the namespace process ``pid`` is in."""
    lines = [line.split() for line in Path(f"/proc/{pid}/net/snmp").read_text().splitlines()
             if line.startswith("Tcp:")]
    header, values = lines[0], lines[1]
    return int(values[header.index("RetransSegs")])
