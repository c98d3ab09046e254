"""A task's Debezium records as the decoding reads them: the columns (`Records`, `Texts`),
what each way of reading gives for a table (`Part`), and the names they share.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lakesink_datasource.debezium.envelope import (
    DELETE_OP,
    TRUNCATE_OP,
    WRITE_OPS,
    where,
)
from lakesink_datasource.debezium.options import DebeziumOptions

OP_COLUMN = "__op"
RECORD = "\x00the record\x00"  # stands for a record's place in errors, until one is raised
CHANGE_OPS = (*WRITE_OPS, DELETE_OP, TRUNCATE_OP)

# A source table as its events name it: (source.db, source.schema, source.table).
SourceName = tuple[str | None, str | None, str]


# The Arrow schema a table already has (None: it does not exist): a row read without
# Connect schemas takes its column types from it, as any routed JSON payload does.
TableSchema = Callable[[str], pa.Schema | None]
# Raw JSON: msgspec's view of the record's bytes, a view of them, or bytes.
Json = bytes | msgspec.Raw | memoryview

@dataclass
class Part:
    """Some of a table's events, read one way: which records, their ops, rows, keys, positions."""

    indices: np.ndarray  # int64, into the task's records
    ops: pa.Array  # string
    rows: pa.Table  # the row's fields (`after`; a delete's `before`)
    keys: pa.Table | None  # the message key's fields (None: no event here has a key)
    keyless: np.ndarray  # bool: the event has no message key
    position: pa.StructArray


class Texts:
    """A binary or string column: the Arrow array for the bulk read's vectorised work, and
    `bytes` per value for records read one by one (one copy of the column, made when first
    asked for)."""

    def __init__(self, array: pa.Array | None, n: int) -> None:
        self.n = n
        if array is None or pa.types.is_null(array.type):
            array = pa.nulls(n, pa.binary())
        elif pa.types.is_string(array.type):
            array = array.cast(pa.binary())
        elif pa.types.is_large_string(array.type):
            array = array.cast(pa.large_binary())
        self.array: pa.Array = array
        self._valid = np.asarray(array.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
        self._offsets: np.ndarray | None = None
        self._whole = b""

    def __getitem__(self, i: int) -> bytes | None:
        if not self._valid[i]:
            return None
        if self._offsets is None:
            _validity, offsets, data = self.array.buffers()[:3]
            wide = pa.types.is_large_binary(self.array.type)
            self._offsets = np.frombuffer(offsets, dtype=np.int64 if wide else np.int32)[self.array.offset : self.array.offset + self.n + 1]
            self._whole = data.to_pybytes() if data is not None else b""
        return self._whole[self._offsets[i] : self._offsets[i + 1]]

    def valid(self, i: int) -> bool:
        return bool(self._valid[i])


def payloads(values: pa.Array, prefix: bytes) -> tuple[np.ndarray, bytes]:
    """Which of `values` are JsonConverter's wrapper with `prefix` (a topic's schema) around a
    payload, and those payloads as one newline-delimited blob: vectorised, no Python per value."""
    text = prefix.decode("utf-8", errors="surrogateescape")
    wrapped = pc.and_(pc.starts_with(values, pattern=text), pc.ends_with(values, pattern="}"))
    mask = np.asarray(pc.fill_null(wrapped, False).to_numpy(zero_copy_only=False), dtype=bool)
    if not mask.any():
        return mask, b""
    chosen = values.filter(pa.array(mask))
    cut = pc.binary_replace_slice(chosen, start=0, stop=len(prefix), replacement="")
    lines = pc.binary_replace_slice(cut, start=-1, stop=1 << 30, replacement="\n")  # the wrapper's closing brace
    if isinstance(lines, pa.ChunkedArray):
        lines = lines.combine_chunks()
    _validity, offsets, data = lines.buffers()[:3]
    wide = pa.types.is_large_binary(lines.type)
    bounds = np.frombuffer(offsets, dtype=np.int64 if wide else np.int32)[lines.offset : lines.offset + len(lines) + 1]
    return mask, data.to_pybytes()[int(bounds[0]) : int(bounds[-1])]


@dataclass
class Records:
    """The task's records as columns, and the options naming them."""

    options: DebeziumOptions
    values: Texts
    keys: Texts
    topics: list[Any]
    partitions: list[Any]
    offsets: list[Any]
    key_struct: pa.StructArray | None
    value_struct: pa.StructArray | None
    sources: dict[str, SourceName] = field(default_factory=dict)  # table -> the source table its events name

    def where(self, i: int) -> str:
        return where(self.topics[i], self.partitions[i], self.offsets[i], i)
