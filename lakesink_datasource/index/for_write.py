"""The one entry a keyed write task takes into its host's key index: open it, bring it to the
table's current snapshot, and hand it over with the names the task's changes go under.

Under the host's locks on every environment (so no other task of the host writes while the
index is brought forward): open the sharded index, sync it (follow the snapshots since its
state, or fetch a published copy, or rebuild), and now and then publish a copy for cold
hosts. A damaged index is a cache, not data: it is started over and synced again.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass

import lmdb
from pyiceberg.io import FileIO
from pyiceberg.table.metadata import TableMetadata

from lakesink_datasource.index.host_lock import host_locks
from lakesink_datasource.index.key_columns import KeyColumns
from lakesink_datasource.index.key_shards import KeyShard
from lakesink_datasource.index.no_room import no_room
from lakesink_datasource.index.owner import default_index_dir, index_owner, owner_digest, token_for
from lakesink_datasource.index.published import fetch as fetch_published
from lakesink_datasource.index.published import maybe_publish
from lakesink_datasource.index.reindex import StoredTombstones
from lakesink_datasource.index.sharded_index import (
    SHARDS,
    ShardedIndex,
    lock_paths,
    make_index_dir,
    open_sharded,
    reopen_empty_sharded,
)
from lakesink_datasource.index.sync import SyncReport, sync

log = logging.getLogger("lakesink")


@dataclass(frozen=True)
class TaskIndex:
    """A host's key index brought to the current snapshot, for one task attempt."""

    index: ShardedIndex
    host: str  # index_owner: the machine and index directory
    token: str  # this attempt's undo token
    report: SyncReport
    healed: bool  # found damaged and rebuilt by this task
    seconds: float  # opening and syncing


def index_location(
    index_dir: str | None, metadata: TableMetadata, route: KeyShard | None = None, writer: str | None = None
) -> str:
    """Where a host keeps a table's index: the whole key space, or one key shard of it (a
    directory beside the whole index's, so either can be dropped alone).

    `writer`: a streaming query's id. Each query keeps its own index on a host: a task sees
    the changes of its own batch in flight and the table's committed state, never another
    writer's batch in flight (whose rows may never commit, and whose pending changes a sync
    of this query would otherwise undo). Two streams on one table and host then each follow
    the other's commits from the table, and keys both change are decided at commit
    (commit/key_conflicts.py). Batch jobs (no query) share the host's index."""
    table_dir = os.path.join(index_dir or default_index_dir(), str(metadata.table_uuid))
    if writer is not None:
        table_dir = f"{table_dir}.query-{owner_digest(writer)}"
    return table_dir if route is None else f"{table_dir}.{route.name()}"


def lock_shards(columns: KeyColumns) -> int:
    """LMDB environments of an index: the whole key space is split for the host's concurrent
    tasks; a key shard has one task a batch, so one environment serves it."""
    return SHARDS if columns.route is None else 1


def open_for_task(
    location: str,
    io: FileIO,
    metadata: TableMetadata,
    columns: KeyColumns,
    *,
    write_id: str,
    partition_id: int,
    attempt: int,
    stored: StoredTombstones,
) -> TaskIndex:
    """The index at `location`, reflecting `metadata`'s current snapshot plus the pending
    changes of this write's other tasks on the host (under their own undo tokens). `stored`
    reads the companion table's tombstones, asked for only by a rebuild."""
    started = time.perf_counter()
    try:
        return _open_for_task(location, io, metadata, columns, write_id, partition_id, attempt, stored, started)
    except OSError as exc:  # a published copy downloaded into a full index directory, a lock file
        full = no_room(os.path.dirname(os.path.abspath(location)), exc)
        if full is not None:
            raise full from exc
        raise


def _open_for_task(
    location: str, io: FileIO, metadata: TableMetadata, columns: KeyColumns, write_id: str, partition_id: int,
    attempt: int, stored: StoredTombstones, started: float,
) -> TaskIndex:
    path = make_index_dir(location)
    host = index_owner(path)

    def synced(index: ShardedIndex) -> SyncReport:
        return sync(
            index, io, metadata, columns, write_id=write_id, host=host, partition_id=partition_id, attempt=attempt,
            stored=stored, fetch=lambda _reason: fetch_published(index, io, metadata, columns) is not None,
        )

    healed = False
    shards = lock_shards(columns)
    with host_locks(lock_paths(path, shards)):
        try:
            index = open_sharded(path, shards)
            report = synced(index)
        except lmdb.Error as exc:
            log.warning("lakesink: key index %s is damaged (%s); starting it over", path, exc)
            healed = True
            index = reopen_empty_sharded(path, shards)
            report = synced(index)
        # A clean index at a committed snapshot: now and then a copy for cold hosts.
        maybe_publish(index, io, metadata, columns, host)
    token = token_for(write_id, host, partition_id, attempt)
    return TaskIndex(index, host, token, report, healed, time.perf_counter() - started)
