"""Generator -> writer -> reader recovers the same ids, dense values and labels, in every format."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np

from bagpipe.data import (
    DatasetConfig,
    FileDataset,
    SyntheticGenerator,
    iter_avazu_csv,
    iter_criteo_tsv,
    make_dataset,
    write_avazu_csv,
    write_criteo_tsv,
    write_jsonl,
)
from bagpipe.data.examples import Examples
from bagpipe.data.writers import avazu_hours, avazu_ids


def _gen_rows(gen: SyntheticGenerator, n: int) -> Examples:
    return gen.examples("train", 0, n)


def _prepared(ds: object) -> Examples:
    """Every prepared row of a file dataset, in file order."""
    assert isinstance(ds, FileDataset)
    return ds.shards.take(slice(None))


def _assert_same(read: Examples, written: Examples) -> None:
    np.testing.assert_array_equal(read.ids, written.ids)
    np.testing.assert_array_equal(read.labels, written.labels)
    np.testing.assert_array_equal(read.dense, written.dense)


def test_criteo_tsv_line_format(tmp_path: Path, kaggle_gen: SyntheticGenerator) -> None:
    rows = _gen_rows(kaggle_gen, 50)
    path = tmp_path / "train.txt"
    write_criteo_tsv(str(path), rows, kaggle_gen.table_sizes)
    lines = path.read_text().split("\n")
    assert lines[-1] == "" and len(lines) == 51
    for i, line in enumerate(lines[:-1]):
        fields = line.split("\t")
        assert len(fields) == 40
        assert fields[0] == str(rows.labels[i])
        for j in range(13):
            want = "" if rows.dense_missing[i, j] else str(rows.dense_raw[i, j])
            assert fields[1 + j] == want
        for f in range(26):
            value = fields[14 + f]
            if rows.ids[i, f] == 0:
                assert value == ""
            else:
                assert len(value) == 8 and int(value, 16) >= 0 and value == value.lower()


def test_criteo_tsv_roundtrip_plain_and_gz(tmp_path: Path, kaggle_gen: SyntheticGenerator) -> None:
    rows = _gen_rows(kaggle_gen, 3000)
    for name in ("day_0", "day_1.gz"):
        path = str(tmp_path / name)
        write_criteo_tsv(path, rows, kaggle_gen.table_sizes)
        blocks = list(iter_criteo_tsv(path, block_bytes=1 << 16))
        assert len(blocks) > 1  # really chunked
        raw = np.concatenate([b.dense_raw for b in blocks])
        np.testing.assert_array_equal(raw, rows.dense_raw)
        np.testing.assert_array_equal(np.concatenate([b.dense_missing for b in blocks]), rows.dense_missing)
    with gzip.open(tmp_path / "day_1.gz", "rt") as handle:
        assert handle.read() == (tmp_path / "day_0").read_text()


def test_criteo_dataset_hash_mod_recovers_generator_ids(tmp_path: Path, kaggle_gen: SyntheticGenerator) -> None:
    rows = _gen_rows(kaggle_gen, 1400)
    path = str(tmp_path / "train.txt")
    write_criteo_tsv(path, rows, kaggle_gen.table_sizes)
    ds = make_dataset(DatasetConfig(kind="criteo_tsv", path=path, scale=0.001))
    assert ds.schema.table_sizes == kaggle_gen.table_sizes
    _assert_same(_prepared(ds), rows)
    # last 1/7 is eval, in file order
    assert len(ds.eval(100)) == 2 and len(ds.train(100)) == 12
    batch = ds.eval(100)[0]
    np.testing.assert_array_equal(batch.labels.numpy(), rows.labels[1200:1300])


def test_criteo_test_file_without_label(tmp_path: Path, kaggle_gen: SyntheticGenerator) -> None:
    rows = _gen_rows(kaggle_gen, 100)
    path = str(tmp_path / "test.txt")
    write_criteo_tsv(path, rows, kaggle_gen.table_sizes, with_label=False)
    assert len(Path(path).read_text().split("\n")[0].split("\t")) == 39
    blocks = list(iter_criteo_tsv(path, has_label=False))
    assert blocks[0].labels is None
    np.testing.assert_array_equal(blocks[0].dense_raw, rows.dense_raw)


def test_vocab_mapping_is_a_bijection_of_generator_ids(tmp_path: Path, kaggle_gen: SyntheticGenerator) -> None:
    rows = _gen_rows(kaggle_gen, 2000)
    path = str(tmp_path / "train.txt")
    write_criteo_tsv(path, rows, kaggle_gen.table_sizes)
    ds = make_dataset(DatasetConfig(kind="criteo_tsv", path=path, mapping="vocab"))
    read = _prepared(ds).ids
    for f in range(26):
        pairs = np.unique(np.stack([rows.ids[:, f], read[:, f]], 1), axis=0)
        distinct = np.unique(rows.ids[:, f])
        assert len(pairs) == len(distinct) == len(np.unique(read[:, f]))  # one-to-one
        assert ds.schema.table_sizes[f] == len(distinct[distinct > 0]) + 1
        np.testing.assert_array_equal(read[:, f] == 0, rows.ids[:, f] == 0)  # missing stays row 0


def test_avazu_roundtrip(tmp_path: Path, avazu_gen: SyntheticGenerator) -> None:
    rows = _gen_rows(avazu_gen, 1400)
    path = str(tmp_path / "train.csv.gz")
    write_avazu_csv(path, rows, avazu_gen.table_sizes, seed=5)
    with gzip.open(path, "rt") as handle:
        header, first = handle.readline().rstrip("\n"), handle.readline().rstrip("\n").split(",")
    assert header.split(",")[:3] == ["id", "click", "hour"] and len(header.split(",")) == 24
    assert len(first[0]) == 20 and int(first[0]) > 2**63 - 1
    assert first[2] == "14102100" and len(first[5]) == 8  # hour, site_id hex
    blocks = list(iter_avazu_csv(path))
    np.testing.assert_array_equal(np.concatenate([b.extra["id"] for b in blocks]), avazu_ids(1400, 5))
    hours = np.concatenate([b.extra["hour"] for b in blocks])
    np.testing.assert_array_equal(hours, avazu_hours(1400))
    assert hours[-1] == 14103023  # 240 hours: Oct 21 00h .. Oct 30 23h
    ds = make_dataset(DatasetConfig(kind="avazu_csv", preset="avazu", path=path))
    assert ds.schema.num_dense == 0 and ds.schema.num_tables == 21
    _assert_same(_prepared(ds), rows)


def test_avazu_test_file_has_no_click(tmp_path: Path, avazu_gen: SyntheticGenerator) -> None:
    rows = _gen_rows(avazu_gen, 10)
    path = str(tmp_path / "test.csv")
    write_avazu_csv(path, rows, avazu_gen.table_sizes, with_label=False)
    assert "click" not in Path(path).read_text().split("\n")[0]
    assert next(iter_avazu_csv(path)).labels is None


def test_jsonl_roundtrip(tmp_path: Path, kaggle_gen: SyntheticGenerator) -> None:
    rows = _gen_rows(kaggle_gen, 700)
    path = str(tmp_path / "part_0.txt")
    write_jsonl(path, rows)
    ds = make_dataset(DatasetConfig(kind="jsonl", path=path))
    _assert_same(_prepared(ds), rows)


def test_terabyte_day_glob(tmp_path: Path) -> None:
    ds_syn = make_dataset(DatasetConfig(preset="criteo_terabyte", scale=1e-5, skew_target=None))
    sizes = ds_syn.schema.table_sizes
    days = [ds_syn.generator.examples("train", d, 300) for d in range(2)]
    for d, rows in enumerate(days):
        write_criteo_tsv(str(tmp_path / f"day_{d}.gz"), rows, sizes)
    ds = make_dataset(DatasetConfig(kind="criteo_tsv", preset="criteo_terabyte", scale=1e-5,
                                    path=str(tmp_path / "day_*.gz")))
    np.testing.assert_array_equal(_prepared(ds).ids, np.concatenate([r.ids for r in days]))
