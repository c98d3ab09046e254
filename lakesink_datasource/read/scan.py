"""Batch reads: choose the table state, plan file scan tasks, read a group of them.

Planning runs on the driver: the snapshot (current, a branch or tag head, `snapshot_id`, or
`as_of_timestamp`), its schema, and the file scan tasks that survive the pushed filters
(partition and column-bound pruning, pyiceberg's planner, which also pairs each data file
with its deletion vector or position deletes). Tasks are bin-packed by bytes into Spark
partitions. Each Spark task reads its group with pyarrow (pyiceberg's Arrow scan: columns
matched by field id, so evolved schemas read right; row groups pruned by statistics; deletes
applied) and hands Spark Arrow batches of exactly the schema Spark expects.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.expressions import AlwaysTrue, BooleanExpression
from pyiceberg.expressions.visitors import bind
from pyiceberg.io import FileIO
from pyiceberg.io.pyarrow import ArrowScan, _read_all_delete_files, expression_to_pyarrow
from pyiceberg.manifest import FileFormat
from pyiceberg.schema import Schema
from pyiceberg.table import FileScanTask, Table
from pyiceberg.table.snapshots import Snapshot

from lakesink_datasource.arrays import unique_sorted
from lakesink_datasource.catalog import loader, sql_commit
from lakesink_datasource.catalog.transient import catalog_call
from lakesink_datasource.errors import LakesinkError
from lakesink_datasource.iceberg.live_files import keep_mask
from lakesink_datasource.iceberg.properties import DEFAULT_READ_SPLIT_BYTES, read_split_target
from lakesink_datasource.iceberg.retry import DEFAULT_POLICY
from lakesink_datasource.iceberg.row_lineage import FIELD_ID_KEY, field_ids
from lakesink_datasource.options import OptionError
from lakesink_datasource.read.options import ReadOptions
from lakesink_datasource.schema.arrow_align import align_by_field_id, table_arrow_schema
from lakesink_datasource.table import metadata_cache

MIN_ADAPTIVE_SPLIT_BYTES = 1024 * 1024
BATCH_ROWS = 131_072  # rows per Arrow batch handed to Spark (pyarrow's scanner default)


T = TypeVar("T")


class ReadError(LakesinkError, ValueError):
    """The table state asked for cannot be read (unknown table, snapshot, or delete kind)."""


class NoSuchTable(ReadError):
    """The table a read names does not exist."""


@dataclass(frozen=True)
class TableState:
    table: Table
    snapshot: Snapshot | None  # None: the table has no snapshot yet (reads as empty)
    schema: Schema  # the snapshot's schema (time travel reads the columns of its time)


def load_table(options: ReadOptions) -> Table:
    """The table a read names, its catalog calls waited for through a lock or an outage as
    a write's are (iceberg/retry.py; a read has no table settings before the table: the
    defaults)."""
    config = loader.catalog_config(options)
    clock = DEFAULT_POLICY.start(f"reading {options.table}")
    name = loader.describe(config)
    catalog = catalog_call(clock, lambda: loader.load(config), what="opening the catalog", catalog=name)
    try:
        with clock.active():
            return catalog_call(clock, lambda: sql_commit.load_table(catalog, options.table), what=f"loading table {options.table}", catalog=name)
    except NoSuchTableError:
        raise NoSuchTable(f"table {options.table} does not exist (catalog {config.name})") from None


def _retained(table: Table) -> str:
    ids = [s.snapshot_id for s in table.metadata.snapshots]
    shown = ", ".join(map(str, ids[-5:]))
    return f"{len(ids)} retained snapshot(s){': ... ' + shown if ids else ''}"


def resolve_state(options: ReadOptions) -> TableState:
    table = load_table(options)
    metadata = table.metadata
    snapshot: Snapshot | None
    if options.snapshot_id is not None:
        snapshot = metadata.snapshot_by_id(options.snapshot_id)
        if snapshot is None:
            raise ReadError(
                f"option 'snapshot_id' = {options.snapshot_id}: table {options.table} has no such snapshot (never "
                f"existed or expired); it has {_retained(table)}"
            )
    elif options.as_of_timestamp_ms is not None:
        snapshot = table.snapshot_as_of_timestamp(options.as_of_timestamp_ms)
        if snapshot is None:
            first = min((s.timestamp_ms for s in metadata.snapshots), default=None)
            raise ReadError(
                f"option 'as_of_timestamp' = {options.as_of_timestamp_ms} ms: table {options.table} has no snapshot "
                f"current at that time (before its first, or its snapshot expired; oldest retained: {first} ms)"
            )
    elif options.branch is not None:
        if options.branch not in metadata.refs:
            raise OptionError(f"option 'branch' = {options.branch!r}: table {options.table} has no such branch or tag")
        snapshot = metadata.snapshot_by_name(options.branch)
    else:
        snapshot = metadata.current_snapshot()
    schema = metadata.schema()
    time_travel = options.snapshot_id is not None or options.as_of_timestamp_ms is not None
    if time_travel and snapshot is not None and snapshot.schema_id is not None:
        # Time travel reads the columns the snapshot was written with (as Iceberg's Spark does).
        schema = metadata.schema_by_id(snapshot.schema_id) or schema
    return TableState(table, snapshot, schema)


@dataclass
class ReadPlan:
    """What every read task needs (picklable): where the metadata is, what to read as what."""

    metadata_location: str
    io_properties: dict[str, str]
    schema_json: str  # the Iceberg schema read (the snapshot's)
    arrow_schema: pa.Schema  # what Spark expects each batch to be
    row_filter: BooleanExpression = field(default_factory=AlwaysTrue)


def plan_tasks(state: TableState, row_filter: BooleanExpression) -> list[FileScanTask]:
    if state.snapshot is None:
        return []
    scan = state.table.scan(row_filter=row_filter, snapshot_id=state.snapshot.snapshot_id, case_sensitive=False)
    try:
        return list(scan.plan_files())
    except ValueError as exc:
        if "equality deletes" in str(exc):
            raise ReadError(
                f"table {'.'.join(state.table.name())} has equality delete files, which lakesink cannot read yet; "
                "rewrite them (Iceberg Java: CALL system.rewrite_data_files with delete-file-threshold) or read "
                "with an engine that applies them"
            ) from None
        raise


def split_bytes(state: TableState, options: ReadOptions, tasks: list[FileScanTask]) -> int:
    """How many bytes of files one Spark partition reads: the option, else the table's
    `read.split.target-size`, made smaller (down to 1 MiB) when the scan would otherwise
    leave cores idle, as Iceberg's adaptive split size does: a 90 MiB table must not be one
    task. The driver's core count stands in for Spark's parallelism (the same in local mode)."""
    if options.split_size_bytes is not None:
        return options.split_size_bytes
    target = read_split_target(state.table.metadata.properties)
    total = sum(_task_bytes(t) for t in tasks)
    return max(MIN_ADAPTIVE_SPLIT_BYTES, min(target, total // max(os.cpu_count() or 1, 1)))


@dataclass(frozen=True)
class Split:
    """A file scan task, or some of its row groups (a file larger than a split is read by
    several Spark tasks)."""

    task: FileScanTask
    row_groups: tuple[int, ...] | None  # None: the whole file
    size: int


def split_tasks(tasks: list[FileScanTask], target_bytes: int) -> list[Split]:
    """Files larger than `target_bytes` cut at row-group boundaries (the manifest's
    `split_offsets`, so no file is opened to plan); the rest whole."""
    out = []
    for task in tasks:
        f = task.file
        offsets = sorted(f.split_offsets or [])
        if f.file_size_in_bytes <= target_bytes or len(offsets) < 2 or f.file_format != FileFormat.PARQUET:
            out.append(Split(task, None, _task_bytes(task)))
            continue
        ends = [*offsets[1:], f.file_size_in_bytes]
        group: list[int] = []
        used = 0
        for i, (start, end) in enumerate(zip(offsets, ends)):
            if group and used + (end - start) > target_bytes:
                out.append(Split(task, tuple(group), used))
                group, used = [], 0
            group.append(i)
            used += end - start
        out.append(Split(task, tuple(group), used))
    return out


def group_units(units: list[Any], target_bytes: int = DEFAULT_READ_SPLIT_BYTES) -> list[list[Any]]:
    """Anything with a `size`, packed like scan tasks."""
    return _pack(units, lambda u: int(u.size), target_bytes)


def _task_bytes(task: FileScanTask) -> int:
    return task.file.file_size_in_bytes + sum(d.file_size_in_bytes for d in task.delete_files)


def group_tasks(tasks: list[FileScanTask], target_bytes: int) -> list[list[Split]]:
    """Splits packed into groups of about `target_bytes`, largest first (first fit), so Spark
    partitions come out even."""
    return _pack(split_tasks(tasks, target_bytes), lambda s: s.size, target_bytes)


def _pack(items: list[T], size_of: Callable[[T], int], target_bytes: int) -> list[list[T]]:
    groups: list[list[T]] = []
    sizes: list[int] = []
    for item in sorted(items, key=size_of, reverse=True):
        size = size_of(item)
        for i, used in enumerate(sizes):
            if used + size <= target_bytes:
                groups[i].append(item)
                sizes[i] += size
                break
        else:
            groups.append([item])
            sizes.append(size)
    return groups


def conform(batch: pa.RecordBatch, target: pa.Schema) -> pa.RecordBatch:
    """`batch` as exactly `target` (names as Spark has them, Spark's Arrow types)."""
    by_name = {name.lower(): i for i, name in enumerate(batch.schema.names)}
    columns = []
    for f in target:
        index = by_name.get(f.name.lower())
        column = pa.nulls(batch.num_rows, f.type) if index is None else batch.column(index)
        columns.append(column if column.type.equals(f.type) else column.cast(f.type))
    return pa.RecordBatch.from_arrays(columns, schema=target)


def read_tasks(plan: ReadPlan, splits: list[Split]) -> Iterator[pa.RecordBatch]:
    metadata = metadata_cache.load(plan.metadata_location, plan.io_properties)
    io = metadata_cache.file_io(plan.io_properties, plan.metadata_location)
    schema = Schema.model_validate_json(plan.schema_json)
    scan = ArrowScan(metadata, io, schema, plan.row_filter, case_sensitive=False)
    deletes = _read_all_delete_files(io, [s.task for s in splits])
    for split in splits:
        if split.row_groups is not None:
            batches = _read_row_groups(io, scan, split, schema, plan.row_filter, deletes.get(split.task.file.file_path))
        elif plan.row_filter != AlwaysTrue() or split.task.file.file_path not in deletes:
            # Batch by batch: ArrowScan.to_record_batches reads each whole file into memory
            # before the first batch reaches Spark, which then waits instead of converting
            # (benchmark scenario 9: 3.3 s -> 2.2 s for 5M rows). pyiceberg is pinned
            # (iceberg/compat.py), so its per-task generator is a stable seam.
            batches = scan._record_batches_from_scan_tasks_and_deletes([split.task], deletes)
        else:
            batches = _without_positions(scan._record_batches_from_scan_tasks_and_deletes([split.task], {}),
                                         deletes[split.task.file.file_path])
        for batch in batches:
            if batch.num_rows:
                yield conform(batch, plan.arrow_schema)


def _read_row_groups(
    io: FileIO, scan: ArrowScan, split: Split, schema: Schema, row_filter: BooleanExpression, hidden: list[pa.ChunkedArray] | None
) -> Iterator[pa.RecordBatch]:
    """Some row groups of a file: columns by field id as `schema`, the file's deletes at
    their positions in the whole file, then the row filter."""
    assert split.row_groups is not None
    target = table_arrow_schema(schema)
    predicate = None if row_filter == AlwaysTrue() else expression_to_pyarrow(bind(schema, row_filter, case_sensitive=False), schema)
    positions = _sorted_positions(hidden) if hidden else None
    with io.new_input(split.task.file.file_path).open() as stream:
        parquet = pq.ParquetFile(stream)
        if not _plain_columns(parquet, target, split.task):
            # Only pyiceberg projects this file right (see _plain_columns), and only whole:
            # the split holding its first row group reads it, the others nothing.
            if 0 in split.row_groups:
                yield from scan._record_batches_from_scan_tasks_and_deletes(
                    [split.task], {split.task.file.file_path: hidden} if hidden else {})
            return
        rows = [parquet.metadata.row_group(i).num_rows for i in range(parquet.num_row_groups)]
        for group in split.row_groups:
            table = align_by_field_id(parquet.read_row_group(group), target)
            if positions is not None:
                table = table.filter(pa.array(keep_mask(positions, sum(rows[:group]), table.num_rows)))
            if predicate is not None:
                table = table.filter(predicate)
            yield from table.to_batches(max_chunksize=BATCH_ROWS)


def _plain_columns(parquet: pq.ParquetFile, target: pa.Schema, task: FileScanTask) -> bool:
    """Can lakesink read row groups of this file itself? Only when the file has every column
    of `target` under its field id, none of them nested, and as many row groups as the
    manifest's split offsets: a missing column may need a value from the partition (identity
    partitions of imported files), a nested one an alignment by field id all the way down,
    and a file without field ids a name mapping. pyiceberg's scan handles all of those."""
    if parquet.num_row_groups != len(task.file.split_offsets or []):
        return False
    if any(pa.types.is_nested(f.type) for f in target):
        return False
    return {int(f.metadata[FIELD_ID_KEY]) for f in target} <= set(field_ids(parquet.schema_arrow))


def _sorted_positions(hidden: list[pa.ChunkedArray]) -> np.ndarray:
    return unique_sorted(np.concatenate([c.to_numpy() for array in hidden for c in array.chunks]).astype(np.int64))


def _without_positions(batches: Iterator[pa.RecordBatch], hidden: list[pa.ChunkedArray]) -> Iterator[pa.RecordBatch]:
    """`batches` (a whole file, in order) minus the rows at `hidden` positions. pyiceberg's own
    delete handling recomputes a set difference over all of a file's deletes for every batch,
    which made a full scan with 10% of rows deleted take twice as long; one sorted array cut
    per batch costs next to nothing. Only without a row filter: with one, pyiceberg filters
    rows inside the scanner and positions no longer line up with batch rows."""
    positions = _sorted_positions(hidden)
    offset = 0
    for batch in batches:
        rows = batch.num_rows
        yield batch.filter(pa.array(keep_mask(positions, offset, rows)))
        offset += rows
