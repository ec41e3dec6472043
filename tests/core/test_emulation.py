"""The emulated cluster as roles see it, on every back-end this machine can run: a NIC shared by a
prefetch and an all-reduce takes the sum of their times, and (netns) every host is a namespace of
its own at an address of its own. CI runs as root, so both back-ends run there."""

from __future__ import annotations

import os

import pytest

from bagpipe.core.net import NetworkConfig, Topology, netns_available
from bagpipe.core.roles import Deployment

from .roles import Sharer, Sink

BACKENDS = ["model"] + (["netns"] if netns_available() is None else [])
GBPS = 0.1  # 12.5 MB/s
ELEMS = 312_500  # 1.25 MB of fp32: 0.1 s alone on a 0.1 Gbps NIC (ring of two: the payload)
SECONDS = ELEMS * 4 * 8 / (GBPS * 1e9)


def _network(backend: str) -> NetworkConfig:
    return NetworkConfig(backend, Topology.uniform(GBPS, latency_us=0.0, servers=1))


@pytest.mark.timeout(180)
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_push_and_an_all_reduce_on_one_nic_take_the_sum_of_their_times(backend: str) -> None:
    with Deployment(["server_0", "trainer_0", "trainer_1"], network=_network(backend)) as deployment:
        sink = deployment.remote("server_0", Sink)
        group = deployment.new_group("trainers", world_size=2)
        trainers = [deployment.remote(f"trainer_{k}", Sharer, group, k) for k in range(2)]
        alone = deployment.wait(  # the all-reduce alone: each trainer's NIC carries the payload
            [t.rpc_async().allreduce_while_pushing(ELEMS, None, 0) for t in trainers], 120
        )
        shared = deployment.wait(  # trainer 0's NIC also carries a push of as many bytes
            [trainers[0].rpc_async().allreduce_while_pushing(ELEMS, sink, ELEMS),
             trainers[1].rpc_async().allreduce_while_pushing(ELEMS, None, 0)], 120
        )
    assert min(alone) >= SECONDS and max(alone) < 1.6 * SECONDS
    # The sum (0.2 s), not the max (0.1 s). netns's htb has run up to 10% fast on the loaded CI
    # machine (0.179 s, twice in full runs), so the floor sits at 80% of the sum, still far above
    # the max that an unshared NIC would give.
    assert 2 * SECONDS * 0.8 <= shared[0] < 2 * SECONDS * 1.5


@pytest.mark.timeout(120)
@pytest.mark.skipif(netns_available() is not None, reason=f"netns: {netns_available()}")
def test_netns_roles_live_in_their_hosts_namespaces() -> None:
    roles = ["server_0", "server_1", "trainer_0", "trainer_1"]
    network = NetworkConfig("netns", Topology.uniform(10.0, servers=1))  # both shards on server_0
    with Deployment(roles, network=network) as deployment:
        group = deployment.new_group("trainers", world_size=2)
        refs = [deployment.remote(r, Sink) for r in roles[:2]]
        refs += [deployment.remote(r, Sharer, group, k) for k, r in enumerate(roles[2:])]
        where = dict(deployment.wait([ref.rpc_async().where() for ref in refs], 60))
    driver_ns = os.readlink("/proc/self/ns/net")
    assert where["server_0"] == where["server_1"]  # one host, one namespace
    namespaces = {where["server_0"], where["trainer_0"], where["trainer_1"], driver_ns}
    assert len(namespaces) == 4
