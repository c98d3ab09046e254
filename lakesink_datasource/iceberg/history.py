"""Snapshot history of a table's main branch (Java's `SnapshotUtil.ancestorsOf`).

Expired snapshots leave their id behind as their children's `parent-snapshot-id`, so a
walk can still tell that a snapshot id it looks for lies behind the oldest retained one.
"""

from __future__ import annotations

from collections.abc import Iterator

from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.snapshots import Snapshot


def ancestors(metadata: TableMetadata, start: int | None = None) -> Iterator[Snapshot]:
    """`start` (default: the current snapshot of main) and its retained ancestors, newest first."""
    snapshot = metadata.current_snapshot() if start is None else metadata.snapshot_by_id(start)
    while snapshot is not None:
        yield snapshot
        parent = snapshot.parent_snapshot_id
        snapshot = metadata.snapshot_by_id(parent) if parent is not None else None


def snapshots_after(metadata: TableMetadata, since: int | None) -> tuple[list[Snapshot], bool]:
    """Main-branch snapshots committed after snapshot `since`, newest first, and whether
    `since` is an ancestor of the current snapshot (None means "from the beginning": always
    found). An expired `since` is still found through its child's parent id."""
    out: list[Snapshot] = []
    for snapshot in ancestors(metadata):
        if snapshot.snapshot_id == since:
            return out, True
        out.append(snapshot)
        if since is not None and snapshot.parent_snapshot_id == since:
            return out, True
    return out, since is None


def is_linear(metadata: TableMetadata) -> bool:
    """Every retained snapshot is an ancestor of main's current one and main is the only ref:
    a file removed from the table then never comes back, which incremental cleanup relies on."""
    if any(name != "main" for name in metadata.refs):
        return False
    on_main = {s.snapshot_id for s in ancestors(metadata)}
    return all(s.snapshot_id in on_main for s in metadata.snapshots)
