"""Seeded initial state (identical across builds, per table independent) and ReferenceModel."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from bagpipe.core.batch import DatasetSchema
from bagpipe.core.interface import ModelState
from bagpipe.models import (
    MODELS,
    ReferenceModel,
    build_dense_model,
    initial_tables,
    table_dim,
)
from tests.conftest import TINY_MODEL, TINY_SCHEMA, TinySource


@pytest.mark.parametrize("name", sorted(MODELS))
def test_dense_init_is_a_function_of_the_seed(name: str) -> None:
    cfg = dataclasses.replace(TINY_MODEL, name=name)
    rng_before = torch.random.get_rng_state()
    first = build_dense_model(cfg, TINY_SCHEMA, seed=5).state_dict()
    second = build_dense_model(cfg, TINY_SCHEMA, seed=5).state_dict()
    other = build_dense_model(cfg, TINY_SCHEMA, seed=6).state_dict()
    assert torch.equal(torch.random.get_rng_state(), rng_before), "global RNG must be untouched"
    assert all(torch.equal(first[k], second[k]) for k in first)
    assert any(
        not torch.equal(first[k], other[k]) for k in first if first[k].dtype.is_floating_point
    )


def test_initial_tables_are_deterministic_bounded_and_independent_per_table() -> None:
    tables = initial_tables(TINY_SCHEMA, 4, seed=3)
    again = initial_tables(TINY_SCHEMA, 4, seed=3)
    assert list(tables) == list(TINY_SCHEMA.table_names)
    for name, rows in zip(TINY_SCHEMA.table_names, TINY_SCHEMA.table_sizes, strict=True):
        assert tables[name].shape == (rows, 4)
        assert torch.equal(tables[name], again[name])
        assert tables[name].abs().max() <= math.sqrt(1 / rows)
    # A table's values depend only on (seed, table index): resizing another table changes nothing.
    bigger = dataclasses.replace(TINY_SCHEMA, table_sizes=(10, 20, 50))
    resized = initial_tables(bigger, 4, seed=3)
    assert torch.equal(resized["t_c0"], tables["t_c0"])
    assert torch.equal(resized["t_c1"], tables["t_c1"])
    assert not torch.equal(initial_tables(TINY_SCHEMA, 4, seed=4)["t_c0"], tables["t_c0"])


def test_table_dim_adds_the_first_order_column_for_deepfm_only() -> None:
    assert table_dim(dataclasses.replace(TINY_MODEL, name="deepfm")) == TINY_MODEL.embedding_dim + 1
    for name in ("dlrm", "wdl", "dcn"):
        assert table_dim(dataclasses.replace(TINY_MODEL, name=name)) == TINY_MODEL.embedding_dim


@pytest.mark.parametrize("name", ["dlrm", "deepfm"])
def test_reference_model_is_lookup_plus_dense_part(name: str) -> None:
    cfg = dataclasses.replace(TINY_MODEL, name=name)
    model = ReferenceModel(cfg, TINY_SCHEMA, seed=2)
    batch = TinySource(TINY_SCHEMA, batch_size=6, num_batches=1)[0]
    tables = initial_tables(TINY_SCHEMA, table_dim(cfg), seed=2)
    ids = batch.sparse_features.values().view(TINY_SCHEMA.num_tables, -1).t()
    pooled = torch.stack(
        [tables[t][ids[:, f]] for f, t in enumerate(TINY_SCHEMA.table_names)], dim=1
    )
    dense = build_dense_model(cfg, TINY_SCHEMA, seed=2)
    with torch.no_grad():
        assert torch.allclose(model(batch), dense(batch.dense_features, pooled), atol=1e-6)


def test_reference_state_round_trip_and_shape_errors() -> None:
    source = ReferenceModel(TINY_MODEL, TINY_SCHEMA, seed=0)
    target = ReferenceModel(TINY_MODEL, TINY_SCHEMA, seed=1)
    target.load_state(source.state())
    state, loaded = source.state(), target.state()
    assert all(torch.equal(state.tables[k], loaded.tables[k]) for k in state.tables)
    assert all(torch.equal(state.dense[k], loaded.dense[k]) for k in state.dense)
    wrong = ModelState(
        tables={**state.tables, "t_c0": torch.zeros(3, TINY_MODEL.embedding_dim)},
        dense=state.dense,
    )
    with pytest.raises(ValueError, match="t_c0"):
        target.load_state(wrong)
    other_schema = DatasetSchema("x", 3, (10,), ("c0",))
    with pytest.raises(ValueError, match="do not match"):
        ReferenceModel(TINY_MODEL, other_schema, 0).load_state(state)
