"""Small-file compaction: plan, rewrite, and land one `replace` snapshot, or nothing.

Used in two places: after every micro-batch's commit when `maintenance=auto` (with a byte
budget, so a batch's latency stays flat), and by `python -m lakesink_datasource.maintain
compact` (with a large one). In a stream it runs in the driver's commit process right after
the batch landed and before Spark plans the next batch, so the stream's own writes and its
compaction are ordered and never conflict (docs/maintenance.md says why this design).

The snapshot lands only on the exact state the rewrite read (one compare-and-swap against
it, validated again as a named step), so a concurrent writer is never overruled: if anything
committed in between, the rewrite is dropped and its files deleted, and the next batch
tries again. Compaction never raises into the stream: any failure is logged and undone.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from pyiceberg.exceptions import CommitFailedException
from pyiceberg.io import FileIO
from pyiceberg.manifest import ManifestEntry
from pyiceberg.schema import index_by_id
from pyiceberg.table import Table
from pyiceberg.table.metadata import TableMetadata

from lakesink_datasource.commit.cleanup import delete_files, dropped_metadata_files
from lakesink_datasource.commit.data_files import data_file
from lakesink_datasource.commit.snapshot_producer import RowDelta, SnapshotProducer
from lakesink_datasource.commit.swap import PreparedCommit, swap_in
from lakesink_datasource.commit.validation import ConflictError
from lakesink_datasource.faults import fault_point
from lakesink_datasource.iceberg import summary_keys as keys
from lakesink_datasource.iceberg.live_files import live_data_files, live_position_deletes
from lakesink_datasource.iceberg.manifests import content_offset
from lakesink_datasource.iceberg.partition_key import encode_partition
from lakesink_datasource.iceberg.properties import TableSettings
from lakesink_datasource.index.key_route import file_route
from lakesink_datasource.maintenance.compaction_plan import CompactionPlan, FileStats, plan_compaction
from lakesink_datasource.maintenance.rewrite import RewriteInput, rewrite_files
from lakesink_datasource.messages import DataFileMessage
from lakesink_datasource.version import __version__

log = logging.getLogger("lakesink")


@dataclass(frozen=True)
class CompactionResult:
    snapshot_id: int | None  # None: nothing committed (nothing to do, dry run, or dropped)
    files_rewritten: int  # input data files replaced by new ones
    files_dropped: int  # data files whose every row was deleted
    files_written: int
    dvs_removed: int
    bytes_read: int
    bytes_written: int
    seconds: float
    skipped_reason: str | None = None

    def describe(self) -> str:
        if self.skipped_reason == "dry run":
            # Nothing was written: say what would be, not "rewrote N files into 0 (0 bytes)".
            return (
                f"would rewrite {self.files_rewritten} data file(s) ({self.bytes_read:,} bytes), drop {self.files_dropped} "
                f"fully deleted file(s), remove {self.dvs_removed} DV(s)"
            )
        what = (
            f"rewrote {self.files_rewritten} data file(s) ({self.bytes_read:,} bytes) into {self.files_written} "
            f"({self.bytes_written:,} bytes), dropped {self.files_dropped} fully deleted file(s), removed {self.dvs_removed} DV(s)"
        )
        return what if self.skipped_reason is None else f"{what}: not committed ({self.skipped_reason})"


def _rewrite_by_shard(
    io: FileIO, metadata: TableMetadata, chosen: list[RewriteInput], *, target_file_size: int,
    on_file: Callable[[RewriteInput], None] | None,
) -> tuple[list[DataFileMessage], Callable[[], list[str]]]:
    """`rewrite_files` once per key shard among the inputs (untagged files together)."""
    by_shard: dict[str | None, list[RewriteInput]] = {}
    for item in chosen:
        shard = file_route(item.entry.data_file.file_path)
        by_shard.setdefault(shard.file_tag() if shard else None, []).append(item)
    messages: list[DataFileMessage] = []
    deleters: list[Callable[[], list[str]]] = []
    try:
        for items in by_shard.values():
            written, delete = rewrite_files(io, metadata, items, target_file_size=target_file_size, on_file=on_file)
            messages += written
            deleters.append(delete)
    except BaseException:
        for delete in deleters:
            delete()
        raise

    def delete_all() -> list[str]:
        return [path for delete in deleters for path in delete()]

    return messages, delete_all


def plan_for(
    table: Table, budget_bytes: int, target_file_size: int | None = None, *, tiered: bool = True, min_files: int = 0
) -> tuple[CompactionPlan, dict[str, RewriteInput]]:
    """The compaction worth doing on the table's current state, within `budget_bytes`."""
    metadata = table.metadata
    snapshot = metadata.current_snapshot()
    specs = metadata.specs()
    schema = metadata.schema()
    settings = TableSettings.of_table(metadata)
    dvs = live_position_deletes(table.io, snapshot)
    column_ids = set(index_by_id(schema))
    readable_specs = {i for i, spec in specs.items() if all(f.source_id in column_ids for f in spec.fields)}
    inputs: dict[str, RewriteInput] = {}
    stats: list[FileStats] = []
    for entry in live_data_files(table.io, snapshot):
        f = entry.data_file
        if f.spec_id not in readable_specs:
            continue  # an earlier spec on a column since dropped: its partition values cannot be re-read
        dv = dvs.get(f.file_path)
        inputs[f.file_path] = RewriteInput(entry, dv)
        # Files of an earlier spec merge with the files of their own old partition; what
        # they are rewritten into is laid out by the current spec (rewrite_files).
        # Files of one key shard (cluster_by_key's) merge only among themselves, so what a
        # shard's index reads stays that shard's (key_route.py).
        shard = file_route(f.file_path)
        key = (f.spec_id, encode_partition(specs[f.spec_id], schema, f.partition), shard.file_tag() if shard else None)
        stats.append(FileStats(
            f.file_path, key, f.file_size_in_bytes, f.record_count, dv.data_file.record_count if dv else 0,
            earlier_spec=f.spec_id != metadata.default_spec_id,
        ))
    plan = plan_compaction(stats, target_file_size or settings.target_file_size_bytes, budget_bytes, tiered=tiered, min_files=min_files)
    return plan, inputs


def _dv_identity(dv: ManifestEntry | None) -> tuple[str, int | None] | None:
    return None if dv is None else (dv.data_file.file_path, content_offset(dv.data_file))


def compact(
    table: Table,
    *,
    budget_bytes: int,
    target_file_size: int | None = None,
    dry_run: bool = False,
    tiered: bool = True,
    progress: Callable[[int], None] | None = None,
    batch_id: int | None = None,
    min_files: int = 0,
) -> CompactionResult:
    """Rewrite the small (or mostly deleted) files the planner picks and commit the result
    as one `replace` snapshot on exactly the state that was read. `progress` gets the bytes
    of each input file once it is rewritten; `tiered=False` merges all small files of a
    partition (see `plan_compaction`); `min_files`: do nothing until the work has that many files."""
    started = time.perf_counter()
    plan, inputs = plan_for(table, budget_bytes, target_file_size, tiered=tiered, min_files=min_files)
    chosen = [inputs[f.path] for g in plan.groups for f in g.files]
    dropped = [inputs[f.path] for f in plan.dropped]
    every = chosen + dropped
    dvs_removed = sum(1 for i in every if i.deletion_vector is not None)
    bytes_read = sum(i.entry.data_file.file_size_in_bytes for i in chosen)

    def result(snapshot_id: int | None, written: int, bytes_written: int, reason: str | None) -> CompactionResult:
        return CompactionResult(
            snapshot_id, len(chosen), len(dropped), written, dvs_removed, bytes_read, bytes_written,
            time.perf_counter() - started, reason,
        )

    if plan.is_empty:
        return result(None, 0, 0, "nothing to compact")
    if dry_run:
        return result(None, 0, 0, "dry run")
    metadata = table.metadata
    settings = TableSettings.of_table(metadata)
    messages, delete_outputs = _rewrite_by_shard(
        table.io, metadata, chosen, target_file_size=target_file_size or settings.target_file_size_bytes,
        on_file=(lambda i: progress(i.entry.data_file.file_size_in_bytes)) if progress else None,
    )
    written = sum(m.file_size_in_bytes for m in messages)
    producer: SnapshotProducer | None = None
    try:
        fault_point("compaction_files_written", batch_id)
        snapshot = metadata.current_snapshot()
        delta = RowDelta(
            added_data_files=[data_file(m, metadata) for m in messages],
            rewritten={i.entry.data_file.file_path: _dv_identity(i.deletion_vector) for i in every},
            planned_snapshot_id=snapshot.snapshot_id if snapshot else None,
        )
        producer = SnapshotProducer(table.io, metadata, delta)
        extra = {keys.ENGINE_NAME: "lakesink", keys.LAKESINK_VERSION: __version__, keys.COMPACTION: "true"}
        new_snapshot = producer.produce(metadata, 0, extra)
    except BaseException as exc:
        if producer is not None:
            producer.cleanup(committed_attempt=None)
        delete_outputs()
        if isinstance(exc, ConflictError):
            return result(None, 0, 0, f"the table changed while compacting ({exc})")
        raise
    try:
        committed = swap_in(table, PreparedCommit(metadata, new_snapshot))
    except CommitFailedException as exc:
        # The swap was refused: nothing references the new files.
        producer.cleanup(committed_attempt=None)
        delete_outputs()
        return result(None, 0, 0, f"another commit landed first ({exc})")
    # Any other error leaves the commit's outcome unknown: the files stay (orphan-file
    # removal collects them if it did not land), the error goes up.
    producer.cleanup(committed_attempt=0)
    fault_point("after_compaction_commit", batch_id)
    delete_files(table.io, dropped_metadata_files(metadata, table.metadata_location, committed.metadata))
    return result(new_snapshot.snapshot_id, len(messages), written, None)
