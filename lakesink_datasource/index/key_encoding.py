"""Order-preserving, injective byte encoding of primary-key tuples.

`encode_keys` turns the key columns of an Arrow batch into one `bytes` per row such that
comparing two encodings bytewise gives the same answer as comparing the key tuples
naturally, and distinct tuples never share an encoding. The index stores these bytes as
LMDB keys, so equal keys must encode equally across batches, tasks and processes: the
encoding depends only on the values and the column types, never on the batch.

Per column (no type tag: the table fixes the column types):

* signed integers, date, time, timestamp, duration: big-endian two's complement with the
  sign bit flipped, so negative values sort first (the timestamp unit and zone are a
  property of the column; the stored integer is what is compared);
* unsigned integers: big-endian; bool: one byte 0/1;
* floats: IEEE bits, sign bit flipped for positives and all bits inverted for negatives
  (the usual total-order trick). -0.0 is encoded as 0.0 (they compare equal) and every NaN
  is encoded as the one canonical positive quiet NaN, which sorts after +inf. So the
  order is -inf < ... < 0.0 == -0.0 < ... < +inf < NaN, and all NaNs are one key;
* decimals: the fixed-width little-endian two's complement reversed to big-endian with
  the sign bit flipped (all values of a column share the scale, so the unscaled integer
  order is the decimal order);
* fixed_size_binary: the raw bytes (fixed width needs no terminator);
* struct: its fields, one after another, as if they were columns of their own (a sequence
  such as a source position of several parts; keys are never structs);
* string / binary: UTF-8 / raw bytes with 0x00 escaped as 0x00 0xFF and terminated by
  0x00 0x00. The terminator sorts below any continuation (a real 0x00 becomes 0x00 0xFF,
  anything else is > 0x00), so a prefix sorts first, and the encoding is prefix-free, so
  the next column's bytes never interfere. UTF-8 byte order equals code-point order,
  which is Python's `str` order.

Everything is vectorised with numpy: each column becomes a flat uint8 buffer plus a
per-row length, and the columns are interleaved row-major in one scatter.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from lakesink_datasource.errors import LakesinkError

__all__ = ["NullKeyError", "encode_keys"]


class NullKeyError(LakesinkError, ValueError):
    """A key column holds nulls: a primary key must identify a row, so null is refused."""

    def __init__(self, column_index: int, null_count: int, column_name: str | None = None):
        self.column_index = column_index
        self.null_count = null_count
        self.column_name = column_name
        label = f"{column_name!r} (#{column_index})" if column_name is not None else f"#{column_index}"
        super().__init__(
            f"key column {label} contains {null_count} null value(s); "
            "primary-key columns must not be null"
        )


# A column after encoding: per-row byte lengths and the rows' bytes concatenated.
# Fixed-width columns are kept as an (n, width) matrix so the all-fixed case can skip the
# general scatter.
_Encoded = tuple[np.ndarray, np.ndarray]  # (lengths int64[n], flat uint8)


def encode_keys(
    columns: Sequence[pa.Array | pa.ChunkedArray],
    names: Sequence[str] | None = None,
) -> list[bytes]:
    """Encode the rows of `columns` (the key tuple, in key order) to order-preserving bytes.

    Raises NullKeyError for nulls, TypeError for unsupported column types and ValueError
    for an empty column list or columns of different lengths.
    """
    if not columns:
        raise ValueError("encode_keys needs at least one key column")
    if names is not None and len(names) != len(columns):
        raise ValueError(f"{len(names)} names given for {len(columns)} key columns")
    arrays, names = _flatten_structs([_as_array(col) for col in columns], names)
    n = len(arrays[0])
    for i, arr in enumerate(arrays):
        if len(arr) != n:
            raise ValueError(f"key column {_label(i, names)} has {len(arr)} rows, expected {n}")
        if arr.null_count:
            raise NullKeyError(i, arr.null_count, names[i] if names is not None else None)
    if n == 0:
        return []

    fixed: list[np.ndarray] = []
    parts: list[_Encoded] = []
    for i, arr in enumerate(arrays):
        matrix = _encode_fixed(arr)
        if matrix is not None:
            fixed.append(matrix)
            parts.append((np.full(n, matrix.shape[1], dtype=np.int64), matrix.reshape(-1)))
            continue
        var = _encode_variable(arr)
        if var is None:
            raise TypeError(f"unsupported key column type {arr.type} for key column {_label(i, names)}")
        parts.append(var)

    if len(fixed) == len(arrays):
        return _rows_from_matrix(np.hstack(fixed) if len(fixed) > 1 else fixed[0])
    return _rows_from_parts(parts, n)


def _flatten_structs(arrays: list[pa.Array], names: Sequence[str] | None) -> tuple[list[pa.Array], Sequence[str] | None]:
    """A struct column compares as its fields, one after another (a sequence such as a source
    position of several parts): its fields take its place, a null struct nulls them all."""
    if not any(pa.types.is_struct(a.type) for a in arrays):
        return arrays, names
    flat: list[pa.Array] = []
    labels: list[str] = []
    for i, arr in enumerate(arrays):
        label = names[i] if names is not None else f"#{i}"
        if not pa.types.is_struct(arr.type):
            flat.append(arr)
            labels.append(label)
            continue
        assert isinstance(arr, pa.StructArray)
        inner, inner_names = _flatten_structs(arr.flatten(), [f"{label}.{f.name}" for f in arr.type])
        flat += inner
        labels += list(inner_names or ())
    return flat, (labels if names is not None else None)


def _label(index: int, names: Sequence[str] | None) -> str:
    return f"{names[index]!r} (#{index})" if names is not None else f"#{index}"


def _as_array(col: pa.Array | pa.ChunkedArray) -> pa.Array:
    """One contiguous array: the numpy views below address a single set of buffers."""
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    if not isinstance(col, pa.Array):
        raise TypeError(f"key columns must be pyarrow arrays, got {type(col).__name__}")
    if pa.types.is_dictionary(col.type):
        # Dictionary indices are batch-local; the encoding must depend on the values only.
        col = col.dictionary_decode()
    return col


# --------------------------------------------------------------------------- fixed width


def _values(arr: pa.Array, dtype: str | np.dtype) -> np.ndarray:
    """Zero-copy numpy view of the data buffer of a fixed-width array, honouring its offset."""
    dtype = np.dtype(dtype)
    return np.frombuffer(
        arr.buffers()[1], dtype=dtype, count=len(arr), offset=arr.offset * dtype.itemsize
    )


def _big_endian_matrix(values: np.ndarray) -> np.ndarray:
    """(n, width) uint8 matrix of unsigned `values` in big-endian byte order."""
    big = values.astype(values.dtype.newbyteorder(">"), copy=False)
    return np.ascontiguousarray(big).view(np.uint8).reshape(len(values), values.dtype.itemsize)


def _encode_signed(arr: pa.Array, byte_width: int) -> np.ndarray:
    unsigned = _values(arr, f"<u{byte_width}")
    # Flipping the sign bit maps two's complement onto offset binary: unsigned order.
    flipped = unsigned ^ unsigned.dtype.type(1 << (8 * byte_width - 1))
    return _big_endian_matrix(flipped)


def _encode_unsigned(arr: pa.Array, byte_width: int) -> np.ndarray:
    return _big_endian_matrix(_values(arr, f"<u{byte_width}"))


def _encode_float(arr: pa.Array, byte_width: int) -> np.ndarray:
    floats = _values(arr, f"<f{byte_width}")
    # Canonical NaN (positive, quiet) so all NaNs are one key that sorts after +inf;
    # -0.0 == 0.0 so both must map to the same bytes.
    floats = np.where(np.isnan(floats), floats.dtype.type(np.nan), floats)
    floats = np.where(floats == 0, floats.dtype.type(0), floats)
    bits = floats.view(f"<u{byte_width}")
    sign = bits.dtype.type(1 << (8 * byte_width - 1))
    # Negatives: invert everything (larger magnitude sorts lower); positives: set the sign.
    ordered = np.where((bits & sign) != 0, ~bits, bits | sign)
    return _big_endian_matrix(ordered)


def _encode_decimal(arr: pa.Array) -> np.ndarray:
    width = arr.type.byte_width
    raw = np.frombuffer(
        arr.buffers()[1], dtype=np.uint8, count=len(arr) * width, offset=arr.offset * width
    ).reshape(len(arr), width)
    big = raw[:, ::-1].copy()  # little-endian two's complement -> big-endian
    big[:, 0] ^= 0x80
    return big


def _encode_fixed_binary(arr: pa.Array) -> np.ndarray:
    width = arr.type.byte_width
    raw = np.frombuffer(
        arr.buffers()[1], dtype=np.uint8, count=len(arr) * width, offset=arr.offset * width
    )
    return raw.reshape(len(arr), width)


def _encode_fixed(arr: pa.Array) -> np.ndarray | None:
    """(n, width) uint8 matrix for fixed-width types, None if the type is not fixed-width."""
    t = arr.type
    if pa.types.is_boolean(t):
        return arr.to_numpy(zero_copy_only=False).astype(np.uint8).reshape(len(arr), 1)
    if pa.types.is_signed_integer(t) or (pa.types.is_temporal(t) and not pa.types.is_interval(t)):
        # date32/64, time32/64, timestamp (any unit/zone), duration: integer storage.
        return _encode_signed(arr, t.bit_width // 8)
    if pa.types.is_unsigned_integer(t):
        return _encode_unsigned(arr, t.bit_width // 8)
    if pa.types.is_floating(t):
        return _encode_float(arr, t.bit_width // 8)
    if pa.types.is_decimal(t):
        return _encode_decimal(arr)
    if pa.types.is_fixed_size_binary(t):
        return _encode_fixed_binary(arr)
    return None


# ------------------------------------------------------------------------ variable width


def _encode_variable(arr: pa.Array) -> _Encoded | None:
    """Escaped, terminated bytes for string/binary columns; None for other types."""
    t = arr.type
    if pa.types.is_string_view(t) or pa.types.is_binary_view(t):
        arr = arr.cast(pa.large_binary())  # view layouts have no offsets buffer to read
        t = arr.type
    offset_dtype: np.dtype
    if pa.types.is_string(t) or pa.types.is_binary(t):
        offset_dtype = np.dtype("<i4")
    elif pa.types.is_large_string(t) or pa.types.is_large_binary(t):
        offset_dtype = np.dtype("<i8")
    else:
        return None
    n = len(arr)
    offsets = _values_offsets(arr, offset_dtype).astype(np.int64)
    start, end = int(offsets[0]), int(offsets[-1])
    data_buf = arr.buffers()[2]
    data = (
        np.frombuffer(data_buf, dtype=np.uint8, count=end - start, offset=start)
        if end > start
        else np.empty(0, dtype=np.uint8)
    )
    lengths = np.diff(offsets)
    is_zero = data == 0
    zeros_before = np.zeros(len(data) + 1, dtype=np.int64)
    np.cumsum(is_zero, out=zeros_before[1:])
    rel = offsets - start
    zeros_per_row = zeros_before[rel[1:]] - zeros_before[rel[:-1]]
    out_lengths = lengths + zeros_per_row + 2

    # Byte i of the concatenated input lands after every escape byte inserted before it
    # and after the 2-byte terminators of all earlier rows.
    row_of_byte = np.repeat(np.arange(n, dtype=np.int64), lengths)
    dest = np.arange(len(data), dtype=np.int64) + zeros_before[:-1] + 2 * row_of_byte
    out = np.zeros(int(out_lengths.sum()), dtype=np.uint8)  # terminators are the zeros left
    out[dest] = data
    out[dest[is_zero] + 1] = 0xFF
    return out_lengths, out


def _values_offsets(arr: pa.Array, dtype: np.dtype) -> np.ndarray:
    return np.frombuffer(
        arr.buffers()[1], dtype=dtype, count=len(arr) + 1, offset=arr.offset * dtype.itemsize
    )


# ------------------------------------------------------------------------------ assembly


def _rows_from_matrix(matrix: np.ndarray) -> list[bytes]:
    """Split an (n, width) matrix into n bytes objects in one C-level pass."""
    matrix = np.ascontiguousarray(matrix)
    # A void view keeps trailing zero bytes (an 'S' view would strip them).
    return matrix.view(np.dtype((np.void, matrix.shape[1]))).reshape(-1).tolist()


def _rows_from_parts(parts: list[_Encoded], n: int) -> list[bytes]:
    """Interleave per-column encodings row-major and split into one bytes per row."""
    row_lengths = np.sum([lengths for lengths, _ in parts], axis=0)
    row_offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(row_lengths, out=row_offsets[1:])
    out = np.empty(int(row_offsets[-1]), dtype=np.uint8)
    column_start = row_offsets[:-1].copy()  # where the current column begins in each row
    for lengths, flat in parts:
        part_offsets = np.zeros(n, dtype=np.int64)
        np.cumsum(lengths[:-1], out=part_offsets[1:])
        dest = np.repeat(column_start - part_offsets, lengths) + np.arange(len(flat), dtype=np.int64)
        out[dest] = flat
        column_start += lengths
    # Arrow splits a buffer by offsets into bytes objects in C, faster than slicing in Python.
    binary = pa.Array.from_buffers(
        pa.large_binary(), n, [None, pa.py_buffer(row_offsets), pa.py_buffer(out)]
    )
    return binary.to_pylist()


_FNV_OFFSET, _FNV_PRIME = np.uint64(0xCBF29CE484222325), np.uint64(0x100000001B3)


def key_hashes(keys: Sequence[bytes], *, drop_last_byte: bool = False) -> np.ndarray:
    """64-bit hashes of the encoded keys, vectorised (FNV-1a over each key's bytes, the length
    mixed in, then a splitmix64 finaliser). A key's hash never depends on the other keys of
    the call: tasks report the keys they touched this way, and the commit compares them with
    keys hashed from other writers' files and other hosts' tasks.

    `drop_last_byte` hashes each key without its last byte, so that keys differing only
    there (256 consecutive integers, say) hash alike: the key index's shards use it to keep
    neighbouring keys together."""
    if not keys:
        return np.empty(0, dtype=np.uint64)
    full_lengths = np.fromiter(map(len, keys), dtype=np.int64, count=len(keys))
    lengths = np.maximum(full_lengths - 1, 0) if drop_last_byte else full_lengths
    width = int(lengths.max())
    matrix = np.array(keys, dtype=f"S{max(1, int(full_lengths.max()))}").view(np.uint8).reshape(len(keys), -1)
    ragged = int(lengths.min()) != width  # fixed-width keys (integers) need no mask
    h = np.full(len(keys), _FNV_OFFSET, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for j in range(width):
            step = (h ^ matrix[:, j]) * _FNV_PRIME
            # Only a key's own bytes count: padding would make the hash depend on the
            # longest key of the call.
            h = np.where(j < lengths, step, h) if ragged else step
        h = (h ^ lengths.astype(np.uint64)) * _FNV_PRIME
        h ^= h >> np.uint64(30)
        h *= np.uint64(0xBF58476D1CE4E5B9)
        h ^= h >> np.uint64(27)
        h *= np.uint64(0x94D049BB133111EB)
        h ^= h >> np.uint64(31)
    return h
