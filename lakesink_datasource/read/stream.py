"""`spark.readStream.format("lakesink")`: offsets are snapshot ids (read/changes.py says what
each snapshot emits); rate limits and `trigger(availableNow=True)` as Spark 4.2 and newer
offer them to Python sources (admission control). PySpark 4.0 and 4.1 have none: Spark asks
for the latest offset without a start or a limit, runs `trigger(availableNow=True)` up to the
offset it found when the query started (its own wrapper, the same outcome), and
`max_files_per_trigger` is refused, naming the minor that has it.

The reader lives in Spark's long-lived streaming Python process on the driver; only what
`read()` needs is pickled to the executors (each partition carries its units and the metadata
file they were planned against).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.types import StructType

from lakesink_datasource.errors import without_traceback
from lakesink_datasource.options import OptionError
from lakesink_datasource.read.changes import snapshots_between
from lakesink_datasource.read.options import ReadOptions
from lakesink_datasource.read.scan import load_table
from lakesink_datasource.read.snapshot_range import RangeStart, UnitReader, head_of, range_start, unit_groups, units_between
from lakesink_datasource.spark_version import pyspark_version

try:
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxFiles, SupportsTriggerAvailableNow

    ADMISSION_CONTROL = True
except ImportError:  # PySpark 4.0 and 4.1
    ADMISSION_CONTROL = False

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]  # a stand-in: Spark never asks for it there
        pass

    class ReadLimit:  # type: ignore[no-redef]
        pass

    class ReadAllAvailable(ReadLimit):  # type: ignore[no-redef]
        pass

    class ReadMaxFiles(ReadLimit):  # type: ignore[no-redef]
        def __init__(self, max_files: int) -> None:
            self.max_files = max_files

Offset = dict[str, Any]


class LakeSinkStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: ReadOptions, schema: StructType):
        if options.max_files_per_trigger is not None and not ADMISSION_CONTROL:
            raise OptionError(
                f"option 'max_files_per_trigger' needs PySpark 4.2 or newer (a Python source's admission control, "
                f"pyspark.sql.streaming.datasource); this is PySpark {pyspark_version()}. Leave it out (each micro-batch "
                "then reads every snapshot committed since the last), or run on PySpark 4.2+"
            )
        if options.ending_snapshot_id is not None or options.ending_timestamp_ms is not None:
            raise OptionError(
                "options 'ending_snapshot_id' and 'ending_timestamp' bound a batch read (spark.read); a stream reads on "
                "as the table grows (trigger(availableNow=True) stops at the head it started with)"
            )
        self._options = options
        self._reader = UnitReader.of(load_table(options), schema, options.read_changes)
        # trigger(availableNow=True): the head when the query started (None: the table was empty)
        self._available_now = False
        self._target: int | None = None
        self._last: Offset | None = None  # PySpark 4.0/4.1: the offset latestOffset() gave last

    def _head(self) -> tuple[Any, int | None]:
        table = load_table(self._options)
        snapshot = head_of(table.metadata, self._options)
        return table, snapshot.snapshot_id if snapshot is not None else None

    @without_traceback
    def initialOffset(self) -> Offset:
        table = load_table(self._options)
        start = range_start(table.metadata, head_of(table.metadata, self._options), self._options)
        self._last = {"snapshot_id": start.after, "scan_all": start.scan_all}
        return self._last

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now = True
        self._target = self._head()[1]

    def getDefaultReadLimit(self) -> ReadLimit:
        if self._options.max_files_per_trigger is not None:
            return ReadMaxFiles(self._options.max_files_per_trigger)
        return ReadAllAvailable()

    @without_traceback
    def latestOffset(self, start: Offset | None = None, limit: ReadLimit | None = None) -> Offset:
        if start is None:
            # PySpark 4.0/4.1 ask without a start: from the offset given last (the initial one
            # after a restart: Spark plans the batch from its checkpoint's end anyway).
            start = self._last if self._last is not None else self.initialOffset()
            self._last = self._latest(start, ReadAllAvailable())
            return self._last
        return self._latest(start, limit)

    def _latest(self, start: Offset, limit: ReadLimit | None) -> Offset:
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

    @without_traceback
    def partitions(self, start: Offset, end: Offset) -> list[InputPartition]:
        if start["snapshot_id"] == end["snapshot_id"]:
            return []
        table = load_table(self._options)
        per_snapshot = units_between(table.metadata, table.io, RangeStart(start["snapshot_id"], start["scan_all"]),
                                     end["snapshot_id"], self._options)
        return unit_groups(table.metadata_location, per_snapshot, self._options.read_changes)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return self._reader.read(partition)

    def commit(self, end: Offset) -> None:
        pass  # nothing to release: offsets are snapshot ids, kept by Spark's checkpoint
