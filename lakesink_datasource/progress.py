"""One line per committed batch on the driver's console.

Spark runs a Python sink's commit in a long-lived Python process on the driver whose
stderr is the driver's console, and logging there is configured by nobody: a plain write
to stderr is what a user actually sees (`progress=false` turns it off). The same figures
are in the snapshot summary (`lakesink.*`, `added-*`) for anything that reads the table.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TextIO

from lakesink_datasource.commit.committer import CommitOutcome
from lakesink_datasource.maintenance.compaction import CompactionResult
from lakesink_datasource.messages import TaskResult
from lakesink_datasource.table.plan import WritePlan


@dataclass(frozen=True)
class BatchTiming:
    """Where one batch's wall time went, from the driver's planning to the end of the work
    after its commit. A user reading only lakesink's own figures would miss what lakesink
    waited for (Spark handing over rows, scheduling, the Python workers' round trips), and
    that was most of a small batch: `spark` is the rest of the wall time."""

    total: float
    plan: float
    tasks: float  # the slowest task's wall time: the batch's critical path through its tasks
    waiting: float  # of `tasks`: that task waiting for Spark to hand over rows
    commit: float
    after: float  # maintenance, tombstones: what follows the commit before Spark goes on

    @property
    def spark(self) -> float:
        return max(0.0, self.total - self.plan - self.tasks - self.commit - self.after)

    @classmethod
    def of(
        cls, plan: WritePlan, results: list[TaskResult], *, commit_started: float, commit_ended: float, ended: float
    ) -> BatchTiming:
        # The commit runs on a writer Spark planned separately: the batch began when its
        # tasks' plan did. Tasks of another planning call (none today) fall back to the commit's.
        starts = [r.planned_at for r in results if r.planned_at > 0] or [plan.planned_at or commit_started]
        plans = [r.plan_seconds for r in results if r.planned_at > 0] or [plan.plan_seconds]
        slowest = max(results, key=lambda r: r.stats.task_seconds, default=None)
        return cls(
            total=max(0.0, ended - min(starts)),
            plan=max(plans),
            tasks=slowest.stats.task_seconds if slowest is not None else 0.0,
            waiting=slowest.stats.input_wait_seconds if slowest is not None else 0.0,
            commit=commit_ended - commit_started,
            after=ended - commit_ended,
        )

    def describe(self) -> str:
        return (
            f"batch {self.total:.2f} s: plan {self.plan:.2f}, tasks {self.tasks:.2f} ({self.waiting:.2f} waiting for rows), "
            f"commit {self.commit:.2f}, maintenance {self.after:.2f}, Spark {self.spark:.2f}"
        )


def _size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def describe_batch(
    table: str, batch_id: int | None, outcome: CommitOutcome, compaction: CompactionResult | None,
    timing: BatchTiming | None = None,
) -> str:
    what = f"lakesink {table} " + (f"batch {batch_id}" if batch_id is not None else "write")
    if outcome.snapshot_id is None:
        return f"{what}: {outcome.skipped_reason}; nothing committed"
    s = outcome.stats
    deleted = f" ({s.rows_deleted:,} keys deleted)" if s.rows_deleted else ""
    # Format version 2 tables get position-delete files where version 3 gets deletion vectors.
    deletes = "DVs" if outcome.table is None or outcome.table.metadata.format_version >= 3 else "position-delete files"
    line = (
        f"{what}: {s.rows_in:,} rows in, {s.rows_written:,} written, {outcome.rows_hidden:,} old rows hidden{deleted}"
        f" | {outcome.data_files} files, {outcome.deletion_vectors} {deletes}, {_size(s.bytes_written)}"
        + (f" | {timing.describe()}" if timing is not None else f" | commit {outcome.seconds:.2f} s")
        + f" | lakesink in tasks {s.partition_seconds + s.index_seconds + s.write_seconds:.2f} s"
        f" | snapshot {outcome.snapshot_id}"
    )
    if outcome.replaced is not None:
        line += f" | {outcome.replaced}"
    if outcome.keys_redecided:
        line += f" | {outcome.keys_redecided:,} keys also written by concurrent commits, decided at commit"
    if outcome.index_starts:
        line += f" | key index {outcome.index_starts}"
    if outcome.expired_snapshots:
        line += f" | expired {outcome.expired_snapshots} snapshots"
    if outcome.note is not None:
        line += f" | {outcome.note}"
    if compaction is not None and compaction.snapshot_id is not None:
        line += f" | compacted {compaction.files_rewritten + compaction.files_dropped} files into {compaction.files_written} ({compaction.seconds:.2f} s)"
    return line


def report_batch(
    table: str, batch_id: int | None, outcome: CommitOutcome, compaction: CompactionResult | None,
    timing: BatchTiming | None = None, out: TextIO | None = None,
) -> None:
    print(describe_batch(table, batch_id, outcome, compaction, timing), file=out or sys.stderr, flush=True)
