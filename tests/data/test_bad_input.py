"""Malformed input raises ``DataFormatError`` naming the file and line; ``skip_bad_rows`` counts."""

from __future__ import annotations

import gzip
import threading
from pathlib import Path

import numpy as np
import pytest

from bagpipe.data import (
    DataFormatError,
    DatasetConfig,
    FileDataset,
    ReadStats,
    SyntheticGenerator,
    iter_avazu_csv,
    iter_criteo_tsv,
    iter_jsonl,
    make_dataset,
    write_avazu_csv,
    write_criteo_tsv,
    write_jsonl,
)
from bagpipe.data.readers import AVAZU_COLUMNS, DEFAULT_BLOCK_BYTES, avazu_header

NUM_ROWS = 400


@pytest.fixture()
def criteo_lines(tmp_path: Path, kaggle_gen: SyntheticGenerator) -> list[str]:
    path = tmp_path / "clean.txt"
    write_criteo_tsv(str(path), kaggle_gen.examples("train", 1, NUM_ROWS), kaggle_gen.table_sizes)
    return path.read_text().split("\n")[:-1]


def _corrupt(lines: list[str], line_number: int, field: int, value: str | None) -> list[str]:
    """Replace field ``field`` of (1-based) line ``line_number``; ``None`` drops the field."""
    out = list(lines)
    fields = out[line_number - 1].split("\t")
    if value is None:
        del fields[field]
    else:
        fields[field] = value
    out[line_number - 1] = "\t".join(fields)
    return out


CORRUPTIONS = {
    "wrong column count": (1, None, "expected 40 fields, got 39"),
    "non-integer dense": (5, "3.5", "int_4"),
    "bad hex": (20, "zz00ff00", "cat_6"),
    "bad label": (0, "2", "label"),
}


@pytest.mark.parametrize("case", sorted(CORRUPTIONS))
def test_criteo_bad_row_names_file_and_line(tmp_path: Path, criteo_lines: list[str], case: str) -> None:
    field, value, needle = CORRUPTIONS[case]
    line_number = 237
    path = tmp_path / "train.txt"
    path.write_text("\n".join(_corrupt(criteo_lines, line_number, field, value)) + "\n")
    with pytest.raises(DataFormatError) as err:
        for _ in iter_criteo_tsv(str(path), block_bytes=1 << 14):
            pass
    assert err.value.path == str(path) and err.value.line == line_number
    assert f"{path}:{line_number}" in str(err.value) and needle in str(err.value)


def test_criteo_skip_bad_rows_counts_and_drops(tmp_path: Path, criteo_lines: list[str]) -> None:
    lines = criteo_lines
    bad_lines = {3: (1, None), 50: (5, "x"), 120: (20, "0000000g"), 300: (0, "")}
    for line_number, (field, value) in bad_lines.items():
        lines = _corrupt(lines, line_number, field, value)
    path = tmp_path / "train.txt"
    path.write_text("\n".join(lines) + "\n")
    stats = ReadStats()
    blocks = list(iter_criteo_tsv(str(path), skip_bad_rows=True, stats=stats, block_bytes=1 << 14))
    assert stats.bad_rows == 4 and stats.rows == NUM_ROWS - 4
    assert sum(len(b) for b in blocks) == NUM_ROWS - 4
    ds = make_dataset(DatasetConfig(kind="criteo_tsv", path=str(path), skip_bad_rows=True))
    assert isinstance(ds, FileDataset) and ds.describe()["bad_rows_skipped"] == 4.0
    clean = tmp_path / "clean.txt"
    clean.write_text("\n".join(ln for i, ln in enumerate(criteo_lines, 1) if i not in bad_lines) + "\n")
    reference = make_dataset(DatasetConfig(kind="criteo_tsv", path=str(clean)))
    np.testing.assert_array_equal(ds.shards.take_ids(slice(None)),  # nothing partial kept
                                  reference.shards.take_ids(slice(None)))


def test_truncated_gzip_raises(tmp_path: Path, kaggle_gen: SyntheticGenerator) -> None:
    full = tmp_path / "day_0.gz"
    write_criteo_tsv(str(full), kaggle_gen.examples("train", 2, 3000), kaggle_gen.table_sizes)
    data = full.read_bytes()
    cut = tmp_path / "day_1.gz"
    cut.write_bytes(data[: len(data) * 2 // 3])
    for skip in (False, True):  # a truncated stream raises even when skipping bad rows
        with pytest.raises(DataFormatError, match=r"day_1\.gz:\d+: unreadable input"):
            for _ in iter_criteo_tsv(str(cut), skip_bad_rows=skip, block_bytes=1 << 14):
                pass


def test_avazu_bad_inputs(tmp_path: Path, avazu_gen: SyntheticGenerator) -> None:
    path = tmp_path / "train.csv"
    write_avazu_csv(str(path), avazu_gen.examples("train", 0, 50), avazu_gen.table_sizes)
    lines = path.read_text().split("\n")
    bad_header = tmp_path / "bad_header.csv"
    bad_header.write_text("\n".join(["id,click,hour", *lines[1:]]))
    with pytest.raises(DataFormatError, match=r"bad_header\.csv:1: not an Avazu header"):
        next(iter_avazu_csv(str(bad_header)))
    cases = {"site_id": (5, "xyz!", "site_id"), "id": (0, "-5", "id"), "C14": (16, "1e5", "C14"),
             "columns": (3, None, "expected 24 fields")}
    for name, (field, value, needle) in cases.items():
        rows = list(lines)
        fields = rows[10].split(",")  # line 11 of the file
        if value is None:
            del fields[field]
        else:
            fields[field] = value
        rows[10] = ",".join(fields)
        bad = tmp_path / f"bad_{name}.csv"
        bad.write_text("\n".join(rows))
        with pytest.raises(DataFormatError, match=rf"bad_{name}\.csv:11: .*{needle}"):
            list(iter_avazu_csv(str(bad)))
        stats = ReadStats()
        assert sum(len(b) for b in iter_avazu_csv(str(bad), skip_bad_rows=True, stats=stats)) == 49
        assert stats.bad_rows == 1


def test_jsonl_bad_inputs(tmp_path: Path, kaggle_gen: SyntheticGenerator) -> None:
    path = tmp_path / "part_0.txt"
    write_jsonl(str(path), kaggle_gen.examples("train", 0, 20))
    lines = path.read_text().split("\n")
    sizes = kaggle_gen.table_sizes
    too_big = '{"label": 1, "dense": ' + str([0.0] * 13) + ', "sparse": ' + str([sizes[0]] + [0] * 25) + "}"
    cases = {"json": "{not json", "fields": '{"label": 1}', "dense": lines[0].replace('"dense": [', '"dense": [1.0, '),
             "range": too_big, "label": lines[0].replace('"label": 0.0', '"label": 3').replace('"label": 1.0', '"label": 3')}
    for name, text in cases.items():
        rows = list(lines)
        rows[6] = text
        bad = tmp_path / f"bad_{name}.txt"
        bad.write_text("\n".join(rows))
        with pytest.raises(DataFormatError, match=rf"bad_{name}\.txt:7: "):
            list(iter_jsonl(str(bad), sizes))
        stats = ReadStats()
        assert sum(len(b) for b in iter_jsonl(str(bad), sizes, skip_bad_rows=True, stats=stats)) == 19
        assert stats.bad_rows == 1
    truncated = tmp_path / "part_1.txt.gz"
    truncated.write_bytes(gzip.compress(path.read_bytes())[:-30])
    with pytest.raises(DataFormatError, match=r"part_1\.txt\.gz: unreadable input"):
        list(iter_jsonl(str(truncated), sizes))


def test_criteo_checked_path_matches_fast_path(tmp_path: Path, criteo_lines: list[str]) -> None:
    """Cells the int64/fixed-width fast path must not take (padding, other hex widths, upper case)
    send their segment to the checked path: the same values as before, the same errors."""
    clean = tmp_path / "clean.txt"
    clean.write_text("\n".join(criteo_lines) + "\n")
    reference = np.concatenate([b.keys for b in iter_criteo_tsv(str(clean), block_bytes=1 << 14)])
    odd = _corrupt(_corrupt(criteo_lines, 30, 14, "00ABC"), 31, 15, "00000000000000ff")
    odd_path = tmp_path / "odd.txt"
    odd_path.write_text("\n".join(odd) + "\n")
    keys = np.concatenate([b.keys for b in iter_criteo_tsv(str(odd_path), block_bytes=1 << 14)])
    assert keys[29, 0] == 0xABC and keys[30, 1] == 0xFF
    np.testing.assert_array_equal(np.delete(keys, [29, 30], axis=0), np.delete(reference, [29, 30], axis=0))
    for value in (" 5", "5 "):  # the CSV int64 parser would trim them; the checked path refuses
        padded = tmp_path / "padded.txt"
        padded.write_text("\n".join(_corrupt(criteo_lines, 40, 3, value)) + "\n")
        with pytest.raises(DataFormatError, match=r"padded\.txt:40: integer feature int_2"):
            list(iter_criteo_tsv(str(padded), block_bytes=1 << 14))


def test_criteo_lines_count_blank_lines(tmp_path: Path, criteo_lines: list[str]) -> None:
    """pyarrow skips empty lines; errors still name the physical line (here after 3 blank ones)."""
    lines = [*criteo_lines[:100], "", "", "", *_corrupt(criteo_lines[100:], 50, 20, "zz00ff00")]
    path = tmp_path / "blank.txt"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataFormatError) as err:
        list(iter_criteo_tsv(str(path), block_bytes=1 << 14))
    assert err.value.line == 153 and "cat_6" in str(err.value)


def test_criteo_reader_threads_end_with_the_generator(tmp_path: Path, criteo_lines: list[str]) -> None:
    path = tmp_path / "train.txt"
    path.write_text("\n".join(criteo_lines) + "\n")
    blocks = iter_criteo_tsv(str(path), block_bytes=1 << 12)
    next(blocks)
    blocks.close()
    assert not [t for t in threading.enumerate() if t.name.startswith("bagpipe-read")]


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("[1, 2]", "expected an object with 'label', 'dense' and 'sparse'"),
        ('{"label": 2, "dense": [0, 0], "sparse": [0, 0]}', "label 2 is not 0/1"),
        ('{"label": 1, "dense": [true, 0.5], "sparse": [0, 0]}',
         "'dense' must be a list of 2 numbers"),
        ('{"label": 1, "dense": [0, 0], "sparse": 4}',
         "'sparse' must be 2 row ids within the table sizes (5, 3)"),
        ('{"label": 1, "dense": [0, 0], "sparse": [0, 3]}',
         "'sparse' must be 2 row ids within the table sizes (5, 3)"),
    ],
)
def test_each_bad_jsonl_record_says_what_is_wrong(tmp_path: Path, text: str, reason: str) -> None:
    good = '{"label": 0, "dense": [0.5, 1], "sparse": [4, 2]}'
    path = tmp_path / "small.jsonl"
    path.write_text(f"{good}\n{text}\n")
    with pytest.raises(DataFormatError) as error:
        list(iter_jsonl(str(path), (5, 3), num_dense=2))
    assert (error.value.line, error.value.reason) == (2, reason)
    path.write_text(f"{good}\n")
    (block,) = iter_jsonl(str(path), (5, 3), num_dense=2)  # no stats passed: counted aside
    assert block.ids.tolist() == [[4, 2]] and block.dense.tolist() == [[0.5, 1.0]]


def test_avazu_header_errors_name_the_file_at_line_one_with_both_headers(
    tmp_path: Path, avazu_gen: SyntheticGenerator
) -> None:
    path = tmp_path / "train.csv"
    write_avazu_csv(str(path), avazu_gen.examples("train", 0, 5), avazu_gen.table_sizes)
    lines = path.read_text().split("\n")
    crlf = tmp_path / "crlf.csv"
    crlf.write_bytes("\r\n".join(lines).encode())
    assert avazu_header(str(crlf)) == AVAZU_COLUMNS
    spaced = tmp_path / "spaced.csv"  # a stray space after the last column name
    spaced.write_text("\n".join([lines[0] + " ", *lines[1:]]))
    with pytest.raises(DataFormatError) as error:
        avazu_header(str(spaced))
    assert (error.value.path, error.value.line, error.value.reason) == (
        str(spaced), 1, f"not an Avazu header: {lines[0] + ' '!r}; expected "
        f"{','.join(AVAZU_COLUMNS)!r} (test files without 'click')")
    undecodable = tmp_path / "latin1.csv"
    undecodable.write_bytes(b"id,cl\xefck\n")
    with pytest.raises(DataFormatError, match="cannot read the header") as error:
        avazu_header(str(undecodable))
    assert (error.value.path, error.value.line) == (str(undecodable), 1)


def test_readers_hand_out_the_example_dtypes_and_count_every_skipped_row(
    tmp_path: Path, criteo_lines: list[str]
) -> None:
    good = '{"label": 0, "dense": [0.5, 1], "sparse": [4, 2]}'
    path = tmp_path / "small.jsonl"
    path.write_text(f"{good}\n[1]\n{good}\n{{bad\n{good}\n")
    stats = ReadStats()
    (block,) = iter_jsonl(str(path), (5, 3), num_dense=2, skip_bad_rows=True, stats=stats)
    assert (block.labels.dtype, block.dense.dtype, block.ids.dtype) == (np.int8, np.float32, np.int64)
    assert (len(block), stats.rows, stats.bad_rows) == (3, 3, 2)
    tsv = tmp_path / "train.txt"
    tsv.write_text("\n".join(criteo_lines) + "\n")
    assert {b.labels.dtype for b in iter_criteo_tsv(str(tsv), block_bytes=1 << 14)} == {np.dtype(np.int8)}


def _read_all(path: Path, **kwargs: object) -> list:
    return list(iter_criteo_tsv(str(path), **kwargs))  # type: ignore[arg-type]


def _error_of(path: Path, lines: list[str], **kwargs: object) -> DataFormatError:
    """The error reading ``lines`` as a Criteo file at ``path`` raises (16 KB segments unless
    ``kwargs`` say otherwise); lone surrogates in ``lines`` are written as the bytes they stand
    for, so a test can plant bytes that are not UTF-8."""
    path.write_bytes(("\n".join(lines) + "\n").encode("utf-8", "surrogateescape"))
    with pytest.raises(DataFormatError) as error:
        _read_all(path, **{"block_bytes": 1 << 14, **kwargs})
    return error.value


@pytest.mark.parametrize(("value", "reason"), [
    ("NA", "integer feature int_4 is not an integer: 'NA'"),  # pyarrow's default null markers are not missing values
    ("nan", "integer feature int_4 is not an integer: 'nan'"),
    ("9223372036854775808", "integer feature int_4 is not an integer: '9223372036854775808'"),  # int64 max + 1
    ("\u00ff5", "integer feature int_4 is not an integer: '\u00ff5'"),
])
def test_a_bad_cell_is_named_with_its_value(
    tmp_path: Path, criteo_lines: list[str], value: str, reason: str
) -> None:
    error = _error_of(tmp_path / "train.txt", _corrupt(criteo_lines, 40, 5, value))
    assert (error.line, error.reason) == (40, reason)


def test_an_undecodable_cell_is_named_with_replacement_characters(
    tmp_path: Path, criteo_lines: list[str]
) -> None:
    error = _error_of(tmp_path / "train.txt", _corrupt(criteo_lines, 40, 20, "z\udcff"))
    assert (error.line, error.reason) == (40, "categorical cat_6 is not hex: 'z\ufffd'")


def test_int64_bounds_are_values_on_the_checked_path(tmp_path: Path, criteo_lines: list[str]) -> None:
    lines = _corrupt(criteo_lines, 10, 3, "9223372036854775807")
    lines = _corrupt(lines, 11, 3, "-9223372036854775808")
    lines = _corrupt(lines, 12, 3, "x")  # sends the column to the cell-by-cell path
    path = tmp_path / "train.txt"
    path.write_text("\n".join(lines) + "\n")
    stats = ReadStats()
    (block,) = _read_all(path, skip_bad_rows=True, stats=stats)
    assert stats.bad_rows == 1
    assert block.dense_raw[9:11, 2].tolist() == [2**63 - 1, -(2**63)]


def test_errors_map_to_lines_past_pyarrows_own_block_size(
    tmp_path: Path, kaggle_gen: SyntheticGenerator
) -> None:
    """A segment of several MB (pyarrow's default block is 1 MB) still numbers its rows exactly."""
    path = tmp_path / "big.txt"
    write_criteo_tsv(str(path), kaggle_gen.examples("train", 5, 20_000), kaggle_gen.table_sizes)
    lines = path.read_text().split("\n")[:-1]
    assert 2 << 20 < len("\n".join(lines[:12_000])) < 4 << 20  # in the first 4 MB segment
    for field, value, reason in ((1, None, "expected 40 fields, got 39"),
                                 (20, "zz00ff00", "categorical cat_6 is not hex: 'zz00ff00'")):
        error = _error_of(tmp_path / "bad.txt", _corrupt(lines, 12_001, field, value),
                          block_bytes=DEFAULT_BLOCK_BYTES)
        assert (error.line, error.reason) == (12_001, reason)


def test_a_bad_value_just_before_a_short_row_is_named_first(
    tmp_path: Path, criteo_lines: list[str]
) -> None:
    lines = _corrupt(_corrupt(criteo_lines, 60, 20, "zz00ff00"), 61, 1, None)
    error = _error_of(tmp_path / "train.txt", lines)
    assert (error.line, error.reason) == (60, "categorical cat_6 is not hex: 'zz00ff00'")


def test_a_quote_is_data_not_a_quoted_field(tmp_path: Path, criteo_lines: list[str]) -> None:
    error = _error_of(tmp_path / "train.txt", _corrupt(criteo_lines, 30, 20, '"ab'))
    assert (error.line, error.reason) == (30, "categorical cat_6 is not hex: '\"ab'")


def test_skipping_bad_rows_keeps_every_field_of_the_others(
    tmp_path: Path, criteo_lines: list[str], avazu_gen: SyntheticGenerator
) -> None:
    clean, bad = tmp_path / "clean.txt", tmp_path / "bad.txt"
    clean.write_text("\n".join(criteo_lines[:9] + criteo_lines[10:]) + "\n")
    bad.write_text("\n".join(_corrupt(criteo_lines, 10, 20, "zz")) + "\n")
    (kept,), (expected,) = _read_all(bad, skip_bad_rows=True), _read_all(clean)
    for name in ("labels", "dense_raw", "dense_missing", "keys", "key_missing"):
        np.testing.assert_array_equal(getattr(kept, name), getattr(expected, name), err_msg=name)
    path = tmp_path / "train.csv"
    write_avazu_csv(str(path), avazu_gen.examples("train", 0, 30), avazu_gen.table_sizes)
    lines = path.read_text().split("\n")
    fields = lines[1].split(",")  # the first data row, line 2: right after the header
    fields[5] = "xyz!"
    (bad_csv := tmp_path / "bad.csv").write_text("\n".join([lines[0], ",".join(fields), *lines[2:]]))
    with pytest.raises(DataFormatError) as error:
        list(iter_avazu_csv(str(bad_csv)))
    assert error.value.line == 2 and "site_id" in error.value.reason
    (kept_csv,) = iter_avazu_csv(str(bad_csv), skip_bad_rows=True)
    (all_csv,) = iter_avazu_csv(str(path))
    for column in ("id", "hour"):
        np.testing.assert_array_equal(kept_csv.extra[column], all_csv.extra[column][1:])


def test_bytes_that_are_not_utf8_in_an_integer_column_fail_their_segment(
    tmp_path: Path, criteo_lines: list[str]
) -> None:
    """No row of such a segment can be trusted: the error names the segment's first line."""
    path = tmp_path / "train.txt"
    error = _error_of(path, _corrupt(criteo_lines, 40, 5, "\udcff5"))
    assert (error.path, error.line) == (str(path), 1)  # 16 KB segments: line 40 in the first
    assert error.reason.startswith("unreadable input (corrupt?): ")
    assert str(error).startswith(f"{path}:1: unreadable input")


def test_a_bad_value_just_after_a_short_row_keeps_its_own_line(
    tmp_path: Path, criteo_lines: list[str]
) -> None:
    """The short row is no row of the parsed table: the rows after it map to their own lines."""
    path = tmp_path / "train.txt"
    error = _error_of(path, _corrupt(_corrupt(criteo_lines, 62, 20, "zz00ff00"), 61, 1, None))
    assert (error.line, error.reason) == (61, "expected 40 fields, got 39")
    stats = ReadStats()
    assert sum(len(b) for b in _read_all(path, skip_bad_rows=True, stats=stats)) == NUM_ROWS - 2


def test_an_unlabelled_file_skips_its_bad_rows_too(tmp_path: Path, criteo_lines: list[str]) -> None:
    unlabelled = [line.split("\t", 1)[1] for line in criteo_lines]  # Kaggle's test.txt: 39 fields
    fields = unlabelled[20].split("\t")
    fields[19] = "zz"
    unlabelled[20] = "\t".join(fields)
    path = tmp_path / "test.txt"
    path.write_text("\n".join(unlabelled) + "\n")
    stats = ReadStats()
    blocks = _read_all(path, has_label=False, skip_bad_rows=True, stats=stats)
    assert [b.labels for b in blocks] == [None] and (stats.rows, stats.bad_rows) == (NUM_ROWS - 1, 1)
