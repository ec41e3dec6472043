"""Writers that emit ``Examples`` in the raw on-disk formats, byte-compatible with the real files.

* Criteo TSV (Kaggle ``train.txt``/``test.txt``, Terabyte ``day_N``, ``.gz`` by extension): label,
  13 raw integers (empty when missing), 26 categoricals as 8 lowercase hex digits (empty for row 0).
* Avazu CSV with header: a 20-digit ``id`` (always above 2**63, as real ids can be), ``click``,
  ``hour`` YYMMDDHH spread over 240 hours from 14102100 in row order, hex strings for the
  site/app/device fields, decimal integers for the others.
* Bagpipe JSON lines: ``{"label": 0.0|1.0, "dense": [13 log1p'd floats], "sparse": [row ids]}``.

Categorical values are ``codec.encode_keys`` of (table, row): hash-looking 32-bit values that the
readers' hash-mod mapping sends back to the same rows, so generator -> writer -> reader is exact.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager

import numpy as np
import pyarrow as pa
from pyarrow import csv as pa_csv

from bagpipe.data.codec import encode_keys, format_hex
from bagpipe.data.examples import Examples
from bagpipe.data.presets import AVAZU_FIELDS, AVAZU_HEX_FIELDS
from bagpipe.data.readers import AVAZU_COLUMNS

WRITE_CHUNK_ROWS = 65536
AVAZU_FIRST_HOUR = (14, 10, 21)  # YY, MM, DD of the first Avazu day
AVAZU_HOURS = 240
AVAZU_INT_SPREAD = 16  # integer fields take values below 16 * table rows
_AVAZU_ID_LOW = 10**19  # 20 digits, above int64's maximum


@contextmanager
def _sink(path: str) -> Iterator[pa.NativeFile]:
    if path.endswith(".gz"):
        with pa.CompressedOutputStream(path, "gzip") as stream:
            yield stream
    else:
        with pa.OSFile(path, "wb") as stream:
            yield stream


def _decimal(values: np.ndarray, missing: np.ndarray | None = None) -> pa.Array:
    return pa.array(values, mask=missing).cast(pa.string())


def _write_chunks(path: str, tables: Iterator[pa.Table], delimiter: str, header: bool) -> None:
    """Write tables unquoted; the header (pyarrow would quote it) is written by hand."""
    options = pa_csv.WriteOptions(include_header=False, delimiter=delimiter, quoting_style="none")
    with _sink(path) as sink:
        writer: pa_csv.CSVWriter | None = None
        for table in tables:
            if writer is None:
                if header:
                    sink.write((delimiter.join(table.column_names) + "\n").encode())
                writer = pa_csv.CSVWriter(sink, table.schema, write_options=options)
            writer.write_table(table)
        if writer is not None:
            writer.close()


def _require_raw(examples: Examples) -> tuple[np.ndarray, np.ndarray]:
    if examples.dense_raw is None or examples.dense_missing is None:
        raise ValueError("writing a raw text format needs the raw dense integers (dense_raw)")
    return examples.dense_raw, examples.dense_missing


def write_criteo_tsv(
    path: str, examples: Examples | Iterable[Examples], table_sizes: Sequence[int], *,
    with_label: bool = True, seed: int = 0,
) -> None:
    """Criteo TSV (see the module docstring); ``with_label=False`` writes a Kaggle ``test.txt``.

    ``examples`` may be one block or an iterable of blocks written one after another (a file
    larger than memory, e.g. a full-size Kaggle ``train.txt`` made chunk by chunk).
    """
    blocks = [examples] if isinstance(examples, Examples) else examples

    def chunks() -> Iterator[pa.Table]:
        for block in blocks:
            raw, raw_missing = _require_raw(block)
            if with_label and block.labels is None:
                raise ValueError("with_label=True needs labelled examples")
            for start in range(0, len(block), WRITE_CHUNK_ROWS):
                stop = min(start + WRITE_CHUNK_ROWS, len(block))
                columns: dict[str, pa.Array] = {}
                if with_label:
                    columns["label"] = _decimal(block.labels[start:stop])  # type: ignore[index]
                for j in range(raw.shape[1]):
                    columns[f"int_{j}"] = _decimal(raw[start:stop, j], raw_missing[start:stop, j])
                for f, rows in enumerate(table_sizes):
                    ids = block.ids[start:stop, f]
                    columns[f"cat_{f}"] = format_hex(encode_keys(ids, f, rows, True, seed), ids == 0)
                yield pa.table(columns)

    _write_chunks(path, chunks(), "\t", header=False)


def avazu_ids(num_rows: int, seed: int = 0) -> np.ndarray:
    """The ``id`` column the Avazu writer emits: seeded uint64 values of 20 digits."""
    rng = np.random.default_rng([seed, 4242])
    return rng.integers(_AVAZU_ID_LOW, np.iinfo(np.uint64).max, num_rows, dtype=np.uint64, endpoint=True)


def avazu_hours(num_rows: int) -> np.ndarray:
    """The ``hour`` column (YYMMDDHH) the Avazu writer emits: 240 hours spread in row order."""
    yy, mm, dd = AVAZU_FIRST_HOUR
    hour_index = np.arange(num_rows, dtype=np.int64) * AVAZU_HOURS // max(num_rows, 1)
    day, hour = dd + hour_index // 24, hour_index % 24
    return ((yy * 100 + mm) * 100 + day) * 100 + hour


def write_avazu_csv(
    path: str, examples: Examples, table_sizes: Sequence[int], *, with_label: bool = True, seed: int = 0
) -> None:
    """Avazu CSV with header (see the module docstring); ``with_label=False`` drops ``click``."""
    if examples.ids.shape[1] != len(AVAZU_FIELDS):
        raise ValueError(f"Avazu has {len(AVAZU_FIELDS)} categorical fields, got {examples.ids.shape[1]}")
    if with_label and examples.labels is None:
        raise ValueError("with_label=True needs labelled examples")
    ids_column, hours = avazu_ids(len(examples), seed), avazu_hours(len(examples))

    def chunks() -> Iterator[pa.Table]:
        for start in range(0, len(examples), WRITE_CHUNK_ROWS):
            stop = min(start + WRITE_CHUNK_ROWS, len(examples))
            columns: dict[str, pa.Array] = {"id": _decimal(ids_column[start:stop])}
            if with_label:
                columns["click"] = _decimal(examples.labels[start:stop])  # type: ignore[index]
            columns["hour"] = _decimal(hours[start:stop])
            for f, (name, rows) in enumerate(zip(AVAZU_FIELDS, table_sizes, strict=True)):
                ids = examples.ids[start:stop, f]
                if name in AVAZU_HEX_FIELDS:
                    keys = encode_keys(ids, f, rows, False, seed)
                    columns[name] = format_hex(keys, np.zeros(keys.size, dtype=bool))
                else:  # small integers, like the real C1/C14.. codes
                    keys = encode_keys(ids, f, rows, False, seed, key_space=rows * AVAZU_INT_SPREAD)
                    columns[name] = _decimal(keys.astype(np.int64))
            assert tuple(columns) == tuple(c for c in AVAZU_COLUMNS if with_label or c != "click")
            yield pa.table(columns)

    _write_chunks(path, chunks(), ",", header=True)


def write_jsonl(path: str, examples: Examples) -> None:
    """Bagpipe JSON lines (dense as the float32 values' exact decimal form, so they round-trip)."""
    if examples.labels is None:
        raise ValueError("Bagpipe JSON lines need labels")
    with _sink(path) as sink:
        for label, dense, ids in zip(examples.labels.tolist(), examples.dense.tolist(),
                                     examples.ids.tolist(), strict=True):
            line = json.dumps({"label": float(label), "dense": dense, "sparse": ids})
            sink.write((line + "\n").encode())
