"""Batch sources: order, epochs, the deterministic block shuffle, random access, per-trainer slices
and id-only reads for every source kind, and the fixed evaluation splits of file datasets."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from bagpipe.core.batch import DatasetSchema, ids_matrix, split_batch
from bagpipe.core.source import BatchSource
from bagpipe.data import (
    ArraySource,
    DatasetConfig,
    SyntheticGenerator,
    make_dataset,
    write_criteo_tsv,
)
from bagpipe.data import generator as generator_module
from bagpipe.data.examples import Examples
from bagpipe.data.shuffle import BlockShuffle
from tests.conftest import TINY_SCHEMA, TinySource


def _examples(n: int) -> tuple[Examples, DatasetSchema]:
    ids = np.stack([np.arange(n), np.arange(n) % 7], 1).astype(np.int64)
    examples = Examples((np.arange(n) % 2).astype(np.int8), np.zeros((n, 1), np.float32), ids)
    return examples, DatasetSchema("t", 1, (n, 7), ("cat_0", "cat_1"))


def test_array_source_order_wrap_and_shuffle() -> None:
    examples, schema = _examples(100)
    plain = ArraySource(examples, schema, batch_size=30, num_batches=5)
    assert isinstance(plain, BatchSource) and plain.batches_per_epoch == 3
    firsts = [int(ids_matrix(b)[0, 0]) for b in plain]
    assert firsts == [0, 30, 60, 0, 30]  # remainder dropped, wraps to a new epoch
    shuffled = ArraySource(examples, schema, batch_size=30, num_batches=6, shuffle_seed=1)
    epoch0 = torch.cat([ids_matrix(shuffled[i])[:, 0] for i in range(3)])
    epoch1 = torch.cat([ids_matrix(shuffled[i])[:, 0] for i in range(3, 6)])
    assert len(set(epoch0.tolist())) == 90 and not torch.equal(epoch0, epoch1)
    again = ArraySource(examples, schema, batch_size=30, num_batches=6, shuffle_seed=1)
    assert torch.equal(ids_matrix(again[4]), ids_matrix(shuffled[4]))
    with pytest.raises(IndexError):
        plain[5]
    with pytest.raises(ValueError, match="do not fill one batch"):
        ArraySource(examples, schema, batch_size=101)


@pytest.mark.parametrize("rows", [1, 37, 1000, 4096])
def test_block_shuffle_is_a_seeded_permutation_per_epoch(rows: int) -> None:
    shuffle = BlockShuffle(rows, seed=5, block_rows=16, window_blocks=4)
    epoch0 = shuffle.rows_at(0, 0, rows)
    assert sorted(epoch0.tolist()) == list(range(rows))  # every row exactly once
    pieces = [shuffle.rows_at(0, start, min(rows, start + 100)) for start in range(0, rows, 100)]
    np.testing.assert_array_equal(np.concatenate(pieces), epoch0)  # random access = the stream
    same = BlockShuffle(rows, seed=5, block_rows=16, window_blocks=4)
    np.testing.assert_array_equal(same.rows_at(1, 0, rows), shuffle.rows_at(1, 0, rows))
    if rows >= 1000:
        other = BlockShuffle(rows, seed=6, block_rows=16, window_blocks=4).rows_at(0, 0, rows)
        assert not np.array_equal(other, epoch0)
        assert not np.array_equal(shuffle.rows_at(1, 0, rows), epoch0)
        # rows of one block stay within one window of the stream (the bounded-memory trade)
        positions = np.argsort(epoch0)  # where each row sits in the stream
        spans = [np.ptp(positions[b * 16:(b + 1) * 16]) for b in range(-(-rows // 16))]
        assert 16 < max(spans) < 64  # a block's rows are spread, but within one window
    with pytest.raises(IndexError):
        shuffle.rows_at(0, 0, rows + 1)


@pytest.fixture(scope="module")
def kaggle_file(tmp_path_factory: pytest.TempPathFactory, kaggle_gen: SyntheticGenerator) -> Path:
    path = tmp_path_factory.mktemp("kaggle") / "train.txt"
    write_criteo_tsv(str(path), kaggle_gen.rows("train", 0, 2100), kaggle_gen.table_sizes)
    return path


def _sources(kaggle_gen: SyntheticGenerator, kaggle_file: Path) -> dict[str, BatchSource]:
    """One source of every kind, batch 64 (the FAE re-packed source: tests/baselines)."""
    synthetic = make_dataset(DatasetConfig(scale=0.001, seed=3))
    shards = make_dataset(DatasetConfig(kind="criteo_tsv", path=str(kaggle_file), scale=0.001))
    shuffled = make_dataset(DatasetConfig(kind="criteo_tsv", path=str(kaggle_file), scale=0.001,
                                          shuffle=True, seed=2))
    examples, schema = _examples(1000)
    return {
        "synthetic": synthetic.train(64, 4),
        "synthetic_eval": synthetic.eval(64, 2),
        "array_shuffled": ArraySource(examples, schema, 64, 20, shuffle_seed=0),
        "shards": shards.train(64, 40),  # past one epoch: wraps
        "shards_shuffled": shuffled.train(64, 3),
        "shards_eval": shuffled.eval(64),
        "tiny": TinySource(TINY_SCHEMA, 64, 3),
    }


def test_every_source_kind_slices_and_reads_ids_exactly(kaggle_gen: SyntheticGenerator,
                                                        kaggle_file: Path) -> None:
    for name, source in _sources(kaggle_gen, kaggle_file).items():
        assert isinstance(source, BatchSource), name
        for index in (0, len(source) - 1):
            whole = source[index]
            assert torch.equal(source.ids(index), ids_matrix(whole)), name
            for parts in (1, 2, 4):
                for part, want in enumerate(split_batch(whole, parts)):
                    got = source.slice(index, part, parts)
                    assert torch.equal(ids_matrix(got), ids_matrix(want)), (name, parts, part)
                    assert torch.equal(got.dense_features, want.dense_features), name
                    assert torch.equal(got.labels, want.labels), name
        with pytest.raises(ValueError, match="does not split into 3 equal"):
            source.slice(0, 0, 3)
        with pytest.raises(IndexError):
            source.ids(len(source))


def test_a_synthetic_slice_generates_only_its_own_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    source = make_dataset(DatasetConfig(scale=0.001)).train(2048, 2)
    made: list[int] = []
    original: Callable[..., np.random.Generator] = generator_module.SyntheticGenerator._chunk_rng

    def counting(self: SyntheticGenerator, split: str, chunk: int) -> np.random.Generator:
        made.append(chunk)
        return original(self, split, chunk)

    monkeypatch.setattr(generator_module.SyntheticGenerator, "_chunk_rng", counting)
    source[1]
    whole, made[:] = sorted(made), []
    source.slice(1, 3, 4)
    assert len(whole) == 2048 // generator_module.CHUNK_ROWS
    assert made == whole[-len(whole) // 4:]  # the last quarter's chunks, nothing else


def _days(tmp_path: Path, gen: SyntheticGenerator, rows: tuple[int, ...]) -> list[Examples]:
    days = [gen.rows("train", 10_000 * d, 10_000 * d + n) for d, n in enumerate(rows)]
    for d, day in enumerate(days):
        write_criteo_tsv(str(tmp_path / f"day_{d}.gz"), day, gen.table_sizes)
    return days


def test_terabyte_evaluates_on_its_last_day(tmp_path: Path) -> None:
    cfg = DatasetConfig(preset="criteo_terabyte", scale=1e-5, skew_target=None)
    gen = make_dataset(cfg).generator  # type: ignore[union-attr]
    days = _days(tmp_path, gen, (700, 500, 300))
    ds = make_dataset(DatasetConfig(kind="criteo_tsv", preset="criteo_terabyte", scale=1e-5,
                                    path=str(tmp_path / "day_*.gz"), shuffle=True))
    train, evaluation = ds.train(100), ds.eval(100)
    assert len(train) == 12 and len(evaluation) == 3  # days 0-1 train, day 2 evaluates
    eval_ids = torch.cat([ids_matrix(b) for b in evaluation]).numpy()
    np.testing.assert_array_equal(eval_ids, days[2].ids)  # file order, untouched by the shuffle
    train_ids = torch.cat([ids_matrix(b) for b in train]).numpy()
    both = np.concatenate([days[0].ids, days[1].ids])
    assert sorted(map(tuple, train_ids.tolist())) == sorted(map(tuple, both.tolist()))
    single = str(tmp_path / "day_0.gz")
    with pytest.raises(ValueError, match=r"dataset\.path=.*day_0\.gz.*at least two day files"):
        make_dataset(DatasetConfig(kind="criteo_tsv", preset="criteo_terabyte", scale=1e-5,
                                   path=single))


def test_kaggle_evaluates_on_its_last_seventh(kaggle_gen: SyntheticGenerator, kaggle_file: Path) -> None:
    ds = make_dataset(DatasetConfig(kind="criteo_tsv", path=str(kaggle_file), scale=0.001))
    evaluation = torch.cat([ids_matrix(b) for b in ds.eval(100)]).numpy()
    np.testing.assert_array_equal(evaluation, kaggle_gen.rows("train", 1800, 2100).ids)
    assert len(ds.train(100)) == 18


def test_a_shard_source_pickles_as_a_handle_not_its_data(kaggle_file: Path) -> None:
    """Role processes (Bagpipe's oracle) are sent the source: paths and a few numbers."""
    import pickle

    source = make_dataset(DatasetConfig(kind="criteo_tsv", path=str(kaggle_file), scale=0.001,
                                        shuffle=True)).train(64)
    source[3]  # caches a window's permutation and the column headers
    copy = pickle.loads(pickle.dumps(source))
    assert len(pickle.dumps(source)) < 20_000
    assert torch.equal(ids_matrix(copy[3]), ids_matrix(source[3]))
