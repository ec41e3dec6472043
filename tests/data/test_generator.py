"""Synthetic generator: calibration, teacher ceiling, determinism, random access, skew report."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bagpipe.core.batch import ids_matrix
from bagpipe.data import (
    BatchSource,
    DatasetConfig,
    GeneratorConfig,
    SyntheticGenerator,
    get_preset,
    id_skew_report,
    make_dataset,
    roc_auc,
    top_share,
)
from bagpipe.data.popularity import expected_top_share, zipf_rank_probs


def _stream_ids(gen: SyntheticGenerator, batches: int, size: int = 8192) -> np.ndarray:
    return np.concatenate([gen.examples("train", i, size).ids for i in range(batches)])


@pytest.mark.parametrize("preset", ["criteo_kaggle", "avazu"])
def test_calibrated_generator_hits_target_share(preset: str) -> None:
    gen = SyntheticGenerator(get_preset(preset), GeneratorConfig(scale=0.001, skew_target=0.92))
    probs = np.concatenate([t.row_probs() for t in gen.tables])
    assert top_share(probs, 0.01) == pytest.approx(0.92, abs=1e-3)  # analytic, as bisected
    realised = id_skew_report(_stream_ids(gen, 12), gen.table_sizes)["skew_top1pct"]
    assert realised == pytest.approx(0.92, abs=0.02)


def test_other_targets_and_uncalibrated_model() -> None:
    preset = get_preset("criteo_kaggle")
    sizes = preset.table_sizes(0.001)
    fitted = expected_top_share(preset.tables, sizes, 1.0)
    gen = SyntheticGenerator(preset, GeneratorConfig(scale=0.001, skew_target=None))
    assert gen.kappa == 1.0
    assert 0.6 < fitted < 0.85  # data.md: the fitted exponents give less skew at small scale
    steeper = SyntheticGenerator(preset, GeneratorConfig(scale=0.001, skew_target=0.97))
    assert steeper.kappa > SyntheticGenerator(preset, GeneratorConfig(scale=0.001)).kappa
    with pytest.raises(ValueError, match=r"skew_target=0\.001 is out of reach"):
        SyntheticGenerator(preset, GeneratorConfig(scale=0.001, skew_target=0.001))


def test_missing_rates_and_heaps_scaling() -> None:
    preset = get_preset("criteo_kaggle")
    assert preset.table_sizes(1.0)[2] == 10131227  # C3 at full scale
    assert preset.table_sizes(0.001)[2] == round(10131227 * 0.001 ** (1 / 1.11))
    assert preset.table_sizes(0.001)[0] == 1460  # finite tables keep their vocabulary
    assert preset.table_sizes(0.001, max_ind_range=1000)[0] == 1000
    probs = zipf_rank_probs(preset.tables[21], 18)  # C22, 79.5% missing
    assert probs[0] == pytest.approx(0.795) and probs.sum() == pytest.approx(1.0)
    heaps = zipf_rank_probs(preset.tables[2], 5000)
    assert heaps.sum() == pytest.approx(1.0) and np.all(np.diff(heaps[1:]) < 0)


def test_missing_rows_and_dense_marginals(kaggle_gen: SyntheticGenerator) -> None:
    block = kaggle_gen.examples("train", 0, 40000)
    assert (block.ids[:, 21] == 0).mean() == pytest.approx(0.795, abs=0.01)
    assert block.dense_missing[:, 11].mean() == pytest.approx(0.785, abs=0.01)
    assert (block.dense_raw[:, 1] < 0).mean() == pytest.approx(0.075, abs=0.01)
    present = ~block.dense_missing[:, 4]
    assert block.dense[present, 4].mean() == pytest.approx(7.13, abs=0.1)
    np.testing.assert_array_equal(block.dense, np.log1p(np.maximum(block.dense_raw, 0)).astype(np.float32))
    assert block.dense.dtype == np.float32 and np.all(block.ids < np.array(kaggle_gen.table_sizes))


def test_hot_rows_are_scattered(kaggle_gen: SyntheticGenerator) -> None:
    table = kaggle_gen.tables[2]
    top = table.rank_to_row[1:101]
    assert top.min() > 0 and top.max() > table.rank_to_row.size // 2  # not clustered at low ids


def test_teacher_ceiling_and_ctr(kaggle_gen: SyntheticGenerator, avazu_gen: SyntheticGenerator) -> None:
    for gen, ctr in ((kaggle_gen, 0.2562), (avazu_gen, 0.1698)):
        ceiling = gen.teacher_auc(rows=32768)
        block = gen.examples("eval", 0, 32768)
        assert block.labels is not None
        assert block.labels.mean() == pytest.approx(ctr, abs=0.015)
        random_auc = roc_auc(block.labels, np.random.default_rng(0).random(len(block)))
        assert ceiling > 0.7 and ceiling > random_auc + 0.15
        assert abs(random_auc - 0.5) < 0.03


def test_roc_auc_known_values() -> None:
    assert roc_auc(np.array([0, 0, 1, 1]), np.array([0.1, 0.2, 0.3, 0.4])) == 1.0
    assert roc_auc(np.array([0, 1]), np.array([0.5, 0.5])) == 0.5
    assert roc_auc(np.array([1, 0, 1, 0]), np.array([0.9, 0.8, 0.2, 0.1])) == 0.75


def test_determinism_and_random_access() -> None:
    cfg = DatasetConfig(scale=0.0005, seed=7)
    first, second = make_dataset(cfg), make_dataset(cfg)
    source = first.train(256, 10)
    assert isinstance(source, BatchSource) and len(source) == 10
    backwards = [second.train(256, 10)[i] for i in reversed(range(10))][::-1]
    for a, b in zip(source, backwards, strict=True):
        assert torch.equal(ids_matrix(a), ids_matrix(b))
        assert torch.equal(a.dense_features, b.dense_features) and torch.equal(a.labels, b.labels)
    other_seed = make_dataset(DatasetConfig(scale=0.0005, seed=8)).train(256, 1)[0]
    assert not torch.equal(ids_matrix(other_seed), ids_matrix(source[0]))
    eval_batch = first.eval(256, 1)[0]
    assert not torch.equal(ids_matrix(eval_batch), ids_matrix(source[0]))  # independent streams
    with pytest.raises(IndexError):
        source[10]


def test_batch_layout(kaggle_gen: SyntheticGenerator) -> None:
    ds = make_dataset(DatasetConfig(scale=0.001, seed=3))
    batch = ds.train(64, 1)[0]
    assert batch.dense_features.shape == (64, 13) and batch.labels.shape == (64,)
    assert batch.sparse_features.keys() == [f"cat_{i}" for i in range(26)]
    assert ds.schema.feature_names == tuple(f"cat_{i}" for i in range(26))
    np.testing.assert_array_equal(ids_matrix(batch).numpy(), kaggle_gen.examples("train", 0, 64).ids)


def test_hot_set_mode() -> None:
    gen = SyntheticGenerator(get_preset("criteo_kaggle"),
                             GeneratorConfig(scale=0.001, hot_set=(0.01, 0.9), skew_target=None))
    ids = gen.examples("train", 0, 20000).ids
    for f in (2, 6):  # C3 (Heaps) and C7 (finite)
        hot = set(gen.tables[f].rank_to_row[: int(np.ceil(0.01 * gen.table_sizes[f]))].tolist())
        in_hot = np.isin(ids[:, f], list(hot)).mean()
        assert in_hot == pytest.approx(0.9 + 0.1 * 0.01, abs=0.01)


def test_skew_report_on_known_stream() -> None:
    ids = np.zeros((1000, 2), dtype=np.int64)
    ids[:, 1] = np.arange(1000) % 100  # table 1: uniform over its 100 rows
    report = id_skew_report(ids, (1000, 100), ("a", "b"))
    assert report["skew_top0.1pct/a"] == 1.0  # one row takes everything
    assert report["skew_top1pct/b"] == pytest.approx(0.01)
    assert report["skew_top10pct/b"] == pytest.approx(0.10)
    # overall: 1100 rows, top 1% = 11 rows: row a0 (1000 lookups) + 10 rows of b (10 each)
    assert report["skew_top1pct"] == pytest.approx((1000 + 100) / 2000)


def test_describe_and_config_errors() -> None:
    summary = make_dataset(DatasetConfig(scale=0.0005)).describe()
    for key in ("skew_top0.1pct", "skew_top1pct", "skew_top10pct", "expected_skew_top1pct",
                "teacher_auc", "ctr", "bad_rows_skipped", "skew_top1pct/cat_2"):
        assert key in summary
    with pytest.raises(ValueError, match=r"unknown preset 'kagle'; valid presets: \['avazu'"):
        DatasetConfig(preset="kagle")
    with pytest.raises(ValueError, match=r"unknown dataset kind 'parquet'; valid kinds: \['synthetic'"):
        DatasetConfig(kind="parquet")
    with pytest.raises(ValueError, match="needs path="):
        DatasetConfig(kind="criteo_tsv")
    with pytest.raises(ValueError, match="needs preset in"):
        DatasetConfig(kind="avazu_csv", path="x.csv")
    with pytest.raises(ValueError, match="unknown mapping"):
        DatasetConfig(mapping="dict")
