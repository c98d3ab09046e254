"""Codec for Iceberg v3 ``deletion-vector-v1`` blobs.

Blob layout (Puffin spec, "deletion-vector-v1"; Java ``BitmapPositionDeleteIndex``)::

    [0:4]      u32 big-endian L = len(magic) + len(bitmap)
    [4:8]      magic D1 D3 39 64
    [8:4+L]    portable 64-bit Roaring bitmap (little-endian)
    [4+L:8+L]  u32 big-endian CRC-32 of bytes [4:4+L]

The blob is stored uncompressed in a Puffin file, and a manifest's ``content_offset`` /
``content_size_in_bytes`` point at exactly these ``L + 8`` bytes.
"""

from __future__ import annotations

import struct
import zlib
from typing import Final

from pyroaring import BitMap64

from lakesink_datasource.errors import LakesinkError

__all__ = [
    "DV_MAGIC",
    "MAX_KEY",
    "MAX_POSITION",
    "InvalidDeletionVector",
    "decode_dv",
    "encode_dv",
]

DV_MAGIC: Final[bytes] = b"\xd1\xd3\x39\x64"

# Java keeps one 32-bit bitmap per key in an array indexed by key, so the key must stay a valid
# non-negative array index below Integer.MAX_VALUE (RoaringPositionBitmap: MAX_KEY = 2^31 - 2).
MAX_KEY: Final[int] = 2**31 - 2

# Java's writer-side limit, toPosition(Integer.MAX_VALUE - 1, Integer.MIN_VALUE): the low word is
# 0x8000_0000, not 0xFFFF_FFFF. Java's *reader* only checks the key, so decode_dv does the same.
MAX_POSITION: Final[int] = (MAX_KEY << 32) | 0x8000_0000

_LENGTH_SIZE: Final[int] = 4
_CRC_SIZE: Final[int] = 4
# Java sizes the blob with a signed int, so L must fit in one.
_MAX_LENGTH: Final[int] = 2**31 - 1
# length prefix + magic + empty portable bitmap (u64 count 0) + CRC.
_MIN_BLOB_SIZE: Final[int] = _LENGTH_SIZE + len(DV_MAGIC) + 8 + _CRC_SIZE

_U32_BE = struct.Struct(">I")


class InvalidDeletionVector(LakesinkError, ValueError):
    """A ``deletion-vector-v1`` blob is malformed or disagrees with its metadata."""


def encode_dv(positions: BitMap64) -> bytes:
    """Serialize deleted row positions as a complete ``deletion-vector-v1`` blob.

    The caller's bitmap is left untouched. Raises ``ValueError`` if a position exceeds
    ``MAX_POSITION`` (negative positions cannot be stored in a ``BitMap64``).
    """
    _check_encodable(positions)
    bitmap = positions.copy()
    # Java run-length encodes before serializing; doing the same gives byte-identical blobs.
    # (pyroaring 1.2.0's copy() already happens to re-pack containers; we don't rely on that.)
    bitmap.run_optimize()
    body = DV_MAGIC + bitmap.serialize()
    if len(body) > _MAX_LENGTH:
        raise ValueError(f"deletion vector too large: {len(body)} bytes exceeds {_MAX_LENGTH}")
    return _U32_BE.pack(len(body)) + body + _U32_BE.pack(zlib.crc32(body))


def decode_dv(blob: bytes, expected_cardinality: int | None = None) -> BitMap64:
    """Parse and verify a complete ``deletion-vector-v1`` blob.

    ``expected_cardinality`` is the manifest's ``record_count`` (or the Puffin ``cardinality``
    property); when given, the decoded bitmap must hold exactly that many positions.
    Raises ``InvalidDeletionVector`` describing the first problem found.
    """
    body = _checked_body(blob)
    bitmap = _deserialize_bitmap(body[len(DV_MAGIC) :])
    _check_cardinality(bitmap, expected_cardinality)
    _check_decoded_keys(bitmap)
    return bitmap


def _check_encodable(positions: BitMap64) -> None:
    if len(positions) and positions.max() > MAX_POSITION:
        bad = next(positions.iter_equal_or_larger(MAX_POSITION + 1))
        raise ValueError(
            f"position {bad} is out of range: deletion vector positions must be in [0, {MAX_POSITION}]"
        )


def _checked_body(blob: bytes) -> bytes:
    """Validate the framing and return magic + bitmap bytes."""
    if len(blob) < _MIN_BLOB_SIZE:
        raise InvalidDeletionVector(
            f"deletion vector truncated: {len(blob)} bytes, need at least {_MIN_BLOB_SIZE}"
        )
    (length,) = _U32_BE.unpack_from(blob, 0)
    expected_size = _LENGTH_SIZE + length + _CRC_SIZE
    if expected_size != len(blob):
        raise InvalidDeletionVector(
            f"deletion vector length prefix {length} implies a {expected_size}-byte blob, "
            f"but the blob has {len(blob)} bytes"
        )
    body = bytes(blob[_LENGTH_SIZE : _LENGTH_SIZE + length])
    magic = body[: len(DV_MAGIC)]
    if magic != DV_MAGIC:
        raise InvalidDeletionVector(
            f"deletion vector has bad magic {magic.hex()}, expected {DV_MAGIC.hex()}"
        )
    (stored_crc,) = _U32_BE.unpack_from(blob, _LENGTH_SIZE + length)
    actual_crc = zlib.crc32(body)
    if stored_crc != actual_crc:
        raise InvalidDeletionVector(
            f"deletion vector CRC mismatch: stored {stored_crc:08x}, computed {actual_crc:08x}"
        )
    return body


def _deserialize_bitmap(data: bytes) -> BitMap64:
    try:
        return BitMap64.deserialize(data)
    # pyroaring signals malformed input with ValueError, but short buffers surface as IndexError.
    except (ValueError, IndexError, OverflowError) as exc:
        raise InvalidDeletionVector(
            f"deletion vector holds an invalid portable Roaring64 bitmap: {exc}"
        ) from exc


def _check_cardinality(bitmap: BitMap64, expected: int | None) -> None:
    if expected is not None and len(bitmap) != expected:
        raise InvalidDeletionVector(
            f"deletion vector cardinality {len(bitmap)} does not match expected {expected}"
        )


def _check_decoded_keys(bitmap: BitMap64) -> None:
    # pyroaring happily reads keys >= 2^31 (even positions with the sign bit set); Iceberg Java
    # rejects them on read, so a blob that Java cannot read is not a valid DV for us either.
    if len(bitmap) and bitmap.max() >> 32 > MAX_KEY:
        bad = next(bitmap.iter_equal_or_larger((MAX_KEY + 1) << 32))
        raise InvalidDeletionVector(
            f"deletion vector position {bad} is out of range: key {bad >> 32} exceeds {MAX_KEY}"
        )
