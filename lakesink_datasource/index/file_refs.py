"""What the key index remembers about a data file: its path, spec and partition.

The index maps keys to a compact file ordinal; the ordinal's entry keeps enough to build a
deletion vector for the file (path, partition spec id, partition values as Iceberg
single-value bytes) without reading any manifest.
"""

from __future__ import annotations

import msgspec


class FileRef(msgspec.Struct, array_like=True, frozen=True):
    path: str
    spec_id: int
    partition: tuple[bytes | None, ...]


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(FileRef)


def encode_ref(ref: FileRef) -> str:
    return _encoder.encode(ref).decode()


def decode_ref(raw: str) -> FileRef:
    return _decoder.decode(raw)
