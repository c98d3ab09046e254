"""One line per committed batch on the driver's console.

Spark runs a Python sink's commit in a long-lived Python process on the driver whose
stderr is the driver's console, and logging there is configured by nobody: a plain write
to stderr is what a user actually sees (`progress=false` turns it off). The same figures
are in the snapshot summary (`lakesink.*`, `added-*`) for anything that reads the table.
"""

from __future__ import annotations

import sys
from typing import TextIO

from lakesink_datasource.commit.committer import CommitOutcome
from lakesink_datasource.maintenance.compaction import CompactionResult


def _size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def describe_batch(table: str, batch_id: int | None, outcome: CommitOutcome, compaction: CompactionResult | None) -> str:
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
        f" | tasks {s.partition_seconds + s.index_seconds + s.write_seconds:.2f} s, commit {outcome.seconds:.2f} s"
        f" | snapshot {outcome.snapshot_id}"
    )
    if outcome.replaced is not None:
        line += f" | {outcome.replaced}"
    if outcome.index_starts:
        line += f" | key index {outcome.index_starts}"
    if outcome.expired_snapshots:
        line += f" | expired {outcome.expired_snapshots} snapshots"
    if compaction is not None and compaction.snapshot_id is not None:
        line += f" | compacted {compaction.files_rewritten + compaction.files_dropped} files into {compaction.files_written} ({compaction.seconds:.2f} s)"
    return line


def report_batch(
    table: str, batch_id: int | None, outcome: CommitOutcome, compaction: CompactionResult | None, out: TextIO | None = None
) -> None:
    print(describe_batch(table, batch_id, outcome, compaction), file=out or sys.stderr, flush=True)
