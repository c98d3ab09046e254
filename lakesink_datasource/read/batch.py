"""`spark.read.format("lakesink")` and temporary views `USING lakesink`: the Spark classes
over read/scan.py (planning and reading) and read/filters.py (pushdown)."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from lakesink_datasource.read.filters import conjunction, to_iceberg
from lakesink_datasource.read.options import ReadOptions
from lakesink_datasource.read.scan import (
    ReadPlan,
    TableState,
    group_tasks,
    load_table,
    plan_tasks,
    read_tasks,
    resolve_state,
    split_bytes,
)
from lakesink_datasource.read.snapshot_range import UnitReader, batch_range, unit_groups, units_between
from lakesink_datasource.worker_gc import settle_imports

if TYPE_CHECKING:
    from pyspark.sql.datasource import Filter  # PySpark 4.1+: filter pushdown (4.0 has none)


def filter_pushdown_enabled() -> bool:
    """Is Spark planning this read with filter pushdown on? Spark refuses a reader that
    implements pushFilters unless spark.sql.python.filterPushdown.enabled is true (off by
    default), so the filtering reader is handed out only when the planning worker that called
    reader() says pushdown is on. Anything unrecognised means off: Spark filters then."""
    frame = sys._getframe(1)
    while frame is not None:
        source = frame.f_code.co_filename
        if source.endswith("data_source_pushdown_filters.py"):
            return True
        if source.endswith("plan_data_source_read.py") and "enable_pushdown" in frame.f_locals:
            return bool(frame.f_locals["enable_pushdown"])
        frame = frame.f_back  # type: ignore[assignment]
    return False


class TaskGroup(InputPartition):
    """One Spark partition of a read: file scan tasks read by one Spark task."""


class LakeSinkReader(DataSourceReader):
    """`spark.read.format("lakesink")` and temporary views `USING lakesink`."""

    def __init__(self, options: ReadOptions, schema: StructType):
        from lakesink_datasource.spark_version import to_arrow_schema

        self._options = options
        self._state: TableState | None = resolve_state(options)  # the driver's only: not pickled
        self.plan = ReadPlan(
            metadata_location=self._state.table.metadata_location,
            io_properties=dict(self._state.table.io.properties),
            schema_json=self._state.schema.model_dump_json(),
            arrow_schema=to_arrow_schema(schema),
        )

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_state": None}

    def partitions(self) -> list[InputPartition]:
        assert self._state is not None, "partitions() runs where the reader was made"
        tasks = plan_tasks(self._state, self.plan.row_filter)
        groups = group_tasks(tasks, split_bytes(self._state, self._options, tasks))
        return [TaskGroup(g) for g in groups] or [TaskGroup([])]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        settle_imports()
        yield from read_tasks(self.plan, partition.value)


class LakeSinkFilteringReader(LakeSinkReader):
    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        assert self._state is not None
        taken, left = [], []
        for f in filters:
            expression = to_iceberg(f, self._state.schema)
            if expression is None:
                left.append(f)  # Spark evaluates it
            else:
                taken.append(expression)
        self.plan.row_filter = conjunction(taken)
        return left


class LakeSinkRangeReader(DataSourceReader):
    """A batch read of a range of snapshots (`starting_*` / `ending_*`, `read_changes`): what a
    stream reading those snapshots would have emitted, so a consumer can replay a range."""

    def __init__(self, options: ReadOptions, schema: StructType):
        table = load_table(options)
        self._reader = UnitReader.of(table, schema, options.read_changes)
        # Planned here, on the driver, so partitions() and every task see the same snapshots.
        bounds = batch_range(table.metadata, options)
        per_snapshot = units_between(table.metadata, table.io, bounds[0], bounds[1].snapshot_id, options) if bounds else []
        self._partitions = unit_groups(table.metadata_location, per_snapshot, options.read_changes)

    def __getstate__(self) -> dict[str, Any]:
        # The tasks get their units in their partition: the reader need not carry them all.
        return {**self.__dict__, "_partitions": []}

    def partitions(self) -> list[InputPartition]:
        return self._partitions or [InputPartition(None)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if partition.value is None:
            return iter(())
        return self._reader.read(partition)
