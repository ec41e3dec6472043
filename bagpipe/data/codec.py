"""Vectorised text codecs for categorical values: hex <-> integer keys, and keys <-> table rows.

Parsing works on Arrow string buffers directly (offsets + bytes), never per cell in Python: every
value is right-aligned into a fixed-width byte matrix, nibbles come from a 256-entry lookup table, and
an invalid character or an over-long value is flagged per row so callers can name the line.

Key -> row ("hash-mod", DLRM's ``max_ind_range``): a categorical value's key is the dataset's own
32-bit hash (Criteo, Avazu's hex fields) or the integer itself (Avazu's integer fields, negatives in
two's complement). A table of ``D`` rows maps it to ``1 + key % (D - 1)`` when row 0 is reserved for
the missing value (Criteo: an empty field -> row 0), else to ``key % D`` (Avazu has no empty fields).
Distinct values can collide, exactly as with DLRM's modulo.

Row -> key (writers): ``encode_keys`` picks, for table row ``r``, a 32-bit key that maps back to ``r``
under the rule above: ``residue(r) + D' * q`` with ``q`` a hash of (table, row) kept in range, so the
emitted values look like hashes, are distinct per row, and round-trip exactly.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

_HEX_LUT = np.full(256, 255, dtype=np.uint8)
for _i, _c in enumerate(b"0123456789abcdef"):
    _HEX_LUT[_c] = _i
for _i, _c in enumerate(b"ABCDEF"):
    _HEX_LUT[_c] = 10 + _i
_HEX_CHARS = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
MAX_HEX_DIGITS = 16
KEY_SPACE = 1 << 32


def string_parts(array: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(starts, lengths, data)`` of an Arrow string array; nulls have length 0."""
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    n = len(array)
    validity, offsets_buf, data_buf = array.buffers()
    offset_type = np.int64 if pa.types.is_large_string(array.type) else np.int32
    offsets = np.frombuffer(offsets_buf, dtype=offset_type, count=n + 1 + array.offset)[array.offset :]
    starts = offsets[:-1].astype(np.int64)
    lengths = np.diff(offsets).astype(np.int64)
    if validity is not None and array.null_count:
        lengths = np.where(array.is_valid().to_numpy(zero_copy_only=False), lengths, 0)
    data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    return starts, lengths, data


def parse_hex(array: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Hex strings -> ``(keys uint64, missing bool, bad bool)``; empty or null = missing.

    ``bad`` marks values with a non-hex character or more than 16 digits.
    """
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    if pa.types.is_fixed_size_binary(array.type) and array.type.byte_width == 8:
        return _parse_hex_fixed8(array)
    starts, lengths, data = string_parts(array)
    missing = lengths == 0
    if lengths.size and np.all(missing | (lengths == 8)):
        span_end = int(starts[-1] + lengths[-1])
        if span_end - int(starts[0]) == 8 * int(np.count_nonzero(~missing)) and data.size >= span_end:
            # the present values are back to back (no null slot holds bytes)
            keys, bad = _parse_hex8(starts, missing, data)
            return keys, missing, bad
    bad = lengths > MAX_HEX_DIGITS
    keys = np.zeros(lengths.size, dtype=np.uint64)
    width = int(min(lengths.max(initial=0), MAX_HEX_DIGITS))
    if width == 0 or data.size == 0:
        return keys, missing, bad
    ends = starts + np.minimum(lengths, MAX_HEX_DIGITS)
    for j in range(width):
        # digit j of a value right-aligned in `width` digits; absent for short values
        present = lengths >= width - j
        pos = np.minimum(ends - (width - j), data.size - 1)
        nibble = _HEX_LUT[data[np.maximum(pos, 0)]]
        nibble = np.where(present, nibble, 0)
        bad |= nibble == 255
        keys = (keys << np.uint64(4)) | nibble.astype(np.uint64)
    return keys, missing, bad


def _hex_pair_table() -> np.ndarray:
    """``[65536]`` uint16: two hex characters (read as one little-endian uint16) -> their byte
    value, or ``0xFFFF`` when either is not a hex digit."""
    pairs = np.arange(1 << 16)
    high, low = _HEX_LUT[pairs & 0xFF].astype(np.uint16), _HEX_LUT[pairs >> 8].astype(np.uint16)
    return np.where((high < 16) & (low < 16), high * 16 + low, 0xFFFF).astype(np.uint16)


_HEX_PAIR_LUT = _hex_pair_table()
_U64 = np.uint64


def _pack_hex8(pairs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``[4 P]`` little-endian uint16 character pairs of ``P`` 8-digit values -> ``(keys, bad)``.

    One table lookup per character pair gives four byte values in the four 16-bit lanes of a uint64
    (``0xFFFF`` marks a non-hex pair); two shift-or steps then pack the lanes, most significant
    first, into the 32-bit key, all with whole-array uint64 operations.
    """
    lanes = np.take(_HEX_PAIR_LUT, pairs).view("<u8")
    bad = (lanes & _U64(0x8000_8000_8000_8000)) != 0
    halves = lanes << _U64(8)  # in place from here on: fewer temporaries
    lanes >>= _U64(16)
    halves |= lanes
    halves &= _U64(0x0000_FFFF_0000_FFFF)
    keys = halves << _U64(16)
    halves >>= _U64(32)
    keys |= halves
    keys &= _U64(0xFFFF_FFFF)
    return keys, bad


def _parse_hex8(starts: np.ndarray, missing: np.ndarray, data: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Fast path for the common case (every value 8 digits or empty): ``(keys, bad)``.

    Arrow stores the values back to back, so the present ones are one block of ``P`` x 8 bytes.
    """
    present = ~missing
    count = int(np.count_nonzero(present))
    if count == 0:
        return np.zeros(starts.size, dtype=np.uint64), np.zeros(starts.size, dtype=bool)
    first = int(starts[0])  # empty values take no bytes: the first present value starts here
    keys_present, bad_present = _pack_hex8(data[first : first + 8 * count].view("<u2"))
    if count == starts.size:
        return keys_present, bad_present
    keys = np.zeros(starts.size, dtype=np.uint64)
    bad = np.zeros(starts.size, dtype=bool)
    keys[present] = keys_present
    bad[present] = bad_present
    return keys, bad


def _parse_hex_fixed8(array: pa.FixedSizeBinaryArray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``parse_hex`` of an 8-byte fixed-width binary array (nulls = missing): every slot holds 8
    bytes, so the whole data buffer is decoded at once and the null slots are cleared after."""
    n = len(array)
    missing = array.is_null().to_numpy(zero_copy_only=False)
    data_buf = array.buffers()[1]
    if n == 0 or data_buf is None:
        return np.zeros(n, dtype=np.uint64), missing, np.zeros(n, dtype=bool)
    keys, bad = _pack_hex8(np.frombuffer(data_buf, dtype="<u2", count=4 * n, offset=8 * array.offset))
    if array.null_count:
        keys[missing] = 0
        bad[missing] = False
    return keys, missing, bad


def format_hex(keys: np.ndarray, missing: np.ndarray, digits: int = 8) -> pa.Array:
    """Keys -> lowercase zero-padded hex strings of ``digits`` characters; missing -> empty string."""
    present = ~missing
    values = keys[present].astype(np.uint64)
    shifts = np.arange(digits - 1, -1, -1, dtype=np.uint64) * np.uint64(4)
    chars = _HEX_CHARS[((values[:, None] >> shifts) & np.uint64(15)).astype(np.intp)]
    lengths = np.where(present, digits, 0).astype(np.int32)
    offsets = np.concatenate(([0], np.cumsum(lengths, dtype=np.int64))).astype(np.int32)
    return pa.StringArray.from_buffers(
        keys.size, pa.py_buffer(offsets.tobytes()), pa.py_buffer(np.ascontiguousarray(chars).tobytes())
    )


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64 finaliser: a fixed, well-mixed 64-bit hash (uint64 arithmetic wraps)."""
    with np.errstate(over="ignore"):
        z = x + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def keys_to_rows(keys: np.ndarray, missing: np.ndarray, rows: int, reserve_missing: bool) -> np.ndarray:
    """Hash-mod mapping (module docstring): ``[N]`` uint64 keys -> int64 rows of a ``rows`` table."""
    if reserve_missing and rows < 2:
        raise ValueError(f"a table with a missing row needs at least 2 rows, got {rows}")
    span = rows - 1 if reserve_missing else rows
    if span < KEY_SPACE and keys.size and int(keys.max()) < KEY_SPACE:
        keys = keys.astype(np.uint32)  # the same residues; 32-bit division is much cheaper
    mapped = (keys % keys.dtype.type(span)).astype(np.int64)
    if reserve_missing:
        mapped += 1
    mapped[missing] = 0
    return mapped


def encode_keys(
    rows_ids: np.ndarray,
    table: int,
    rows: int,
    reserve_missing: bool,
    seed: int = 0,
    key_space: int = KEY_SPACE,
) -> np.ndarray:
    """Inverse of ``keys_to_rows``: a hash-looking key below ``key_space`` per row id.

    Row 0 has no key when it is reserved for the missing value (writers emit an empty field).
    """
    span = rows - 1 if reserve_missing else rows
    residue = (rows_ids - 1 if reserve_missing else rows_ids).astype(np.uint64)
    residue = np.where(rows_ids < (1 if reserve_missing else 0), 0, residue).astype(np.uint64)
    q_count = max(1, (key_space - span) // span + 1)  # keeps residue + span*q < key_space
    salt = np.uint64((seed * 1_000_003 + table) & 0xFFFFFFFF) << np.uint64(32)
    q = _splitmix64(rows_ids.astype(np.uint64) ^ salt) % np.uint64(q_count)
    return residue + np.uint64(span) * q

