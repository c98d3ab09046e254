"""Append an Arrow table to an Iceberg table as one snapshot, outside Spark, through
lakesink's own commit path (Parquet writer, snapshot producer, compare-and-swap).

For the few rows the driver itself appends (the companion table's tombstones after every
sequenced batch): pyiceberg's `append` spent ~40 ms a call there, most of it copying the
table metadata and checking schemas, on the commit path of every micro-batch.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping

import pyarrow as pa
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.table import Table

from lakesink_datasource.commit.cleanup import delete_files, dropped_metadata_files
from lakesink_datasource.commit.data_files import data_file
from lakesink_datasource.commit.lost_answer import swap_settled
from lakesink_datasource.commit.snapshot_producer import RowDelta, SnapshotProducer
from lakesink_datasource.commit.swap import PreparedCommit
from lakesink_datasource.iceberg import summary_keys as keys
from lakesink_datasource.iceberg.partition_key import PartitionKey, partition_path
from lakesink_datasource.iceberg.properties import TableSettings
from lakesink_datasource.iceberg.retry import RetryClock, RetryPolicy
from lakesink_datasource.io.partitioning import PartitionSplitter
from lakesink_datasource.io.rolling_writer import PartitionedParquetWriter
from lakesink_datasource.schema.arrow_align import align_array, table_arrow_schema
from lakesink_datasource.version import __version__


def append_rows(
    table: Table, rows: pa.Table, *, properties: Mapping[str, str] | None = None, clock: RetryClock | None = None
) -> Table:
    """Write `rows` (columns named as the table's, in any order and castable types) into new
    data files and commit them, with `properties` set, as one append snapshot on the table's
    current state. Raises CommitFailedException (nothing left behind) when another commit
    landed first; returns the table as committed. `clock`: the operation's it is part of (a
    lost answer is settled within its budget), else one of its own with the table's."""
    metadata = table.metadata
    schema, spec = metadata.schema(), metadata.spec()
    settings = TableSettings.of_table(metadata)
    clock = clock if clock is not None else RetryPolicy.of(settings).start(f"appending to {'.'.join(table.name())}")
    target = table_arrow_schema(schema)
    columns = [rows.column(f.name) for f in target]
    aligned = pa.Table.from_arrays(
        [c if c.type.equals(f.type) else align_array(c.combine_chunks(), f.type) for c, f in zip(columns, target)], schema=target
    )
    prefix = uuid.uuid4().hex

    def path_for(key: PartitionKey, n: int) -> str:
        return settings.data_locations.of(partition_path(spec, schema, key), f"{prefix}-{n:05d}.parquet")

    writer = PartitionedParquetWriter.for_table(
        settings, io=table.io, iceberg_schema=schema, arrow_schema=target, spec_id=spec.spec_id,
        table_properties=metadata.properties, path_for=path_for,
    )
    try:
        for key, part in PartitionSplitter(spec, schema).split(aligned):
            writer.write(key, part)
        messages = writer.close()
    except BaseException:
        writer.abort()
        raise
    snapshot = metadata.current_snapshot()
    delta = RowDelta(
        added_data_files=[data_file(m, metadata) for m in messages], planned_snapshot_id=snapshot.snapshot_id if snapshot else None
    )
    producer = SnapshotProducer(table.io, metadata, delta)

    def forget() -> None:  # nothing references what this attempt wrote
        producer.cleanup(committed_attempt=None)
        delete_files(table.io, [m.path for m in messages])

    try:
        new_snapshot = producer.produce(metadata, 0, {keys.ENGINE_NAME: "lakesink", keys.LAKESINK_VERSION: __version__})
    except BaseException:
        forget()
        raise
    try:
        committed = swap_settled(
            table, PreparedCommit(metadata, new_snapshot, properties=dict(properties or {})),
            what=f"appending to {'.'.join(table.name())}", clock=clock,
        )
    except CommitFailedException:
        forget()
        raise
    # Any other error leaves the outcome unknown (an answer lost and the catalog away past
    # the outage budget): the files stay (orphan removal collects them if the commit did
    # not land), and the error goes up.
    producer.cleanup(committed_attempt=0)
    delete_files(table.io, dropped_metadata_files(metadata, table.metadata_location, committed.metadata))
    return committed
