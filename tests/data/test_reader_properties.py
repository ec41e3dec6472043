"""Readers against files the tests write by hand (hypothesis): every row comes back as written,
empty fields as missing, plain and ``.gz``, in segments of any size; and the error paths name the
exact line: a bad row inside a ``.gz``, a truncated stream (the first line not handed out), a bad
JSON line, skipped rows counted.

The expected values are the rows the test drew, formatted here by ``str``/``format``: neither the
package's writers nor its codec take part.
"""

from __future__ import annotations

import gzip
import json
import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bagpipe.data import DataFormatError, ReadStats, iter_avazu_csv, iter_criteo_tsv, iter_jsonl
from bagpipe.data.presets import AVAZU_FIELDS, AVAZU_HEX_FIELDS
from bagpipe.data.readers import RawBlock

PROPERTY = settings(max_examples=25, deadline=None, derandomize=True, database=None)

dense_value = st.none() | st.integers(0, 2**40)
hex_key = st.none() | st.integers(0, 2**32 - 1)
criteo_row = st.tuples(st.integers(0, 1), st.lists(dense_value, min_size=13, max_size=13),
                       st.lists(hex_key, min_size=26, max_size=26))
Row = tuple[int, list[int | None], list[int | None]]


def _criteo_line(row: Row) -> str:
    label, dense, keys = row
    return "\t".join([str(label), *("" if v is None else str(v) for v in dense),
                      *("" if k is None else format(k, "08x") for k in keys)])


def _write(path: Path, text: str) -> None:
    """``text`` to ``path``, gzipped if its name ends in ``.gz``."""
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)


def _concat(blocks: list[RawBlock]) -> RawBlock:
    assert blocks
    return RawBlock(
        None if blocks[0].labels is None else np.concatenate([b.labels for b in blocks]),
        np.concatenate([b.dense_raw for b in blocks]),
        np.concatenate([b.dense_missing for b in blocks]),
        np.concatenate([b.keys for b in blocks]),
        np.concatenate([b.key_missing for b in blocks]),
        {k: np.concatenate([b.extra[k] for b in blocks]) for k in blocks[0].extra},
    )


def _values(column: list[int | None]) -> tuple[list[int], list[bool]]:
    return [0 if v is None else v for v in column], [v is None for v in column]


@PROPERTY
@given(rows=st.lists(criteo_row, min_size=1, max_size=30), gz=st.booleans(),
       block_bytes=st.sampled_from([64, 300, 1 << 16]))
def test_criteo_rows_come_back_as_written(
    tmp_path_factory: pytest.TempPathFactory, rows: list[Row], gz: bool, block_bytes: int
) -> None:
    path = tmp_path_factory.mktemp("criteo") / ("day_0.gz" if gz else "day_0")
    _write(path, "".join(_criteo_line(row) + "\n" for row in rows))
    stats = ReadStats()
    read = _concat(list(iter_criteo_tsv(str(path), block_bytes=block_bytes, stats=stats)))
    assert read.labels is not None and read.labels.tolist() == [label for label, _, _ in rows]
    dense, dense_missing = zip(*(_values(d) for _, d, _ in rows), strict=True)
    keys, key_missing = zip(*(_values(k) for _, _, k in rows), strict=True)
    assert read.dense_raw.tolist() == list(dense)
    assert read.dense_missing.tolist() == list(dense_missing)
    assert read.keys.tolist() == list(keys)
    assert read.key_missing.tolist() == list(key_missing)
    assert (stats.rows, stats.bad_rows) == (len(rows), 0)


avazu_row = st.tuples(
    st.integers(0, 2**64 - 1), st.integers(0, 1), st.integers(14102100, 14103023),
    st.lists(st.none() | st.integers(0, 2**31 - 1), min_size=len(AVAZU_FIELDS),
             max_size=len(AVAZU_FIELDS)),
)


@PROPERTY
@given(rows=st.lists(avazu_row, min_size=1, max_size=20), gz=st.booleans(),
       block_bytes=st.sampled_from([200, 1 << 16]))
def test_avazu_rows_come_back_as_written(
    tmp_path_factory: pytest.TempPathFactory,
    rows: list[tuple[int, int, int, list[int | None]]], gz: bool, block_bytes: int,
) -> None:
    def cell(name: str, value: int | None) -> str:
        if value is None:
            return ""
        return format(value, "08x") if name in AVAZU_HEX_FIELDS else str(value)

    header = ",".join(["id", "click", "hour", *AVAZU_FIELDS])
    lines = [",".join([str(i), str(click), str(hour),
                       *(cell(n, v) for n, v in zip(AVAZU_FIELDS, fields, strict=True))])
             for i, click, hour, fields in rows]
    path = tmp_path_factory.mktemp("avazu") / ("train.csv.gz" if gz else "train.csv")
    _write(path, "\n".join([header, *lines]) + "\n")
    read = _concat(list(iter_avazu_csv(str(path), block_bytes=block_bytes)))
    assert read.extra["id"].tolist() == [i for i, _, _, _ in rows]
    assert read.labels is not None and read.labels.tolist() == [c for _, c, _, _ in rows]
    assert read.extra["hour"].tolist() == [h for _, _, h, _ in rows]
    keys, missing = zip(*(_values(fields) for _, _, _, fields in rows), strict=True)
    assert read.keys.tolist() == list(keys) and read.key_missing.tolist() == list(missing)
    assert read.dense_raw.shape == (len(rows), 0)


json_row = st.tuples(st.integers(0, 1), st.lists(st.floats(-1e3, 1e3, width=32), min_size=3,
                                                 max_size=3),
                     st.tuples(st.integers(0, 4), st.integers(0, 9)))


@PROPERTY
@given(rows=st.lists(json_row, min_size=1, max_size=20), gz=st.booleans(),
       chunk_rows=st.integers(1, 8), blank_after=st.integers(0, 20))
def test_jsonl_rows_come_back_as_written(
    tmp_path_factory: pytest.TempPathFactory,
    rows: list[tuple[int, list[float], tuple[int, int]]], gz: bool, chunk_rows: int,
    blank_after: int,
) -> None:
    lines = [json.dumps({"label": label, "dense": dense, "sparse": list(sparse)})
             for label, dense, sparse in rows]
    lines.insert(min(blank_after, len(lines)), "")  # blank lines are skipped
    path = tmp_path_factory.mktemp("jsonl") / ("part.txt.gz" if gz else "part.txt")
    _write(path, "\n".join(lines) + "\n")
    stats = ReadStats()
    blocks = list(iter_jsonl(str(path), (5, 10), num_dense=3, chunk_rows=chunk_rows, stats=stats))
    assert [len(b) for b in blocks[:-1]] == [chunk_rows] * (len(blocks) - 1)
    assert blocks[0].labels is not None
    assert np.concatenate([b.labels for b in blocks]).tolist() == [r[0] for r in rows]
    assert np.concatenate([b.dense for b in blocks]).tolist() == [r[1] for r in rows]
    assert np.concatenate([b.ids for b in blocks]).tolist() == [list(r[2]) for r in rows]
    assert (stats.rows, stats.bad_rows) == (len(rows), 0)


def _clean_rows(count: int) -> list[str]:
    """``count`` valid Criteo lines, each different."""
    return [_criteo_line((n % 2, [n, *([None] * 11), 7], [n, *range(25)])) for n in range(count)]


@pytest.mark.parametrize("block_bytes", [1 << 10, 1 << 14])
def test_bad_row_inside_a_gz_names_its_line(tmp_path: Path, block_bytes: int) -> None:
    lines = _clean_rows(300)
    lines[212] = lines[212].replace("\t", "\tx", 1)  # line 213: the first dense value is "x0..."
    path = tmp_path / "day_3.gz"
    _write(path, "\n".join(lines) + "\n")
    with pytest.raises(DataFormatError) as err:
        list(iter_criteo_tsv(str(path), block_bytes=block_bytes))
    assert (err.value.path, err.value.line) == (str(path), 213)
    assert "int_0" in str(err.value)
    stats = ReadStats()
    kept = list(iter_criteo_tsv(str(path), skip_bad_rows=True, stats=stats, block_bytes=block_bytes))
    assert (stats.rows, stats.bad_rows) == (299, 1)
    assert np.concatenate([b.dense_raw[:, 0] for b in kept]).tolist() == [
        n for n in range(300) if n != 212
    ]


def _truncated_gzip(text: str, keep: float) -> bytes:
    """A gzip member of ``text`` cut after ``keep`` of its compressed bytes (no trailer)."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, 31)
    data = compressor.compress(text.encode()) + compressor.flush()
    return data[: int(len(data) * keep)]


@pytest.mark.parametrize("keep", [0.3, 0.7])
def test_truncated_gz_names_the_first_line_not_handed_out(tmp_path: Path, keep: float) -> None:
    lines = _clean_rows(2000)
    path = tmp_path / "day_9.gz"
    path.write_bytes(_truncated_gzip("\n".join(lines) + "\n", keep))
    handed_out = 0
    with pytest.raises(DataFormatError) as err:
        for block in iter_criteo_tsv(str(path), block_bytes=1 << 12):
            assert block.dense_raw[:, 0].tolist() == list(range(handed_out, handed_out + len(block)))
            handed_out += len(block)
    assert 0 < handed_out < 2000
    assert err.value.line == handed_out + 1
    assert f"day_9.gz:{handed_out + 1}: unreadable input" in str(err.value)


def test_jsonl_bad_line_inside_a_gz_names_its_line_and_skipping_counts_it(tmp_path: Path) -> None:
    good = json.dumps({"label": 1, "dense": [0.5, 1.0, 2.0], "sparse": [1, 2]})
    lines = [good] * 9
    lines[6] = json.dumps({"label": 1, "dense": [0.5, 1.0, 2.0], "sparse": [1, 10]})  # 10 >= 10
    path = tmp_path / "part.txt.gz"
    _write(path, "\n".join(lines) + "\n")
    with pytest.raises(DataFormatError) as err:
        list(iter_jsonl(str(path), (5, 10), num_dense=3))
    assert err.value.line == 7 and "'sparse' must be 2 row ids" in str(err.value)
    stats = ReadStats()
    kept = list(iter_jsonl(str(path), (5, 10), num_dense=3, skip_bad_rows=True, stats=stats))
    assert (stats.rows, stats.bad_rows) == (8, 1) and sum(len(b) for b in kept) == 8
