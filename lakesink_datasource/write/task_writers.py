"""What a write task does with its rows, one writer per kind behind one small protocol:
- `AppendTaskWriter`: aligns each chunk to the table's schema, fans it out by partition into
  the rolling Parquet writers (an overwrite with `replace_where` checks its rows first);
- `KeyedTaskWriter` (upsert, cdc, dedupe, history): resolves each chunk's keys in the host's
  key index (write/keyed.py) before its rows are written. Its index is the whole key space's,
  opened before the first row, or, for rows `cluster_by_key` routed, the one key shard the
  task's rows belong to, opened at its first rows. Placeholders (`unavailable_value`) are
  filled from the stored rows before any row is written; a history table decides all of a
  task's versions in one chunk.
Each owns its write, what it adds to the commit message, and its abort; `write.task` only
chooses one and drives it (as Iceberg's `SparkWrite.WriterFactory` chooses a data writer).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa
from pyiceberg.io import FileIO
from pyiceberg.io.pyarrow import BUFFER_SIZE
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table.metadata import TableMetadata

from lakesink_datasource.errors import LakesinkError
from lakesink_datasource.iceberg.locations import DataLocations
from lakesink_datasource.iceberg.partition_key import PartitionKey, partition_path
from lakesink_datasource.iceberg.properties import TableSettings, effective_properties
from lakesink_datasource.iceberg.row_filter import RowFilter, matches, parse_filter
from lakesink_datasource.io.partitioning import PartitionSplitter
from lakesink_datasource.io.rolling_writer import STREAM_BUFFER_BYTES, PartitionedParquetWriter
from lakesink_datasource.io.row_order import RowOrder
from lakesink_datasource.messages import DataFileMessage
from lakesink_datasource.schema.arrow_align import BatchAligner, table_arrow_schema
from lakesink_datasource.table import metadata_cache
from lakesink_datasource.table.plan import WritePlan, write_schema, write_spec

if TYPE_CHECKING:
    from lakesink_datasource.index.for_write import TaskIndex
    from lakesink_datasource.index.key_shards import KeyShard
    from lakesink_datasource.write.keyed import KeyedWriter
    from lakesink_datasource.write.task import TaskIdentity

# The key index is imported by the tasks that use it: a task is often the first thing a fresh
# Python worker runs, and an append needs none.

log = logging.getLogger("lakesink")

MAX_OPEN_FILES = 100
# Spark hands Arrow batches of 10K rows (spark.sql.execution.arrow.maxRecordsPerBatch);
# splitting each by partition makes many tiny slices, and the per-slice cost (a write call,
# a copy, a fragment to concatenate later) dominated partitioned writes. Tasks therefore
# combine incoming batches to about this many rows before aligning and splitting them.
CHUNK_ROWS = 100_000


class TaskWriter(Protocol):
    """A task's writer of one kind."""

    chunk_rows: int  # rows gathered from Spark's batches before each `write`

    def input(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """The task's rows as this writer takes them (it may read them all first)."""

    def write(self, chunk: pa.RecordBatch) -> None: ...

    def close(self) -> list[DataFileMessage]:
        """The data files written, closed."""

    def abort(self) -> None:
        """Undo what the task did (its files, its index changes): the task failed."""

    def stats(self) -> dict[str, Any]:
        """The writer's share of the task's stats (`TaskStats` fields): its timings, rows deleted."""

    def report(self) -> dict[str, Any]:
        """What the writer adds to the task's result (`TaskResult` fields): a keyed write's keys."""


class _FileNamer:
    """Data file names, unique per task attempt: a retried or replayed task never overwrites
    a file that a committed snapshot may reference. A clustered task's files carry its key
    shard (`KeyShard.file_tag`), set before its first row is written."""

    def __init__(self, locations: DataLocations, spec: PartitionSpec, schema: Schema, who: TaskIdentity) -> None:
        self._locations, self._spec, self._schema = locations, spec, schema
        self._prefix = f"{who.batch_id if who.batch_id is not None else 0:05d}-{who.partition_id:05d}-{who.attempt}-{uuid.uuid4().hex[:12]}"
        self.tag = ""

    def __call__(self, key: PartitionKey, n: int) -> str:
        name = f"{self._prefix}{'-' + self.tag if self.tag else ''}-{n:05d}.parquet"
        return self._locations.of(partition_path(self._spec, self._schema, key), name)


@dataclass
class TableFiles:
    """What every kind of task writer writes with: the table's schema and spec as planned,
    the batch aligner, the partition splitter and the rolling Parquet writers."""

    schema: Schema
    settings: TableSettings
    aligner: BatchAligner
    splitter: PartitionSplitter
    io: FileIO
    writer: PartitionedParquetWriter
    namer: _FileNamer

    @classmethod
    def open(cls, plan: WritePlan, metadata: TableMetadata, who: TaskIdentity) -> TableFiles:
        schema = write_schema(plan, metadata)
        spec = write_spec(plan, metadata)
        arrow_schema = table_arrow_schema(schema)
        aligner = BatchAligner(
            arrow_schema, plan.column_sources, plan.keyed.table_key_columns if plan.keyed is not None else (),
            defaults=[f.write_default for f in schema.fields],
        )
        io = metadata_cache.file_io(plan.io_properties, plan.metadata_location)
        # Data files get small stream buffers: a task may hold many files open (see rolling_writer).
        data_io = metadata_cache.file_io({**plan.io_properties, BUFFER_SIZE: str(STREAM_BUFFER_BYTES)}, plan.metadata_location)
        # The write's own property.<key> options apply to what it writes: they land with it.
        properties = effective_properties(metadata.properties, plan.options.table_properties)
        settings = TableSettings.of(properties, metadata.location)
        namer = _FileNamer(settings.data_locations, spec, schema, who)
        row_order = RowOrder.of(metadata.sort_order(), schema)
        writer = PartitionedParquetWriter.for_table(
            settings, io=data_io, iceberg_schema=schema, arrow_schema=arrow_schema, spec_id=spec.spec_id,
            table_properties=properties, path_for=namer, target_file_size=plan.options.target_file_size_bytes,
            # Each open file holds memory of its own (stream buffer, writer state), so a task
            # keeps at most this many open (the least recently written closes).
            max_open_files=MAX_OPEN_FILES,
            row_order=row_order,
            # Keyed writes record each row's position as it arrives, before a file is written:
            # their rows are sorted as they arrive, a chunk's rows of a partition as one run.
            sort_on_arrival=plan.keyed is not None and row_order is not None,
        )
        return cls(schema, settings, aligner, PartitionSplitter(spec, schema), io, writer, namer)


class ReplaceWhereError(LakesinkError, ValueError):
    """Rows of an overwrite with replace_where fall outside its filter."""


class _RollingFiles:
    """What both kinds share: the rolling Parquet writers, closed (timed with the writes) or
    aborted."""

    def __init__(self, files: TableFiles) -> None:
        self._files = files
        self._write_seconds = 0.0

    def close(self) -> list[DataFileMessage]:
        started = time.perf_counter()
        files = self._files.writer.close()
        self._write_seconds += time.perf_counter() - started
        return files

    def abort(self) -> None:
        _undo(self._files.writer.abort)


class AppendTaskWriter(_RollingFiles):
    """Rows appended as they are: aligned, split by partition, written."""

    def __init__(self, plan: WritePlan, files: TableFiles) -> None:
        super().__init__(files)
        # Rows an overwrite with replace_where writes must match its filter (as Delta checks):
        # the overwrite replaces exactly the matching rows, so a row outside it would land
        # beside the rows it was meant to replace.
        self._replace_where = parse_filter(plan.options.replace_where, files.schema) if plan.overwrite and plan.options.replace_where else None
        # Concatenating Spark's batches only pays where they are split by partition; an
        # unpartitioned append buffers them as they come (the writer keeps each once).
        self.chunk_rows = 1 if files.splitter.is_unpartitioned else CHUNK_ROWS
        self._partition_seconds = 0.0

    def input(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        return batches

    def write(self, chunk: pa.RecordBatch) -> None:
        started = time.perf_counter()
        aligned = self._files.aligner.align(chunk)
        if self._replace_where is not None:
            _check_rows_match(self._replace_where, aligned)
        grouped, groups = self._files.splitter.split_grouped(aligned)
        split = time.perf_counter()
        self._files.writer.write_groups(grouped, groups)
        self._partition_seconds += split - started
        self._write_seconds += time.perf_counter() - split

    def stats(self) -> dict[str, Any]:
        return {"partition_seconds": self._partition_seconds, "write_seconds": self._write_seconds}

    def report(self) -> dict[str, Any]:
        return {}


def _check_rows_match(row_filter: RowFilter, batch: pa.Table | pa.RecordBatch) -> None:
    hit = matches(row_filter, batch if isinstance(batch, pa.Table) else pa.Table.from_batches([batch]))
    if not hit.all():
        outside = int((~hit).sum())
        raise ReplaceWhereError(
            f"{outside} row(s) of the DataFrame do not match option 'replace_where' = {row_filter.text!r}; an overwrite with "
            "replace_where writes only rows the filter matches: filter the DataFrame with the same condition or "
            "widen replace_where. Nothing was committed"
        )


class KeyedTaskWriter(_RollingFiles):
    """Rows written by key: each chunk's keys resolved in the host's key index first."""

    def __init__(self, plan: WritePlan, metadata: TableMetadata, files: TableFiles, who: TaskIdentity) -> None:
        assert plan.keyed is not None
        super().__init__(files)
        self._plan, self._keyed_plan, self._metadata, self._who = plan, plan.keyed, metadata, who
        self._index: TaskIndex | None = None
        self._writer: KeyedWriter | None = None
        self._route: KeyShard | None = None
        # A history table's key may change several times in a task: its versions must all be
        # decided at once (a version written by an earlier chunk is not in a file yet).
        self.chunk_rows = 1 << 62 if plan.keyed.history is not None else CHUNK_ROWS

    def input(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from lakesink_datasource.write.keyed import chunk_route

        placeholders = self._plan.options.unavailable_value is not None
        if not self._keyed_plan.clustered:
            self._open(None)
            return self._with_unchanged_values(batches) if placeholders else batches
        if not placeholders:
            return batches  # the key shard's index opens at the first rows (`write`)
        # The shard's index opened before any row is written, so the placeholders read the
        # shard's current rows.
        gathered = [b for b in batches if b.num_rows]
        if not gathered:
            return iter(())
        self._open(chunk_route(gathered[0], self._keyed_plan.table_key_columns, None))
        return self._with_unchanged_values(iter(gathered))

    def _open(self, route: KeyShard | None) -> None:
        from lakesink_datasource.write.keyed import KeyedWriter, open_task_index

        if route is not None:
            self._route = route
            self._files.namer.tag = route.file_tag()
        who, files = self._who, self._files
        self._index = open_task_index(
            self._plan, self._metadata, files.io, partition_id=who.partition_id, attempt=who.attempt, route=route, query_id=who.query_id
        )
        self._writer = KeyedWriter(self._plan, self._metadata, self._index, files.writer, files.splitter, files.aligner, route, io=files.io)

    def _with_unchanged_values(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """The task's whole input, its placeholders (option unavailable_value) replaced by the
        values the keys hold (write/unchanged_values.py): read before any row is written."""
        from lakesink_datasource.write.unchanged_values import fill_unchanged

        assert self._index is not None
        gathered = [b for b in batches if b.num_rows]
        if not gathered:
            return iter(())
        filled = fill_unchanged(pa.Table.from_batches(gathered), self._plan, self._files.aligner, self._index.index, self._files.io)
        return iter(filled.rows.to_batches())

    def write(self, chunk: pa.RecordBatch) -> None:
        if self._keyed_plan.clustered:
            from lakesink_datasource.write.keyed import chunk_route

            # A clustered task holds one key shard: its host's index of that shard alone.
            shard = chunk_route(chunk, self._keyed_plan.table_key_columns, self._route)
            if self._writer is None:
                self._open(shard)
        assert self._writer is not None
        started = time.perf_counter()
        self._writer.write(chunk)
        self._write_seconds += time.perf_counter() - started

    def abort(self) -> None:
        super().abort()
        if self._writer is not None:
            _undo(self._writer.rollback)

    def stats(self) -> dict[str, Any]:
        # The index's share: bringing it forward, then resolving keys (inside the writes).
        sync = self._index.seconds if self._index is not None else 0.0
        lookup = self._writer.lookup_seconds if self._writer is not None else 0.0
        return {
            "rows_deleted": self._writer.rows_deleted if self._writer is not None else 0,
            "index_seconds": sync + lookup,
            "index_sync_seconds": sync,
            "write_seconds": max(0.0, self._write_seconds - lookup),
        }

    def report(self) -> dict[str, Any]:
        writer, index = self._writer, self._index
        if writer is None or index is None:
            return {}  # a clustered task that got no rows opened no index
        from lakesink_datasource.index.key_columns import TOMBSTONE_DIR
        from lakesink_datasource.index.owner import owner_digest

        # Named with the host's digest: a host catching up a batch made on several hosts skips
        # its own reports (its index has its own part already).
        who = self._who
        report = f"{self._files.settings.data_path}/{TOMBSTONE_DIR}/{self._plan.write_id}-{owner_digest(writer.host)}-{who.partition_id:05d}-{who.attempt}"
        return {
            "position_deletes": writer.position_deletes(),
            "host": writer.host,
            "key_hashes": writer.key_hashes(),
            "tombstones": writer.write_tombstones(self._files.io, f"{report}.parquet"),
            "deleted_keys": writer.write_deleted_keys(self._files.io, f"{report}-deleted.parquet"),
            "tombstone_max_sequence": writer.tombstone_max,
            "index_healed": index.healed,
            "index_sync": index.report.describe(),
        }


def _undo(step: Any) -> None:
    # Clean up, but never let a failure of the clean-up (the same full disk, say) hide the
    # error that stopped the task.
    try:
        step()
    except Exception:
        log.warning("lakesink: cleaning up after a failed task failed too", exc_info=True)


def task_writer(plan: WritePlan, metadata: TableMetadata, files: TableFiles, who: TaskIdentity) -> TaskWriter:
    """The writer of the write's kind."""
    if plan.keyed is not None:
        return KeyedTaskWriter(plan, metadata, files, who)
    return AppendTaskWriter(plan, files)
