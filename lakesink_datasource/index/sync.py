"""Bring a host's key index to the table state a batch was planned against.

The index is a cache of the table, never the source of truth. It records the snapshot it
reflects (`IndexState`); changes of a batch in flight are kept under undo tokens
`<write id>/<host>/<task>/<attempt>` until the table shows whether that batch committed.
Before a task uses the index (holding every shard's host lock, so once per host and batch;
the tokens' part is `tokens.py`):

1. tokens of an earlier attempt of this very task are rolled back (a retried task must not
   see its failed attempt's rows);
2. the snapshots between the index's state and the planned one are walked, oldest first:
   - a batch this host took part in commits the tokens of its task attempts the snapshot
     lists (those of attempts lost with their executor are rolled back);
   - its other hosts' part, and any other writer's snapshot (appends, row-level deletes,
     overwrites), is followed from what the snapshot changed (`follow_changes.py`);
   - a compaction (`replace`) is followed through row lineage (`follow_compaction.py`);
   - keys a batch decided at commit against concurrent commits are set to its outcome last;
   - a batch this host holds already (pending tokens) that another writer's commit overtook
     (landed between its plan and its commit) makes the index start over (`_overtaken`);
   - what cannot be followed (equality deletes, a source table's truncate, history the index's state is not in:
     expired or another table, no index at all, an interrupted catch-up toward another
     snapshot) starts over: from a published copy of the index when one fits
     (`published.py`), else by rebuilding from the planned snapshot, logged with the reason;
3. tokens of writes that never reached the table are rolled back (undo);
4. the state becomes the planned snapshot.
Deleting the index directory is therefore always safe: the next task rebuilds it.

Catch-up and rebuild write without undo records (they cost a lookup and a record per key,
two thirds of a catch-up's time): their writes are idempotent and ordered by the table's
history, and the state moves only after all of them. A crash halfway leaves the target
recorded (`begin_catch_up`): a task planned against that same snapshot replays the path
(putting the same values again); a task planned against any other snapshot starts over.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from pyiceberg.io import FileIO
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.snapshots import Operation, Snapshot

from lakesink_datasource.iceberg.history import snapshots_after
from lakesink_datasource.iceberg.summary_keys import REDECIDED_KEYS, TRUNCATED, WRITE_ID
from lakesink_datasource.index.environment import IndexState
from lakesink_datasource.index.follow_changes import CannotFollow, follow_changes, follow_redecided
from lakesink_datasource.index.follow_compaction import fold_moves, fold_needed, follow_compaction
from lakesink_datasource.index.key_columns import KeyColumns
from lakesink_datasource.index.owner import owner_digest, write_of
from lakesink_datasource.index.reindex import StoredTombstones, floor_lifted, index_state, rebuild
from lakesink_datasource.index.sharded_index import ShardedIndex
from lakesink_datasource.index.tokens import (
    committed_writes,
    roll_back_earlier_attempts,
    roll_back_uncommitted,
    settle_own_part,
)

log = logging.getLogger("lakesink")


@dataclass
class SyncReport:
    """What a sync did, for the task's report (and the tests)."""

    action: str = "current"  # current | caught up | rebuilt | fetched
    snapshots: int = 0  # snapshots walked
    followed: int = 0  # of them, followed from their changes (other hosts' parts, other writers)
    reason: str | None = None  # why the index was rebuilt or fetched
    start_seconds: float = 0.0  # the rebuild, or the copy's download

    def describe(self) -> str:
        if self.action == "current":
            return "current"
        if self.action == "caught up":
            return f"caught up {self.snapshots} snapshot(s)"
        how = "from a published copy" if self.action == "fetched" else "from the table"
        return f"{self.action} {how} in {self.start_seconds:.1f} s, then caught up {self.snapshots} snapshot(s) ({self.reason})"


# Starts an index over from scratch when it cannot be followed: (reason) -> whether it did
# by fetching a published copy (the sync then goes on from that copy's state).
StartOver = Callable[[str], bool]


def sync(
    index: ShardedIndex,
    io: FileIO,
    metadata: TableMetadata,
    columns: KeyColumns,
    *,
    write_id: str,
    host: str,
    partition_id: int,
    attempt: int,
    stored: StoredTombstones | None = None,
    fetch: StartOver | None = None,
) -> SyncReport:
    """Make `index` reflect `metadata`'s current snapshot plus the current write's own tokens.
    `stored`: the companion table's tombstones, read only if the index must be rebuilt.
    `fetch`: replaces the index with a published copy, when one fits, before a rebuild."""
    roll_back_earlier_attempts(index, write_id, host, partition_id, attempt)
    report = SyncReport()
    for _ in range(2):  # a second round after fetching a copy
        reason = _walk(index, io, metadata, columns, write_id, host, stored, report)
        if reason is None:
            return report
        roll_back_uncommitted(index, write_id, committed=set())
        started = time.perf_counter()
        report.snapshots = 0
        if fetch is not None and report.action != "fetched" and fetch(reason):
            report.action, report.reason, report.start_seconds = "fetched", reason, time.perf_counter() - started
            continue
        rebuild(index, io, metadata, columns, stored, reason=reason)
        report.action, report.reason, report.start_seconds = "rebuilt", reason, time.perf_counter() - started
        return report
    raise AssertionError("unreachable: a fetched copy is walked once")


def _walk(
    index: ShardedIndex, io: FileIO, metadata: TableMetadata, columns: KeyColumns, write_id: str, host: str,
    stored: StoredTombstones | None, report: SyncReport,
) -> str | None:
    """Walk the index to the current snapshot; the reason to start over when it cannot be."""
    target = metadata.current_snapshot()
    state = index.get_state()
    unfinished = index.catch_up_under_way()
    target_name = _catch_up_name(metadata, target)
    if unfinished is not None and unfinished != target_name:
        # Its undo-less writes may be ahead of this task's snapshot. Replaying toward the
        # same target would put them again; toward another one, only starting over is exact.
        return f"a catch-up toward {unfinished} was interrupted"
    if state is not None and state.tombstone_floor is not None and floor_lifted(stored):
        return "the stored tombstones it was built without can be read again"
    if state is not None and state.table_uuid == str(metadata.table_uuid) and state.snapshot_id == (target and target.snapshot_id):
        roll_back_uncommitted(index, write_id, committed=set())
        return None
    reason = _no_path_reason(state, metadata)
    path = _path_since(metadata, state) if reason is None and state is not None else None
    if path is None:
        return reason or f"snapshot {state and state.snapshot_id} of the index is not in the table's history (expired, or the table was rolled back)"
    assert state is not None
    # Tokens of writes absent from the table's history never committed: undo them first, so
    # catch-up below works on committed state only.
    roll_back_uncommitted(index, write_id, committed=committed_writes(path))
    pending = index.pending_tokens()
    overtaken = _overtaken(path, pending)
    if overtaken is not None:
        return overtaken
    catching_up = False
    for snapshot in path:
        report.snapshots += 1
        summary = snapshot.summary
        if summary is not None and TRUNCATED in summary.additional_properties:
            # A source table's truncate hid rows by position, not by key: an index reads the
            # few rows left (and the tombstones) again rather than follow it key by key.
            return f"snapshot {snapshot.snapshot_id} took its source table's truncate"
        own = settle_own_part(index, pending, snapshot, host)
        if isinstance(own, str):
            return own
        redecided = summary is not None and REDECIDED_KEYS in summary.additional_properties
        if own.only_here and not redecided:
            continue  # the whole batch is in the index already
        tokens = own.tokens
        if not catching_up:
            index.begin_catch_up(target_name)
            catching_up = True
        if summary is not None and summary.operation == Operation.REPLACE and not tokens:
            follow_compaction(index, io, metadata, snapshot, columns)
            continue
        try:
            if not own.only_here:
                follow_changes(index, io, metadata, snapshot, columns, own_digest=owner_digest(host) if tokens else None)
                report.followed += 1
            # Keys the batch decided at commit: its outcome last, over what the snapshot's
            # other changes and the commits walked before left for them.
            follow_redecided(index, io, snapshot, columns)
        except CannotFollow as exc:
            return str(exc)
    if fold_needed(index):
        if not catching_up:
            index.begin_catch_up(target_name)  # the fold writes without undo, as a catch-up does
        fold_moves(index, io, metadata, columns)
    index.set_state(index_state(metadata, target, state.tombstone_floor))
    if report.action == "current":
        report.action = "caught up"
    return None


def _overtaken(path: list[Snapshot], pending: list[str]) -> str | None:
    """Why this host's index cannot be walked over `path`: another writer's commit lands in it
    before a batch whose changes this host already holds (its pending tokens). Walking that
    commit would lay its changes over the batch's for keys both wrote, although the batch
    committed later (a delete of a key the batch wrote, the outcome of keys the other commit
    decided at commit): the index must then start over and apply both in commit order.
    Compactions move rows without deciding keys, and are followed as usual."""
    mine = {write_of(t) for t in pending}
    if not mine:
        return None
    last_own = max((i for i, s in enumerate(path) if s.summary and s.summary.additional_properties.get(WRITE_ID) in mine), default=None)
    if last_own is None:
        return None
    for snapshot in path[:last_own]:
        summary = snapshot.summary
        if summary is None or summary.operation == Operation.REPLACE or summary.additional_properties.get(WRITE_ID) in mine:
            continue
        return (
            f"snapshot {snapshot.snapshot_id}, another writer's, committed while this host's batch was in flight and before it; "
            "this host's index holds that batch's changes already, so it starts over to apply both in commit order"
        )
    return None


def _no_path_reason(state: IndexState | None, metadata: TableMetadata) -> str | None:
    if state is None:
        return "no index on this host yet (or one whose shards disagree)"
    if state.table_uuid != str(metadata.table_uuid):
        return f"the index is of another table ({state.table_uuid})"
    return None


def _path_since(metadata: TableMetadata, state: IndexState) -> list[Snapshot] | None:
    """Snapshots after the index's state up to the current one, oldest first (None: the
    state is not an ancestor of the current snapshot)."""
    newest_first, found = snapshots_after(metadata, state.snapshot_id, state.sequence_number)
    return list(reversed(newest_first)) if found else None


def _catch_up_name(metadata: TableMetadata, target: Snapshot | None) -> str:
    return f"{metadata.table_uuid}/{target.snapshot_id if target else 'none'}"
