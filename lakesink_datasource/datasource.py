"""The Spark Python Data Source `lakesink`: the entry point Spark calls.

Driver:   DataSource.writer()/streamWriter() -> table.setup.plan_write (resolve/create the
          table, validate, pin its state) -> a picklable writer holding the WritePlan.
Executor: writer.write(Arrow batches) -> write.task.write_task -> commit message.
Driver:   writer.commit(messages[, batchId]) -> commit.committer.commit_write (one snapshot),
          then the batch's tombstones into the companion table (sequenced keyed writes) and
          maintenance.after_batch (compaction, orphan removal) unless maintenance=off.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from lakesink_datasource.errors import without_traceback
from lakesink_datasource.worker_gc import settle_imports

if TYPE_CHECKING:
    import pyarrow as pa

    from lakesink_datasource.catalog.table_transaction import TableTransaction
    from lakesink_datasource.options import WriteOptions
    from lakesink_datasource.read.stream import LakeSinkStreamReader
    from lakesink_datasource.routing.route_plan import RoutedWrite
    from lakesink_datasource.table.plan import WritePlan

# The rest is imported where it is used: Spark starts a Python process of its own for each
# role (creating the source, planning, a task, the commit, a read) and each pays for what
# this module imports, a second or more on a fresh executor for the whole package. pyarrow
# and msgspec too: every session imports this module at its start to find the source by
# name (pyspark_lakesink): with them the import took 0.17-0.3 s and 39 MB, without 9-15 ms.

log = logging.getLogger("lakesink")

try:
    from pyspark.sql.datasource import DataSourceStreamArrowWriter

    STREAM_ARROW = True
except ImportError:  # PySpark 4.0: a stream sink is handed Rows (spark_rows.py turns them into Arrow)
    from pyspark.sql.datasource import DataSourceStreamWriter as DataSourceStreamArrowWriter  # type: ignore[assignment]

    STREAM_ARROW = False


class LakeSinkDataSource(DataSource):
    """`df.write.format("lakesink")`, `df.writeStream.format("lakesink")`, `USING lakesink`."""

    @classmethod
    def name(cls) -> str:
        return "lakesink"

    @without_traceback
    def schema(self) -> StructType:
        # Asked for by reads without a user schema (the read's table state: time travel sees
        # the columns of its time) and by CREATE TABLE ... USING lakesink without a column
        # list (which passes write options: only the read ones are looked at).
        from lakesink_datasource.read import metadata_tables
        from lakesink_datasource.read.changes import CHANGE_ORDINAL, CHANGE_TYPE, COMMIT_SNAPSHOT_ID, COMMIT_TIMESTAMP
        from lakesink_datasource.read.options import parse_read_options, read_subset
        from lakesink_datasource.read.scan import NoSuchTable, resolve_state
        from lakesink_datasource.schema.iceberg_to_spark import iceberg_to_spark

        options = parse_read_options(read_subset(self.options))
        meta_schema = metadata_tables.resolve_schema(options)
        if meta_schema is not None:
            return metadata_tables.spark_schema(meta_schema)
        try:
            state = resolve_state(options)
        except NoSuchTable as exc:
            # Only a missing table has this way out; a bad snapshot or timestamp says its own.
            raise NoSuchTable(f"{exc}: give the columns in CREATE TABLE, or write to the table first") from None
        schema = iceberg_to_spark(state.schema)
        if options.read_changes:
            schema = (schema.add(CHANGE_TYPE, "string", nullable=False).add(COMMIT_SNAPSHOT_ID, "long", nullable=False)
                      .add(CHANGE_ORDINAL, "long", nullable=False).add(COMMIT_TIMESTAMP, "timestamp", nullable=False))
        return schema

    @without_traceback
    def reader(self, schema: StructType) -> DataSourceReader:
        from lakesink_datasource.options import OptionError
        from lakesink_datasource.read import metadata_tables
        from lakesink_datasource.read.batch import (
            LakeSinkFilteringReader,
            LakeSinkRangeReader,
            LakeSinkReader,
            filter_pushdown_enabled,
        )
        from lakesink_datasource.read.options import parse_read_options

        settle_imports()
        options = parse_read_options(self.options)
        meta = metadata_tables.resolve(options)
        if meta is not None:
            return metadata_tables.MetadataTableReader(meta, schema)
        if options.max_files_per_trigger is not None:
            raise OptionError(
                "option 'max_files_per_trigger' applies to spark.readStream; a batch read reads its whole range at once"
            )
        if options.is_range:
            return LakeSinkRangeReader(options, schema)
        reader_class = LakeSinkFilteringReader if filter_pushdown_enabled() else LakeSinkReader
        return reader_class(options, schema)

    @without_traceback
    def streamReader(self, schema: StructType) -> LakeSinkStreamReader:
        from lakesink_datasource.read.options import parse_read_options
        from lakesink_datasource.read.stream import LakeSinkStreamReader

        settle_imports()
        return LakeSinkStreamReader(parse_read_options(self.options), schema)

    @without_traceback
    def writer(self, schema: StructType, overwrite: bool) -> LakeSinkBatchWriter | TablesBatchWriter:
        from lakesink_datasource.options import OptionError, parse_options
        from lakesink_datasource.routing.route_options import is_routed
        from lakesink_datasource.routing.route_plan import plan_routed_write

        if is_routed(self.options):
            settle_imports()
            return TablesBatchWriter(plan_routed_write(self.options, schema, overwrite))
        options = parse_options(self.options)
        if options.new_checkpoint is not None:
            raise OptionError(
                "option 'new_checkpoint' applies to streaming writes (what a new checkpoint's first batch does to a table "
                "its query name wrote before); a batch write has no checkpoint"
            )
        return LakeSinkBatchWriter(_timed_plan(options, schema, overwrite))

    @without_traceback
    def streamWriter(
        self, schema: StructType, overwrite: bool
    ) -> LakeSinkStreamWriter | ClusteredStreamWriter | TablesStreamWriter | ClusteredTablesStreamWriter:
        from lakesink_datasource.key_clustering import clustered_stream
        from lakesink_datasource.options import OptionError, parse_options
        from lakesink_datasource.routing.route_options import is_routed, parse_routing
        from lakesink_datasource.routing.route_plan import RoutedWrite, plan_routed_write

        clustered = clustered_stream(schema, self.options)
        if clustered is not None and clustered.tables:
            # cluster_by_key's stateful operator wrote each shard of the tables its rows named.
            settle_imports()
            return ClusteredTablesStreamWriter(RoutedWrite(options=parse_routing(clustered.options), write_id=""))
        if is_routed(self.options):
            # Rows routed to many tables (table_column): the tasks plan the tables they meet.
            settle_imports()
            if any(k.lower().rsplit(".", 1)[-1] == "new_checkpoint" and v.strip().lower() == "replace" for k, v in self.options.items()):
                raise OptionError(
                    "option new_checkpoint=replace empties a table before a new checkpoint's first batch, and a stream "
                    "routed by 'table_column' only knows its tables once their rows arrive: give it 'refuse' (the "
                    "default) or 'append', and empty the tables yourself before starting a new checkpoint"
                )
            return TablesStreamWriter(plan_routed_write(self.options, schema, overwrite), schema)
        if clustered is not None:
            # cluster_by_key's stateful operator writes the rows; this sink plans the batch
            # (creating the table, refusing bad input, before any task runs) and commits.
            return ClusteredStreamWriter(_stream_plan(parse_options(clustered.options), clustered.data_schema, overwrite))
        options = parse_options(self.options)
        if options.txn_app_id is not None:
            raise OptionError(
                "options 'txn_app_id' and 'txn_version' apply to batch writes (for example inside foreachBatch, "
                "with the batch id as txn_version); a streaming query's batches are already exactly once"
            )
        if _called_by_commit_runner():
            # The batch was planned before its tasks ran, and its first task's message carries
            # that plan: the commit uses it, not a second plan (a catalog and metadata read).
            return LakeSinkStreamWriter(None, schema, replan=(options, overwrite))
        return LakeSinkStreamWriter(_stream_plan(options, schema, overwrite), schema)


# Spark's streaming commit runs in a worker of its own, which calls streamWriter() again and
# then commit() on what it returns (the planner's writer went to the tasks, not to it).
_COMMIT_RUNNER = "pyspark.sql.worker.python_streaming_sink_runner"


def _called_by_commit_runner() -> bool:
    """Whether Spark's streaming commit runner is the caller (its module imported by a worker,
    or run as the main module where Spark starts workers without a daemon)."""
    frame = sys._getframe(1)
    while frame is not None:
        spec = frame.f_globals.get("__spec__")
        if frame.f_globals.get("__name__") == _COMMIT_RUNNER or getattr(spec, "name", None) == _COMMIT_RUNNER:
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


def _stream_plan(options: WriteOptions, schema: StructType, overwrite: bool) -> WritePlan:
    """A micro-batch's plan; the first batch of a new checkpoint with new_checkpoint=replace
    empties the table first (table/new_checkpoint.py), then plans against the empty table."""
    from lakesink_datasource.table.new_checkpoint import ContentsToReplace

    try:
        return _timed_plan(options, schema, overwrite)
    except ContentsToReplace as found:
        from lakesink_datasource.commit.new_checkpoint import empty_for_new_checkpoint

        outcome = empty_for_new_checkpoint(options, found)
        log.info("lakesink: %s emptied for the new checkpoint of streaming query %r (%s)", options.table, found.query_name, found)
        if options.progress:
            print(
                f"lakesink {options.table}: streaming query {found.query_name!r} starts from a new checkpoint "
                f"(new_checkpoint=replace): the table emptied in snapshot {outcome.snapshot_id} before its first batch",
                file=sys.stderr, flush=True,
            )
        return _timed_plan(options, schema, overwrite)


def _timed_plan(options: WriteOptions, schema: StructType, overwrite: bool) -> WritePlan:
    from lakesink_datasource.table.setup import plan_write

    # Once the planning imports are in (the planning worker and the commit runner both plan).
    settle_imports()
    # Spark plans every micro-batch anew: where the batch's time starts, for the progress line.
    planned_at, started, cpu = time.time(), time.perf_counter(), time.process_time()
    plan = plan_write(options, schema, overwrite)
    seconds = time.perf_counter() - started
    _driver_event("plan", None, seconds, time.process_time() - cpu)
    import msgspec

    return msgspec.structs.replace(plan, planned_at=planned_at, plan_seconds=seconds)


def _driver_event(step: str, batch_id: int | None, seconds: float, cpu_seconds: float) -> None:
    # The driver's share of a batch, for a log handler that collects it (the benchmarks do:
    # with compaction in the tasks it should stay small and flat whatever the ingest rate).
    log.info("lakesink: driver %s of batch %s: %.3f s, %.3f s CPU", step, batch_id, seconds, cpu_seconds,
             extra={"lakesink_event": {"event": f"driver_{step}", "batch": batch_id, "seconds": seconds, "cpu_seconds": cpu_seconds}})


def _commit(
    plan: WritePlan, messages: list[WriterCommitMessage | None], batch_id: int | None, transaction: TableTransaction | None = None
) -> None:
    """One batch's commit in the driver: its snapshot, then what follows from it. With
    `transaction` (a write routed to many tables) the snapshot lands with the other tables'."""
    from lakesink_datasource.catalog import loader
    from lakesink_datasource.catalog.transient import catalog_call
    from lakesink_datasource.commit.committer import commit_write
    from lakesink_datasource.maintenance.after_batch import land_compaction, maintain_after_commit
    from lakesink_datasource.maintenance.background import report_background, table_turn
    from lakesink_datasource.maintenance.compaction import CompactionResult
    from lakesink_datasource.maintenance.tombstone_storing import store_tombstones_before_commit, store_tombstones_safely
    from lakesink_datasource.messages import decode_messages
    from lakesink_datasource.progress import BatchTiming, report_batch
    from lakesink_datasource.table.plan import retry_clock

    settle_imports()
    commit_started, cpu = time.time(), time.process_time()
    results = decode_messages(messages)
    sequenced = plan.keyed is not None and bool(plan.keyed.sequence_sources)
    compaction = None
    # The batch's commit is one operation of the retry policy (iceberg/retry.py): storing its
    # tombstones, landing its compaction, its snapshot and the maintenance after it wait on
    # one clock, this table's (a routed write's tables each commit in a thread of their own).
    clock = retry_clock(plan, f"committing batch {batch_id} to {plan.identifier}")
    name = loader.describe(plan.catalog)
    # The table's turn on this host: a compaction still running beside this batch
    # (maintenance=background) lands first, so snapshots keep the order they have with auto.
    with clock.active(), table_turn(plan.catalog, plan.identifier) as in_background:
        if sequenced:
            # Deletes of a batch whose storing did not happen are stored before this commit
            # may expire the snapshot that names them: if they cannot be, the batch does not commit.
            catalog = catalog_call(clock, lambda: loader.load(plan.catalog), what="opening the catalog", catalog=name)
            store_tombstones_before_commit(catalog, plan.identifier, clock)
        # The compaction the tasks carried lands first, on the state it read (carried.py says why).
        compaction = land_compaction(plan, results, batch_id, clock)
        outcome = commit_write(plan, results, batch_id=batch_id, transaction=transaction, clock=clock)
        commit_ended = time.time()
        if outcome.snapshot_id is not None:
            if sequenced:
                store_tombstones_safely(
                    catalog_call(clock, lambda: loader.load(plan.catalog), what="opening the catalog", catalog=name),
                    plan.identifier, outcome.table, clock,
                )
            if plan.options.branch is None:  # maintenance keeps main; a branch is published into it
                table = outcome.table

                def maintain() -> CompactionResult | None:
                    return maintain_after_commit(
                        plan, outcome.stats.bytes_written, batch_id=batch_id, table=table, batch_files=outcome.data_files,
                        clock=clock,
                    )

                if plan.options.maintenance == "background" and batch_id is not None:
                    in_background(lambda: report_background(plan.options.table, batch_id, maintain(), plan.options.progress))
                else:
                    compaction = maintain() or compaction
    ended = time.time()
    _driver_event("commit", batch_id, ended - commit_started, time.process_time() - cpu)
    if plan.options.progress:
        timing = BatchTiming.of(plan, results, commit_started=commit_started, commit_ended=commit_ended, ended=ended)
        report_batch(plan.options.table, batch_id, outcome, compaction, timing)


def _write(plan: WritePlan, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
    """A task (on an executor): the rows into data files, and a commit message."""
    from lakesink_datasource.write.task import write_task

    settle_imports()
    return write_task(plan, iterator)


def _stream_arrow(iterator: Iterator[pa.RecordBatch], schema: StructType | None) -> Iterator[pa.RecordBatch]:
    """A stream writer's input as Arrow batches: PySpark 4.0 hands a stream sink Rows."""
    if STREAM_ARROW:
        return iterator
    from lakesink_datasource.spark_rows import arrow_batches

    assert schema is not None
    return arrow_batches(iterator, schema)


def _abort(plan: WritePlan, messages: list[WriterCommitMessage | None], batch_id: int | None) -> None:
    from lakesink_datasource.commit.committer import abort_write
    from lakesink_datasource.messages import decode_messages

    abort_write(plan, decode_messages(messages), batch_id=batch_id)


class LakeSinkBatchWriter(DataSourceArrowWriter):
    def __init__(self, plan: WritePlan):
        self.plan = plan

    @without_traceback
    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        return _write(self.plan, iterator)

    @without_traceback
    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        _commit(self.plan, messages, batch_id=None)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        _abort(self.plan, messages, batch_id=None)


class ClusteredStreamWriter(DataSourceStreamArrowWriter):
    """The sink of a stream cluster_by_key clustered by key shard: its tasks pass on the
    commit messages of the keyed writes cluster_by_key's operator ran; the commit is every
    other stream's."""

    def __init__(self, plan: WritePlan):
        self.plan = plan

    @without_traceback
    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        from lakesink_datasource.key_clustering import RESULT_COLUMN
        from lakesink_datasource.messages import RoutedCommitMessage

        if not STREAM_ARROW:  # PySpark 4.0: Rows
            return RoutedCommitMessage([row[RESULT_COLUMN] for row in iterator])
        return RoutedCommitMessage([p for batch in iterator for p in batch.column(RESULT_COLUMN).to_pylist()])

    @without_traceback
    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        _commit(self.plan, messages, batch_id=batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        _abort(self.plan, messages, batch_id=batchId)


class LakeSinkStreamWriter(DataSourceStreamArrowWriter):
    """A micro-batch's writer. The planner's holds the batch's plan and goes to the tasks; the
    first task's message carries the plan to the commit, whose writer holds none (`replan`:
    the options to plan with when no message carries it, as when no task ran)."""

    def __init__(self, plan: WritePlan | None, schema: StructType | None = None, replan: tuple[WriteOptions, bool] | None = None):
        self.plan = plan
        self.schema = schema  # the rows' schema (PySpark 4.0 hands the sink Rows)
        self.replan = replan

    @without_traceback
    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        assert self.plan is not None, "a stream's tasks get the planner's writer"
        from lakesink_datasource.messages import LakeSinkCommitMessage

        message = _write(self.plan, _stream_arrow(iterator, self.schema))
        if isinstance(message, LakeSinkCommitMessage) and _first_task():
            import pickle

            message.plan = pickle.dumps(self.plan)
        return message

    def _batch_plan(self, messages: list[WriterCommitMessage | None]) -> WritePlan:
        if self.plan is not None:
            return self.plan
        from lakesink_datasource.messages import carried_plan

        carried = carried_plan(messages)
        if carried is not None:
            import pickle

            plan: WritePlan = pickle.loads(carried)
            return plan
        assert self.replan is not None and self.schema is not None
        options, overwrite = self.replan
        return _stream_plan(options, self.schema, overwrite)

    @without_traceback
    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        _commit(self._batch_plan(messages), messages, batch_id=batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        _abort(self._batch_plan(messages), messages, batch_id=batchId)


def _first_task() -> bool:
    """The task of the batch's first partition (or a write outside Spark's tasks)."""
    from pyspark import TaskContext

    context = TaskContext.get()
    return context is None or context.partitionId() == 0


def _write_tables(write: RoutedWrite, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
    from lakesink_datasource.routing.route_task import write_routed_task

    settle_imports()
    return write_routed_task(write, iterator)


def _commit_tables(write: RoutedWrite, messages: list[WriterCommitMessage | None], batch_id: int | None) -> None:
    from lakesink_datasource.routing.route_commit import commit_routed

    commit_routed(
        messages, batch_id, _commit, _abort, progress=write.options.table_options("routed.any_table").progress,
        together=write.options.commit_tables == "together",
    )


def _abort_tables(messages: list[WriterCommitMessage | None], batch_id: int | None) -> None:
    from lakesink_datasource.routing.route_commit import abort_routed

    abort_routed(messages, batch_id, _abort)


class TablesBatchWriter(DataSourceArrowWriter):
    """`df.write.format("lakesink").option("table_column", ...)`: rows into many tables."""

    def __init__(self, write: RoutedWrite):
        self.write_plan = write

    @without_traceback
    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        return _write_tables(self.write_plan, iterator)

    @without_traceback
    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        _commit_tables(self.write_plan, messages, batch_id=None)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        _abort_tables(messages, batch_id=None)


class TablesStreamWriter(DataSourceStreamArrowWriter):
    """`df.writeStream.format("lakesink").option("table_column", ...)`: each micro-batch's
    rows into the tables they name, each table's share committed once."""

    def __init__(self, write: RoutedWrite, schema: StructType | None = None):
        self.write_plan = write
        self.schema = schema

    @without_traceback
    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        return _write_tables(self.write_plan, _stream_arrow(iterator, self.schema))

    @without_traceback
    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        _commit_tables(self.write_plan, messages, batch_id=batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        _abort_tables(messages, batch_id=batchId)


class ClusteredTablesStreamWriter(DataSourceStreamArrowWriter):
    """The sink of a stream cluster_by_key routed to many tables: its tasks pass on what each
    shard's task wrote (every table it met); the commit is a routed write's."""

    def __init__(self, write: RoutedWrite):
        self.write_plan = write

    @without_traceback
    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        import msgspec

        from lakesink_datasource.key_clustering import RESULT_COLUMN, ShardTables
        from lakesink_datasource.messages import RoutedTablesMessage

        if not STREAM_ARROW:  # PySpark 4.0: Rows
            payloads = [row[RESULT_COLUMN] for row in iterator]
        else:
            payloads = [p for batch in iterator for p in batch.column(RESULT_COLUMN).to_pylist()]
        shards = [msgspec.msgpack.decode(p, type=ShardTables) for p in payloads]
        skipped: dict[str, int] = {}
        for shard in shards:
            for kind, count in shard.skipped.items():
                skipped[kind] = skipped.get(kind, 0) + count
        tables = [(i, plan, result) for shard in shards for i, plan, result in shard.tables]
        truncates: dict[str, bytes] = {}
        for shard in shards:
            for name, position in shard.truncates.items():
                truncates[name] = max(position, truncates.get(name, position))
        from lakesink_datasource.debezium.naming import check_batch_sources

        check_batch_sources(shard.sources for shard in shards)  # shards of one table, two source tables
        sources = {name: source for shard in shards for name, source in shard.sources.items()}
        return RoutedTablesMessage(tables, skipped, sorted({t for shard in shards for t in shard.change_logs}), truncates, sources)

    @without_traceback
    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        _commit_tables(self.write_plan, messages, batch_id=batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        _abort_tables(messages, batch_id=batchId)
