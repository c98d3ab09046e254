"""Where a key's live row sits (`Location`), and its byte encoding as a value of the key
index's ``keys`` sub-database.

A packed location is a u32 file ordinal and a u64 row position (little-endian), followed,
when the table orders conflicting upserts by a sequence column, by a 0x01 marker and the
encoded sequence: the marker keeps an empty sequence (b"") apart from none (None). The
bulk packers and `decode_locations` produce and read exactly the bytes of `pack_location`
and `unpack_location`, with numpy doing the per-row work.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import NamedTuple, cast

import msgspec
import numpy as np

from lakesink_datasource.index.undo_log import MAX_VALUE_LENGTH

__all__ = ["Found", "Location", "decode_locations", "pack_location", "pack_locations", "pack_positions", "unpack_location"]


class Location(msgspec.Struct, array_like=True, frozen=True):
    """Where a key's live row is: a data file (by compact ordinal) and a row position.

    `sequence` is an order-preserving encoded sequence value (compared bytewise) when the
    table resolves conflicting upserts by a sequence column, else None.
    """

    file_ordinal: int
    position: int
    sequence: bytes | None = None


class Found(NamedTuple):
    """The current locations of a chunk of keys, as columns in the keys' order."""

    present: np.ndarray  # bool: the index has the key
    ordinal: np.ndarray  # int64 file ordinal (0 where absent)
    position: np.ndarray  # int64 row position (0 where absent)
    sequence: list[bytes | None] | None  # per key, None: no sequence; the list is None when no key has one


_LOCATION = struct.Struct("<IQ")
_SEQUENCE_MARKER = b"\x01"


def _check_sequence_length(length: int) -> None:
    # Every packed location is also a value of the undo log, whose lengths are bounded.
    if _LOCATION.size + len(_SEQUENCE_MARKER) + length > MAX_VALUE_LENGTH:
        raise ValueError(f"sequence value of {length} bytes is too long for the index")


def pack_location(loc: Location) -> bytes:
    head = _LOCATION.pack(loc.file_ordinal, loc.position)
    if loc.sequence is not None:
        _check_sequence_length(len(loc.sequence))
    return head if loc.sequence is None else head + _SEQUENCE_MARKER + loc.sequence


def pack_locations(ordinal: int, first_position: int, count: int, sequences: Sequence[bytes] | None = None) -> list[bytes]:
    """`pack_location` for `count` consecutive positions of one file, vectorised."""
    return pack_positions(ordinal, np.arange(first_position, first_position + count, dtype=np.uint64), sequences)


def pack_positions(ordinal: int, positions: np.ndarray, sequences: Sequence[bytes | None] | None = None) -> list[bytes]:
    """`pack_location` for rows at `positions` of one file, vectorised."""
    width = _fixed_width(sequences) if sequences is not None and len(positions) else None
    fields = [("ordinal", "<u4"), ("position", "<u8")]
    if width is not None:
        # Every row has a sequence of one width (an integer or timestamp column): the whole
        # value is one numpy record, so no row costs a Python concatenation.
        _check_sequence_length(width)
        fields += [("marker", "u1"), ("sequence", f"V{width}")]
    packed = np.empty(len(positions), dtype=fields)
    packed["ordinal"] = ordinal
    packed["position"] = positions
    if width is not None:
        packed["marker"] = _SEQUENCE_MARKER[0]
        packed["sequence"] = np.frombuffer(b"".join(cast(Sequence[bytes], sequences)), dtype=f"V{width}")
    # A void dtype's tolist() gives one bytes object per record, all in C.
    heads: list[bytes] = packed.view(f"V{packed.dtype.itemsize}").tolist()
    if sequences is None or width is not None:
        return heads
    lengths = [len(s) for s in sequences if s is not None]
    if lengths:
        _check_sequence_length(max(lengths))
    return [h if s is None else h + _SEQUENCE_MARKER + s for h, s in zip(heads, sequences)]


def _fixed_width(values: Sequence[bytes | None]) -> int | None:
    """The one length of `values` when none is None (nor empty) and all are as long."""
    if not values or None in values:
        return None
    widths = set(map(len, cast(Sequence[bytes], values)))
    width = widths.pop()
    return width if not widths and width > 0 else None


def unpack_location(raw: bytes) -> Location:
    if len(raw) == _LOCATION.size:  # the common no-sequence case, kept cheap
        return Location(*_LOCATION.unpack(raw))
    ordinal, position = _LOCATION.unpack_from(raw)
    return Location(ordinal, position, raw[_LOCATION.size + 1 :])  # skip the marker byte


def decode_locations(raw: Sequence[bytes | None]) -> Found:
    """`unpack_location` of a whole lookup at once: the fixed heads are cut out of one joined
    buffer by numpy, so only keys that carry a sequence cost a Python slice."""
    n = len(raw)
    values = [r or b"" for r in raw]  # a stored location is never empty
    lengths = np.fromiter(map(len, values), dtype=np.int64, count=n)
    present = lengths > 0
    blob = np.frombuffer(b"".join(values), dtype=np.uint8)
    size = _LOCATION.size
    if blob.size == size * int(present.sum()):
        heads = blob  # no sequences: the heads are the whole buffer
    else:
        starts = (np.cumsum(lengths) - lengths)[present]
        heads = blob[(starts[:, None] + np.arange(size)).ravel()]
    fields = np.ascontiguousarray(heads).view(np.dtype([("ordinal", "<u4"), ("position", "<u8")]))
    ordinal = np.zeros(n, dtype=np.int64)
    position = np.zeros(n, dtype=np.int64)
    ordinal[present] = fields["ordinal"]
    position[present] = fields["position"].astype(np.int64)
    sequence = None
    if blob.size != size * int(present.sum()):
        sequence = _sequences(values, lengths, blob)
    return Found(present, ordinal, position, sequence)


def _sequences(values: list[bytes], lengths: np.ndarray, blob: np.ndarray) -> list[bytes | None]:
    """Each value's sequence (after the head and the marker byte), None where it has none."""
    size = _LOCATION.size
    has = lengths > size
    widths = lengths[has] - size - 1
    if len(widths) and int(widths.min()) == int(widths.max()) > 0:
        # One width (an integer or timestamp sequence column): cut every sequence out of
        # the joined buffer at once instead of slicing each value in Python.
        width = int(widths[0])
        starts = (np.cumsum(lengths) - lengths)[has] + size + 1
        cut = np.ascontiguousarray(blob[(starts[:, None] + np.arange(width)).ravel()]).view(f"V{width}")
        sequence = np.full(len(values), None, dtype=object)
        sequence[has] = cut.tolist()
        return cast(list[bytes | None], sequence.tolist())
    return [v[size + 1 :] if len(v) > size else None for v in values]  # skip the marker byte
