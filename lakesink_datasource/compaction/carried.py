"""Compaction carried by a write's own tasks: the driver plans it, executors rewrite.

With `maintenance=auto` the plan of a write (made on the driver before its tasks run) also
picks the compaction worth doing on the table state it planned against: the tiered planner
(`plan.py`) within a byte budget. The groups travel with the plan, dealt out by the number
of tasks the table's last write ran: the task with partition id p rewrites groups p,
p + tasks, ... once its rows are written and hands the new files back in its commit
message. The commit lands them as a `replace` snapshot of their own right before the
batch's snapshot. So the driver plans and commits metadata only, whatever the table's ingest rate,
and the rewriting is spread over the executors as the batch's rows are.

Why before the batch's snapshot and not after: a keyed batch may hide rows in files the
group rewrote. Landing first, the compaction meets exactly the state it read (unless another
writer changed those files: the group is then dropped), and the batch's deletes move onto the
rewritten files as they do after any compaction that lands between a write's plan and its
commit (commit/rebase.py).

A group no task took (the batch ran fewer tasks than the last write) is planned again with
a later write.
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
    # The tasks the table's last write ran: task p takes groups p, p + tasks, ... so that a
    # stream with few tasks (one input partition, many table partitions) still merges all.
    tasks: int = 1


def plan_carried(table: Table, *, budget_bytes: int, min_files: int, tasks: int = 1) -> CarriedCompaction | None:
    """The compaction a write's tasks carry out on `table` as it is now, None for none;
    `tasks`: how many tasks the write is expected to run (its groups are dealt out to them)."""
    plan, inputs = plan_for(table, budget_bytes, min_files=min_files)
    if plan.is_empty:
        return None
    groups = [[inputs[f.path] for f in g.files] for g in plan.groups] or [[]]
    dropped = [inputs[f.path] for f in plan.dropped]
    target = TableSettings.of_table(table.metadata).target_file_size_bytes
    return CarriedCompaction(
        [CarriedGroup(pickle.dumps(g), pickle.dumps(dropped) if i == 0 and dropped else b"") for i, g in enumerate(groups)],
        target, max(1, tasks),
    )


def read_file(item: RewriteInput) -> ReadFile:
    """A file as the rewrite read it: its path and the DV it had."""
    dv: ManifestEntry | None = item.deletion_vector
    return ReadFile(item.entry.data_file.file_path, None if dv is None else (dv.data_file.file_path, content_offset(dv.data_file)))


def rewrite_carried(
    carried: CarriedCompaction, io: FileIO, metadata: TableMetadata, partition_id: int
) -> tuple[CompactionMessage, Callable[[], list[str]]] | None:
    """The groups of task `partition_id` rewritten (`metadata`: the state the write planned
    against), as one message; with a function that deletes what it wrote. None: no group
    for this task."""
    mine = carried.groups[partition_id::carried.tasks] if partition_id < carried.tasks else []
    if not mine:
        return None
    started = time.perf_counter()
    inputs: list[RewriteInput] = []
    dropped: list[RewriteInput] = []
    files: list[DataFileMessage] = []
    deleters: list[Callable[[], list[str]]] = []

    def delete() -> list[str]:
        return [path for d in deleters for path in d()]

    try:
        for group in mine:
            group_inputs: list[RewriteInput] = pickle.loads(group.inputs)
            dropped += pickle.loads(group.dropped) if group.dropped else []
            if group_inputs:
                # One rewrite per group: each group is one partition's files of one size class.
                written, undo = rewrite_by_shard(io, metadata, group_inputs, target_file_size=carried.target_file_size, on_file=None)
                files += written
                deleters.append(undo)
            inputs += group_inputs
    except BaseException:
        delete()
        raise
    message = CompactionMessage(
        group=partition_id,
        rewritten=[read_file(i) for i in inputs],
        dropped=[read_file(i) for i in dropped],
        files=files,
        bytes_read=sum(i.entry.data_file.file_size_in_bytes for i in inputs),
        seconds=time.perf_counter() - started,
    )
    return message, delete
