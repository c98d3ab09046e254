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
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.expressions import AlwaysTrue, BooleanExpression
from pyiceberg.io.pyarrow import ArrowScan, _read_all_delete_files
from pyiceberg.schema import Schema
from pyiceberg.table import FileScanTask, Table
from pyiceberg.table.snapshots import Snapshot

from lakesink_datasource.catalog import loader, sql_commit
from lakesink_datasource.options import OptionError
from lakesink_datasource.read.options import ReadOptions
from lakesink_datasource.table import metadata_cache

DEFAULT_SPLIT_BYTES = 128 * 1024 * 1024  # Iceberg's read.split.target-size
SPLIT_PROPERTY = "read.split.target-size"
MIN_ADAPTIVE_SPLIT_BYTES = 1024 * 1024


T = TypeVar("T")


class ReadError(ValueError):
    """The table state asked for cannot be read (unknown table, snapshot, or delete kind)."""


@dataclass(frozen=True)
class TableState:
    table: Table
    snapshot: Snapshot | None  # None: the table has no snapshot yet (reads as empty)
    schema: Schema  # the snapshot's schema (time travel reads the columns of its time)


def load_table(options: ReadOptions) -> Table:
    catalog = loader.load(loader.catalog_config(options))
    try:
        return sql_commit.load_table(catalog, options.table)
    except NoSuchTableError:
        raise ReadError(f"table {options.table} does not exist (catalog {loader.catalog_config(options).name})") from None


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
    raw = state.table.metadata.properties.get(SPLIT_PROPERTY)
    target = int(raw) if raw and raw.isdigit() and int(raw) > 0 else DEFAULT_SPLIT_BYTES
    total = sum(_task_bytes(t) for t in tasks)
    return max(MIN_ADAPTIVE_SPLIT_BYTES, min(target, total // max(os.cpu_count() or 1, 1)))


def group_units(units: list[Any], target_bytes: int = DEFAULT_SPLIT_BYTES) -> list[list[Any]]:
    """Anything with a `size`, packed like scan tasks."""
    return _pack(units, lambda u: int(u.size), target_bytes)


def _task_bytes(task: FileScanTask) -> int:
    return task.file.file_size_in_bytes + sum(d.file_size_in_bytes for d in task.delete_files)


def group_tasks(tasks: list[FileScanTask], target_bytes: int) -> list[list[FileScanTask]]:
    """Tasks packed into groups of about `target_bytes`, largest first (first fit), so Spark
    partitions come out even; a file larger than the target is a group of its own."""
    return _pack(tasks, _task_bytes, target_bytes)


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


def read_tasks(plan: ReadPlan, tasks: list[FileScanTask]) -> Iterator[pa.RecordBatch]:
    metadata = metadata_cache.load(plan.metadata_location, plan.io_properties)
    io = metadata_cache.file_io(plan.io_properties, plan.metadata_location)
    schema = Schema.model_validate_json(plan.schema_json)
    scan = ArrowScan(metadata, io, schema, plan.row_filter, case_sensitive=False)
    # Batch by batch, file after file: ArrowScan.to_record_batches reads each whole file into
    # memory (in a thread pool) before the first batch reaches Spark, which then waits instead
    # of converting while the next batch is read (benchmark scenario 9: 3.3 s -> 2.2 s for 5M
    # rows). pyiceberg is pinned (iceberg/compat.py), so its per-task generator is a stable seam.
    deletes = _read_all_delete_files(io, tasks)
    if plan.row_filter != AlwaysTrue() or not deletes:
        for batch in scan._record_batches_from_scan_tasks_and_deletes(tasks, deletes):
            if batch.num_rows:
                yield conform(batch, plan.arrow_schema)
        return
    for task in tasks:
        hidden = deletes.get(task.file.file_path)
        batches = scan._record_batches_from_scan_tasks_and_deletes([task], {})
        for batch in batches if hidden is None else _without_positions(batches, hidden):
            if batch.num_rows:
                yield conform(batch, plan.arrow_schema)


def _without_positions(batches: Iterator[pa.RecordBatch], hidden: list[pa.ChunkedArray]) -> Iterator[pa.RecordBatch]:
    """`batches` (a whole file, in order) minus the rows at `hidden` positions. pyiceberg's own
    delete handling recomputes a set difference over all of a file's deletes for every batch,
    which made a full scan with 10% of rows deleted take twice as long; one sorted array cut
    per batch costs next to nothing. Only without a row filter: with one, pyiceberg filters
    rows inside the scanner and positions no longer line up with batch rows."""
    positions = np.unique(np.concatenate([c.to_numpy() for array in hidden for c in array.chunks]).astype(np.int64))
    offset = 0
    for batch in batches:
        rows = batch.num_rows
        lo, hi = np.searchsorted(positions, [offset, offset + rows])
        if hi > lo:
            keep = np.ones(rows, dtype=bool)
            keep[positions[lo:hi] - offset] = False
            batch = batch.filter(pa.array(keep))
        offset += rows
        yield batch
