"""`spark.readStream.format("lakesink")`: offsets are snapshot ids (read/changes.py says what
each snapshot emits); rate limits and `trigger(availableNow=True)` as Spark 4.3 offers them.

The reader lives in Spark's long-lived streaming Python process on the driver; only what
`read()` needs is pickled to the executors (each partition carries its units and the metadata
file they were planned against).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxFiles, SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

from lakesink_datasource.read.changes import NOTHING, StreamReadError, Unit, read_units, snapshots_between, units_for
from lakesink_datasource.read.options import ReadOptions
from lakesink_datasource.read.scan import conform, group_units, load_table
from lakesink_datasource.worker_gc import settle_imports

Offset = dict[str, Any]


class UnitGroup(InputPartition):
    """Units read by one Spark task, with the metadata file they were planned against."""

    def __init__(self, metadata_location: str, units: list[Unit]):
        super().__init__(units)
        self.metadata_location = metadata_location


class LakeSinkStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: ReadOptions, schema: StructType):
        from pyspark.sql.pandas.types import to_arrow_schema

        self._options = options
        table = load_table(options)
        self._io_properties = dict(table.io.properties)
        iceberg_schema = table.schema()
        self._schema_json = iceberg_schema.model_dump_json()
        self._key_columns = tuple(iceberg_schema.find_column_name(i) or "" for i in sorted(iceberg_schema.identifier_field_ids))
        self._arrow_schema = to_arrow_schema(schema, timezone="UTC")
        # trigger(availableNow=True): the head when the query started (None: the table was empty)
        self._available_now = False
        self._target: int | None = None

    def _head(self) -> tuple[Any, int | None]:
        table = load_table(self._options)
        snapshot = table.metadata.snapshot_by_name(self._options.branch or "main")
        return table, snapshot.snapshot_id if snapshot is not None else None

    def initialOffset(self) -> Offset:
        table, head = self._head()
        metadata = table.metadata
        options = self._options
        if options.starting_snapshot_id is not None:
            start = metadata.snapshot_by_id(options.starting_snapshot_id)
            if start is None:
                raise StreamReadError(
                    f"option 'starting_snapshot_id' = {options.starting_snapshot_id}: table {options.table} has no such "
                    "snapshot (never existed or expired)"
                )
            return {"snapshot_id": start.parent_snapshot_id or NOTHING, "scan_all": False}
        if options.starting_timestamp_ms is not None:
            # The stream starts with the first snapshot committed at or after the time.
            before = [s for s in snapshots_between(metadata, NOTHING, head)
                      if s.timestamp_ms < options.starting_timestamp_ms] if head is not None else []
            return {"snapshot_id": before[-1].snapshot_id if before else NOTHING, "scan_all": False}
        return {"snapshot_id": NOTHING, "scan_all": True}

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now = True
        self._target = self._head()[1]

    def getDefaultReadLimit(self) -> ReadLimit:
        if self._options.max_files_per_trigger is not None:
            return ReadMaxFiles(self._options.max_files_per_trigger)
        return ReadAllAvailable()

    def latestOffset(self, start: Offset, limit: ReadLimit) -> Offset:
        table, head = self._head()
        if self._available_now:
            head = self._target  # nothing committed after the query started is read
        if head is None or head == start["snapshot_id"]:
            return start
        if not isinstance(limit, ReadMaxFiles):
            return {"snapshot_id": head, "scan_all": False}
        # Whole snapshots, as many as fit in the file budget (always at least one).
        chain = snapshots_between(table.metadata, start["snapshot_id"], head)
        files = 0
        end = chain[0].snapshot_id
        for i, snapshot in enumerate(chain):
            summary = snapshot.summary
            key = "total-data-files" if i == 0 and start["scan_all"] else "added-data-files"
            files += int(summary.get(key) or 0) if summary is not None else 0
            if i > 0 and files > limit.max_files:
                break
            end = snapshot.snapshot_id
        return {"snapshot_id": end, "scan_all": False}

    @property
    def _skipped_operations(self) -> frozenset[str]:
        return frozenset(
            op for op, skip in (("delete", self._options.skip_delete_snapshots), ("overwrite", self._options.skip_overwrite_snapshots))
            if skip
        )

    def partitions(self, start: Offset, end: Offset) -> list[InputPartition]:
        if start["snapshot_id"] == end["snapshot_id"]:
            return []
        table = load_table(self._options)
        metadata, io = table.metadata, table.io
        chain = snapshots_between(metadata, start["snapshot_id"], end["snapshot_id"])
        per_snapshot = [
            units_for(metadata, io, s, full=start["scan_all"] and i == 0, read_changes=self._options.read_changes,
                      skip=self._skipped_operations)
            for i, s in enumerate(chain)
        ]
        location = table.metadata_location
        if self._options.read_changes:
            # One task per snapshot: its deletes and inserts are compared to find updates.
            return [UnitGroup(location, units) for units in per_snapshot if units]
        units = [u for group in per_snapshot for u in group]
        return [UnitGroup(location, g) for g in group_units(units)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        settle_imports()
        assert isinstance(partition, UnitGroup)
        for table in read_units(partition.metadata_location, self._io_properties, self._schema_json, partition.value,
                                self._key_columns, self._options.read_changes):
            for batch in table.to_batches():
                if batch.num_rows:
                    yield conform(batch, self._arrow_schema)

    def commit(self, end: Offset) -> None:
        pass  # nothing to release: offsets are snapshot ids, kept by Spark's checkpoint
