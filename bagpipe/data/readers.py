"""Streaming, chunked readers for Criteo (Kaggle ``train.txt``/``test.txt``, Terabyte ``day_N``
plain or ``.gz``), Avazu CSV and Bagpipe's JSON lines.

The text readers run on pyarrow's streaming CSV reader (``open_csv``, one block of ``block_bytes``
at a time, never the whole file), read every column as a string and validate it with vectorised
checks, so a bad cell is found without per-cell Python and mapped back to its physical line:

* wrong column count -> pyarrow's ``invalid_row_handler`` (the threaded reader does not number
  rows, so the error path rescans the file for the line);
* a non-integer dense value or label, bad hex, a truncated compressed stream -> our checks.

By default a malformed row raises ``DataFormatError`` naming the file and line, before any row of its
chunk is handed out. With ``skip_bad_rows=True`` such rows are dropped and counted in
``ReadStats.bad_rows``; nothing partial is ever used. A truncated stream always raises (its tail
is unknowable).

Readers yield ``RawBlock``s: categorical values as integer *keys* (see ``codec``) that a mapper turns
into table rows (hash-mod or vocabulary, ``bagpipe.data.files``).
"""

from __future__ import annotations

import gzip
import io
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyarrow import csv as pa_csv

from bagpipe.data.codec import parse_hex
from bagpipe.data.errors import DataFormatError
from bagpipe.data.examples import Examples
from bagpipe.data.presets import AVAZU_FIELDS, AVAZU_HEX_FIELDS

CRITEO_NUM_DENSE = 13
CRITEO_NUM_CATEGORICAL = 26
AVAZU_COLUMNS = ("id", "click", "hour", *AVAZU_FIELDS)
DEFAULT_BLOCK_BYTES = 1 << 24  # ~60k Criteo rows per chunk


@dataclass
class ReadStats:
    """What a reader saw: rows kept and malformed rows skipped (``skip_bad_rows=True``)."""

    rows: int = 0
    bad_rows: int = 0


@dataclass(frozen=True)
class RawBlock:
    """Parsed rows before the categorical mapping.

    ``keys``/``key_missing`` are ``[N, F]``; ``extra`` holds format-specific columns (Avazu ``id``
    as uint64 and ``hour`` as int64).
    """

    labels: np.ndarray | None
    dense_raw: np.ndarray
    dense_missing: np.ndarray
    keys: np.ndarray
    key_missing: np.ndarray
    extra: dict[str, np.ndarray] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.keys.shape[0])


def _parse_ints(
    column: pa.Array, dtype: pa.DataType | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Decimal strings -> ``(values, missing, bad)`` (int64 unless ``dtype``); empty = missing (0)."""
    dtype = dtype if dtype is not None else pa.int64()
    missing = column.is_null().to_numpy(zero_copy_only=False)
    try:
        values = pc.cast(column, dtype).fill_null(0).to_numpy(zero_copy_only=False)
        return values, missing, np.zeros(len(column), dtype=bool)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        pass
    # error path only: find the offending cells one by one
    bad = np.zeros(len(column), dtype=bool)
    values = np.zeros(len(column), dtype=dtype.to_pandas_dtype())
    info = np.iinfo(values.dtype)
    for i, text in enumerate(column.to_pylist()):
        if text is None:
            continue
        try:
            number = int(text, 10)
        except ValueError:
            bad[i] = True
            continue
        if info.min <= number <= info.max and text.strip() == text:
            values[i] = number
        else:
            bad[i] = True
    return values, missing, bad


class _RowChecker:
    """Collects per-row problems of one chunk and either raises or drops the rows."""

    def __init__(self, path: str, first_line: int, num_rows: int) -> None:
        self.path = path
        self.first_line = first_line
        self.bad = np.zeros(num_rows, dtype=bool)
        self.reasons: list[tuple[int, str]] = []

    def flag(self, bad: np.ndarray, what: str, column: pa.Array) -> None:
        if bad.any():
            row = int(np.argmax(bad))
            self.reasons.append((row, f"{what} {column[row].as_py()!r}"))
            self.bad |= bad

    def finish(self, skip: bool, stats: ReadStats) -> np.ndarray | None:
        """Row mask to keep (``None`` = all); raises on the first bad row unless skipping."""
        if not self.bad.any():
            return None
        if not skip:
            row, reason = min(self.reasons)
            raise DataFormatError(self.path, self.first_line + row, reason)
        stats.bad_rows += int(self.bad.sum())
        return ~self.bad


def _iter_batches(
    path: str,
    column_names: Sequence[str],
    delimiter: str,
    skip_header: bool,
    block_bytes: int,
    skip_bad_rows: bool,
    stats: ReadStats,
) -> Iterator[tuple[int, pa.RecordBatch]]:
    """``(first_line, batch)`` of all-string columns; column-count errors raise or are counted."""
    bad_lines: list[tuple[int | None, str]] = []

    def on_invalid(row: pa_csv.InvalidRow) -> str:
        bad_lines.append((row.number, f"expected {row.expected_columns} fields, got {row.actual_columns}"))
        return "skip"

    next_line = 2 if skip_header else 1
    try:
        reader = pa_csv.open_csv(
            path,
            read_options=pa_csv.ReadOptions(column_names=list(column_names), block_size=block_bytes,
                                            skip_rows=1 if skip_header else 0, use_threads=True),
            parse_options=pa_csv.ParseOptions(delimiter=delimiter, quote_char=False,
                                              invalid_row_handler=on_invalid),
            convert_options=pa_csv.ConvertOptions(column_types=dict.fromkeys(column_names, pa.string()),
                                                  strings_can_be_null=True, null_values=[""]),
        )
    except (OSError, pa.ArrowInvalid) as err:
        raise DataFormatError(path, next_line, f"unreadable input (truncated or corrupt?): {err}") from err
    while True:
        try:
            batch = reader.read_next_batch()
        except StopIteration:
            break
        except (OSError, pa.ArrowInvalid) as err:
            raise DataFormatError(path, next_line + len(bad_lines),
                                  f"unreadable input (truncated or corrupt?): {err}") from err
        if bad_lines:
            if not skip_bad_rows:
                numbered = [(line, reason) for line, reason in bad_lines if line is not None]
                line, reason = min(numbered) if numbered else (
                    _first_line_with_wrong_width(path, delimiter, len(column_names)), bad_lines[0][1])
                raise DataFormatError(path, line, reason)
            stats.bad_rows += len(bad_lines)
            bad_lines.clear()
        yield next_line, batch
        next_line += batch.num_rows


def _first_line_with_wrong_width(path: str, delimiter: str, num_fields: int) -> int | None:
    """Error path only: pyarrow's threaded reader does not number invalid rows, so scan for it."""
    with _open_text(path) as handle:
        for number, text in enumerate(handle, start=1):
            if text.rstrip("\r\n").count(delimiter) != num_fields - 1:
                return number
    return None


def _keep(block: RawBlock, keep: np.ndarray | None) -> RawBlock:
    if keep is None:
        return block
    return RawBlock(
        None if block.labels is None else block.labels[keep],
        block.dense_raw[keep], block.dense_missing[keep], block.keys[keep], block.key_missing[keep],
        {k: v[keep] for k, v in block.extra.items()},
    )


def _parse_label(batch: pa.RecordBatch, name: str, checker: _RowChecker) -> np.ndarray:
    column = batch.column(name)
    values, missing, bad = _parse_ints(column)
    checker.flag(bad | missing | ((values != 0) & (values != 1)), f"label {name} is not 0/1:", column)
    return values.astype(np.int8)


def iter_criteo_tsv(
    path: str,
    *,
    has_label: bool = True,
    skip_bad_rows: bool = False,
    stats: ReadStats | None = None,
    block_bytes: int = DEFAULT_BLOCK_BYTES,
) -> Iterator[RawBlock]:
    """Criteo TSV (Kaggle or Terabyte): ``label``, 13 integers, 26 hex categoricals; empty = missing.

    ``has_label=False`` reads Kaggle's ``test.txt`` (39 fields). A ``.gz`` path is decompressed.
    """
    stats = stats if stats is not None else ReadStats()
    dense_names = [f"int_{i}" for i in range(CRITEO_NUM_DENSE)]
    cat_names = [f"cat_{i}" for i in range(CRITEO_NUM_CATEGORICAL)]
    names = (["label"] if has_label else []) + dense_names + cat_names
    for first_line, batch in _iter_batches(path, names, "\t", False, block_bytes, skip_bad_rows, stats):
        n = batch.num_rows
        checker = _RowChecker(path, first_line, n)
        labels = _parse_label(batch, "label", checker) if has_label else None
        dense = np.empty((n, CRITEO_NUM_DENSE), dtype=np.int64)
        dense_missing = np.empty((n, CRITEO_NUM_DENSE), dtype=bool)
        for j, name in enumerate(dense_names):
            column = batch.column(name)
            dense[:, j], dense_missing[:, j], bad = _parse_ints(column)
            checker.flag(bad, f"integer feature {name} is not an integer:", column)
        keys = np.empty((n, CRITEO_NUM_CATEGORICAL), dtype=np.uint64)
        key_missing = np.empty((n, CRITEO_NUM_CATEGORICAL), dtype=bool)
        for f, name in enumerate(cat_names):
            column = batch.column(name)
            keys[:, f], key_missing[:, f], bad = parse_hex(column)
            checker.flag(bad, f"categorical {name} is not hex:", column)
        keep = checker.finish(skip_bad_rows, stats)
        block = _keep(RawBlock(labels, dense, dense_missing, keys, key_missing), keep)
        stats.rows += len(block)
        yield block


def _open_text(path: str) -> io.TextIOBase:
    if path.endswith(".gz"):
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8")
    return open(path, encoding="utf-8")


def avazu_header(path: str) -> tuple[str, ...]:
    """The header of an Avazu file: the 24 train columns, or the 23 test columns (no ``click``)."""
    try:
        with _open_text(path) as handle:
            header = tuple(handle.readline().rstrip("\r\n").split(","))
    except (OSError, EOFError, UnicodeDecodeError) as err:
        raise DataFormatError(path, 1, f"cannot read the header: {err}") from err
    test_columns = tuple(c for c in AVAZU_COLUMNS if c != "click")
    if header not in (AVAZU_COLUMNS, test_columns):
        raise DataFormatError(path, 1, f"not an Avazu header: {','.join(header)!r}; expected "
                              f"{','.join(AVAZU_COLUMNS)!r} (test files without 'click')")
    return header


def iter_avazu_csv(
    path: str,
    *,
    skip_bad_rows: bool = False,
    stats: ReadStats | None = None,
    block_bytes: int = DEFAULT_BLOCK_BYTES,
) -> Iterator[RawBlock]:
    """Avazu CSV with header. The 21 categorical fields become keys (hex fields parsed as hex,
    integer fields as integers); ``id`` (uint64, may exceed int64) and ``hour`` (YYMMDDHH) go to
    ``extra``. Avazu has no dense features (``dense_raw`` is ``[N, 0]``)."""
    stats = stats if stats is not None else ReadStats()
    header = avazu_header(path)
    has_label = "click" in header
    for first_line, batch in _iter_batches(path, header, ",", True, block_bytes, skip_bad_rows, stats):
        n = batch.num_rows
        checker = _RowChecker(path, first_line, n)
        labels = _parse_label(batch, "click", checker) if has_label else None
        ids, id_missing, bad = _parse_ints(batch.column("id"), pa.uint64())
        checker.flag(bad | id_missing, "id is not an unsigned 64-bit integer:", batch.column("id"))
        hours, hour_missing, bad = _parse_ints(batch.column("hour"))
        checker.flag(bad | hour_missing, "hour is not YYMMDDHH:", batch.column("hour"))
        keys = np.empty((n, len(AVAZU_FIELDS)), dtype=np.uint64)
        key_missing = np.empty((n, len(AVAZU_FIELDS)), dtype=bool)
        for f, name in enumerate(AVAZU_FIELDS):
            column = batch.column(name)
            if name in AVAZU_HEX_FIELDS:
                keys[:, f], key_missing[:, f], bad = parse_hex(column)
                checker.flag(bad, f"field {name} is not hex:", column)
            else:
                values, key_missing[:, f], bad = _parse_ints(column)
                keys[:, f] = values.view(np.uint64)
                checker.flag(bad, f"field {name} is not an integer:", column)
        keep = checker.finish(skip_bad_rows, stats)
        empty = np.zeros((n, 0), dtype=np.int64)
        block = RawBlock(labels, empty, empty.astype(bool), keys, key_missing,
                         {"id": ids.astype(np.uint64), "hour": hours})
        block = _keep(block, keep)
        stats.rows += len(block)
        yield block


def _jsonl_record(text: str, num_dense: int, table_sizes: Sequence[int]) -> tuple[float, list, list]:
    """Validate one Bagpipe JSON line; raises ``ValueError`` with the reason."""
    record = json.loads(text)
    if not isinstance(record, dict) or not {"label", "dense", "sparse"} <= record.keys():
        raise ValueError("expected an object with 'label', 'dense' and 'sparse'")
    label, dense, sparse = record["label"], record["dense"], record["sparse"]
    if label not in (0, 1):
        raise ValueError(f"label {label!r} is not 0/1")
    if not isinstance(dense, list) or len(dense) != num_dense or not all(
        isinstance(x, int | float) and not isinstance(x, bool) for x in dense
    ):
        raise ValueError(f"'dense' must be a list of {num_dense} numbers")
    if not isinstance(sparse, list) or len(sparse) != len(table_sizes) or not all(
        isinstance(x, int) and not isinstance(x, bool) and 0 <= x < d for x, d in zip(sparse, table_sizes, strict=True)
    ):
        raise ValueError(f"'sparse' must be {len(table_sizes)} row ids within the table sizes {tuple(table_sizes)}")
    return label, dense, sparse


def iter_jsonl(
    path: str,
    table_sizes: Sequence[int],
    *,
    num_dense: int = CRITEO_NUM_DENSE,
    skip_bad_rows: bool = False,
    stats: ReadStats | None = None,
    chunk_rows: int = 65536,
) -> Iterator[Examples]:
    """Bagpipe JSON lines ``{"label", "dense": [log1p'd floats], "sparse": [row ids]}``.

    Ids are already table rows (DLRM contiguous ids), so they are checked against ``table_sizes``
    and used as they are; dense values are already transformed. Parsed line by line (JSON has no
    vectorised reader that names lines); this format is for Bagpipe's small samples and fixtures.
    """
    stats = stats if stats is not None else ReadStats()
    labels: list[float] = []
    dense: list[list] = []
    sparse: list[list] = []

    def flush() -> Examples:
        block = Examples(np.asarray(labels, dtype=np.int8),
                         np.asarray(dense, dtype=np.float32).reshape(len(labels), num_dense),
                         np.asarray(sparse, dtype=np.int64).reshape(len(labels), len(table_sizes)))
        labels.clear()
        dense.clear()
        sparse.clear()
        stats.rows += len(block)
        return block

    try:
        with _open_text(path) as handle:
            for line_number, text in enumerate(handle, start=1):
                if not text.strip():
                    continue
                try:
                    label, d, s = _jsonl_record(text, num_dense, table_sizes)
                except ValueError as err:
                    if not skip_bad_rows:
                        raise DataFormatError(path, line_number, str(err)) from err
                    stats.bad_rows += 1
                    continue
                labels.append(label)
                dense.append(d)
                sparse.append(s)
                if len(labels) == chunk_rows:
                    yield flush()
    except (OSError, EOFError) as err:
        raise DataFormatError(path, None, f"unreadable input (truncated or corrupt?): {err}") from err
    if labels:
        yield flush()
