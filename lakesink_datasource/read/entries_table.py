"""The `entries` metadata table: one row per manifest entry of the current snapshot (deleted
entries included), as Iceberg's `db.t.entries`.

Built here, with lakesink's v3-aware manifest reader, rather than by pyiceberg's inspect:
pyiceberg 0.12 assumes every file has column metrics, which a deletion vector (a blob in a
Puffin file) has not by the spec, and it does not read the v3 fields. The
columns are Iceberg's: entry status and sequence numbers, the file as a `data_file` struct
(with the v3 fields Iceberg Java shows: `first_row_id`, `referenced_data_file`,
`content_offset`, `content_size_in_bytes`), and `readable_metrics` with the bounds decoded
per top-level column.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from pyiceberg.conversions import from_bytes
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table
from pyiceberg.types import NestedField, PrimitiveType

from lakesink_datasource.iceberg.manifest_list import read_manifest_list
from lakesink_datasource.iceberg.manifests import (
    content_offset,
    content_size_in_bytes,
    data_file_first_row_id,
    read_entries,
    referenced_data_file,
)

_COUNTS = pa.map_(pa.int32(), pa.int64())
_BOUNDS = pa.map_(pa.int32(), pa.binary())


def _data_file_type(partition: pa.DataType) -> pa.StructType:
    return pa.struct([
        pa.field("content", pa.int8(), nullable=False),
        pa.field("file_path", pa.string(), nullable=False),
        pa.field("file_format", pa.string(), nullable=False),
        pa.field("spec_id", pa.int32()),
        pa.field("partition", partition, nullable=False),
        pa.field("record_count", pa.int64(), nullable=False),
        pa.field("file_size_in_bytes", pa.int64(), nullable=False),
        pa.field("column_sizes", _COUNTS),
        pa.field("value_counts", _COUNTS),
        pa.field("null_value_counts", _COUNTS),
        pa.field("nan_value_counts", _COUNTS),
        pa.field("lower_bounds", _BOUNDS),
        pa.field("upper_bounds", _BOUNDS),
        pa.field("key_metadata", pa.binary()),
        pa.field("split_offsets", pa.list_(pa.int64())),
        pa.field("equality_ids", pa.list_(pa.int32())),
        pa.field("sort_order_id", pa.int32()),
        pa.field("first_row_id", pa.int64()),
        pa.field("referenced_data_file", pa.string()),
        pa.field("content_offset", pa.int64()),
        pa.field("content_size_in_bytes", pa.int64()),
    ])


def _metric_columns(table: Table) -> list[NestedField]:
    # Bounds are kept for primitive columns only; a struct's are its leaves', not its own.
    return [f for f in table.schema().fields if isinstance(f.field_type, PrimitiveType)]


def _metrics_type(columns: list[NestedField]) -> pa.StructType:
    return pa.struct([
        pa.field(c.name, pa.struct([
            pa.field("column_size", pa.int64()), pa.field("value_count", pa.int64()),
            pa.field("null_value_count", pa.int64()), pa.field("nan_value_count", pa.int64()),
            pa.field("lower_bound", schema_to_pyarrow(c.field_type)), pa.field("upper_bound", schema_to_pyarrow(c.field_type)),
        ]))
        for c in columns
    ])


def _bound(column: NestedField, bounds: dict[int, bytes] | None) -> Any:
    raw = (bounds or {}).get(column.field_id)
    return None if raw is None else from_bytes(column.field_type, raw)  # type: ignore[arg-type]


def _readable(columns: list[NestedField], f: DataFile) -> dict[str, dict[str, Any]]:
    return {c.name: {
        "column_size": (f.column_sizes or {}).get(c.field_id),
        "value_count": (f.value_counts or {}).get(c.field_id),
        "null_value_count": (f.null_value_counts or {}).get(c.field_id),
        "nan_value_count": (f.nan_value_counts or {}).get(c.field_id),
        "lower_bound": _bound(c, f.lower_bounds),
        "upper_bound": _bound(c, f.upper_bounds),
    } for c in columns}


def _map(values: Any) -> list[tuple[int, Any]] | None:
    # pyiceberg keeps metrics in lazy dicts, which Arrow cannot iterate as a mapping
    return None if values is None else list(dict(values).items())


def _data_file(f: DataFile, partition_names: list[str]) -> dict[str, Any]:
    return {
        "content": f.content.value,
        "file_path": f.file_path,
        "file_format": f.file_format.value,
        "spec_id": f.spec_id,
        "partition": {name: f.partition[i] for i, name in enumerate(partition_names)},
        "record_count": f.record_count,
        "file_size_in_bytes": f.file_size_in_bytes,
        **{name: _map(getattr(f, name)) for name in (
            "column_sizes", "value_counts", "null_value_counts", "nan_value_counts", "lower_bounds", "upper_bounds")},
        "key_metadata": f.key_metadata, "split_offsets": f.split_offsets, "equality_ids": f.equality_ids,
        "sort_order_id": f.sort_order_id,
        "first_row_id": data_file_first_row_id(f),  # inherited from the manifest made explicit
        "referenced_data_file": referenced_data_file(f),
        "content_offset": content_offset(f),
        "content_size_in_bytes": content_size_in_bytes(f),
    }


def entries_schema(table: Table) -> pa.Schema:
    partition = schema_to_pyarrow(table.metadata.specs_struct())
    return pa.schema([
        pa.field("status", pa.int8(), nullable=False),
        pa.field("snapshot_id", pa.int64()),
        pa.field("sequence_number", pa.int64()),
        pa.field("file_sequence_number", pa.int64()),
        pa.field("data_file", _data_file_type(partition), nullable=False),
        pa.field("readable_metrics", _metrics_type(_metric_columns(table))),
    ])


def entries(table: Table) -> pa.Table:
    """Every manifest entry of the current snapshot's manifests (empty without a snapshot)."""
    metadata = table.metadata
    columns = _metric_columns(table)
    snapshot = metadata.current_snapshot()
    rows = []
    specs = metadata.specs()
    for manifest in read_manifest_list(table.io, snapshot.manifest_list) if snapshot is not None else []:
        names = [field.name for field in specs[manifest.partition_spec_id].fields]
        for entry in read_entries(table.io, manifest, live_only=False):
            rows.append({
                "status": entry.status.value,
                "snapshot_id": entry.snapshot_id,
                "sequence_number": entry.sequence_number,
                "file_sequence_number": entry.file_sequence_number,
                "data_file": _data_file(entry.data_file, names),
                "readable_metrics": _readable(columns, entry.data_file),
            })
    return pa.Table.from_pylist(rows, schema=entries_schema(table))
