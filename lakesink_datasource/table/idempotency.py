"""Which writes and micro-batches of a streaming query already reached the table.

The table is the source of truth: each lakesink streaming commit records the query id and
the batch (epoch) id in its snapshot summary, under the keys Iceberg's own Spark sink uses.
A replayed batch finds its id there and is not applied twice.
"""

from __future__ import annotations

from pyiceberg.table.metadata import TableMetadata

from lakesink_datasource.iceberg.history import ancestors, snapshots_after
from lakesink_datasource.iceberg.summary_keys import EPOCH_ID, QUERY_ID, WRITE_ID


def last_committed_epoch(metadata: TableMetadata, query_id: str) -> int | None:
    """The newest epoch of `query_id` on the main branch's history, or None."""
    for snapshot in ancestors(metadata):
        props = snapshot.summary.additional_properties if snapshot.summary else {}
        if props.get(QUERY_ID) == query_id and EPOCH_ID in props:
            return int(props[EPOCH_ID])
    return None


def is_epoch_committed(metadata: TableMetadata, query_id: str | None, epoch: int | None) -> bool:
    if query_id is None or epoch is None:
        return False
    last = last_committed_epoch(metadata, query_id)
    return last is not None and epoch <= last


def is_write_committed(metadata: TableMetadata, write_id: str, since_snapshot_id: int | None) -> bool:
    """Did a commit of `write_id` land after `since_snapshot_id` (the state it planned on)?"""
    after, _ = snapshots_after(metadata, since_snapshot_id)
    return any(s.summary is not None and s.summary.get(WRITE_ID) == write_id for s in after)
