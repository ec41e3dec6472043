"""The emulated cluster every system runs on: one topology, one network back-end, one wire.

``topology`` describes the cluster (hosts, NICs, compute, placement; ``suites/topology/*.yaml``);
``wire`` is where every message and collective between roles is counted and delayed
(:class:`NetworkConfig` picks the back-end); ``netns`` and ``fairshare`` are the two emulating
back-ends (real kernel networking between network namespaces, or a fair-shared NIC model).
"""

from bagpipe.core.net.netns import NetnsUnavailableError, netns_available
from bagpipe.core.net.topology import Compute, Nic, Topology, host_of
from bagpipe.core.net.wire import BACKENDS, NetworkConfig, Wire

__all__ = [
    "BACKENDS",
    "Compute",
    "NetnsUnavailableError",
    "NetworkConfig",
    "Nic",
    "Topology",
    "Wire",
    "host_of",
    "resolve_backend",
]


def resolve_backend(name: str) -> str:
    """The back-end a run uses: ``auto`` is ``netns`` where this process may build namespaces
    (root, as CI runs) and ``model`` elsewhere; ``netns`` where it cannot is an error saying why."""
    if name == "auto":
        return "netns" if netns_available() is None else "model"
    if name not in BACKENDS:
        raise ValueError(f"network.backend: {name!r} is not one of {('auto', *BACKENDS)}")
    if name == "netns":
        reason = netns_available()
        if reason is not None:
            raise NetnsUnavailableError(f"network.backend=netns is not available here: {reason}")
    return name
