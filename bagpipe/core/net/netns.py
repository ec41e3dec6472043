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
  packet FIFO behind it (``pfifo limit 100000``), so shaping delays packets and never drops them.
  Drops are read per host, in its shaped queues and at both ends of its veth (a starved
  receiver's backlog is the one place left where the kernel could drop), and should stay 0;
  so are TCP's resends of segments really lost.
* **The driver's control path is not shaped**: packets to or from the driver's address go to a
  second class at a very high rate. The driver only starts steps and gathers results and state;
  the roles talk to each other on the shaped classes, and the byte checks count those classes only.
* **Latency** is not emulated here: this kernel has no ``netem``. The accounting layer charges
  each message's latency in both back-ends (``bagpipe.core.net.wire``).
* **Lifetime.** Namespaces are anonymous and held by small holder processes that exit as soon as
  the driver process is gone (checked every 0.2 s), even after a ``SIGKILL``. A namespace dies
  with the last process in it, taking its interfaces, qdiscs and the bridge with it, and the
  driver's veth end dies with its peer. A deployment's hosts go when it closes; the switch (the
  bridge and the driver's port, :class:`Switch`) serves every deployment of the driver process
  and goes with the process. Nothing is named in ``/run/netns`` and nothing outlives the driver
  but the hosts' name tables (small files), which the next deployment on the machine removes.
  Addresses are private (``10.200.0.0/13``), picked so as not to overlap any route of this
  machine, and used only inside these namespaces.

Role processes enter their host with :func:`enter`, before they open any socket.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import ipaddress
import itertools
import json
import os
import random
import re
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from bagpipe.core.net.topology import FRAME_BYTES, Nic

__all__ = [
    "HostView", "NamespaceHosts", "NetnsUnavailableError", "NicCounters", "enter", "netns_available",
]

_CLONE_NEWNET = 0x40000000
_CLONE_NEWNS = 0x00020000
_MS_BIND, _MS_REC, _MS_PRIVATE = 0x1000, 0x4000, 0x40000
_LOCK_PATH = Path("/run/bagpipe-netns.lock")
_HOLDER = "while kill -0 $0 2>/dev/null; do sleep 0.2; done"
_DATA_CLASS, _CONTROL_CLASS = "1:10", "1:20"
_CONTROL_RATE = "40gbit"
_FIFO_PACKETS = 100_000
_TOOLS = ("ip", "tc", "unshare", "nsenter")
_IDS = itertools.count()
#: Hosts' name tables, ``<driver pid>-<tag>-*``: a killed driver's are removed by the next start.
_NAME_TABLES = Path(tempfile.gettempdir()) / "bagpipe-netns"
DRIVER_HOST = "driver"  # the driver's name in every host's name table


class NetnsUnavailableError(RuntimeError):
    """The ``netns`` back-end cannot run here (not root, or a tool missing)."""


@dataclass(frozen=True)
class NicCounters:
    """What the kernel saw on one host's shaped NIC classes during a run.

    ``tx_bytes``/``rx_bytes`` count what crossed the host's shaped classes (frames: payload plus
    TCP/IP and Ethernet headers, ACKs included); ``control_bytes`` what went to or came from the
    driver; ``retransmits`` the host's TCP segments resent because they were lost, ``loss_probes``
    those resent because an ACK came late; ``dropped`` packets its shaped queues or either end of
    its veth dropped (0 by construction; a check, not an assumption).
    """

    tx_bytes: int
    rx_bytes: int
    control_bytes: int
    retransmits: int
    dropped: int = 0
    loss_probes: int = 0

    def __sub__(self, other: NicCounters) -> NicCounters:
        return NicCounters(
            self.tx_bytes - other.tx_bytes,
            self.rx_bytes - other.rx_bytes,
            self.control_bytes - other.control_bytes,
            self.retransmits - other.retransmits,
            self.dropped - other.dropped,
            self.loss_probes - other.loss_probes,
        )


def netns_available() -> str | None:
    """``None`` when this process can build namespaces, else the reason it cannot."""
    if os.geteuid() != 0:
        return "not root"
    missing = [tool for tool in _TOOLS if shutil.which(tool) is None]
    if missing:
        return f"missing tools {missing}"
    return None


@dataclass(frozen=True)
class HostView:
    """What a role process needs to live on its emulated host: the host's network namespace and
    the host's name table (every emulated host's address by name, as ``/etc/hosts``).

    The name table matters because an address of these namespaces has no DNS to answer for it:
    libraries that name their peers (c10d's store logs each client by host name) would otherwise
    fail the lookup, and warn, on every connection.
    """

    netns_path: str
    hosts_file: str


def enter(view: HostView) -> None:
    """Move the calling (still single-threaded) process onto its emulated host.

    The process joins the host's network namespace and gets a mount namespace of its own in which
    ``/etc/hosts`` is the host's name table (nothing outside the process sees either). Threads
    started afterwards inherit both, so a role calls this before it starts any thread or opens any
    socket.
    """
    libc = ctypes.CDLL(None, use_errno=True)

    def check(result: int, what: str) -> None:
        if result != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"{what}: {os.strerror(err)}")

    fd = os.open(view.netns_path, os.O_RDONLY)
    try:
        check(libc.setns(fd, _CLONE_NEWNET), f"setns({view.netns_path})")
    finally:
        os.close(fd)
    check(libc.unshare(_CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    # private first, so the bind mount below stays in this process's mount namespace
    check(libc.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None), "mount --make-rprivate /")
    check(libc.mount(view.hosts_file.encode(), b"/etc/hosts", None, _MS_BIND, None),
          f"mount --bind {view.hosts_file} /etc/hosts")


class Switch:
    """The bridge every emulated host of this process plugs into, and the driver's port on it.

    One per driver process, built on first use and kept until the process exits: TensorPipe reads
    the interface it listens on once per process, so the driver's address must outlive any one
    deployment. The bridge lives in a namespace of its own, held by a process that exits with the
    driver; the driver's veth end dies with it. Host addresses are handed out and taken back as
    deployments come and go.
    """

    _instance: Switch | None = None

    def __init__(self) -> None:
        self.tag = f"bq{os.getpid() % 46656:03x}"
        self.holder: subprocess.Popen[bytes] | None = None
        self.subnet: ipaddress.IPv4Network | None = None
        self._free: list[int] = list(range(1, 250))
        self._lock = threading.Lock()

    @classmethod
    def of_this_process(cls) -> Switch:
        """This process's switch, built now if it does not exist yet."""
        if cls._instance is None or cls._instance.holder is None or (
            cls._instance.holder.poll() is not None
        ):
            switch = cls()
            switch._build()
            cls._instance = switch
        return cls._instance

    @property
    def driver_ifname(self) -> str:
        return f"{self.tag}d"

    @property
    def driver_address(self) -> str:
        assert self.subnet is not None
        return str(self.subnet[254])

    def netns_path(self) -> str:
        assert self.holder is not None
        return f"/proc/{self.holder.pid}/ns/net"

    def allocate(self, count: int) -> list[str]:
        """``count`` free host addresses of the switch's subnet."""
        assert self.subnet is not None
        with self._lock:
            if count > len(self._free):
                raise NetnsUnavailableError(f"{count} hosts: only {len(self._free)} addresses left")
            taken, self._free = self._free[:count], self._free[count:]
        return [str(self.subnet[i]) for i in taken]

    def release(self, addresses: list[str]) -> None:
        assert self.subnet is not None
        base = int(self.subnet.network_address)
        with self._lock:
            self._free.extend(int(ipaddress.IPv4Address(a)) - base for a in addresses)

    def _build(self) -> None:
        try:
            with _machine_lock():
                self.subnet = _free_subnet()
                self.holder = _holder()
                _wait_for_holders({"switch": self.holder})
                inside = f"{self.tag}s"
                _in(self.holder.pid, "ip", "link", "add", "br0", "type", "bridge")
                _in(self.holder.pid, "ip", "link", "set", "br0", "up")
                # Born with its switch end inside the holder's namespace (one command), so a
                # driver killed at any point leaves no pair behind: the namespace takes it along.
                _run("ip", "link", "add", self.driver_ifname, "type", "veth", "peer", "name",
                     inside, "netns", str(self.holder.pid))
                _in(self.holder.pid, "ip", "link", "set", inside, "master", "br0")
                _in(self.holder.pid, "ip", "link", "set", inside, "up")
                _run("ip", "addr", "add", f"{self.driver_address}/{self.subnet.prefixlen}", "dev",
                     self.driver_ifname)
                _run("ip", "link", "set", self.driver_ifname, "up")
        except BaseException:
            if self.holder is not None:
                self.holder.kill()
                self.holder.wait()
            self.holder = None
            raise


class NamespaceHosts:
    """Emulated hosts on this process's switch (module docstring). A context manager.

    Args:
        hosts: host name -> its NIC (bandwidths each way; latency is charged elsewhere).
    """

    def __init__(self, hosts: Mapping[str, Nic]) -> None:
        reason = netns_available()
        if reason is not None:
            raise NetnsUnavailableError(f"the netns back-end needs root and {_TOOLS}: {reason}")
        if not hosts:
            raise ValueError("NamespaceHosts needs at least one host")
        self.nics = dict(hosts)
        self.switch = Switch.of_this_process()
        self._tag = f"{self.switch.tag}{next(_IDS) % 1296:02x}"
        self._holders: dict[str, subprocess.Popen[bytes]] = {}
        self._addresses: dict[str, str] = {}
        self._switch_ends: dict[str, str] = {}
        self._baseline: dict[str, NicCounters] = {}
        self._hosts_file: Path | None = None
        self._closed = False

    # ------------------------------------------------------------------ public
    @property
    def driver_address(self) -> str:
        return self.switch.driver_address

    @property
    def driver_ifname(self) -> str:
        return self.switch.driver_ifname

    @property
    def host_ifname(self) -> str:
        """The NIC's name inside every host namespace."""
        return "eth0"

    def address(self, host: str) -> str:
        return self._addresses[host]

    def view(self, host: str) -> HostView:
        """What a role process on ``host`` :func:`enter`\\ s."""
        assert self._hosts_file is not None, "start() the hosts first"
        return HostView(f"/proc/{self._holders[host].pid}/ns/net", str(self._hosts_file))

    def __enter__(self) -> NamespaceHosts:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def start(self) -> None:
        """Build the hosts and plug them into the switch; on any failure, remove them all."""
        try:
            _remove_orphaned_name_tables()
            addresses = self.switch.allocate(len(self.nics))
            for host, address in zip(self.nics, addresses, strict=True):
                self._holders[host] = _holder()
                self._addresses[host] = address
            _wait_for_holders(self._holders)
            self._hosts_file = self._write_name_table()
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
            resent, probes = _tcp_counters(self._holders[host].pid)
            ingress = _in(self.switch_pid, "tc", "-s", "class", "show", "dev",
                          self._switch_ends[host])
            now = NicCounters(
                tx_bytes=_class_stat(egress, _DATA_CLASS, "bytes"),
                rx_bytes=_class_stat(ingress, _DATA_CLASS, "bytes"),
                control_bytes=_class_stat(egress, _CONTROL_CLASS, "bytes")
                + _class_stat(ingress, _CONTROL_CLASS, "bytes"),
                retransmits=resent,
                loss_probes=probes,
                dropped=_class_stat(egress, _DATA_CLASS, "dropped")
                + _class_stat(ingress, _DATA_CLASS, "dropped")
                + _link_drops(self._holders[host].pid, self.host_ifname)
                + _link_drops(self.switch_pid, self._switch_ends[host]),
            )
            base = self._baseline.get(host) if since_start else None
            out[host] = now - base if base is not None else now
        return out

    def close(self) -> None:
        """End the hosts' holders: their namespaces, interfaces and qdiscs go with them (the
        switch stays for the next deployment of this process, and goes when the process does).

        Role processes must have left first (a namespace lives while any process is in it).
        """
        if self._closed:
            return
        self._closed = True
        # A veth end in the switch outlives its peer's namespace here (gVisor): delete the pair.
        switch = self.switch.holder
        if switch is not None and switch.poll() is None:
            for switch_end in self._switch_ends.values():
                with contextlib.suppress(subprocess.CalledProcessError):
                    _in(switch.pid, "ip", "link", "del", switch_end)
        for proc in self._holders.values():
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        for proc in self._holders.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        self.switch.release(list(self._addresses.values()))
        if self._hosts_file is not None:  # a role's mount of it lives on until the role exits
            self._hosts_file.unlink(missing_ok=True)

    def _write_name_table(self) -> Path:
        """The ``/etc/hosts`` every host sees: the loopback, the driver and every host by name,
        each address also in its IPv4-mapped IPv6 form (how a dual-stack listener sees a peer)."""
        _NAME_TABLES.mkdir(exist_ok=True)
        fd, path = tempfile.mkstemp(prefix=f"{os.getpid()}-{self._tag}-", dir=_NAME_TABLES)
        names = {"127.0.0.1": "localhost", self.driver_address: DRIVER_HOST,
                 **{address: host for host, address in self._addresses.items()}}
        lines = [f"{prefix}{address}\t{name}" for address, name in names.items()
                 for prefix in ("", "::ffff:")]
        with os.fdopen(fd, "w") as handle:
            handle.write("\n".join(lines) + "\n")
        os.chmod(path, 0o644)
        return Path(path)

    # ------------------------------------------------------------------ building
    def _add_host(self, index: int, host: str) -> None:
        nic = self.nics[host]
        outside, switch_end = f"{self._tag}h{index}", f"{self._tag}s{index}"
        self._switch_ends[host] = switch_end
        # Both ends are born in their namespaces (one command): no moment leaves a pair here.
        _run("ip", "link", "add", outside, "netns", str(self._holders[host].pid), "type", "veth",
             "peer", "name", switch_end, "netns", str(self.switch_pid))
        assert self.switch.subnet is not None
        prefix = self.switch.subnet.prefixlen
        self._in(host, "ip", "link", "set", outside, "name", self.host_ifname)
        self._in(host, "ip", "addr", "add", f"{self._addresses[host]}/{prefix}", "dev",
                 self.host_ifname)
        self._in(host, "ip", "link", "set", self.host_ifname, "up")
        self._in(host, "ip", "link", "set", "lo", "up")
        _in(self.switch_pid, "ip", "link", "set", switch_end, "master", "br0")
        _in(self.switch_pid, "ip", "link", "set", switch_end, "up")
        self._shape(self._holders[host].pid, self.host_ifname, nic.egress_bytes_per_s, "dst")
        self._shape(self.switch_pid, switch_end, nic.ingress_bytes_per_s, "src")

    def _shape(self, pid: int, dev: str, bytes_per_s: float, driver_field: str) -> None:
        """``htb``: the data class at the NIC's rate, the driver's control class unshaped."""
        rate = f"{int(bytes_per_s * 8)}bit"
        # A token bucket lets a burst pass at line rate: keep it to two full frames or 100 us of
        # the rate, so a small message pays its bytes at the NIC's rate as the model back-end's do.
        burst = str(max(2 * FRAME_BYTES, int(bytes_per_s * 1e-4)))
        tc = ("tc",)
        _in(pid, *tc, "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb",
                 "default", "10")
        _in(pid, *tc, "class", "add", "dev", dev, "parent", "1:", "classid",
                 _DATA_CLASS, "htb", "rate", rate, "ceil", rate, "burst", burst, "cburst", burst,
                 "quantum", "60000")
        _in(pid, *tc, "class", "add", "dev", dev, "parent", "1:", "classid",
                 _CONTROL_CLASS, "htb", "rate", _CONTROL_RATE, "ceil", _CONTROL_RATE,
                 "quantum", "200000")
        for leaf, parent in (("10:", _DATA_CLASS), ("20:", _CONTROL_CLASS)):
            _in(pid, *tc, "qdisc", "add", "dev", dev, "parent", parent, "handle",
                     leaf, "pfifo", "limit", str(_FIFO_PACKETS))
        _in(pid, *tc, "filter", "add", "dev", dev, "parent", "1:", "protocol", "ip",
                 "prio", "1", "u32", "match", "ip", driver_field, f"{self.driver_address}/32",
                 "flowid", _CONTROL_CLASS)

    # ------------------------------------------------------------------ helpers
    @property
    def switch_pid(self) -> int:
        assert self.switch.holder is not None
        return self.switch.holder.pid

    def _in(self, host: str, *cmd: str) -> str:
        return _in(self._holders[host].pid, *cmd)


def _run(*cmd: str) -> str:
    """Run a command; its failure names the command and what it printed."""
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise subprocess.CalledProcessError(
            done.returncode, cmd, done.stdout, f"{' '.join(cmd)}: {done.stderr.strip()}"
        )
    return done.stdout


def _in(pid: int, *cmd: str) -> str:
    """Run a command in the network namespace of process ``pid``."""
    return _run("nsenter", f"--net=/proc/{pid}/ns/net", *cmd)


def _remove_orphaned_name_tables() -> None:
    """Remove the name tables of drivers that are gone (a ``SIGKILL`` cannot clean up after
    itself; a role that still mounts one keeps its copy until it exits)."""
    for path in _NAME_TABLES.glob("*-*") if _NAME_TABLES.is_dir() else ():
        pid = path.name.split("-", 1)[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            path.unlink(missing_ok=True)


def _wait_for_holders(holders: Mapping[str, subprocess.Popen[bytes]]) -> None:
    """A holder has unshared once its ``net`` namespace differs from ours."""
    mine = os.readlink("/proc/self/ns/net")
    deadline = time.monotonic() + 10.0
    for name, proc in holders.items():
        while True:
            with contextlib.suppress(FileNotFoundError):
                if os.readlink(f"/proc/{proc.pid}/ns/net") != mine:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise NetnsUnavailableError(f"namespace holder for {name} did not start")
            time.sleep(0.005)


def _holder() -> subprocess.Popen[bytes]:
    """A process in a new, anonymous network namespace that exits within 0.2 s of this one.

    It watches this process's pid rather than relying on a parent-death signal, which Linux
    sends when the *thread* that started the child exits, not the process.
    """
    return subprocess.Popen(
        ["unshare", "--net", "sh", "-c", _HOLDER, str(os.getpid())],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
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


def _link_drops(pid: int, ifname: str) -> int:
    """Packets veth end ``ifname`` (in ``pid``'s namespace) dropped on their way to its peer.

    A veth drops what its peer cannot take: a full receive backlog on a starved host, a frame
    over the peer's MTU. The peer reports the same packets as received and dropped, so only the
    sending end's count is read: each of a host's two ends counts one direction, once.
    """
    (link,) = json.loads(_in(pid, "ip", "-s", "-j", "link", "show", "dev", ifname))
    return int(link["stats64"]["tx"]["dropped"])


def _tcp_counters(pid: int) -> tuple[int, int]:
    """``(segments resent because they were lost, tail loss probes)`` in ``pid``'s namespace.

    A loss probe is TCP re-sending its last segment when an ACK is late, and a resend the
    receiver reports as a duplicate (D-SACK) was not needed either: a loaded host delays ACKs
    past TCP's timers. Both are counted apart from the resends of segments really lost.
    """
    def table(path: str, prefix: str) -> dict[str, int]:
        rows = [line.split() for line in Path(f"/proc/{pid}/net/{path}").read_text().splitlines()
                if line.startswith(prefix)]
        return {key: int(value) for key, value in zip(rows[0][1:], rows[1][1:], strict=True)}

    resent = table("snmp", "Tcp:")["RetransSegs"]
    extended = table("netstat", "TcpExt:")
    probes = extended.get("TCPLossProbes", 0)
    return max(0, resent - probes - extended.get("TCPDSACKRecvSegs", 0)), probes
