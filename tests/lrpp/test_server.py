"""Bagpipe's embedding-server shards: id % S layout over the seeded tables, read-after-write barrier."""

from __future__ import annotations

import threading

import torch

from bagpipe.core import runtime
from bagpipe.lrpp.server import BagpipeServerShard
from bagpipe.models import initial_tables
from tests.conftest import TINY_SCHEMA


def _shards(num_shards: int = 2) -> list[BagpipeServerShard]:
    runtime.init("server_test")
    return [BagpipeServerShard(s, num_shards, TINY_SCHEMA, 4, 7, num_trainers=2) for s in range(num_shards)]


def test_shards_together_hold_exactly_the_seeded_tables() -> None:
    flat = torch.cat(list(initial_tables(TINY_SCHEMA, 4, 7).values()))
    got = torch.full_like(flat, float("nan"))
    for shard in _shards():
        ids, rows = shard.state()
        got[ids] = rows
    assert torch.equal(got, flat)


def test_fetch_waits_until_every_trainer_wrote_back_the_round() -> None:
    shard = _shards()[0]
    row_id = torch.tensor([4])
    shard.write_back(1, row_id, torch.ones(1, 4))  # trainer 0's write-back (trainer 1 pending)
    got: list[torch.Tensor] = []
    reader = threading.Thread(target=lambda: got.append(shard.fetch(1, row_id)))
    reader.start()
    reader.join(timeout=0.3)
    assert reader.is_alive() and not got  # blocked: trainer 1 has not written back round 1
    shard.write_back(1, torch.tensor([6]), torch.full((1, 4), 2.0))
    reader.join(timeout=5.0)
    assert torch.equal(got[0], torch.ones(1, 4))
    assert torch.equal(shard.fetch(1, torch.tensor([6])), torch.full((1, 4), 2.0))
