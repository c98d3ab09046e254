"""Small-file compaction: land a rewrite as one `replace` snapshot, or nothing.

Used in three places: `land_carried` lands the groups a write's tasks rewrote
(`maintenance=auto`, compaction/carried.py) right before the batch's own snapshot; `compact`
plans, rewrites and lands in this process, after a batch's commit where the tasks carried
nothing (clustered streams, `maintenance=background`, overwrites, evolving writes; with a byte
budget, so a batch's latency stays flat) and for `python -m lakesink_datasource.maintain
compact` (with a large one). docs/maintenance.md says why this design.

A rewrite lands only if every file it read is still live with the DV it was read with (and,
when the table moved on since the read, no equality deletes came meanwhile), so a concurrent
writer is never overruled: otherwise the rewrite is dropped and its files deleted, and a
later write tries again. Compaction never raises into the stream: any failure is logged and
undone.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pyiceberg.exceptions import CommitFailedException
from pyiceberg.table import Table

from lakesink_datasource.commit.cleanup import delete_files, dropped_metadata_files
from lakesink_datasource.commit.data_files import data_file
from lakesink_datasource.commit.lost_answer import swap_settled
from lakesink_datasource.commit.snapshot_producer import RowDelta, SnapshotProducer
from lakesink_datasource.commit.swap import PreparedCommit
from lakesink_datasource.commit.validation import ConflictError, validate_no_new_equality_deletes
from lakesink_datasource.compaction.carried import read_file
from lakesink_datasource.compaction.choice import plan_for
from lakesink_datasource.compaction.rewrite import rewrite_by_shard
from lakesink_datasource.faults import fault_point
from lakesink_datasource.iceberg import summary_keys as keys
from lakesink_datasource.iceberg.properties import TableSettings
from lakesink_datasource.iceberg.retry import RetryClock, RetryPolicy
from lakesink_datasource.messages import DataFileMessage, ReadFile, TaskResult
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
    clock: RetryClock | None = None,
) -> CompactionResult:
    """Rewrite the small (or mostly deleted) files the planner picks and commit the result
    as one `replace` snapshot on exactly the state that was read. `progress` gets the bytes
    of each input file once it is rewritten; `tiered=False` merges all small files of a
    partition (see `plan_compaction`); `min_files`: do nothing until the work has that many
    files; `clock`: the operation's it is part of (iceberg/retry.py), else its own."""
    clock = clock if clock is not None else _own_clock(table, "compaction")
    with clock.active():
        return _compact(table, budget_bytes, target_file_size, dry_run, tiered, progress, batch_id, min_files, clock)


def _own_clock(table: Table, what: str) -> RetryClock:
    return RetryPolicy.of(TableSettings.of_table(table.metadata)).start(f"{what} of {'.'.join(table.name())}")


def _compact(
    table: Table, budget_bytes: int, target_file_size: int | None, dry_run: bool, tiered: bool,
    progress: Callable[[int], None] | None, batch_id: int | None, min_files: int, clock: RetryClock,
) -> CompactionResult:
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
    messages, delete_outputs = rewrite_by_shard(
        table.io, metadata, chosen, target_file_size=target_file_size or settings.target_file_size_bytes,
        on_file=(lambda i: progress(i.entry.data_file.file_size_in_bytes)) if progress else None,
    )
    read = [read_file(i) for i in every]
    snapshot = metadata.current_snapshot()
    landed, reason = _land(table, read, messages, delete_outputs, batch_id, read_at=snapshot.snapshot_id if snapshot else None, clock=clock)
    return result(landed, len(messages) if landed else 0, sum(m.file_size_in_bytes for m in messages) if landed else 0, reason)


def land_carried(table: Table, results: Sequence[TaskResult], batch_id: int | None, clock: RetryClock) -> CompactionResult | None:
    """The groups a write's tasks rewrote (compaction/carried.py) as one `replace` snapshot on
    `table` as it is now, or nothing if another commit changed their files since the write
    was planned (their new files are then deleted). None: the tasks rewrote nothing.
    `clock`: the batch's commit operation's."""
    done = [r.compaction for r in results if r.compaction is not None and not r.skipped]
    if not done:
        return None
    started = time.perf_counter()
    rewritten = [f for m in done for f in m.rewritten]
    dropped = [f for m in done for f in m.dropped]
    messages = [f for m in done for f in m.files]

    def delete_outputs() -> int:
        return delete_files(table.io, [m.path for m in messages])

    planned = next((r.planned_snapshot_id for r in results if r.compaction is not None), None)
    landed, reason = _land(table, rewritten + dropped, messages, delete_outputs, batch_id, read_at=planned, clock=clock.scoped())
    return CompactionResult(
        landed, len(rewritten), len(dropped), len(messages) if landed else 0,
        sum(1 for f in rewritten + dropped if f.deletion_vector is not None), sum(m.bytes_read for m in done),
        sum(m.file_size_in_bytes for m in messages) if landed else 0, time.perf_counter() - started + sum(m.seconds for m in done),
        reason,
    )


def _land(
    table: Table, read: list[ReadFile], messages: list[DataFileMessage], delete_outputs: Callable[[], object],
    batch_id: int | None, *, read_at: int | None, clock: RetryClock,
) -> tuple[int | None, str | None]:
    """Commit a rewrite as one `replace` snapshot on `table`'s state: the new snapshot's id,
    or None and why not (its new files deleted then). `read_at`: the snapshot the rewrite
    read its files at; each must still be live with the DV it had then."""
    metadata = table.metadata
    producer: SnapshotProducer | None = None
    try:
        fault_point("compaction_files_written", batch_id)
        current = metadata.current_snapshot()
        if current is not None and current.snapshot_id != read_at:
            validate_no_new_equality_deletes(metadata, read_at)
        delta = RowDelta(
            added_data_files=[data_file(m, metadata) for m in messages],
            rewritten={f.path: f.deletion_vector for f in read},
            planned_snapshot_id=read_at,
        )
        producer = SnapshotProducer(table.io, metadata, delta)
        extra = {keys.ENGINE_NAME: "lakesink", keys.LAKESINK_VERSION: __version__, keys.COMPACTION: "true"}
        new_snapshot = producer.produce(metadata, 0, extra)
    except BaseException as exc:
        if producer is not None:
            producer.cleanup(committed_attempt=None)
        delete_outputs()
        if isinstance(exc, ConflictError):
            return None, f"the table changed while compacting ({exc})"
        raise
    try:
        committed = swap_settled(table, PreparedCommit(metadata, new_snapshot), what=f"compaction of {'.'.join(table.name())}", clock=clock)
    except CommitFailedException as exc:
        # The swap was refused: nothing references the new files.
        producer.cleanup(committed_attempt=None)
        delete_outputs()
        return None, f"another commit landed first ({exc})"
    # Any other error leaves the commit's outcome unknown (an answer lost and the catalog
    # away past the outage budget): the files stay (orphan-file removal collects them if it
    # did not land), the error goes up.
    producer.cleanup(committed_attempt=0)
    fault_point("after_compaction_commit", batch_id)
    delete_files(table.io, dropped_metadata_files(metadata, table.metadata_location, committed.metadata))
    return new_snapshot.snapshot_id, None
