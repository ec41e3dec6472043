"""Streaming, chunked readers for Criteo (Kaggle ``train.txt``/``test.txt``, Terabyte ``day_N``
plain or ``.gz``), Avazu CSV and Bagpipe's JSON lines.

The text readers cut the input into segments of whole lines (``segments``: never the whole file in
memory), parse each with pyarrow's CSV reader on a small thread pool and validate every cell with
vectorised checks, so a bad cell is found without per-cell Python and mapped back to its physical
line:

* wrong column count -> pyarrow's ``invalid_row_handler`` (it numbers rows within the segment);
* a non-integer dense value or label, bad hex, a truncated compressed stream -> our checks.

Criteo takes a fast path: when a segment holds nothing but digits, hex letters, ``-``, tabs and
newlines, pyarrow parses the label and integer columns as int64 directly (on such bytes its CSV
integer parser accepts exactly what the string -> int64 cast of the checked path accepts: no
whitespace to trim, no ``0x`` prefix) and the categoricals as 8-byte fixed-width binary (Criteo's
hashes are 8 hex digits or empty). Any other segment, or one whose conversion fails (a value of
another width, an integer out of range), is parsed again with integers as strings, checked cell by
cell, and categoricals as variable-width binary. Either way ``codec.parse_hex`` decodes the
categoricals without a UTF-8 pass.

By default a malformed row raises ``DataFormatError`` naming the file and line, before any row of its
segment is handed out. With ``skip_bad_rows=True`` such rows are dropped and counted in
``ReadStats.bad_rows``; nothing partial is ever used. A truncated stream always raises (its tail
is unknowable).

Readers yield ``RawBlock``s: categorical values as integer *keys* (see ``codec``) that a mapper turns
into table rows (hash-mod or vocabulary, ``bagpipe.data.files``).
"""

from __future__ import annotations

import gzip
import io
import json
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyarrow import csv as pa_csv

from bagpipe.data.codec import parse_hex
from bagpipe.data.errors import DataFormatError
from bagpipe.data.examples import Examples
from bagpipe.data.presets import AVAZU_FIELDS, AVAZU_HEX_FIELDS
from bagpipe.data.segments import Segment, iter_segments, ordered_map

CRITEO_NUM_DENSE = 13
CRITEO_NUM_CATEGORICAL = 26
AVAZU_COLUMNS = ("id", "click", "hour", *AVAZU_FIELDS)
DEFAULT_BLOCK_BYTES = 1 << 22  # ~17k Criteo rows per segment: parsed within the CPU caches
_INT_FAST_PATH_BYTES = b"\t\n\r-0123456789abcdefABCDEF"  # see the module docstring


@dataclass
class ReadStats:
    """What a reader saw: rows kept and malformed rows skipped (``skip_bad_rows=True``)."""

    rows: int = 0
    bad_rows: int = 0


@dataclass(frozen=True)
class RawBlock:
    """Parsed rows before the categorical mapping.

    ``keys``/``key_missing`` are ``[N, F]``, ``dense_raw`` is 0 where ``dense_missing`` (an empty
    field), so it transforms as it is; ``extra`` holds format-specific columns (Avazu ``id``
    as uint64 and ``hour`` as int64). The readers fill them one column at a time, so ``keys``,
    ``key_missing``, ``dense_raw`` and ``dense_missing`` are column-major (Fortran order): a column
    ``[:, f]`` is contiguous for the mapper, which also works column by column.
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
    column: pa.Array | pa.ChunkedArray, dtype: pa.DataType | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Decimal strings (or integers the CSV reader already parsed) -> ``(values, missing, bad)``
    (int64 unless ``dtype``); empty = missing (0)."""
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
    """Collects per-row problems of one segment and either raises or drops the rows."""

    def __init__(self, path: str, segment: Segment, num_rows: int, invalid: list[tuple[int, str]]) -> None:
        self.path = path
        self.segment = segment
        self.invalid = invalid  # (pyarrow row number, reason): rows it skipped for their width
        self.bad = np.zeros(num_rows, dtype=bool)
        self.reasons: list[tuple[int, str]] = []

    def flag(self, bad: np.ndarray, what: str, column: pa.Array | pa.ChunkedArray) -> None:
        if bad.any():
            row = int(np.argmax(bad))
            value = column[row].as_py()
            value = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
            self.reasons.append((row, f"{what} {value!r}"))
            self.bad |= bad

    def finish(self, skip: bool) -> tuple[np.ndarray | None, int]:
        """``(row mask to keep or None for all, rows dropped)``; raises on the first bad line unless
        skipping."""
        if not self.invalid and not self.bad.any():
            return None, 0
        if not skip:
            lines = self.segment.nonempty_lines()
            is_row = np.ones(lines.size, dtype=bool)  # lines whose row is in the parsed table
            is_row[[number - 1 for number, _ in self.invalid]] = False
            is_row[0] &= not self.segment.has_header
            problems = [(int(lines[number - 1]), reason) for number, reason in self.invalid]
            problems += [(int(lines[is_row][row]), reason) for row, reason in self.reasons]
            line, reason = min(problems)
            raise DataFormatError(self.path, line, reason)
        dropped = int(self.bad.sum())
        return (~self.bad if dropped else None), len(self.invalid) + dropped


ColumnTypes = dict[str, pa.DataType]


def _read_segment(
    path: str, segment: Segment, column_names: Sequence[str], delimiter: str,
    types: ColumnTypes, fast_types: ColumnTypes | None,
) -> tuple[pa.Table, list[tuple[int, str]]]:
    """Parse one segment: ``(table, rows skipped for their width as (row number, reason))``.

    ``fast_types`` are tried first when the segment's bytes allow it (module docstring), else and on
    a conversion failure ``types``.
    """
    invalid: list[tuple[int, str]] = []

    def on_invalid(row: pa_csv.InvalidRow) -> str:
        invalid.append((row.number, f"expected {row.expected_columns} fields, got {row.actual_columns}"))
        return "skip"

    def parse(column_types: ColumnTypes) -> pa.Table:
        invalid.clear()
        return pa_csv.read_csv(
            pa.BufferReader(segment.data),
            read_options=pa_csv.ReadOptions(column_names=list(column_names), use_threads=False,
                                            block_size=len(segment.data) + 1,
                                            skip_rows=1 if segment.has_header else 0),
            parse_options=pa_csv.ParseOptions(delimiter=delimiter, quote_char=False,
                                              invalid_row_handler=on_invalid),
            convert_options=pa_csv.ConvertOptions(column_types=column_types, strings_can_be_null=True,
                                                  null_values=[""]),
        )

    if fast_types is not None and not segment.data.translate(None, _INT_FAST_PATH_BYTES):
        try:
            return parse(fast_types), invalid
        except pa.ArrowInvalid:
            pass  # a value the int64 parser refuses: the checked path names it
    try:
        return parse(types), invalid
    except pa.ArrowInvalid as err:
        raise DataFormatError(path, segment.first_line, f"unreadable input (corrupt?): {err}") from err


def _keep(block: RawBlock, keep: np.ndarray | None) -> RawBlock:
    if keep is None:
        return block
    return RawBlock(
        None if block.labels is None else block.labels[keep],
        block.dense_raw[keep], block.dense_missing[keep], block.keys[keep], block.key_missing[keep],
        {k: v[keep] for k, v in block.extra.items()},
    )


def _parse_label(table: pa.Table, name: str, checker: _RowChecker) -> np.ndarray:
    column = table.column(name)
    values, missing, bad = _parse_ints(column)
    checker.flag(bad | missing | ((values != 0) & (values != 1)), f"label {name} is not 0/1:", column)
    return values.astype(np.int8)


def _read_blocks(
    path: str,
    column_names: Sequence[str],
    delimiter: str,
    skip_header: bool,
    block_bytes: int,
    skip_bad_rows: bool,
    stats: ReadStats,
    types: ColumnTypes,
    fast_types: ColumnTypes | None,
    decode: Callable[[pa.Table, _RowChecker], RawBlock],
) -> Generator[RawBlock, None, None]:
    """Every segment parsed and ``decode``d on the reader threads; blocks (bad rows dropped or
    raised) in file order."""

    def work(segment: Segment) -> tuple[RawBlock, int]:
        table, invalid = _read_segment(path, segment, column_names, delimiter, types, fast_types)
        table = table.combine_chunks()
        checker = _RowChecker(path, segment, table.num_rows, invalid)
        block = decode(table, checker)
        keep, dropped = checker.finish(skip_bad_rows)
        return _keep(block, keep), dropped

    for block, dropped in ordered_map(work, iter_segments(path, block_bytes, skip_header)):
        stats.bad_rows += dropped
        stats.rows += len(block)
        yield block


def iter_criteo_tsv(
    path: str,
    *,
    has_label: bool = True,
    skip_bad_rows: bool = False,
    stats: ReadStats | None = None,
    block_bytes: int = DEFAULT_BLOCK_BYTES,
) -> Generator[RawBlock, None, None]:
    """Criteo TSV (Kaggle or Terabyte): ``label``, 13 integers, 26 hex categoricals; empty = missing.

    ``has_label=False`` reads Kaggle's ``test.txt`` (39 fields). A ``.gz`` path is decompressed.
    """
    dense_names = [f"int_{i}" for i in range(CRITEO_NUM_DENSE)]
    cat_names = [f"cat_{i}" for i in range(CRITEO_NUM_CATEGORICAL)]
    int_names = (["label"] if has_label else []) + dense_names
    types = {**dict.fromkeys(int_names, pa.string()), **dict.fromkeys(cat_names, pa.binary())}
    fast_types = {**dict.fromkeys(int_names, pa.int64()), **dict.fromkeys(cat_names, pa.binary(8))}

    def decode(table: pa.Table, checker: _RowChecker) -> RawBlock:
        n = table.num_rows
        labels = _parse_label(table, "label", checker) if has_label else None
        dense = np.empty((CRITEO_NUM_DENSE, n), dtype=np.int64)  # column-major: see RawBlock
        dense_missing = np.empty((CRITEO_NUM_DENSE, n), dtype=bool)
        for j, name in enumerate(dense_names):
            column = table.column(name)
            dense[j], dense_missing[j], bad = _parse_ints(column)
            checker.flag(bad, f"integer feature {name} is not an integer:", column)
        keys = np.empty((CRITEO_NUM_CATEGORICAL, n), dtype=np.uint64)
        key_missing = np.empty((CRITEO_NUM_CATEGORICAL, n), dtype=bool)
        for f, name in enumerate(cat_names):
            column = table.column(name)
            keys[f], key_missing[f], bad = parse_hex(column)
            checker.flag(bad, f"categorical {name} is not hex:", column)
        return RawBlock(labels, dense.T, dense_missing.T, keys.T, key_missing.T)

    yield from _read_blocks(path, int_names + cat_names, "\t", False, block_bytes, skip_bad_rows,
                            stats if stats is not None else ReadStats(), types, fast_types, decode)


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
) -> Generator[RawBlock, None, None]:
    """Avazu CSV with header. The 21 categorical fields become keys (hex fields parsed as hex,
    integer fields as integers); ``id`` (uint64, may exceed int64) and ``hour`` (YYMMDDHH) go to
    ``extra``. Avazu has no dense features (``dense_raw`` is ``[N, 0]``)."""
    header = avazu_header(path)
    has_label = "click" in header

    def decode(table: pa.Table, checker: _RowChecker) -> RawBlock:
        n = table.num_rows
        labels = _parse_label(table, "click", checker) if has_label else None
        ids, id_missing, bad = _parse_ints(table.column("id"), pa.uint64())
        checker.flag(bad | id_missing, "id is not an unsigned 64-bit integer:", table.column("id"))
        hours, hour_missing, bad = _parse_ints(table.column("hour"))
        checker.flag(bad | hour_missing, "hour is not YYMMDDHH:", table.column("hour"))
        keys = np.empty((len(AVAZU_FIELDS), n), dtype=np.uint64)  # column-major: see RawBlock
        key_missing = np.empty((len(AVAZU_FIELDS), n), dtype=bool)
        for f, name in enumerate(AVAZU_FIELDS):
            column = table.column(name)
            if name in AVAZU_HEX_FIELDS:
                keys[f], key_missing[f], bad = parse_hex(column)
                checker.flag(bad, f"field {name} is not hex:", column)
            else:
                values, key_missing[f], bad = _parse_ints(column)
                keys[f] = values.view(np.uint64)
                checker.flag(bad, f"field {name} is not an integer:", column)
        empty = np.zeros((n, 0), dtype=np.int64)
        return RawBlock(labels, empty, empty.astype(bool), keys.T, key_missing.T,
                        {"id": ids.astype(np.uint64), "hour": hours})

    yield from _read_blocks(path, header, ",", True, block_bytes, skip_bad_rows,
                            stats if stats is not None else ReadStats(),
                            dict.fromkeys(header, pa.string()), None, decode)


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
