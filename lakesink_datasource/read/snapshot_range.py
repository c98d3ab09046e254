"""A range of snapshots and what reading it emits, shared by the stream (which reads one range
per micro-batch) and by a batch read of a range (`starting_*` / `ending_*` bounds, with or
without `read_changes`), so a batch read of a range returns exactly what a stream reading
the same snapshots would have emitted.

A range is given by where it starts (the snapshot before its first, or NOTHING) and its last
snapshot; `scan_all` says the first snapshot is emitted as the whole table as of it (a range
that starts before every retained snapshot).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
from pyiceberg.io import FileIO
from pyiceberg.table import Table
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.snapshots import Snapshot
from pyspark.sql.datasource import InputPartition
from pyspark.sql.types import StructType

from lakesink_datasource.options import OptionError
from lakesink_datasource.read.changes import NOTHING, StreamReadError, Unit, read_units, snapshots_between, units_for
from lakesink_datasource.read.options import ReadOptions
from lakesink_datasource.read.scan import conform, group_units
from lakesink_datasource.worker_gc import settle_imports


@dataclass(frozen=True)
class RangeStart:
    after: int  # the snapshot before the range's first (NOTHING: before every snapshot)
    scan_all: bool  # emit the first snapshot as the whole table as of it


def head_of(metadata: TableMetadata, options: ReadOptions) -> Snapshot | None:
    """The head of the branch (or tag) read; None for a table without snapshots."""
    return metadata.snapshot_by_name(options.branch or "main")


def _named_snapshot(metadata: TableMetadata, options: ReadOptions, option: str, snapshot_id: int) -> Snapshot:
    snapshot = metadata.snapshot_by_id(snapshot_id)
    if snapshot is None:
        raise StreamReadError(
            f"option '{option}' = {snapshot_id}: table {options.table} has no such snapshot (never existed or expired; "
            f"{options.table}.snapshots lists the retained ones)"
        )
    return snapshot


def range_start(metadata: TableMetadata, head: Snapshot | None, options: ReadOptions) -> RangeStart:
    """Where reading starts: `starting_snapshot_id` (its changes on), `starting_timestamp` (the
    first snapshot committed at or after it on), else the whole table as of the oldest
    retained snapshot, then every later snapshot's changes."""
    if options.starting_snapshot_id is not None:
        start = _named_snapshot(metadata, options, "starting_snapshot_id", options.starting_snapshot_id)
        return RangeStart(start.parent_snapshot_id or NOTHING, False)
    if options.starting_timestamp_ms is not None:
        before = [s for s in snapshots_between(metadata, NOTHING, head.snapshot_id)
                  if s.timestamp_ms < options.starting_timestamp_ms] if head is not None else []
        return RangeStart(before[-1].snapshot_id if before else NOTHING, False)
    return RangeStart(NOTHING, True)


def range_end(metadata: TableMetadata, head: Snapshot | None, options: ReadOptions) -> Snapshot | None:
    """The last snapshot a batch read of a range reads: `ending_snapshot_id`, the last one
    committed at or before `ending_timestamp`, else the head. None: nothing to read."""
    if options.ending_snapshot_id is not None:
        return _named_snapshot(metadata, options, "ending_snapshot_id", options.ending_snapshot_id)
    if head is None or options.ending_timestamp_ms is None:
        return head
    within = [s for s in snapshots_between(metadata, NOTHING, head.snapshot_id) if s.timestamp_ms <= options.ending_timestamp_ms]
    return within[-1] if within else None


def skipped_operations(options: ReadOptions) -> frozenset[str]:
    return frozenset(
        op for op, skip in (("delete", options.skip_delete_snapshots), ("overwrite", options.skip_overwrite_snapshots)) if skip
    )


def units_between(metadata: TableMetadata, io: FileIO, start: RangeStart, end: int, options: ReadOptions) -> list[list[Unit]]:
    """What each snapshot after `start` through `end` emits, oldest first, one list per snapshot."""
    chain = snapshots_between(metadata, start.after, end)
    return [
        units_for(metadata, io, s, full=start.scan_all and i == 0, read_changes=options.read_changes,
                  skip=skipped_operations(options))
        for i, s in enumerate(chain)
    ]


def batch_range(metadata: TableMetadata, options: ReadOptions) -> tuple[RangeStart, Snapshot] | None:
    """The range a batch read of a range reads, or None when it holds no snapshot (an empty
    table, an ending time before the first commit, a start after the end)."""
    head = head_of(metadata, options)
    end = range_end(metadata, head, options)
    if end is None:
        return None
    start = range_start(metadata, end, options)
    if options.starting_snapshot_id is not None and start.after != NOTHING:
        ancestry = {s.snapshot_id for s in snapshots_between(metadata, NOTHING, end.snapshot_id)}
        if options.starting_snapshot_id not in ancestry:
            if metadata.snapshot_by_id(options.starting_snapshot_id).timestamp_ms > end.timestamp_ms:  # type: ignore[union-attr]
                return None  # starts after it ends: an empty range, as an empty time window is
            raise OptionError(
                f"option 'starting_snapshot_id' = {options.starting_snapshot_id} is not an ancestor of the range's last "
                f"snapshot {end.snapshot_id} (another branch, or rolled back): the changes between them are not one history"
            )
    if start.after == end.snapshot_id:
        return None
    return start, end


class UnitGroup(InputPartition):
    """Units read by one Spark task, with the metadata file they were planned against."""

    def __init__(self, metadata_location: str, units: list[Unit]):
        super().__init__(units)
        self.metadata_location = metadata_location


def unit_groups(metadata_location: str, per_snapshot: list[list[Unit]], read_changes: bool) -> list[InputPartition]:
    """Spark partitions for the units of a range of snapshots."""
    if read_changes:
        # One task per snapshot: its deletes and inserts are compared to find updates.
        return [UnitGroup(metadata_location, units) for units in per_snapshot if units]
    units = [u for group in per_snapshot for u in group]
    return [UnitGroup(metadata_location, g) for g in group_units(units)]


@dataclass(frozen=True)
class UnitReader:
    """What a Spark task needs to read a `UnitGroup`: pickled with the stream or range reader,
    made once on the driver from the table as the query found it."""

    io_properties: dict[str, str]
    schema_json: str
    key_columns: tuple[str, ...]  # the table's identifier fields: a change feed pairs updates by them
    read_changes: bool
    arrow_schema: pa.Schema  # what Spark expects

    @classmethod
    def of(cls, table: Table, spark_schema: StructType, read_changes: bool) -> UnitReader:
        from lakesink_datasource.spark_version import to_arrow_schema

        schema = table.schema()
        return cls(
            dict(table.io.properties), schema.model_dump_json(),
            tuple(schema.find_column_name(i) or "" for i in sorted(schema.identifier_field_ids)), read_changes,
            to_arrow_schema(spark_schema),
        )

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        settle_imports()
        assert isinstance(partition, UnitGroup)
        units = partition.value
        for table in read_units(partition.metadata_location, self.io_properties, self.schema_json, units, self.key_columns,
                                self.read_changes):
            for batch in table.to_batches():
                if batch.num_rows:
                    yield conform(batch, self.arrow_schema)
