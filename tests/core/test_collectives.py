"""Trainer-group all-reduce through the wire: SUM over the group, payload counted once per member,
ring time held on the model back-end (in the background for an async call)."""

from __future__ import annotations

import torch

from bagpipe.core.collectives import _flatten, _unflatten_into
from bagpipe.core.net import NetworkConfig, Topology
from bagpipe.core.roles import Deployment

from .roles import GroupMember

# Slow NICs, long transfers: timing noise on a loaded 2-core machine stays small beside them.
SLOW = NetworkConfig("model", Topology.uniform(0.2, latency_us=0.0))
PAYLOAD_ELEMS = 250_000  # 1 MB of fp32: ring all-reduce over 2 ranks = 1 MB on each NIC = 40 ms
RING_S = (6 + PAYLOAD_ELEMS) * 4 * 8 / 0.2e9


def test_allreduce_sums_counts_payload_and_holds_ring_time() -> None:
    with Deployment(["trainer_0", "trainer_1"], network=SLOW) as deployment:
        group = deployment.new_group("trainers", world_size=2)
        members = [deployment.remote(f"trainer_{k}", GroupMember, group, k) for k in range(2)]
        calls = [
            m.rpc_async().allreduce(
                [torch.full((2, 3), k + 1.0), torch.full((PAYLOAD_ELEMS,), k * 1.0)]
            )
            for k, m in enumerate(members)
        ]
        results = deployment.wait(calls, timeout_s=60)
        for out, bytes_sent, held_s in results:
            assert torch.equal(out[0], torch.full((2, 3), 3.0))
            assert torch.equal(out[1], torch.full((PAYLOAD_ELEMS,), 1.0))
            assert bytes_sent == {"allreduce": (6 + PAYLOAD_ELEMS) * 4}
            assert held_s >= RING_S
        asyncs = [m.rpc_async().allreduce_async(torch.full((PAYLOAD_ELEMS,), 2.0)) for m in members]
        for summed, started_s, done_s in deployment.wait(asyncs, timeout_s=60):
            assert torch.equal(summed, torch.full((PAYLOAD_ELEMS,), 4.0))
            assert started_s < RING_S / 2 <= RING_S <= done_s  # held in the background
        report = deployment.network_report()
    for host in ("trainer_0", "trainer_1"):  # each NIC carried 2 (T-1)/T of both payloads out
        wire = (6 + PAYLOAD_ELEMS) * 4 + PAYLOAD_ELEMS * 4
        assert report.hosts[host].ledger_tx == report.hosts[host].ledger_rx == wire


def test_a_replicas_wait_for_its_all_reduce_is_charged_as_sync_not_backward() -> None:
    """DDP waits for its buckets inside ``backward()``: that wait is network time, the same rule
    for every system, so a 40 ms ring over slow NICs lands in ``sync`` and ``backward`` stays the
    (sub-millisecond) gradient compute the CPU-share check compares."""
    with Deployment(["trainer_0", "trainer_1"], network=SLOW) as deployment:
        group = deployment.new_group("trainers", world_size=2)
        members = [deployment.remote(f"trainer_{k}", GroupMember, group, k) for k in range(2)]
        results = deployment.wait(
            [m.rpc_async().train_wide_slice(PAYLOAD_ELEMS) for m in members], timeout_s=60
        )
    for phases in results:
        assert phases["sync"] >= 0.9 * RING_S
        assert phases["backward"] < phases["sync"] / 2
        wall_phases = {k: v for k, v in phases.items() if k != "wall" and not k.startswith("cpu_")}
        assert sum(wall_phases.values()) <= phases["wall"]
        # the wait is waiting: the replica's thread spends little CPU on it
        assert phases["cpu_sync"] < phases["sync"] / 2


def test_one_contiguous_tensor_is_summed_in_place_and_others_through_a_copy() -> None:
    """A sync-later buffer (one contiguous tensor) crosses as itself, with no copy in or out;
    several tensors, or a strided one, are packed into one flat copy and unpacked after."""
    rows = torch.arange(6.0).view(3, 2)
    flat = _flatten([rows])
    assert flat.data_ptr() == rows.data_ptr()
    flat.mul_(2)  # what the collective's SUM does to it
    _unflatten_into(flat, [rows])
    assert rows.flatten().tolist() == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]
    strided, other = torch.arange(6.0).view(2, 3).t(), torch.ones(2)
    for tensors in ([strided], [strided, other]):
        packed = _flatten(tensors)
        assert packed.data_ptr() != tensors[0].data_ptr()
        packed.add_(1)
        _unflatten_into(packed, tensors)
    assert strided.t().flatten().tolist() == [2.0, 3.0, 4.0, 5.0, 6.0, 7.0]
    assert other.tolist() == [2.0, 2.0]
