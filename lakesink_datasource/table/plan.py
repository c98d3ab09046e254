"""The write plan: the small picklable object the driver hands to every task.

It pins the table state the batch was planned against (a metadata file location),
so tasks read table metadata from storage once per process instead of asking the
catalog, and so a task can tell that its batch was already committed.
"""

from __future__ import annotations

import msgspec
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table.metadata import TableMetadata

from lakesink_datasource.catalog.loader import CatalogConfig
from lakesink_datasource.compaction.carried import CarriedCompaction
from lakesink_datasource.iceberg.properties import effective_properties
from lakesink_datasource.iceberg.retry import REAL_TIME, RetryClock, RetryPolicy, TimeSource
from lakesink_datasource.options import WriteOptions


class HistoryPlan(msgspec.Struct, frozen=True, kw_only=True):
    """A history table's columns (write/history.py)."""

    start: str  # the table's __start_at
    end: str  # the table's __end_at
    tracked: tuple[str, ...]  # table columns whose change starts a version
    data: tuple[str, ...]  # table columns a change may differ in (all but the key, bounds and sequence)
    partial: bool  # some columns are not tracked (their changes update the current version in place)
    at: float | None  # no sequence column: the batch's time (epoch seconds), where its versions start


class KeyedPlan(msgspec.Struct, frozen=True, kw_only=True):
    """Column roles of a keyed write, by DataFrame name (sources) and table name."""

    key_sources: tuple[str, ...]
    op_source: str | None
    sequence_sources: tuple[str, ...]  # compared in order; (): no sequence
    table_key_columns: tuple[str, ...]
    table_sequence_columns: tuple[str, ...]  # (): the sequence is not stored in the table (all of its columns)
    # The rows carry cluster_by_key's shard column: each task holds one key shard and opens
    # its host's index of that shard only (index/key_shards.py).
    clustered: bool = False
    history: HistoryPlan | None = None  # history=true: every version of each key is kept


class WritePlan(msgspec.Struct, frozen=True, kw_only=True):
    write_id: str  # unique per planned write; recorded in the snapshot summary
    options: WriteOptions
    catalog: CatalogConfig
    identifier: str
    metadata_location: str
    io_properties: dict[str, str]
    format_version: int
    overwrite: bool
    column_sources: list[str | None]  # per table column, the DataFrame column feeding it
    planned_snapshot_id: int | None
    keyed: KeyedPlan | None = None
    # merge_schema: the evolved schema the tasks write with (JSON; staged in the table, not
    # current yet) and the id of the schema it evolved from. None: the table's current schema.
    write_schema_json: str | None = None
    evolved_from_schema_id: int | None = None
    # evolve_partition: the staged spec the tasks write with (None: the table's default spec).
    write_spec_id: int | None = None
    # When planning began (epoch seconds) and how long it took: where a batch's time starts.
    planned_at: float = 0.0
    plan_seconds: float = 0.0
    # maintenance=auto: the compaction the write's tasks carry out beside their rows.
    compaction: CarriedCompaction | None = None
    # A routed task met its source table's truncate (cdc_format=debezium): its position,
    # encoded as the write's sequences are. The commit hides the rows ordered before it.
    truncated_at: bytes | None = None
    truncates: tuple[bytes, ...] = ()  # every truncate's position, in order (truncated_at the last)
    # MySQL/MariaDB (cdc_format=debezium): what the task's partitions showed of the source's
    # binlogs (debezium/failovers.py), for the table's property.
    binlogs: str | None = None


def write_schema(plan: WritePlan, metadata: TableMetadata) -> Schema:
    """The schema the write's files are written with: the staged, evolved one or the
    table's current one."""
    if plan.write_schema_json is not None:
        return Schema.model_validate_json(plan.write_schema_json)
    return metadata.schema()


def write_spec(plan: WritePlan, metadata: TableMetadata) -> PartitionSpec:
    """The partition spec the write's files are laid out by: the staged, evolved one or the
    table's default one."""
    if plan.write_spec_id is not None:
        return metadata.specs()[plan.write_spec_id]
    return metadata.spec()


def retry_clock(plan: WritePlan, what: str, time: TimeSource = REAL_TIME) -> RetryClock:
    """A clock for one operation of the write (iceberg/retry.py): the budgets of the table
    as planned (its FileIO holds its properties) under the write's own `property.<key>`
    options, until the caller adopts the table's as it loads it."""
    properties = effective_properties(plan.io_properties, plan.options.table_properties)
    return RetryPolicy.from_properties(properties, time).start(what)
