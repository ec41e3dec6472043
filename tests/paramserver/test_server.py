"""EmbeddingServer shards (in-process): layout, seeded start, SGD with duplicates, overwrites."""

from __future__ import annotations

import pytest
import torch

from bagpipe.core import runtime
from bagpipe.core.batch import DatasetSchema
from bagpipe.models import initial_tables
from bagpipe.paramserver import EmbeddingServer, ShardLayout, gather_tables

SCHEMA = DatasetSchema(
    name="shards", num_dense=1, table_sizes=(7, 4, 10), feature_names=("a", "b", "c")
)
DIM, SEED, SHARDS = 3, 11, 3


@pytest.fixture
def servers() -> list[EmbeddingServer]:
    runtime.init("server")
    return [EmbeddingServer(s, SHARDS, SCHEMA, DIM, SEED) for s in range(SHARDS)]


def _flat_initial() -> torch.Tensor:
    tables = initial_tables(SCHEMA, DIM, SEED)
    return torch.cat([tables[name] for name in SCHEMA.table_names])


def test_shards_hold_the_seeded_tables_round_robin(servers: list[EmbeddingServer]) -> None:
    flat = _flat_initial()
    for s, server in enumerate(servers):
        ids, rows = server.state()
        assert torch.equal(ids, torch.arange(s, SCHEMA.total_rows, SHARDS))
        assert torch.equal(rows, flat[ids])
    tables = gather_tables([server.state() for server in servers], SCHEMA)
    for name, table in initial_tables(SCHEMA, DIM, SEED).items():
        assert torch.equal(tables[name], table)


def test_split_routes_every_id_to_its_shard() -> None:
    ids = torch.tensor([5, 0, 7, 3, 20, 1])
    parts = ShardLayout(SHARDS).split(ids)
    assert [ids[p].tolist() for p in parts] == [[0, 3], [7, 1], [5, 20]]


def test_fetch_sgd_with_duplicates_and_write(servers: list[EmbeddingServer]) -> None:
    flat = _flat_initial()
    server = servers[1]
    ids = torch.tensor([7, 1, 7])
    assert torch.equal(server.fetch_rows(ids), flat[ids])
    grads = torch.ones(3, DIM)
    server.apply_gradients(ids, grads, lr=0.5)
    want = flat.clone()
    want[7] -= 1.0  # two gradients of row 7, summed
    want[1] -= 0.5
    assert torch.allclose(server.fetch_rows(torch.tensor([7, 1])), want[[7, 1]])
    server.write_rows(torch.tensor([4]), torch.full((1, DIM), 2.0))
    assert torch.equal(server.fetch_rows(torch.tensor([4])), torch.full((1, DIM), 2.0))


def test_ids_of_another_shard_are_refused(servers: list[EmbeddingServer]) -> None:
    with pytest.raises(ValueError, match="server_0: asked for ids stored on other shards"):
        servers[0].fetch_rows(torch.tensor([0, 1]))
