"""Spark's own hash functions, computed from Arrow columns the way Spark computes them from rows.

A key's shard is decided twice: by Spark, when `cluster_by_key` routes rows (`xxhash64`
over the key columns, a native expression: no row crosses into Python for it), and by the
key index, when it reads keys back from data files and keeps only its shards' keys. Both
must agree bit for bit, or a key would be indexed in a shard its rows never reach. So this
module replays Spark's `XxHash64` (seed 42, each column's hash seeding the next, nulls
skipped) on the values as the table stores them, and Spark's `Murmur3Hash` of one bigint
(how `HashPartitioning` picks a row's partition), vectorised with numpy.

Spark hashes by its own types: an int as 4 bytes, a long, timestamp or decimal of up to 18
digits (its unscaled long) as 8, a boolean as the int 0 or 1, a date as its day number,
strings as UTF-8 and binaries as their bytes. The route casts every key column to the
Spark type of its table column first, so the values hashed here are the table's.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

__all__ = ["SEED", "UnsupportedKeyType", "murmur3_long", "xxhash64"]

SEED = 42  # Spark's seed for both hash expressions

_P1 = np.uint64(0x9E3779B185EBCA87)
_P2 = np.uint64(0xC2B2AE3D27D4EB4F)
_P3 = np.uint64(0x165667B19E3779F9)
_P4 = np.uint64(0x85EBCA77C2B2AE63)
_P5 = np.uint64(0x27D4EB2F165667C5)


class UnsupportedKeyType(TypeError):
    """A key column whose type this module cannot hash exactly as Spark does."""


def _rotl64(x: np.ndarray, r: int) -> np.ndarray:
    return (x << np.uint64(r)) | (x >> np.uint64(64 - r))


def _fmix64(h: np.ndarray) -> np.ndarray:
    h = h ^ (h >> np.uint64(33))
    h = h * _P2
    h = h ^ (h >> np.uint64(29))
    h = h * _P3
    return h ^ (h >> np.uint64(32))


def _xxh64_int(values: np.ndarray, seeds: np.ndarray) -> np.ndarray:
    """XXH64 of each 4-byte value (Spark's XXH64.hashInt)."""
    h = seeds + _P5 + np.uint64(4)
    h = h ^ (values.astype(np.uint32).astype(np.uint64) * _P1)
    h = _rotl64(h, 23) * _P2 + _P3
    return _fmix64(h)


def _xxh64_long(values: np.ndarray, seeds: np.ndarray) -> np.ndarray:
    """XXH64 of each 8-byte value (Spark's XXH64.hashLong)."""
    h = seeds + _P5 + np.uint64(8)
    h = h ^ (_rotl64(values.astype(np.uint64) * _P2, 31) * _P1)
    h = _rotl64(h, 27) * _P1 + _P4
    return _fmix64(h)


def _xxh64_bytes(values: Sequence[bytes | None], seeds: np.ndarray) -> np.ndarray:
    out = seeds.copy()
    for i, value in enumerate(values):
        if value is not None:
            out[i] = xxhash.xxh64_intdigest(value, int(seeds[i]))
    return out


def _numbers(arr: pa.Array, dtype: str) -> tuple[np.ndarray, np.ndarray | None]:
    valid = None if arr.null_count == 0 else np.asarray(arr.is_valid())
    filled = arr if valid is None else pc.fill_null(arr, pa.scalar(0, arr.type) if not pa.types.is_boolean(arr.type) else False)
    return np.asarray(filled.to_numpy(zero_copy_only=False)).astype(dtype, copy=False), valid


def _column_hash(arr: pa.Array, seeds: np.ndarray) -> np.ndarray:
    t = arr.type
    if pa.types.is_dictionary(t):
        return _column_hash(arr.dictionary_decode(), seeds)
    valid: np.ndarray | None
    if pa.types.is_boolean(t) or pa.types.is_int8(t) or pa.types.is_int16(t) or pa.types.is_int32(t) or pa.types.is_uint8(t) or pa.types.is_uint16(t):
        values, valid = _numbers(arr, "int64")
        hashed = _xxh64_int(values, seeds)
    elif pa.types.is_date32(t):
        values, valid = _numbers(arr.cast(pa.int32()), "int64")
        hashed = _xxh64_int(values, seeds)
    elif pa.types.is_int64(t):
        values, valid = _numbers(arr, "int64")
        hashed = _xxh64_long(values, seeds)
    elif pa.types.is_timestamp(t):
        if t.unit != "us":
            raise UnsupportedKeyType(f"timestamp[{t.unit}] (Spark keeps microseconds)")
        values, valid = _numbers(arr.cast(pa.int64()), "int64")
        hashed = _xxh64_long(values, seeds)
    elif pa.types.is_decimal(t):
        if t.precision > 18:
            raise UnsupportedKeyType(f"{t} (more than 18 digits)")
        # Spark hashes a decimal of up to 18 digits as its unscaled long.
        unscaled = [None if d is None else int(d.scaleb(t.scale)) for d in arr.to_pylist()]
        valid = None if arr.null_count == 0 else np.asarray(arr.is_valid())
        values = np.array([0 if u is None else u for u in unscaled], dtype=np.int64)
        hashed = _xxh64_long(values, seeds)
    elif pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return _xxh64_bytes([None if s is None else s.encode() for s in arr.to_pylist()], seeds)
    elif pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t) or pa.types.is_binary_view(t):
        return _xxh64_bytes(arr.to_pylist(), seeds)
    else:
        raise UnsupportedKeyType(str(t))
    return hashed if valid is None else np.where(valid, hashed, seeds)


def xxhash64(columns: Sequence[pa.Array | pa.ChunkedArray]) -> np.ndarray:
    """Spark's `xxhash64(c1, c2, ...)` of every row, as int64 (Spark's signed result)."""
    if not columns:
        raise ValueError("xxhash64 needs at least one column")
    n = len(columns[0])
    h = np.full(n, SEED, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for column in columns:
            arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
            h = _column_hash(arr, h)
    return h.view(np.int64)


def _mix_k1(k: np.ndarray) -> np.ndarray:
    k = k * np.uint32(0xCC9E2D51)
    k = (k << np.uint32(15)) | (k >> np.uint32(17))
    return k * np.uint32(0x1B873593)


def _mix_h1(h: np.ndarray, k: np.ndarray) -> np.ndarray:
    h = h ^ k
    h = (h << np.uint32(13)) | (h >> np.uint32(19))
    return h * np.uint32(5) + np.uint32(0xE6546B64)


def murmur3_long(values: np.ndarray) -> np.ndarray:
    """Spark's `hash(c)` (Murmur3_x86_32, seed 42) of a bigint column, as int32: what
    `HashPartitioning` on that one column takes modulo the partition count."""
    v = np.asarray(values, dtype=np.int64).view(np.uint64)
    low = (v & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    high = (v >> np.uint64(32)).astype(np.uint32)
    with np.errstate(over="ignore"):
        h = np.full(len(v), SEED, dtype=np.uint32)
        h = _mix_h1(h, _mix_k1(low))
        h = _mix_h1(h, _mix_k1(high))
        h = h ^ np.uint32(8)
        h = h ^ (h >> np.uint32(16))
        h = h * np.uint32(0x85EBCA6B)
        h = h ^ (h >> np.uint32(13))
        h = h * np.uint32(0xC2B2AE35)
        h = h ^ (h >> np.uint32(16))
    return h.view(np.int32)
