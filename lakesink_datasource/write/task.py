"""Executor side: one Spark task's Arrow batches -> Parquet data files -> a commit message.

Reads top to bottom as the data path: load the planned table state (cached per
process), skip the batch if the table already holds it, align each Arrow batch to the
table schema, fan rows out by partition, roll files, and report what was written.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyiceberg.io import FileIO
from pyiceberg.io.pyarrow import BUFFER_SIZE
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table.metadata import TableMetadata

from lakesink_datasource.errors import LakesinkError
from lakesink_datasource.faults import fault_point
from lakesink_datasource.iceberg.locations import DataLocations
from lakesink_datasource.iceberg.partition_key import PartitionKey, partition_path
from lakesink_datasource.iceberg.properties import TableSettings, effective_properties
from lakesink_datasource.iceberg.row_filter import RowFilter, matches, parse_filter
from lakesink_datasource.io.partitioning import PartitionSplitter
from lakesink_datasource.io.rolling_writer import STREAM_BUFFER_BYTES, PartitionedParquetWriter
from lakesink_datasource.io.row_order import RowOrder
from lakesink_datasource.messages import CompactionMessage, LakeSinkCommitMessage, TaskResult, TaskStats
from lakesink_datasource.schema.arrow_align import BatchAligner, table_arrow_schema
from lakesink_datasource.table import idempotency, metadata_cache
from lakesink_datasource.table.plan import WritePlan, retry_clock, write_schema, write_spec
from lakesink_datasource.write.changes import KeyedInputError

if TYPE_CHECKING:
    from lakesink_datasource.index.for_write import TaskIndex
    from lakesink_datasource.index.key_route import KeyRoute
    from lakesink_datasource.write.keyed import KeyedWriter

# The key index and the carried compaction are imported by the tasks that use them: a task
# is often the first thing a fresh Python worker runs, and an append needs neither.

log = logging.getLogger("lakesink")

MAX_OPEN_FILES = 100
PARTITION_OVERWRITE_MODE = "spark.sql.sources.partitionOverwriteMode"
# Spark hands Arrow batches of 10K rows (spark.sql.execution.arrow.maxRecordsPerBatch);
# splitting each by partition makes many tiny slices, and the per-slice cost (a write call,
# a copy, a fragment to concatenate later) dominated partitioned writes. Tasks therefore
# combine incoming batches to about this many rows before aligning and splitting them.
CHUNK_ROWS = 100_000


def _chunks(batches: Iterator[pa.RecordBatch], rows: int) -> Iterator[pa.RecordBatch]:
    pending: list[pa.RecordBatch] = []
    count = 0
    for batch in batches:
        if batch.num_rows == 0:
            continue
        pending.append(batch)
        count += batch.num_rows
        if count >= rows:
            yield pending[0] if len(pending) == 1 else pa.concat_batches(pending)
            pending, count = [], 0
    if pending:
        yield pending[0] if len(pending) == 1 else pa.concat_batches(pending)


class _Timed(Iterator[pa.RecordBatch]):
    """Spark's batches, counting how long the task waits for each one: the part of a task
    that is Spark's (the JVM's conversion to Arrow and its transfer), not lakesink's."""

    def __init__(self, batches: Iterator[pa.RecordBatch]) -> None:
        self._batches = batches
        self.waited = 0.0

    def __iter__(self) -> _Timed:
        return self

    def __next__(self) -> pa.RecordBatch:
        started = time.perf_counter()
        try:
            return next(self._batches)
        finally:
            self.waited += time.perf_counter() - started


@dataclass(frozen=True)
class TaskIdentity:
    """Which task attempt of which batch of which query this is."""

    partition_id: int = 0
    # Spark's task attempt id, unique within the application. Not attemptNumber: that starts
    # again at 0 when Spark resubmits a stage (map output lost with an executor), so a rerun
    # on the same host would share the dead attempt's undo token and see its index changes.
    attempt: int = 0
    batch_id: int | None = None
    query_id: str | None = None
    speculation: bool = False  # Spark may run a second attempt of this task at the same time
    overwrite_mode: str | None = None  # the session's spark.sql.sources.partitionOverwriteMode, if set

    @classmethod
    def from_spark(cls) -> TaskIdentity:
        # Spark sets these local properties on every task of a streaming micro-batch.
        from pyspark import TaskContext

        ctx = TaskContext.get()
        if ctx is None:
            return cls()
        batch = ctx.getLocalProperty("streaming.sql.batchId")
        return cls(
            partition_id=ctx.partitionId(),
            attempt=ctx.taskAttemptId(),
            batch_id=int(batch) if batch is not None else None,
            query_id=ctx.getLocalProperty("sql.streaming.queryId"),
            # Spark SQL hands its session's spark.* settings to tasks as local properties.
            speculation=(ctx.getLocalProperty("spark.speculation") or "false").strip().lower() == "true",
            overwrite_mode=(ctx.getLocalProperty(PARTITION_OVERWRITE_MODE) or "").strip().lower() or None,
        )


class _FileNamer:
    """Data file names, unique per task attempt: a retried or replayed task never overwrites
    a file that a committed snapshot may reference. A routed task's files carry its key
    shard (`KeyRoute.file_tag`), set before its first row is written."""

    def __init__(self, locations: DataLocations, spec: PartitionSpec, schema: Schema, who: TaskIdentity) -> None:
        self._locations, self._spec, self._schema = locations, spec, schema
        self._prefix = f"{who.batch_id if who.batch_id is not None else 0:05d}-{who.partition_id:05d}-{who.attempt}-{uuid.uuid4().hex[:12]}"
        self.tag = ""

    def __call__(self, key: PartitionKey, n: int) -> str:
        name = f"{self._prefix}{'-' + self.tag if self.tag else ''}-{n:05d}.parquet"
        return self._locations.of(partition_path(self._spec, self._schema, key), name)


class ReplaceWhereError(LakesinkError, ValueError):
    """Rows of an overwrite with replace_where fall outside its filter."""


def _check_rows_match(row_filter: RowFilter, batch: pa.Table | pa.RecordBatch) -> None:
    hit = matches(row_filter, batch if isinstance(batch, pa.Table) else pa.Table.from_batches([batch]))
    if not hit.all():
        outside = int((~hit).sum())
        raise ReplaceWhereError(
            f"{outside} row(s) of the DataFrame do not match option 'replace_where' = {row_filter.text!r}; an overwrite with "
            "replace_where writes only rows the filter matches: filter the DataFrame with the same condition or "
            "widen replace_where. Nothing was committed"
        )


def write_task(
    plan: WritePlan, batches: Iterator[pa.RecordBatch], who: TaskIdentity | None = None
) -> LakeSinkCommitMessage:
    """One task's rows into data files, and its commit message. The task is one operation of
    the retry policy (iceberg/retry.py): every file it reads or writes waits for a store
    that is away on one clock, with the table's budgets as planned and the write's own
    `property.<key>` options."""
    with retry_clock(plan, "a write task").active():
        return _write_task(plan, batches, who)


def _write_task(
    plan: WritePlan, batches: Iterator[pa.RecordBatch], who: TaskIdentity | None = None
) -> LakeSinkCommitMessage:
    task_started = time.perf_counter()
    batches = timed = _Timed(iter(batches))
    who = who or TaskIdentity.from_spark()
    if plan.keyed is not None and who.speculation:
        # Two live attempts of one task would both resolve their keys in the host's index,
        # and the attempt Spark keeps could hide rows the other one wrote.
        raise KeyedInputError(
            "keyed writes (operation=upsert, cdc, dedupe) cannot run with spark.speculation=true: two attempts "
            "of one task would change the key index at once. Set spark.speculation=false for this job "
            "(appends are safe with speculation)"
        )
    metadata = metadata_cache.load(plan.metadata_location, plan.io_properties)

    def result(**kwargs: Any) -> LakeSinkCommitMessage:
        return LakeSinkCommitMessage.of(
            TaskResult(
                write_id=plan.write_id,
                query_id=who.query_id,
                batch_id=who.batch_id,
                partition_id=who.partition_id,
                attempt=who.attempt,
                planned_metadata_location=plan.metadata_location,
                planned_snapshot_id=plan.planned_snapshot_id,
                write_schema_json=plan.write_schema_json,
                evolved_from_schema_id=plan.evolved_from_schema_id,
                write_spec_id=plan.write_spec_id,
                session_overwrite_mode=who.overwrite_mode,
                planned_at=plan.planned_at,
                plan_seconds=plan.plan_seconds,
                truncated_at=plan.truncated_at,
                truncates=plan.truncates,
                binlogs=plan.binlogs,
                **kwargs,
            )
        )

    if idempotency.is_epoch_committed(metadata, who.query_id, who.batch_id) or idempotency.is_txn_committed(
        metadata, plan.options.txn_app_id, plan.options.txn_version
    ):
        # A replay of a batch (or txn version) whose commit reached the table: write nothing.
        for _ in batches:
            pass
        return result(skipped=True)

    schema = write_schema(plan, metadata)
    spec = write_spec(plan, metadata)
    arrow_schema = table_arrow_schema(schema)
    aligner = BatchAligner(
        arrow_schema, plan.column_sources, plan.keyed.table_key_columns if plan.keyed is not None else (),
        defaults=[f.write_default for f in schema.fields],
    )
    splitter = PartitionSplitter(spec, schema)
    io = metadata_cache.file_io(plan.io_properties, plan.metadata_location)
    # Data files get small stream buffers: a task may hold many files open (see rolling_writer).
    data_io = metadata_cache.file_io({**plan.io_properties, BUFFER_SIZE: str(STREAM_BUFFER_BYTES)}, plan.metadata_location)
    # The write's own property.<key> options apply to what it writes: they land with it.
    properties = effective_properties(metadata.properties, plan.options.table_properties)
    settings = TableSettings.of(properties, metadata.location)
    writer = PartitionedParquetWriter.for_table(
        settings,
        io=data_io,
        iceberg_schema=schema,
        arrow_schema=arrow_schema,
        spec_id=spec.spec_id,
        table_properties=properties,
        path_for=(namer := _FileNamer(settings.data_locations, spec, schema, who)),
        target_file_size=plan.options.target_file_size_bytes,
        # Each open file holds memory of its own (stream buffer, writer state), so a task
        # keeps at most this many open (the least recently written closes).
        max_open_files=MAX_OPEN_FILES,
        row_order=(row_order := RowOrder.of(metadata.sort_order(), schema)),
        # Keyed writes record each row's position as it arrives, before a file is written:
        # their rows are sorted as they arrive, a chunk's rows of a partition as one run.
        sort_on_arrival=plan.keyed is not None and row_order is not None,
    )
    # Rows an overwrite with replace_where writes must match its filter (as Delta checks):
    # the overwrite replaces exactly the matching rows, so a row outside it would land
    # beside the rows it was meant to replace.
    replace_where = parse_filter(plan.options.replace_where, schema) if plan.overwrite and plan.options.replace_where else None
    rows_in = 0
    partition_seconds = write_seconds = 0.0
    keyed: KeyedWriter | None = None
    task_index: TaskIndex | None = None
    route: KeyRoute | None = None
    if plan.keyed is not None:
        from lakesink_datasource.write.keyed import KeyedWriter, chunk_route, open_task_index
    try:
        if plan.keyed is not None and not plan.keyed.clustered:
            task_index = open_task_index(plan, metadata, io, partition_id=who.partition_id, attempt=who.attempt, query_id=who.query_id)
            keyed = KeyedWriter(plan, metadata, task_index, writer, splitter, aligner, io=io)
            if plan.options.unavailable_value is not None:
                batches = _with_unchanged_values(batches, plan, aligner, task_index, io)
        elif plan.keyed is not None and plan.options.unavailable_value is not None:
            # A routed task's index is its key shard's, known from its rows: opened before any
            # row is written, so the placeholders read the shard's current rows.
            gathered = [b for b in batches if b.num_rows]
            if gathered:
                route = chunk_route(gathered[0], plan.keyed.table_key_columns, None)
                namer.tag = route.file_tag()
                task_index = open_task_index(
                    plan, metadata, io, partition_id=who.partition_id, attempt=who.attempt, route=route, query_id=who.query_id
                )
                keyed = KeyedWriter(plan, metadata, task_index, writer, splitter, aligner, route, io=io)
                batches = _with_unchanged_values(iter(gathered), plan, aligner, task_index, io)
        # Concatenating Spark's batches only pays where they are split (by partition or by key);
        # an unpartitioned append buffers them as they come (the writer keeps each once).
        chunk_rows = CHUNK_ROWS if plan.keyed is not None or not splitter.is_unpartitioned else 1
        if plan.keyed is not None and plan.keyed.history is not None:
            # A history table's key may change several times in a task: its versions must all
            # be decided at once (a version written by an earlier chunk is not in a file yet).
            chunk_rows = 1 << 62
        for batch in _chunks(batches, chunk_rows):
            rows_in += batch.num_rows
            if plan.keyed is not None and plan.keyed.clustered:
                # A routed task holds one key shard: its host's index of that shard alone.
                shard = chunk_route(batch, plan.keyed.table_key_columns, route)
                if route is None:
                    route = shard
                    namer.tag = route.file_tag()
                    task_index = open_task_index(
                        plan, metadata, io, partition_id=who.partition_id, attempt=who.attempt, route=route, query_id=who.query_id
                    )
                    keyed = KeyedWriter(plan, metadata, task_index, writer, splitter, aligner, route, io=io)
            t0 = time.perf_counter()
            if keyed is not None:
                keyed.write(batch)
                write_seconds += time.perf_counter() - t0
                continue
            aligned = aligner.align(batch)
            if replace_where is not None:
                _check_rows_match(replace_where, aligned)
            grouped, groups = splitter.split_grouped(aligned)
            t1 = time.perf_counter()
            writer.write_groups(grouped, groups)
            partition_seconds += t1 - t0
            write_seconds += time.perf_counter() - t1
        fault_point("task_rows_written", who.batch_id)  # tests: the store goes away before the files are put
        t1 = time.perf_counter()
        files = writer.close()
        write_seconds += time.perf_counter() - t1
        fault_point("task_files_written", who.batch_id)
    except BaseException:
        # Clean up, but never let a failure of the clean-up (the same full disk, say) hide
        # the error that stopped the task.
        for undo in (writer.abort, keyed.rollback if keyed is not None else None):
            if undo is None:
                continue
            try:
                undo()
            except Exception:
                log.warning("lakesink: cleaning up after a failed task failed too", exc_info=True)
        raise
    finally:
        # Spark reuses this worker process: give the allocator's cached pages back to the OS
        # instead of carrying this task's peak into the next one.
        pa.default_memory_pool().release_unused()
    compaction = _carried_compaction(plan, io, metadata, who)
    # The index's share: bringing it forward, then resolving keys (inside write_seconds).
    sync_seconds = task_index.seconds if task_index is not None else 0.0
    lookup_seconds = keyed.lookup_seconds if keyed is not None else 0.0
    stats = TaskStats(
        rows_in=rows_in,
        rows_written=sum(f.record_count for f in files),
        rows_deleted=keyed.rows_deleted if keyed else 0,
        bytes_written=sum(f.file_size_in_bytes for f in files),
        partition_seconds=partition_seconds,
        index_seconds=sync_seconds + lookup_seconds,
        index_sync_seconds=sync_seconds,
        write_seconds=max(0.0, write_seconds - lookup_seconds),
        task_seconds=time.perf_counter() - task_started,
        input_wait_seconds=timed.waited,
    )
    if keyed is None or task_index is None:
        return result(data_files=files, stats=stats, compaction=compaction)
    from lakesink_datasource.index.key_columns import TOMBSTONE_DIR
    from lakesink_datasource.index.owner import owner_digest

    # Named with the host's digest: a host catching up a batch made on several hosts skips
    # its own reports (its index has its own part already).
    report = f"{settings.data_path}/{TOMBSTONE_DIR}/{plan.write_id}-{owner_digest(keyed.host)}-{who.partition_id:05d}-{who.attempt}"
    tombstones = keyed.write_tombstones(io, f"{report}.parquet")
    deleted = keyed.write_deleted_keys(io, f"{report}-deleted.parquet")
    return result(
        data_files=files, stats=stats, position_deletes=keyed.position_deletes(), host=keyed.host,
        key_hashes=keyed.key_hashes(), tombstones=tombstones, deleted_keys=deleted, tombstone_max_sequence=keyed.tombstone_max,
        index_healed=task_index.healed, index_sync=task_index.report.describe(), compaction=compaction,
    )


def _with_unchanged_values(
    batches: Iterator[pa.RecordBatch], plan: WritePlan, aligner: BatchAligner, task_index: TaskIndex, io: FileIO
) -> Iterator[pa.RecordBatch]:
    """The task's whole input, its placeholders (option unavailable_value) replaced by the
    values the keys hold (write/unchanged_values.py): read before any row is written."""
    from lakesink_datasource.write.unchanged_values import fill_unchanged

    gathered = [b for b in batches if b.num_rows]
    if not gathered:
        return iter(())
    filled = fill_unchanged(pa.Table.from_batches(gathered), plan, aligner, task_index.index, io)
    return iter(filled.rows.to_batches())


def _carried_compaction(plan: WritePlan, io: FileIO, metadata: TableMetadata, who: TaskIdentity) -> CompactionMessage | None:
    """This task's groups of the compaction the write carries (maintenance=auto), rewritten
    after its rows. Never fails the task: the batch's rows matter, the groups wait for a
    later write."""
    if plan.compaction is None:
        return None
    try:
        from lakesink_datasource.compaction.carried import rewrite_carried

        done = rewrite_carried(plan.compaction, io, metadata, who.partition_id)
        if done is None:
            return None
        message, delete = done
        try:
            fault_point("task_compaction_written", who.batch_id)
        except BaseException:
            delete()
            raise
        return message
    except Exception:
        log.warning("lakesink: the compaction this task carried failed; its files are planned again with a later write", exc_info=True)
        return None
