"""Metadata tables, read as Iceberg's Spark runtime names them: `db.t.snapshots`, `db.t.history`,
`db.t.files`, ... plus `db.t.lakesink_history`, lakesink's own figures per snapshot.

Iceberg's metadata tables are what a user inspects a table with before trusting it. pyiceberg
builds them with the columns and types of Iceberg's (its `inspect` API, from the same
manifests this reader plans with); lakesink serves them through the data source so that they
are one `spark.read` or `CREATE TEMPORARY VIEW` away. They are small (one row per snapshot,
file or manifest): the driver builds the Arrow table and Spark reads it as one partition.

`entries` is built by read/entries_table.py: pyiceberg 0.12's builder fails on deletion
vectors (files without column metrics).
"""

from __future__ import annotations

from collections.abc import Iterator

import msgspec
import pyarrow as pa
from pyiceberg.table import Table
from pyspark.sql.datasource import DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from lakesink_datasource.iceberg import summary_keys as keys
from lakesink_datasource.options import OptionError
from lakesink_datasource.read import entries_table
from lakesink_datasource.read.options import ReadOptions
from lakesink_datasource.read.scan import NoSuchTable, load_table

# Iceberg's names, in the order its documentation lists them.
ICEBERG_TABLES = (
    "history", "metadata_log_entries", "snapshots", "entries", "refs", "files", "data_files", "delete_files", "manifests",
    "partitions", "all_manifests", "all_files", "all_data_files", "all_delete_files",
)
LAKESINK_HISTORY = "lakesink_history"
METADATA_TABLES = (*ICEBERG_TABLES, LAKESINK_HISTORY)


def split_identifier(identifier: str) -> tuple[str, str] | None:
    """`db.t.snapshots` -> (`db.t`, `snapshots`); None when the last part names no metadata
    table (or nothing is left for the table)."""
    table, _, last = identifier.rpartition(".")
    name = last.lower()
    if not table or "." not in table or name not in METADATA_TABLES:
        return None
    return table, name


def resolve(options: ReadOptions) -> pa.Table | None:
    """The metadata table the read names, or None when it names a table (a table whose name
    happens to end in `.snapshots` wins over the metadata table of its namespace's table)."""
    named = _named(options)
    return None if named is None else metadata_table(*named)


def resolve_schema(options: ReadOptions) -> pa.Schema | None:
    """The columns of the metadata table the read names (None: it names a table), without
    reading the manifests where the columns do not depend on them: Spark asks for the
    schema in one process and reads in another, so the rows would be built twice."""
    named = _named(options)
    if named is None:
        return None
    table, name = named
    if name == LAKESINK_HISTORY:
        return LAKESINK_HISTORY_SCHEMA
    if name == "entries":
        return entries_table.entries_schema(table)
    if name in _BUILT_EMPTY_WITHOUT_SNAPSHOT:
        return metadata_table(_without_snapshot(table), name).schema
    return metadata_table(table, name).schema  # from the metadata file alone, or cheap enough


# pyiceberg builds these as an empty table of the same columns when the table has no
# snapshot (the columns depend on the schema and specs only).
_BUILT_EMPTY_WITHOUT_SNAPSHOT = (
    "files", "data_files", "delete_files", "manifests", "all_manifests", "all_files", "all_data_files", "all_delete_files",
)


def _without_snapshot(table: Table) -> Table:
    metadata = table.metadata.model_copy(update={"current_snapshot_id": None, "refs": {}, "snapshots": []})
    return Table(table.name(), metadata, table.metadata_location, table.io, table.catalog)


def _named(options: ReadOptions) -> tuple[Table, str] | None:
    parts = split_identifier(options.table)
    if parts is None:
        return None
    try:
        load_table(options)
        return None
    except NoSuchTable:
        pass
    base, name = parts
    given = [o for o, v in (("snapshot_id", options.snapshot_id), ("as_of_timestamp", options.as_of_timestamp_ms),
                            ("branch", options.branch)) if v is not None]
    if given or options.range_options:
        raise OptionError(
            f"metadata table {options.table} shows the table's current metadata (every retained snapshot, ref and "
            f"file): drop option(s) {', '.join(map(repr, given + list(options.range_options)))}"
        )
    return load_table(msgspec.structs.replace(options, table=base)), name


def metadata_table(table: Table, name: str) -> pa.Table:
    if name == LAKESINK_HISTORY:
        return lakesink_history(table)
    if name == "entries":
        return entries_table.entries(table)
    return getattr(table.inspect, name)()


def _int(summary: dict[str, str], key: str) -> int | None:
    value = summary.get(key)
    return int(value) if value is not None and value.lstrip("-").isdigit() else None


def _float(summary: dict[str, str], key: str) -> float | None:
    try:
        return float(summary[key]) if key in summary else None
    except ValueError:
        return None


def _hidden(summary: dict[str, str]) -> int | None:
    # A DV replaces the file's earlier one with all of its positions: what this snapshot hid
    # is what the new DVs add beyond the ones they replace.
    added = _int(summary, "added-position-deletes")
    return None if added is None else added - (_int(summary, "removed-position-deletes") or 0)


def _live(summary: dict[str, str]) -> int | None:
    total, hidden = _int(summary, "total-records"), _int(summary, "total-position-deletes")
    return None if total is None else total - (hidden or 0)


LAKESINK_HISTORY_SCHEMA = pa.schema([
    pa.field("committed_at", pa.timestamp("ms", tz="UTC"), nullable=False),
    pa.field("snapshot_id", pa.int64(), nullable=False),
    pa.field("parent_id", pa.int64()),
    pa.field("sequence_number", pa.int64()),
    pa.field("operation", pa.string()),
    pa.field("is_current_ancestor", pa.bool_(), nullable=False),
    pa.field("engine", pa.string()),  # engine-name: spark for lakesink's commits (Iceberg's convention)
    pa.field("lakesink_version", pa.string()),  # null: not a lakesink commit
    pa.field("query_id", pa.string()),
    pa.field("batch_id", pa.int64()),
    pa.field("write_id", pa.string()),
    pa.field("compaction", pa.bool_(), nullable=False),
    pa.field("rows_in", pa.int64()),
    pa.field("added_records", pa.int64()),
    pa.field("rows_hidden", pa.int64()),  # old rows this snapshot hid with deletion vectors (position deletes on v2)
    pa.field("keys_deleted", pa.int64()),  # keyed writes: keys a delete removed
    pa.field("deleted_records", pa.int64()),  # rows of data files this snapshot removed
    pa.field("added_data_files", pa.int64()),
    pa.field("added_dvs", pa.int64()),
    pa.field("added_files_size", pa.int64()),
    pa.field("total_records", pa.int64()),  # rows in live data files, hidden ones included (Iceberg's count)
    pa.field("live_records", pa.int64()),  # what a reader sees: total_records less the hidden rows
    pa.field("total_data_files", pa.int64()),
    pa.field("partition_seconds", pa.float64()),
    pa.field("index_seconds", pa.float64()),
    pa.field("write_seconds", pa.float64()),
    pa.field("hosts", pa.string()),
    pa.field("index_starts", pa.string()),
    pa.field("maintenance_note", pa.string()),
])


def lakesink_history(table: Table) -> pa.Table:
    """One row per retained snapshot, oldest first: Iceberg's history columns with the
    counters and lakesink's own figures from the snapshot's summary (null where the
    snapshot has none: another engine's commit, a compaction)."""
    metadata = table.metadata
    ancestors = set()
    snapshot = metadata.current_snapshot()
    while snapshot is not None:
        ancestors.add(snapshot.snapshot_id)
        snapshot = metadata.snapshot_by_id(snapshot.parent_snapshot_id) if snapshot.parent_snapshot_id is not None else None
    rows = []
    for s in sorted(metadata.snapshots, key=lambda s: (s.sequence_number or 0, s.timestamp_ms)):
        summary = dict(s.summary.additional_properties) if s.summary is not None else {}
        rows.append({
            "committed_at": s.timestamp_ms,
            "snapshot_id": s.snapshot_id,
            "parent_id": s.parent_snapshot_id,
            "sequence_number": s.sequence_number,
            "operation": s.summary.operation.value if s.summary is not None else None,
            "is_current_ancestor": s.snapshot_id in ancestors,
            "engine": summary.get(keys.ENGINE_NAME),
            "lakesink_version": summary.get(keys.LAKESINK_VERSION),
            "query_id": summary.get(keys.QUERY_ID),
            "batch_id": _int(summary, keys.EPOCH_ID),
            "write_id": summary.get(keys.WRITE_ID),
            "compaction": summary.get(keys.COMPACTION) == "true",
            "rows_in": _int(summary, keys.ROWS_IN),
            "added_records": _int(summary, "added-records"),
            "rows_hidden": _hidden(summary),
            "keys_deleted": _int(summary, keys.ROWS_DELETED),
            "deleted_records": _int(summary, "deleted-records"),
            "added_data_files": _int(summary, "added-data-files"),
            "added_dvs": _int(summary, "added-dvs"),
            "added_files_size": _int(summary, "added-files-size"),
            "total_records": _int(summary, "total-records"),
            "live_records": _live(summary),
            "total_data_files": _int(summary, "total-data-files"),
            "partition_seconds": _float(summary, keys.PARTITION_SECONDS),
            "index_seconds": _float(summary, keys.INDEX_SECONDS),
            "write_seconds": _float(summary, keys.WRITE_SECONDS),
            "hosts": summary.get(keys.HOSTS),
            "index_starts": summary.get(keys.INDEX_STARTS),
            "maintenance_note": summary.get(keys.MAINTENANCE_NOTE),
        })
    return pa.Table.from_pylist(rows, schema=LAKESINK_HISTORY_SCHEMA)


class MetadataTableReader(DataSourceReader):
    """One metadata table, built on the driver and read by one Spark task."""

    def __init__(self, table: pa.Table, schema: StructType) -> None:
        from lakesink_datasource.spark_version import to_arrow_schema

        self._ipc = _to_ipc(table.cast(to_arrow_schema(schema)))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        yield from pa.ipc.open_stream(self._ipc).read_all().to_batches()


def _to_ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def spark_schema(schema: pa.Schema) -> StructType:
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(schema)
