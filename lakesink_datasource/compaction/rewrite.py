"""Rewrite data files into new ones: live rows only, row lineage kept.

A compacted row keeps its identity (Iceberg v3 row lineage): its `_row_id` and
`_last_updated_sequence_number` are written explicitly into the new file, taken from the
old file's columns when it has them and otherwise inherited as the spec says (the file's
`first_row_id` + position, and its data sequence number). Rows hidden by the file's DV are
dropped, so the DV goes with the file.

Columns are matched by Parquet field id, so files written by other engines (other column
order, extra metadata columns) are read correctly.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.io import FileIO
from pyiceberg.manifest import ManifestEntry
from pyiceberg.schema import Schema
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.types import LongType, NestedField

from lakesink_datasource.iceberg.live_files import without_hidden_rows
from lakesink_datasource.iceberg.manifests import data_file_first_row_id
from lakesink_datasource.iceberg.partition_key import PartitionKey, encode_partition, partition_path
from lakesink_datasource.iceberg.properties import TableSettings
from lakesink_datasource.iceberg.row_lineage import (
    FIELD_ID_KEY,
    LAST_UPDATED,
    LAST_UPDATED_FIELD_ID,
    ROW_ID,
    ROW_ID_FIELD_ID,
    field_ids,
)
from lakesink_datasource.index.key_shards import file_shard
from lakesink_datasource.io.partitioning import PartitionSplitter
from lakesink_datasource.io.rolling_writer import PartitionedParquetWriter
from lakesink_datasource.io.row_order import RowOrder
from lakesink_datasource.messages import DataFileMessage
from lakesink_datasource.schema.arrow_align import align_array, null_array, table_arrow_schema

COMPACTED_PREFIX = "compacted-"  # names of files a lakesink compaction wrote
_V = TypeVar("_V")


@dataclass(frozen=True)
class RewriteInput:
    entry: ManifestEntry  # the live data file (data sequence number, first row id)
    deletion_vector: ManifestEntry | None


def _lineage_field(field_id: int, name: str) -> pa.Field:
    return pa.field(name, pa.int64(), nullable=True, metadata={FIELD_ID_KEY: str(field_id).encode()})


def live_rows_with_lineage(io: FileIO, item: RewriteInput, target: pa.Schema) -> pa.Table:
    """The file's rows its DV does not hide, as `target` (table columns + the two lineage
    columns), lineage made explicit."""
    data_file = item.entry.data_file
    with io.new_input(data_file.file_path).open() as stream:
        table = pq.read_table(stream)
    table, positions = without_hidden_rows(io, table, item.deletion_vector)
    ids = field_ids(table.schema)
    first_row_id = data_file_first_row_id(data_file)
    inherited = {
        ROW_ID_FIELD_ID: None if first_row_id is None else pa.array(positions + first_row_id, pa.int64()),
        LAST_UPDATED_FIELD_ID: None if item.entry.sequence_number is None else pa.array(
            np.full(len(positions), item.entry.sequence_number, dtype=np.int64)
        ),
    }
    columns = []
    for f in target:
        field_id = int(f.metadata[FIELD_ID_KEY])
        present = table.column(ids[field_id]) if field_id in ids else None
        if field_id in inherited:
            fallback = inherited[field_id]
            if present is None:
                column = fallback if fallback is not None else pa.nulls(len(positions), pa.int64())
            else:
                column = present.cast(pa.int64()) if fallback is None else pc.coalesce(present.cast(pa.int64()), fallback)
        elif present is None:
            column = null_array(len(positions), f.type)  # a column the file predates
        else:
            column = present if present.type.equals(f.type) else align_array(present, f.type)
        columns.append(column)
    return pa.Table.from_arrays(columns, schema=target)


def rewrite_files(
    io: FileIO,
    metadata: TableMetadata,
    inputs: Iterable[RewriteInput],
    *,
    target_file_size: int,
    on_file: Callable[[RewriteInput], None] | None = None,
) -> tuple[list[DataFileMessage], Callable[[], list[str]]]:
    """Write the live rows of `inputs` into new files laid out by the current spec (files of
    an earlier spec are re-partitioned); returns the new files and a function that deletes
    them."""
    schema = metadata.schema()
    spec = metadata.spec()
    settings = TableSettings.of_table(metadata)
    # Row lineage exists from format v3 on; v2 files get the table's columns only.
    v3 = metadata.format_version >= 3
    target = pa.schema(
        [*table_arrow_schema(schema)]
        + ([_lineage_field(ROW_ID_FIELD_ID, ROW_ID), _lineage_field(LAST_UPDATED_FIELD_ID, LAST_UPDATED)] if v3 else [])
    )
    lineage = [
        NestedField(ROW_ID_FIELD_ID, ROW_ID, LongType(), required=False),
        NestedField(LAST_UPDATED_FIELD_ID, LAST_UPDATED, LongType(), required=False),
    ] if v3 else []
    write_schema = Schema(*schema.fields, *lineage, schema_id=schema.schema_id, identifier_field_ids=schema.identifier_field_ids)
    prefix = f"{COMPACTED_PREFIX}{uuid.uuid4().hex[:16]}"
    inputs = list(inputs)
    shards = {file_shard(i.entry.data_file.file_path) for i in inputs}
    if len(shards) == 1 and None not in shards:
        # One key shard's files make a file of that shard (compaction.py rewrites each
        # shard's files apart): another shard's index goes on skipping it.
        (shard,) = shards
        assert shard is not None
        prefix = f"{prefix}-{shard.file_tag()}"

    def path_for(key: PartitionKey, n: int) -> str:
        return settings.data_locations.of(partition_path(spec, schema, key), f"{prefix}-{n:05d}.parquet")

    writer = PartitionedParquetWriter.for_table(
        settings,
        io=io,
        iceberg_schema=write_schema,
        arrow_schema=target,
        spec_id=spec.spec_id,
        table_properties=metadata.properties,
        path_for=path_for,
        target_file_size=target_file_size,
        # Compaction output sorted by the table's order: the key index follows it by row id,
        # not by position, so its rows may be reordered.
        row_order=RowOrder.of(metadata.sort_order(), write_schema),
    )
    splitter = PartitionSplitter(spec, schema)
    try:
        for item, rows in _read_ahead(inputs, lambda i: live_rows_with_lineage(io, i, target)):
            if item.entry.data_file.spec_id == spec.spec_id:
                writer.write(encode_partition(spec, schema, item.entry.data_file.partition), rows)
            else:
                # A file of an earlier spec: its rows go to the current spec's partitions.
                for key, part in splitter.split(rows):
                    writer.write(key, part)
            if on_file is not None:
                on_file(item)
        messages = writer.close()
    except BaseException:
        writer.abort()
        raise
    paths = [m.path for m in messages]

    def delete() -> list[str]:
        for path in paths:
            try:
                io.delete(path)
            except FileNotFoundError:
                pass
        return paths

    # Readers know the lineage columns by their reserved ids; no metrics for them, as Java.
    lineage_ids = {ROW_ID_FIELD_ID, LAST_UPDATED_FIELD_ID}
    return [_without_fields(m, lineage_ids) for m in messages], delete


def rewrite_by_shard(
    io: FileIO, metadata: TableMetadata, chosen: list[RewriteInput], *, target_file_size: int,
    on_file: Callable[[RewriteInput], None] | None,
) -> tuple[list[DataFileMessage], Callable[[], list[str]]]:
    """`rewrite_files` once per key shard among the inputs (untagged files together)."""
    by_shard: dict[str | None, list[RewriteInput]] = {}
    for item in chosen:
        shard = file_shard(item.entry.data_file.file_path)
        by_shard.setdefault(shard.file_tag() if shard else None, []).append(item)
    messages: list[DataFileMessage] = []
    deleters: list[Callable[[], list[str]]] = []
    try:
        for items in by_shard.values():
            written, delete = rewrite_files(io, metadata, items, target_file_size=target_file_size, on_file=on_file)
            messages += written
            deleters.append(delete)
    except BaseException:
        for delete in deleters:
            delete()
        raise

    def delete_all() -> list[str]:
        return [path for delete in deleters for path in delete()]

    return messages, delete_all


def _read_ahead(inputs: Iterable[RewriteInput], read: Callable[[RewriteInput], pa.Table]) -> Iterator[tuple[RewriteInput, pa.Table]]:
    """Each input with its rows, the next one read while the caller encodes this one: reading
    (I/O, decompression, decoding) and encoding each took about half of a compaction, one
    after the other, and pyarrow does both without holding the GIL. One file ahead at most,
    so memory stays at two inputs' rows."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="lakesink-rewrite-read") as pool:
        pending: tuple[RewriteInput, Future[pa.Table]] | None = None
        for item in inputs:
            upcoming = (item, pool.submit(read, item))
            if pending is not None:
                yield pending[0], pending[1].result()
            pending = upcoming
        if pending is not None:
            yield pending[0], pending[1].result()


def _without_fields(message: DataFileMessage, field_ids: set[int]) -> DataFileMessage:
    def strip(metrics: Mapping[int, _V]) -> dict[int, _V]:
        return {k: v for k, v in metrics.items() if k not in field_ids}

    return msgspec.structs.replace(
        message,
        column_sizes=strip(message.column_sizes),
        value_counts=strip(message.value_counts),
        null_value_counts=strip(message.null_value_counts),
        nan_value_counts=strip(message.nan_value_counts),
        lower_bounds=strip(message.lower_bounds),
        upper_bounds=strip(message.upper_bounds),
    )
