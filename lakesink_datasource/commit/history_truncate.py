"""A source table's truncate in a history table (`history=true` with `cdc_format=debezium`).

A plain replica hides every row ordered before the truncate (commit/overwrite.py, scope
`before`). A history table keeps its past: the versions that held at a truncate's position
T end there, the rest stay. The task that meets the truncate deletes its own keys at T
(debezium/decode.py); the rest is done at commit, so that every task's rows of the batch
count: each live version whose `__end_at` is null or after the first truncate T after its
`__start_at` (the batch's own rows included: a task of the batch that did not meet the
truncate ended a version after T) is hidden and written again ending at T, in a file this
commit adds.

The key index still points at the hidden open row of such a key; the next batch's tasks
know it is no current version by its start, before the table's `lakesink.truncated-before`
(write/keyed.py).
"""

from __future__ import annotations

import bisect
import decimal
import uuid
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.io import FileIO
from pyiceberg.manifest import DataFile
from pyiceberg.table.metadata import TableMetadata
from pyroaring import BitMap64

from lakesink_datasource.commit.data_files import data_file
from lakesink_datasource.commit.deletion_vectors import PendingDeletes
from lakesink_datasource.iceberg.live_files import live_data_files, live_position_deletes, without_hidden_rows
from lakesink_datasource.iceberg.partition_key import PartitionKey, partition_path
from lakesink_datasource.iceberg.properties import TableSettings, effective_properties
from lakesink_datasource.index.key_encoding import encode_keys
from lakesink_datasource.io.partitioning import PartitionSplitter
from lakesink_datasource.io.rolling_writer import PartitionedParquetWriter
from lakesink_datasource.schema.arrow_align import table_arrow_schema
from lakesink_datasource.table.plan import WritePlan, write_schema, write_spec


class TruncateBoundError(ValueError):
    """The truncate's position cannot be written as the table's bound (a part of a type the
    position encoding does not read back)."""


@dataclass
class Ended:
    """What ending the versions at a truncate adds to the batch's commit."""

    files: list[DataFile]
    hidden: dict[str, PendingDeletes]
    versions: int


def end_versions_at(
    io: FileIO, metadata: TableMetadata, plan: WritePlan, added: list[DataFile], hidden: dict[str, PendingDeletes],
    truncates: list[bytes],
) -> Ended:
    """End every version that held at one of the batch's truncates (`truncates`, encoded as
    sequences are, in order) at the first of them after its start: live rows of the table and
    rows of the batch's files (`added`), less the rows the batch hides already (`hidden`)."""
    history = plan.keyed.history if plan.keyed is not None else None
    assert history is not None
    schema = write_schema(plan, metadata)
    arrow_schema = table_arrow_schema(schema)
    kind = arrow_schema.field(history.end).type
    snapshot = metadata.current_snapshot()
    gone = live_position_deletes(io, snapshot) if snapshot is not None else {}
    candidates = [(e.data_file, True) for e in live_data_files(io, snapshot)] if snapshot is not None else []
    candidates += [(f, False) for f in added]
    rows: list[pa.Table] = []
    out = Ended([], {}, 0)
    for f, committed in candidates:
        with io.new_input(f.file_path).open() as stream:
            bounds = pq.read_table(stream, columns=[history.start, history.end])
        visible, positions = without_hidden_rows(io, bounds, gone.get(f.file_path)) if committed else (bounds, np.arange(bounds.num_rows))
        positions = np.asarray(positions, dtype=np.int64)
        pending = hidden.get(f.file_path)
        if pending is not None and len(positions):
            keep = ~np.isin(positions, np.asarray(list(pending.positions), dtype=np.int64))
            visible, positions = visible.filter(pa.array(keep)), positions[keep]
        if visible.num_rows == 0:
            continue
        spans, ends_at = _spanning(visible.column(history.start), visible.column(history.end), truncates)
        if not len(spans):
            continue
        at = positions[spans]
        out.hidden[f.file_path] = PendingDeletes(f.spec_id, f.partition, BitMap64(at.astype(np.uint64)))
        with io.new_input(f.file_path).open() as stream:
            chosen = _conform(pq.read_table(stream).take(pa.array(at)), arrow_schema)
        index = chosen.schema.get_field_index(history.end)
        ended_at = pa.array([decode_bound(p, kind) for p in ends_at], kind)
        rows.append(chosen.set_column(index, chosen.schema.field(index), ended_at))
        out.versions += len(spans)
    if rows:
        out.files = _write(io, metadata, plan, pa.concat_tables(rows))
    return out


def _conform(rows: pa.Table, schema: pa.Schema) -> pa.Table:
    """A data file's rows as the table's columns now (a column added since: null)."""
    columns = [rows.column(f.name).cast(f.type) if f.name in rows.column_names else pa.nulls(rows.num_rows, f.type) for f in schema]
    return pa.Table.from_arrays(columns, schema=schema)


def _spanning(starts: pa.ChunkedArray, ends: pa.ChunkedArray, truncates: list[bytes]) -> tuple[np.ndarray, list[bytes]]:
    """Rows whose version holds at a truncate (the first of `truncates`, in order, after its
    start: it ends there unless it ended at or before it), and the truncate each ends at."""
    start = encode_keys([starts])
    end_column = ends.combine_chunks()
    valid = np.asarray(end_column.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    end: list[bytes | None] = [None] * len(end_column)
    where = np.flatnonzero(valid)
    if len(where):
        for i, e in zip(where.tolist(), encode_keys([end_column.take(pa.array(where))])):
            end[i] = e
    rows: list[int] = []
    at: list[bytes] = []
    for i, (s, e_or_open) in enumerate(zip(start, end)):
        first = bisect.bisect_right(truncates, s)  # the first truncate after the start
        if first < len(truncates) and (e_or_open is None or e_or_open > truncates[first]):
            rows.append(i)
            at.append(truncates[first])
    return np.asarray(rows, dtype=np.int64), at


def _write(io: FileIO, metadata: TableMetadata, plan: WritePlan, rows: pa.Table) -> list[DataFile]:
    """The ended versions in new data files of the table's layout."""
    schema = write_schema(plan, metadata)
    spec = write_spec(plan, metadata)
    properties = effective_properties(metadata.properties, plan.options.table_properties)
    settings = TableSettings.of(properties, metadata.location)
    prefix = f"truncate-{uuid.uuid4().hex[:12]}"

    def path_for(key: PartitionKey, n: int) -> str:
        return settings.data_locations.of(partition_path(spec, schema, key), f"{prefix}-{n:05d}.parquet")

    writer = PartitionedParquetWriter.for_table(
        settings, io=io, iceberg_schema=schema, arrow_schema=table_arrow_schema(schema), spec_id=spec.spec_id,
        table_properties=properties, path_for=path_for,
    )
    try:
        for partition, indices in PartitionSplitter(spec, schema).split_rows(rows):
            writer.write(partition, rows.take(pa.array(indices)) if len(indices) != rows.num_rows else rows)
        messages = writer.close()
    except BaseException:
        writer.abort()
        raise
    return [data_file(m, metadata) for m in messages]


def decode_bound(encoded: bytes, kind: pa.DataType) -> object:
    """The value of `kind` whose sequence encoding (index/key_encoding.py) is `encoded`."""
    value, rest = _decode(encoded, kind)
    if rest:
        raise TruncateBoundError(f"a truncate's position has {len(rest)} byte(s) more than a {kind} bound holds")
    return value


def _decode(data: bytes, kind: pa.DataType) -> tuple[object, bytes]:
    if pa.types.is_struct(kind):
        fields = {}
        for field in kind:
            fields[field.name], data = _decode(data, field.type)
        return fields, data
    if pa.types.is_boolean(kind):
        return bool(data[0]), data[1:]
    if pa.types.is_signed_integer(kind) or (pa.types.is_temporal(kind) and not pa.types.is_interval(kind)):
        width = kind.bit_width // 8
        raw = int.from_bytes(data[:width], "big") ^ (1 << (8 * width - 1))
        number = raw - (1 << (8 * width)) if raw >= 1 << (8 * width - 1) else raw
        return (number if pa.types.is_integer(kind) else pa.scalar(number, pa.int64()).cast(kind).as_py()), data[width:]
    if pa.types.is_unsigned_integer(kind):
        width = kind.bit_width // 8
        return int.from_bytes(data[:width], "big"), data[width:]
    if pa.types.is_decimal(kind):
        width = kind.byte_width
        raw = int.from_bytes(data[:width], "big") ^ (1 << (8 * width - 1))
        unscaled = raw - (1 << (8 * width)) if raw >= 1 << (8 * width - 1) else raw
        return decimal.Decimal(unscaled).scaleb(-kind.scale), data[width:]
    if pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        out = bytearray()
        i = 0
        while not (data[i] == 0 and data[i + 1] == 0):
            if data[i] == 0:  # 0x00 0xFF: an escaped zero byte
                out.append(0)
                i += 2
            else:
                out.append(data[i])
                i += 1
        raw = bytes(out)
        return (raw.decode() if pa.types.is_string(kind) or pa.types.is_large_string(kind) else raw), data[i + 2 :]
    raise TruncateBoundError(f"a truncate's position part of type {kind} cannot be written as a history table's bound")
