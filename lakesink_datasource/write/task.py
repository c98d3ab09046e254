"""Executor side: one Spark task's Arrow batches -> Parquet data files -> a commit message.

Reads top to bottom as the data path: load the planned table state (cached per process),
skip the batch if the table already holds it, choose the writer of the write's kind
(write/task_writers.py: an append, or a keyed write through the key index), feed it the
task's rows in chunks, and report what was written.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyiceberg.io import FileIO
from pyiceberg.table.metadata import TableMetadata

from lakesink_datasource.faults import fault_point
from lakesink_datasource.messages import CompactionMessage, LakeSinkCommitMessage, TaskResult, TaskStats
from lakesink_datasource.table import idempotency, metadata_cache
from lakesink_datasource.table.plan import WritePlan, retry_clock
from lakesink_datasource.write.changes import KeyedInputError
from lakesink_datasource.write.task_writers import TableFiles, task_writer

# The carried compaction is imported by the tasks that carry one: a task is often the first
# thing a fresh Python worker runs.

log = logging.getLogger("lakesink")

PARTITION_OVERWRITE_MODE = "spark.sql.sources.partitionOverwriteMode"


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


def write_task(
    plan: WritePlan, batches: Iterator[pa.RecordBatch], who: TaskIdentity | None = None
) -> LakeSinkCommitMessage:
    """One task's rows into data files, and its commit message. The task is one operation of
    the retry policy (iceberg/retry.py): every file it reads or writes waits for a store
    that is away on one clock, with the table's budgets as planned and the write's own
    `property.<key>` options."""
    with retry_clock(plan, "a write task").active():
        return _write_task(plan, batches, who)


def _write_task(plan: WritePlan, batches: Iterator[pa.RecordBatch], who: TaskIdentity | None = None) -> LakeSinkCommitMessage:
    task_started = time.perf_counter()
    timed = _Timed(iter(batches))
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
    if idempotency.is_epoch_committed(metadata, who.query_id, who.batch_id) or idempotency.is_txn_committed(
        metadata, plan.options.txn_app_id, plan.options.txn_version
    ):
        # A replay of a batch (or txn version) whose commit reached the table: write nothing.
        for _ in timed:
            pass
        return _result(plan, who, skipped=True)

    files = TableFiles.open(plan, metadata, who)
    writer = task_writer(plan, metadata, files, who)
    rows_in = 0
    try:
        for chunk in _chunks(writer.input(timed), writer.chunk_rows):
            rows_in += chunk.num_rows
            writer.write(chunk)
        fault_point("task_rows_written", who.batch_id)  # tests: the store goes away before the files are put
        data_files = writer.close()
        fault_point("task_files_written", who.batch_id)
    except BaseException:
        writer.abort()
        raise
    finally:
        # Spark reuses this worker process: give the allocator's cached pages back to the OS
        # instead of carrying this task's peak into the next one.
        pa.default_memory_pool().release_unused()
    compaction = _carried_compaction(plan, files.io, metadata, who)
    stats = TaskStats(
        rows_in=rows_in,
        rows_written=sum(f.record_count for f in data_files),
        bytes_written=sum(f.file_size_in_bytes for f in data_files),
        task_seconds=time.perf_counter() - task_started,
        input_wait_seconds=timed.waited,
        **writer.stats(),
    )
    return _result(plan, who, data_files=data_files, stats=stats, compaction=compaction, **writer.report())


def _result(plan: WritePlan, who: TaskIdentity, **kwargs: Any) -> LakeSinkCommitMessage:
    """The task's commit message: what it wrote, and what the commit needs of the plan."""
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
