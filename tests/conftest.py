"""Shared fixtures: a tiny schema and a tiny deterministic, learnable batch source.

``TinySource`` stands alone (no ``bagpipe.data``) so model, system and runner tests do not depend on
the data package. Labels come from a hidden linear teacher over the ids and dense features, so
training on it lowers the loss and raises AUC.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator

import pytest
import torch

from bagpipe.core.batch import Batch, DatasetSchema, batch_from_arrays, ids_matrix, split_batch
from bagpipe.core.interface import ModelConfig, ModelState, OptimConfig, TrainContext
from tests.fault.kill_steps import SEED as KILL_SEED

# Tiny tensors on a shared 2-core machine: intra-op threads only contend (a 60-step training test
# takes 7 s with the default thread count and 0.1 s with one thread).
torch.set_num_threads(1)


def pytest_report_header() -> str:
    return f"fault tests: kills at steps drawn with BAGPIPE_KILL_SEED={KILL_SEED} (set it to replay)"


TINY_SCHEMA = DatasetSchema(
    name="tiny", num_dense=3, table_sizes=(10, 20, 5), feature_names=("c0", "c1", "c2")
)

#: A small model config every model name accepts (bottom MLP ends in embedding_dim).
TINY_MODEL = ModelConfig(name="dlrm", embedding_dim=4, bottom_mlp=(8, 4), top_mlp=(8, 1))


class TinySource:
    """``num_batches`` batches of ``batch_size`` one-hot examples; batch ``i`` depends only on
    ``(seed, i)``. Ids are skewed (half the accesses go to rows 0..1 of each table).

    Labels come from the teacher ``teacher_seed``, shared by default, so a source with another
    ``seed`` is held-out data of the same task (use it for evaluation).
    """

    def __init__(
        self,
        schema: DatasetSchema,
        batch_size: int,
        num_batches: int,
        seed: int = 0,
        teacher_seed: int = 0,
    ) -> None:
        self.schema = schema
        self.batch_size = batch_size
        self.num_batches = num_batches
        self.seed = seed
        teacher = torch.Generator().manual_seed(teacher_seed + 10_000)
        self._row_scores = [torch.randn(rows, generator=teacher) for rows in schema.table_sizes]
        self._dense_weights = torch.randn(schema.num_dense, generator=teacher)

    def __len__(self) -> int:
        return self.num_batches

    def __getitem__(self, index: int) -> Batch:
        if not 0 <= index < self.num_batches:
            raise IndexError(f"batch {index} of {self.num_batches}")
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        columns = []
        for rows in self.schema.table_sizes:
            uniform = torch.randint(0, rows, (self.batch_size,), generator=gen)
            hot = torch.randint(0, min(2, rows), (self.batch_size,), generator=gen)
            pick_hot = torch.rand(self.batch_size, generator=gen) < 0.5
            columns.append(torch.where(pick_hot, hot, uniform))
        ids = torch.stack(columns, dim=1)
        dense = torch.randn(self.batch_size, self.schema.num_dense, generator=gen)
        score = dense @ self._dense_weights + sum(
            scores[ids[:, f]] for f, scores in enumerate(self._row_scores)
        )
        labels = (score > 0).to(torch.float32)
        return batch_from_arrays(dense, ids, labels, self.schema.feature_names)

    def __iter__(self) -> Iterator[Batch]:
        return (self[i] for i in range(self.num_batches))

    def slice(self, index: int, part: int, parts: int) -> Batch:
        """Made from the whole batch: a slice's cost does not matter at this size."""
        return split_batch(self[index], parts)[part]

    def ids(self, index: int) -> torch.Tensor:
        return ids_matrix(self[index])


@pytest.fixture(autouse=True, scope="session")
def _private_data_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Prepared datasets go to a temporary directory, never the user's cache (role processes and
    subprocesses inherit it through the environment)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("BAGPIPE_DATA_CACHE", str(tmp_path_factory.mktemp("data-cache")))
        yield


def equivalence_context(
    schema: DatasetSchema, model_name: str, batch_size: int, num_batches: int, seed: int,
    **extra: object,
) -> TrainContext:
    """The context every multi-process equivalence test trains ``local`` and its system on.

    Learning rates large enough that every step moves the weights, and nothing emulated on the
    network (exact results, not timing, are under test).
    """
    return TrainContext(
        schema=schema,
        model=dataclasses.replace(TINY_MODEL, name=model_name),
        optim=OptimConfig(embedding_lr=0.5, dense_lr=0.3),
        global_batch_size=batch_size,
        seed=seed,
        source=TinySource(schema, batch_size, num_batches, seed=seed),
        **extra,  # type: ignore[arg-type]
    )


def assert_states_equal(got: ModelState, want: ModelState) -> None:
    """Every table and dense tensor bit-identical (``torch.equal``), naming the first that is not."""
    assert got.tables.keys() == want.tables.keys()
    for name, table in want.tables.items():
        assert torch.equal(got.tables[name], table), name
    assert got.dense.keys() == want.dense.keys()
    for key, tensor in want.dense.items():
        assert torch.equal(got.dense[key], tensor), key


def assert_states_close(
    got: ModelState, want: ModelState, *, rtol: float = 1e-5, atol: float = 1e-6
) -> None:
    """Every table and dense tensor equal to fp tolerance (the equivalence tests' check)."""
    assert got.tables.keys() == want.tables.keys()
    for name, table in want.tables.items():
        torch.testing.assert_close(got.tables[name], table, rtol=rtol, atol=atol, msg=name)
    assert got.dense.keys() == want.dense.keys()
    for key, tensor in want.dense.items():
        torch.testing.assert_close(got.dense[key], tensor, rtol=rtol, atol=atol, msg=key)


@pytest.fixture
def tiny_schema() -> DatasetSchema:
    return TINY_SCHEMA


@pytest.fixture
def tiny_source() -> Callable[..., TinySource]:
    """Factory: ``tiny_source(batch_size=8, num_batches=4, seed=0)``."""

    def make(batch_size: int = 8, num_batches: int = 4, seed: int = 0) -> TinySource:
        return TinySource(TINY_SCHEMA, batch_size, num_batches, seed)

    return make


@pytest.fixture
def tiny_context(tiny_source: Callable[..., TinySource]) -> Callable[..., TrainContext]:
    """Factory for a ``TrainContext`` over a ``TinySource`` (keyword overrides for the knobs)."""

    def make(
        model: ModelConfig = TINY_MODEL,
        batch_size: int = 8,
        num_batches: int = 4,
        seed: int = 0,
        lr: float = 0.1,
    ) -> TrainContext:
        return TrainContext(
            schema=TINY_SCHEMA,
            model=model,
            optim=OptimConfig(embedding_lr=lr, dense_lr=lr),
            global_batch_size=batch_size,
            seed=seed,
            source=tiny_source(batch_size, num_batches, seed),
        )

    return make
