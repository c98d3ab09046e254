"""Snapshot history of a table's main branch (Java's `SnapshotUtil.ancestorsOf`).

A walk back from main's head may end before the snapshot it looks for when that snapshot
expired. Iceberg Java keeps an expired parent's id in its child (`parent-snapshot-id`), so
the child still names it; pyiceberg's expiry clears that id. Sequence numbers bridge the
gap: every commit to a table takes the next one, so when the oldest retained ancestor's
sequence number directly follows the sought snapshot's, nothing lies between them.
"""

from __future__ import annotations

from collections.abc import Iterator

from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.snapshots import Snapshot


def branch_head(metadata: TableMetadata, branch: str | None) -> Snapshot | None:
    """The snapshot a commit to `branch` (None: main) builds on: the branch's head, or main's
    current snapshot for a branch that does not exist yet (it is created from main, as
    Iceberg Java's `toBranch` does)."""
    if branch is not None and branch in metadata.refs:
        return metadata.snapshot_by_id(metadata.refs[branch].snapshot_id)
    return metadata.current_snapshot()


def ancestors(metadata: TableMetadata, start: int | None = None) -> Iterator[Snapshot]:
    """`start` (default: the current snapshot of main) and its retained ancestors, newest first."""
    snapshot = metadata.current_snapshot() if start is None else metadata.snapshot_by_id(start)
    while snapshot is not None:
        yield snapshot
        parent = snapshot.parent_snapshot_id
        snapshot = metadata.snapshot_by_id(parent) if parent is not None else None


def snapshots_after(
    metadata: TableMetadata, since: int | None, since_sequence: int | None = None, head: Snapshot | None = None
) -> tuple[list[Snapshot], bool]:
    """Main-branch snapshots committed after snapshot `since`, newest first, and whether
    `since` is an ancestor of the current snapshot (None means "from the beginning": always
    found). `head`: walk back from this snapshot instead (a branch's head). An expired `since` is still found through its child's parent id or, given its
    sequence number, when the oldest retained ancestor's number directly follows it."""
    out: list[Snapshot] = []
    for snapshot in ancestors(metadata, head.snapshot_id if head is not None else None):
        if snapshot.snapshot_id == since:
            return out, True
        if since_sequence is not None and (snapshot.sequence_number or 0) <= since_sequence:
            return out, False  # reached its age without meeting it: another line of history
        out.append(snapshot)
        if since is not None and snapshot.parent_snapshot_id == since:
            return out, True
    if since is None:
        return out, True
    oldest = out[-1] if out else None
    contiguous = (
        since_sequence is not None
        and oldest is not None
        and oldest.parent_snapshot_id is None
        and oldest.sequence_number == since_sequence + 1
    )
    return out, contiguous


def is_linear(metadata: TableMetadata) -> bool:
    """Every retained snapshot is an ancestor of main's current one and main is the only ref:
    a file removed from the table then never comes back, which incremental cleanup relies on."""
    if any(name != "main" for name in metadata.refs):
        return False
    on_main = {s.snapshot_id for s in ancestors(metadata)}
    return all(s.snapshot_id in on_main for s in metadata.snapshots)
