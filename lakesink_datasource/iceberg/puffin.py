"""Puffin file writer and reader, specialised for Iceberg v3 deletion vectors.

File layout (Puffin spec; Java ``PuffinWriter``)::

    Magic | Blob_1 | ... | Blob_n | Magic | FooterPayload | PayloadSize | Flags | Magic

``Magic`` is ``PFA1``, ``FooterPayload`` is compact UTF-8 JSON (never compressed here),
``PayloadSize`` is a little-endian int32 and ``Flags`` four bytes whose bit 0 of byte 0 marks a
compressed payload.
"""

from __future__ import annotations

import struct
from typing import Final

import msgspec
from pyroaring import BitMap64

from lakesink_datasource.errors import LakesinkError
from lakesink_datasource.iceberg.deletion_vector import InvalidDeletionVector, decode_dv, encode_dv
from lakesink_datasource.version import __version__

__all__ = [
    "DEFAULT_CREATED_BY",
    "DELETION_VECTOR_V1",
    "DV_FIELD_ID",
    "PUFFIN_MAGIC",
    "BlobMetadata",
    "DVBlobRef",
    "FileMetadata",
    "InvalidPuffinFile",
    "PuffinWriter",
    "read_blob",
    "read_deletion_vectors",
    "read_footer",
]

PUFFIN_MAGIC: Final[bytes] = b"PFA1"
DELETION_VECTOR_V1: Final[str] = "deletion-vector-v1"
# The `_pos` metadata column id (Integer.MAX_VALUE - 2). The spec leaves `fields` open; Java writes this.
DV_FIELD_ID: Final[int] = 2147483645
# DV blobs inherit snapshot id and sequence number at commit time, so the spec requires -1.
UNASSIGNED: Final[int] = -1

PROP_REFERENCED_DATA_FILE: Final[str] = "referenced-data-file"
PROP_CARDINALITY: Final[str] = "cardinality"
PROP_CREATED_BY: Final[str] = "created-by"

FLAG_FOOTER_COMPRESSED: Final[int] = 0x01

_MAGIC_SIZE: Final[int] = len(PUFFIN_MAGIC)
_FIRST_BLOB_OFFSET: Final[int] = _MAGIC_SIZE
# Footer trailer after the payload: size (4) + flags (4) + magic (4).
_TRAILER_SIZE: Final[int] = 12
# Leading magic + footer magic + empty payload + trailer.
_MIN_FILE_SIZE: Final[int] = _MAGIC_SIZE + _MAGIC_SIZE + _TRAILER_SIZE
_I32_LE = struct.Struct("<i")


# Not read from the package metadata: importlib.metadata scans every installed distribution,
# a few hundred milliseconds at each Python worker's import.
DEFAULT_CREATED_BY: Final[str] = f"lakesink {__version__}"


class InvalidPuffinFile(LakesinkError, ValueError):
    """Bytes that are not a well-formed (uncompressed-footer) Puffin file."""


# Field order is the JSON key order; it mirrors Java's FileMetadataParser so our footers look
# exactly like Java's. omit_defaults drops compression-codec=None and empty properties, as Java does.
class BlobMetadata(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, rename="kebab"):
    type: str
    fields: list[int]
    snapshot_id: int
    sequence_number: int
    offset: int
    length: int
    compression_codec: str | None = None
    properties: dict[str, str] = msgspec.field(default_factory=dict)


class FileMetadata(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    blobs: list[BlobMetadata]
    properties: dict[str, str] = msgspec.field(default_factory=dict)


class DVBlobRef(msgspec.Struct, frozen=True):
    """Where a DV landed in the Puffin file: the manifest's 143/144/145 fields and record_count."""

    referenced_data_file: str
    offset: int
    length: int
    cardinality: int


class PuffinWriter:
    """Builds one Puffin file of DV blobs in memory; any number of data files may share it."""

    def __init__(self) -> None:
        self._chunks: list[bytes] = [PUFFIN_MAGIC]
        self._offset = _FIRST_BLOB_OFFSET
        self._blobs: list[BlobMetadata] = []
        self._refs: dict[str, DVBlobRef] = {}
        self._result: bytes | None = None

    @property
    def refs(self) -> list[DVBlobRef]:
        return list(self._refs.values())

    def add_deletion_vector(self, referenced_data_file: str, positions: BitMap64) -> DVBlobRef:
        if self._result is not None:
            raise RuntimeError("PuffinWriter already finished")
        # Readers key DVs by referenced-data-file, so a second blob for the same file would be ambiguous.
        if referenced_data_file in self._refs:
            raise ValueError(f"duplicate deletion vector for {referenced_data_file!r}")
        blob = encode_dv(positions)
        ref = DVBlobRef(referenced_data_file, self._offset, len(blob), len(positions))
        self._blobs.append(_dv_blob_metadata(ref))
        self._chunks.append(blob)
        self._offset += len(blob)
        self._refs[referenced_data_file] = ref
        return ref

    def finish(self, created_by: str = DEFAULT_CREATED_BY) -> bytes:
        """Return the complete file. Calling it again returns the same bytes."""
        if self._result is None:
            properties = {PROP_CREATED_BY: created_by} if created_by else {}
            footer = FileMetadata(blobs=self._blobs, properties=properties)
            self._chunks.append(_encode_footer(footer))
            self._result = b"".join(self._chunks)
        return self._result


def _dv_blob_metadata(ref: DVBlobRef) -> BlobMetadata:
    return BlobMetadata(
        type=DELETION_VECTOR_V1,
        fields=[DV_FIELD_ID],
        snapshot_id=UNASSIGNED,
        sequence_number=UNASSIGNED,
        offset=ref.offset,
        length=ref.length,
        properties={
            PROP_REFERENCED_DATA_FILE: ref.referenced_data_file,
            PROP_CARDINALITY: str(ref.cardinality),
        },
    )


def _encode_footer(footer: FileMetadata) -> bytes:
    payload = msgspec.json.encode(footer)
    flags = bytes(4)  # uncompressed: Java cannot read LZ4 footers yet
    return PUFFIN_MAGIC + payload + _I32_LE.pack(len(payload)) + flags + PUFFIN_MAGIC


def read_footer(data: bytes) -> FileMetadata:
    """Parse and validate the footer of a whole Puffin file."""
    payload_start, payload_end = _footer_payload_bounds(data)
    try:
        footer = msgspec.json.decode(data[payload_start:payload_end], type=FileMetadata)
    except msgspec.DecodeError as exc:  # ValidationError is a subclass
        raise InvalidPuffinFile(f"Puffin footer is not valid FileMetadata JSON: {exc}") from exc
    for blob in footer.blobs:
        _check_blob_bounds(blob.offset, blob.length, payload_start - _MAGIC_SIZE)
    return footer


def _footer_payload_bounds(data: bytes) -> tuple[int, int]:
    size = len(data)
    if size < _MIN_FILE_SIZE:
        raise InvalidPuffinFile(f"Puffin file truncated: {size} bytes, need at least {_MIN_FILE_SIZE}")
    _expect_magic(data, 0, "leading")
    _expect_magic(data, size - _MAGIC_SIZE, "trailing")
    _check_flags(data[size - 8 : size - 4])
    (payload_size,) = _I32_LE.unpack_from(data, size - _TRAILER_SIZE)
    payload_end = size - _TRAILER_SIZE
    footer_start = payload_end - payload_size - _MAGIC_SIZE
    if payload_size < 0 or footer_start < _FIRST_BLOB_OFFSET:
        raise InvalidPuffinFile(
            f"Puffin footer payload size {payload_size} points outside the {size}-byte file"
        )
    _expect_magic(data, footer_start, "footer")
    return footer_start + _MAGIC_SIZE, payload_end


def _expect_magic(data: bytes, at: int, which: str) -> None:
    found = bytes(data[at : at + _MAGIC_SIZE])
    if found != PUFFIN_MAGIC:
        raise InvalidPuffinFile(
            f"bad {which} Puffin magic at offset {at}: {found!r}, expected {PUFFIN_MAGIC!r}"
        )


def _check_flags(flags: bytes) -> None:
    if flags[0] & FLAG_FOOTER_COMPRESSED:
        raise InvalidPuffinFile("Puffin footer is LZ4-compressed, which is not supported")
    # An unknown flag could change how the footer must be read, so refuse rather than guess.
    if flags[0] & ~FLAG_FOOTER_COMPRESSED or any(flags[1:]):
        raise InvalidPuffinFile(f"Puffin footer has unknown flags set: {bytes(flags).hex()}")


def _check_blob_bounds(offset: int, length: int, blobs_end: int) -> None:
    if offset < _FIRST_BLOB_OFFSET or length < 0 or offset + length > blobs_end:
        raise InvalidPuffinFile(
            f"Puffin blob [offset {offset}, length {length}] lies outside the blob area [4, {blobs_end})"
        )


def read_deletion_vectors(data: bytes) -> dict[str, BitMap64]:
    """Decode every ``deletion-vector-v1`` blob, keyed by its referenced data file."""
    result: dict[str, BitMap64] = {}
    for blob in read_footer(data).blobs:
        if blob.type != DELETION_VECTOR_V1:
            continue
        path = _required_property(blob, PROP_REFERENCED_DATA_FILE)
        if path in result:
            raise InvalidPuffinFile(f"Puffin file has more than one deletion vector for {path!r}")
        # The spec forbids compressing DVs; a codec here means the blob is not a plain DV.
        if blob.compression_codec is not None:
            raise InvalidPuffinFile(
                f"deletion vector for {path!r} is compressed with {blob.compression_codec!r}"
            )
        cardinality = _parse_cardinality(_required_property(blob, PROP_CARDINALITY), path)
        try:
            result[path] = read_blob(data, blob.offset, blob.length, cardinality)
        except InvalidDeletionVector as exc:
            raise InvalidDeletionVector(f"deletion vector for {path!r}: {exc}") from exc
    return result


def read_blob(data: bytes, offset: int, length: int, expected_cardinality: int | None) -> BitMap64:
    """Decode one DV from a Puffin file given only the manifest's content offset and size.

    This is Java's read path: it never consults the footer.
    """
    if offset < 0 or length < 0 or offset + length > len(data):
        raise InvalidPuffinFile(
            f"deletion vector [offset {offset}, length {length}] lies outside the {len(data)}-byte file"
        )
    return decode_dv(data[offset : offset + length], expected_cardinality)


def _required_property(blob: BlobMetadata, key: str) -> str:
    try:
        return blob.properties[key]
    except KeyError:
        raise InvalidPuffinFile(
            f"{blob.type} blob at offset {blob.offset} lacks the required property {key!r}"
        ) from None


def _parse_cardinality(text: str, path: str) -> int:
    # int() alone would also accept " 5", "+5" or "5_0"; Java writes plain decimal digits.
    if not text.isascii() or not text.isdigit():
        raise InvalidPuffinFile(f"deletion vector for {path!r} has a non-numeric cardinality {text!r}")
    return int(text)
