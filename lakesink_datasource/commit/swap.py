"""The catalog commit itself: one compare-and-swap of a branch (main unless the write names one).

Kept apart from snapshot production (as Iceberg Java keeps `SnapshotProducer` apart from
the commit): the producer builds a snapshot against a base, `swap_in` lands it only if the
branch still points where it pointed in that base (or still does not exist, for a branch the
commit creates), together with the property changes and the snapshot expiry that travel
with it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pyiceberg.table import Table
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.refs import SnapshotRefType
from pyiceberg.table.snapshots import Snapshot
from pyiceberg.table.update import (
    AddSnapshotUpdate,
    AssertRefSnapshotId,
    RemoveSnapshotsUpdate,
    SetPropertiesUpdate,
    SetSnapshotRefUpdate,
    TableUpdate,
)

from lakesink_datasource.catalog import sql_commit
from lakesink_datasource.catalog.table_transaction import TableTransaction


@dataclass
class PreparedCommit:
    """One compare-and-swap: the base it was built on, what it changes, what it expires."""

    base: TableMetadata
    snapshot: Snapshot | None  # None: only properties and expiry (e.g. `maintain expire`)
    properties: dict[str, str] = field(default_factory=dict)
    expired: list[int] = field(default_factory=list)
    branch: str | None = None  # None: main
    layout_updates: list[TableUpdate] = field(default_factory=list)  # make the files' schema and spec current


def swap_in(table: Table, prepared: PreparedCommit, transaction: TableTransaction | None = None) -> Table:
    """Commit `prepared` if its branch still is where it was in the base (CommitFailedException
    if not); returns the table as committed. With `transaction`, together with the other
    tables' swaps it gathers."""
    branch = prepared.branch or "main"
    ref = prepared.base.refs.get(branch)
    updates: list[TableUpdate] = list(prepared.layout_updates)
    if prepared.snapshot is not None:
        updates += [
            AddSnapshotUpdate(snapshot=prepared.snapshot),
            SetSnapshotRefUpdate(
                ref_name=branch, type=SnapshotRefType.BRANCH, snapshot_id=prepared.snapshot.snapshot_id,
                max_ref_age_ms=None, max_snapshot_age_ms=None, min_snapshots_to_keep=None,
            ),
        ]
    if prepared.properties:
        updates.append(SetPropertiesUpdate(updates=prepared.properties))
    if prepared.expired:
        updates.append(RemoveSnapshotsUpdate(snapshot_ids=prepared.expired))
    requirements = (AssertRefSnapshotId(ref=branch, snapshot_id=ref.snapshot_id if ref is not None else None),)
    if transaction is not None:
        response = transaction.swap(table, requirements, tuple(updates))
    else:
        response = sql_commit.commit(table, requirements=requirements, updates=tuple(updates))
    return Table(
        table.name(), metadata=response.metadata, metadata_location=response.metadata_location, io=table.io, catalog=table.catalog
    )
