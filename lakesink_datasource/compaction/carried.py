"""Compaction carried by a write's own tasks: the driver plans it, executors rewrite.

With `maintenance=auto` the plan of a write (made on the driver before its tasks run) also
picks the compaction worth doing on the table state it planned against: the tiered planner
(`plan.py`) within a byte budget. The groups travel with the plan; the task with partition
id p rewrites group p once its rows are written and hands the new files back in its commit
message. The commit lands them as a `replace` snapshot of their own right before the batch's
snapshot. So the driver plans and commits metadata only, whatever the table's ingest rate,
and the rewriting is spread over the executors as the batch's rows are.

Why before the batch's snapshot and not after: a keyed batch may hide rows in files the
group rewrote. Landing first, the compaction meets exactly the state it read (unless another
writer changed those files: the group is then dropped), and the batch's deletes move onto the
rewritten files as they do after any compaction that lands between a write's plan and its
commit (commit/rebase.py).

A group no task took (the batch ran fewer tasks than there were groups) is planned again
with a later write; the budget keeps the number of groups small.
"""

from __future__ import annotations

import pickle
import time
from collections.abc import Callable

import msgspec
from pyiceberg.io import FileIO
from pyiceberg.manifest import ManifestEntry
from pyiceberg.table import Table
from pyiceberg.table.metadata import TableMetadata

from lakesink_datasource.compaction.choice import plan_for
from lakesink_datasource.compaction.rewrite import RewriteInput, rewrite_by_shard
from lakesink_datasource.iceberg.manifests import content_offset
from lakesink_datasource.iceberg.properties import TableSettings
from lakesink_datasource.messages import CompactionMessage, DataFileMessage, ReadFile

__all__ = ["CarriedCompaction", "CarriedGroup", "plan_carried", "read_file", "rewrite_carried"]


class CarriedGroup(msgspec.Struct, frozen=True):
    """One group's files. Their manifest entries (and their DVs') travel as pickled pyiceberg
    objects, between lakesink's own processes: a task rewrites from them without reading
    the table's manifests again."""

    inputs: bytes  # list[RewriteInput]: merged into new files
    dropped: bytes = b""  # list[RewriteInput]: every row deleted, removed without a rewrite


class CarriedCompaction(msgspec.Struct, frozen=True):
    groups: list[CarriedGroup]
    target_file_size: int


def plan_carried(table: Table, *, budget_bytes: int, min_files: int) -> CarriedCompaction | None:
    """The compaction a write's tasks carry out on `table` as it is now, None for none."""
    plan, inputs = plan_for(table, budget_bytes, min_files=min_files)
    if plan.is_empty:
        return None
    groups = [[inputs[f.path] for f in g.files] for g in plan.groups] or [[]]
    dropped = [inputs[f.path] for f in plan.dropped]
    target = TableSettings.of_table(table.metadata).target_file_size_bytes
    return CarriedCompaction(
        [CarriedGroup(pickle.dumps(g), pickle.dumps(dropped) if i == 0 and dropped else b"") for i, g in enumerate(groups)],
        target,
    )


def read_file(item: RewriteInput) -> ReadFile:
    """A file as the rewrite read it: its path and the DV it had."""
    dv: ManifestEntry | None = item.deletion_vector
    return ReadFile(item.entry.data_file.file_path, None if dv is None else (dv.data_file.file_path, content_offset(dv.data_file)))


def rewrite_carried(
    carried: CarriedCompaction, io: FileIO, metadata: TableMetadata, partition_id: int
) -> tuple[CompactionMessage, Callable[[], list[str]]] | None:
    """Task `partition_id`'s group rewritten (`metadata`: the state the write planned
    against); with a function that deletes what it wrote. None: no group for this task."""
    if partition_id >= len(carried.groups):
        return None
    group = carried.groups[partition_id]
    inputs: list[RewriteInput] = pickle.loads(group.inputs)
    dropped: list[RewriteInput] = pickle.loads(group.dropped) if group.dropped else []
    started = time.perf_counter()
    files: list[DataFileMessage] = []
    delete: Callable[[], list[str]] = list
    if inputs:
        files, delete = rewrite_by_shard(io, metadata, inputs, target_file_size=carried.target_file_size, on_file=None)
    message = CompactionMessage(
        group=partition_id,
        rewritten=[read_file(i) for i in inputs],
        dropped=[read_file(i) for i in dropped],
        files=files,
        bytes_read=sum(i.entry.data_file.file_size_in_bytes for i in inputs),
        seconds=time.perf_counter() - started,
    )
    return message, delete
