"""Trainer-group all-reduce: SUM over the group, payload charged once per member, ring delay held."""

from __future__ import annotations

import torch

from bagpipe.core.link import LinkConfig
from bagpipe.core.roles import Deployment

from .roles import GroupMember

SLOW = LinkConfig(bandwidth_gbps=0.2, latency_us=0.0)
PAYLOAD_ELEMS = 250_000  # 1 MB of fp32: ring all-reduce over 2 ranks = 1 MB on the wire = 40 ms


def test_allreduce_sums_charges_payload_and_holds_ring_time() -> None:
    with Deployment(["trainer_0", "trainer_1"], link=SLOW) as deployment:
        group = deployment.new_group("trainers", world_size=2)
        members = [deployment.remote(f"trainer_{k}", GroupMember, group, k) for k in range(2)]
        calls = [
            m.rpc_async().allreduce(
                [torch.full((2, 3), k + 1.0), torch.full((PAYLOAD_ELEMS,), k * 1.0)]
            )
            for k, m in enumerate(members)
        ]
        results = deployment.wait(calls, timeout_s=60)
        ring_s = SLOW.ring_allreduce_time_s((6 + PAYLOAD_ELEMS) * 4, world=2)
        for out, bytes_sent, held_s in results:
            assert torch.equal(out[0], torch.full((2, 3), 3.0))
            assert torch.equal(out[1], torch.full((PAYLOAD_ELEMS,), 1.0))
            assert bytes_sent == {"allreduce": (6 + PAYLOAD_ELEMS) * 4}
            assert held_s >= ring_s
        asyncs = [m.rpc_async().allreduce_async(torch.full((PAYLOAD_ELEMS,), 2.0)) for m in members]
        for summed, started_s, done_s in deployment.wait(asyncs, timeout_s=60):
            assert torch.equal(summed, torch.full((PAYLOAD_ELEMS,), 4.0))
            assert (
                started_s < ring_s / 2 <= ring_s <= done_s
            )  # the delay is spent in the background
