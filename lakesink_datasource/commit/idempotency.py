"""Which micro-batches of a streaming query already reached the table.

The table is the source of truth: each lakesink streaming commit records the query id
and the batch (epoch) id in its snapshot summary, under the keys Iceberg's own Spark
sink uses. A replayed batch finds its id there and is not applied twice.
"""

from __future__ import annotations

from typing import Iterator, Optional

from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.snapshots import Snapshot

QUERY_ID = "spark.sql.streaming.queryId"
EPOCH_ID = "spark.sql.streaming.epochId"
WRITE_ID = "lakesink.write-id"


def ancestors(metadata: TableMetadata) -> Iterator[Snapshot]:
    snapshot = metadata.current_snapshot()
    while snapshot is not None:
        yield snapshot
        parent = snapshot.parent_snapshot_id
        snapshot = metadata.snapshot_by_id(parent) if parent is not None else None


def snapshots_after(metadata: TableMetadata, since: Optional[int]) -> tuple[list[Snapshot], bool]:
    """Main-branch snapshots committed after snapshot `since`, newest first, and whether
    `since` was found among the ancestors (None means "from the beginning": always found)."""
    out: list[Snapshot] = []
    for snapshot in ancestors(metadata):
        if snapshot.snapshot_id == since:
            return out, True
        out.append(snapshot)
    return out, since is None


def last_committed_epoch(metadata: TableMetadata, query_id: str) -> Optional[int]:
    """The newest epoch of `query_id` on the main branch's history, or None."""
    for snapshot in ancestors(metadata):
        summary = snapshot.summary
        if summary is not None and summary.get(QUERY_ID) == query_id and EPOCH_ID in summary.additional_properties:
            return int(summary[EPOCH_ID])
    return None


def is_epoch_committed(metadata: TableMetadata, query_id: Optional[str], epoch: Optional[int]) -> bool:
    if query_id is None or epoch is None:
        return False
    last = last_committed_epoch(metadata, query_id)
    return last is not None and epoch <= last


def is_write_committed(metadata: TableMetadata, write_id: str, since_snapshot_id: Optional[int]) -> bool:
    """Did a commit of `write_id` land after `since_snapshot_id` (the state it planned on)?"""
    after, _ = snapshots_after(metadata, since_snapshot_id)
    return any(s.summary is not None and s.summary.get(WRITE_ID) == write_id for s in after)
