"""Bring a host's key index to the table state a batch was planned against.

The index is a cache of the table, never the source of truth. It records the snapshot it
reflects (`IndexState`); changes of a batch in flight are kept under undo tokens
`<write id>/<host>/<task>/<attempt>` until the table shows whether that batch committed.
Before a task uses the index (holding every shard's host lock, so once per host and batch):

1. tokens of an earlier attempt of this very task are rolled back (a retried task must not
   see its failed attempt's rows);
2. walking the snapshots between the index's state and the planned one: a lakesink
   snapshot whose changes were all made on this host commits its tokens; a plain append by
   another writer is indexed incrementally (its new files are read), and so is a compaction
   (`replace`: the keys of its new files are pointed at their new places, the removed
   files forgotten); anything else (another writer's deletes, a multi-host batch, expired
   history, a different table, no index at all) rebuilds the index from the planned snapshot;
3. tokens of writes that never reached the table are rolled back (undo);
4. the state becomes the planned snapshot.
Deleting the index directory is therefore always safe: the next task rebuilds it.

Catch-up and rebuild write without undo records (they cost a lookup and a record per key,
two thirds of a catch-up's time): their writes are idempotent and ordered by the table's
history, and the state moves only after all of them. A crash halfway leaves the target
recorded (`begin_catch_up`): a task planned against that same snapshot replays the path
(putting the same values again); a task planned against any other snapshot rebuilds.
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.io import FileIO
from pyiceberg.manifest import DataFile, ManifestEntry, ManifestEntryStatus
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.snapshots import Operation, Snapshot

from lakesink_datasource.faults import fault_point
from lakesink_datasource.iceberg.history import ancestors, snapshots_after
from lakesink_datasource.iceberg.live_files import (
    data_entries_changed_by,
    live_data_files,
    live_position_deletes,
    without_hidden_rows,
)
from lakesink_datasource.iceberg.manifests import data_file_first_row_id
from lakesink_datasource.iceberg.partition_key import encode_partition
from lakesink_datasource.iceberg.properties import TOMBSTONE_MAX_SEQUENCE
from lakesink_datasource.iceberg.row_lineage import read_with_row_ids, row_ids
from lakesink_datasource.iceberg.summary_keys import HOSTS, TOMBSTONES, WRITE_ID
from lakesink_datasource.index.file_refs import FileRef, encode_ref
from lakesink_datasource.index.key_encoding import encode_keys
from lakesink_datasource.index.key_index import IndexState, Location, pack_positions
from lakesink_datasource.index.row_moves import maps_from_row_ids
from lakesink_datasource.index.sharded_index import ShardedIndex

log = logging.getLogger("lakesink")

TOMBSTONE_DIR = "lakesink-tombstones"
# The index's own format, shared with the task-side writer (write/keyed.py):
TOMBSTONE = 0xFFFF_FFFF  # file ordinal of a deleted key that remembers its sequence
SEQUENCE = "__lakesink_sequence"  # the sequence column's name in tombstone files
_REBUILD_TOKEN = "rebuild"


def index_owner(path: str) -> str:
    """Names the index a task resolves its keys in: the host, plus a short digest of the
    index's directory, because two Spark workers on one machine (each with its own HOME or
    index_dir) keep separate indexes just like two machines do. No ',' or '/': the names are
    listed in a snapshot summary and inside undo tokens."""
    digest = hashlib.sha1(os.path.realpath(path).encode()).hexdigest()[:8]
    return f"{socket.gethostname().replace(',', '_').replace('/', '_')}:{digest}"


def default_index_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "lakesink", "index")


def token_for(write_id: str, host: str, partition_id: int, attempt: int) -> str:
    return f"{write_id}/{host}/{partition_id}/{attempt}"


def _write_of(token: str) -> str:
    return token.split("/", 1)[0]


@dataclass(frozen=True)
class KeyColumns:
    """Which table columns form the key and the sequence (as stored in data files)."""

    key: tuple[str, ...]
    sequence: str | None  # None when no sequence column, or it is not stored in the table


def index_files(
    index: ShardedIndex, io: FileIO, metadata: TableMetadata, files: Sequence[tuple[DataFile, int]], columns: KeyColumns
) -> int:
    """Index every live row of `files` ((data file, data sequence number) pairs), oldest
    data first so a newer row of a key wins; positions hidden by a live DV are skipped.
    Without undo (`KeyIndex.overwrite_packed`): only for catch-up and rebuild, before the
    index's state moves."""
    dvs = live_position_deletes(io, metadata.current_snapshot())
    indexed = 0
    for data_file, _seq in sorted(files, key=lambda fs: fs[1]):
        read = list(columns.key) + ([columns.sequence] if columns.sequence else [])
        with io.new_input(data_file.file_path).open() as stream:
            table = pq.read_table(stream, columns=read)
        table, positions = without_hidden_rows(io, table, dvs.get(data_file.file_path))
        if table.num_rows == 0:
            continue
        keys = encode_keys([table.column(c) for c in columns.key], names=list(columns.key))
        sequences = encode_keys([table.column(columns.sequence)]) if columns.sequence else None
        ordinal = index.file_ordinal(_file_ref(metadata, data_file))
        index.mark_direct(ordinal)
        index.overwrite_packed(keys, pack_positions(ordinal, np.asarray(positions, dtype=np.uint64), sequences))
        indexed += len(keys)
        fault_point("index_file_done")  # tests: a crash between two files of a catch-up
    return indexed


# A source of stored tombstone rows (key columns + SEQUENCE): the companion table. Returns
# None when there is none; raises TombstonesUnreadable when it exists but cannot be read.
StoredTombstones = Callable[[], pa.Table | None]


class TombstonesUnreadable(RuntimeError):
    """The companion table of tombstones exists but cannot be read."""


def tombstone_floor(metadata: TableMetadata) -> bytes:
    """The highest sequence a sequenced delete of the table ever carried (encoded); for a
    table written before lakesink recorded it, above every sequence (0xFF...)."""
    raw = metadata.properties.get(TOMBSTONE_MAX_SEQUENCE)
    return bytes.fromhex(raw) if raw else b"\xff" * 64


def restore_tombstones(
    index: ShardedIndex, io: FileIO, metadata: TableMetadata, columns: KeyColumns, token: str, stored: StoredTombstones | None = None
) -> bool:
    """Re-create the tombstones of sequenced deletes for keys that are not live, from the
    companion table's rows and the tombstone files named in the current snapshot's ancestors
    (those not stored yet): the highest deleted sequence per key is kept. False when the
    companion table could not be read (deletes whose snapshots expired are then unknown)."""
    if columns.sequence is None:
        return True
    newest: dict[bytes, bytes] = {}

    def add(table: pa.Table) -> None:
        if table.num_rows == 0:
            return
        keys = encode_keys([table.column(c) for c in columns.key], names=list(columns.key))
        for key, seq in zip(keys, encode_keys([table.column(SEQUENCE)])):
            if key not in newest or newest[key] < seq:
                newest[key] = seq

    readable = True
    try:
        rows = stored() if stored is not None else None
    except TombstonesUnreadable as exc:
        log.warning("lakesink: rebuilding key index %s without the stored tombstones (%s): changes to keys it does not "
                    "hold, with a sequence at or below the highest delete's, are refused until the tombstones can be read", index.path, exc)
        rows, readable = None, False
    if rows is not None:
        add(rows)
    for snapshot in reversed(list(ancestors(metadata))):
        props = snapshot.summary.additional_properties if snapshot.summary else {}
        for path in filter(None, props.get(TOMBSTONES, "").split(",")):
            try:
                with io.new_input(path).open() as stream:
                    add(pq.read_table(stream))
            except FileNotFoundError:
                if rows is None:
                    log.warning("lakesink: tombstone file %s is gone and no companion table holds it; its deletes are forgotten", path)
    if newest:
        keys = list(newest)
        found = index.lookup(keys)
        puts = [(k, Location(TOMBSTONE, 0, newest[k])) for k, loc in zip(keys, found) if loc is None]
        index.apply(token, puts, [])
    return readable


def rebuild(
    index: ShardedIndex, io: FileIO, metadata: TableMetadata, columns: KeyColumns, stored: StoredTombstones | None = None
) -> None:
    snapshot = metadata.current_snapshot()
    index.clear()
    entries = live_data_files(io, snapshot)
    rows = index_files(index, io, metadata, [(e.data_file, e.sequence_number or 0) for e in entries], columns)
    readable = restore_tombstones(index, io, metadata, columns, _REBUILD_TOKEN, stored)
    index.commit_tokens([_REBUILD_TOKEN], _state(metadata, snapshot, None if readable else tombstone_floor(metadata)))
    log.info("lakesink: rebuilt key index %s from snapshot %s: %d keys from %d files", index.path, snapshot and snapshot.snapshot_id, rows, len(entries))


def _state(metadata: TableMetadata, snapshot: Snapshot | None, floor: bytes | None = None) -> IndexState:
    return IndexState(
        table_uuid=str(metadata.table_uuid),
        snapshot_id=snapshot.snapshot_id if snapshot else None,
        sequence_number=snapshot.sequence_number if snapshot else None,
        tombstone_floor=floor,
    )


def _floor_lifted(stored: StoredTombstones | None) -> bool:
    """Whether the stored tombstones an earlier rebuild could not read can be read now."""
    if stored is None:
        return True
    try:
        stored()
    except TombstonesUnreadable:
        return False
    return True


def _path_since(metadata: TableMetadata, state: IndexState) -> list[Snapshot] | None:
    """Snapshots after the index's state up to the current one, oldest first (None: the
    state is not an ancestor of the current snapshot)."""
    newest_first, found = snapshots_after(metadata, state.snapshot_id, state.sequence_number)
    return list(reversed(newest_first)) if found else None


def _added_files(io: FileIO, snapshot: Snapshot) -> list[tuple[DataFile, int]]:
    return [(e.data_file, e.sequence_number or 0) for e in data_entries_changed_by(io, snapshot, ManifestEntryStatus.ADDED)]


def _file_ref(metadata: TableMetadata, data_file: DataFile) -> str:
    """The index's name of a data file (its encoded file ref)."""
    spec = metadata.specs()[data_file.spec_id]
    return encode_ref(FileRef(data_file.file_path, data_file.spec_id, encode_partition(spec, metadata.schema(), data_file.partition)))


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
) -> None:
    """Make `index` reflect `metadata`'s current snapshot plus the current write's own tokens.
    `stored`: the companion table's tombstones, read only if the index must be rebuilt."""
    target = metadata.current_snapshot()
    pending = index.pending_tokens()
    mine = token_for(write_id, host, partition_id, attempt)
    stale_attempts = [t for t in pending if t != mine and t.startswith(f"{write_id}/{host}/{partition_id}/")]
    if stale_attempts:
        index.rollback_tokens(stale_attempts)
    state = index.get_state()
    unfinished = index.catch_up_under_way()
    target_name = _catch_up_name(metadata, target)
    if unfinished is not None and unfinished != target_name:
        # A catch-up toward another snapshot stopped halfway (a crash): its undo-less writes
        # may be ahead of this task's snapshot. Replaying toward the same target would put
        # them again; toward another one, only a rebuild is exact.
        log.warning("lakesink: key index %s was interrupted catching up to %s; rebuilding it", index.path, unfinished)
        _rollback_uncommitted(index, write_id, committed=set())
        rebuild(index, io, metadata, columns, stored)
        return
    if state is not None and state.tombstone_floor is not None and _floor_lifted(stored):
        # The index was rebuilt without the stored tombstones, which can be read again.
        log.info("lakesink: the stored tombstones of key index %s can be read again; rebuilding it with them", index.path)
        _rollback_uncommitted(index, write_id, committed=set())
        rebuild(index, io, metadata, columns, stored)
        return
    if state is not None and state.table_uuid == str(metadata.table_uuid) and state.snapshot_id == (target and target.snapshot_id):
        _rollback_uncommitted(index, write_id, committed=set())
        return
    path = _path_since(metadata, state) if state and state.table_uuid == str(metadata.table_uuid) else None
    if path is None:
        _rollback_uncommitted(index, write_id, committed=set())
        rebuild(index, io, metadata, columns, stored)
        return
    # Tokens of writes absent from the table's history never committed: undo them first, so
    # catch-up below works on committed state only.
    _rollback_uncommitted(index, write_id, committed=_committed_writes(path))
    pending = index.pending_tokens()
    catching_up = False
    for snapshot in path:
        summary = snapshot.summary
        props = summary.additional_properties if summary else {}
        snapshot_write = props.get(WRITE_ID)
        tokens = [t for t in pending if _write_of(t) == snapshot_write]
        hosts = set(filter(None, props.get(HOSTS, "").split(",")))
        if tokens and hosts <= {host}:
            index.commit_tokens(tokens)  # every change of that batch is already in this index
            continue
        if not catching_up and summary is not None and summary.operation in (Operation.APPEND, Operation.REPLACE) and not tokens:
            index.begin_catch_up(target_name)
            catching_up = True
        if summary is not None and summary.operation == Operation.APPEND and not tokens:
            # Rows appended by anyone else (another writer, lakesink tasks on other hosts):
            # index the new files incrementally.
            index_files(index, io, metadata, _added_files(io, snapshot), columns)
            continue
        if summary is not None and summary.operation == Operation.REPLACE and not tokens:
            # A compaction (lakesink's or another engine's): the same live rows in new files.
            # Its row lineage says where each row went (row_moves.py): keys stay where they
            # are and lookups follow the moves. Without usable lineage, every key of the
            # added files is pointed at its new place, which moves exactly the keys that moved.
            removed = data_entries_changed_by(io, snapshot, ManifestEntryStatus.DELETED)
            removed_refs = [_file_ref(metadata, e.data_file) for e in removed]
            if not record_compaction_moves(index, io, metadata, snapshot, removed, removed_refs):
                index_files(index, io, metadata, _added_files(io, snapshot), columns)
                # Removed files carry no maps yet; only a compaction output's marker may be
                # left. Maps leading into them are retired by the next fold (no longer live).
                index.forget_moves([o for o in index.known_ordinals(removed_refs) if o is not None])
            index.forget_files(removed_refs)
            continue
        rebuild(index, io, metadata, columns, stored)
        return
    if fold_needed(index):
        if not catching_up:
            index.begin_catch_up(target_name)  # the fold writes without undo, as a catch-up does
        fold_moves(index, io, metadata, columns)
    assert state is not None  # a path was found from it
    index.set_state(_state(metadata, target, state.tombstone_floor))


def _file_row_ids(io: FileIO, data_file: DataFile) -> np.ndarray:
    """The `_row_id` of every position of a data file (stored, else inherited)."""
    positions = np.arange(data_file.record_count, dtype=np.int64)
    table = read_with_row_ids(io, data_file.file_path, [])
    return row_ids(table, positions, data_file_first_row_id(data_file))


def record_compaction_moves(
    index: ShardedIndex, io: FileIO, metadata: TableMetadata, snapshot: Snapshot,
    removed: Sequence[ManifestEntry], removed_refs: Sequence[str],
) -> bool:
    """Record where compaction `snapshot` (which removed `removed`, named `removed_refs` in
    the index) moved the rows the index points at, from row lineage; False (nothing
    recorded) when lineage cannot tell, or a file is unreadable."""
    if metadata.format_version < 3:
        return False
    added = data_entries_changed_by(io, snapshot, ManifestEntryStatus.ADDED)
    known = index.known_ordinals(removed_refs)
    try:
        # Removed files the index never knew (a negative stand-in ordinal, dropped below)
        # hold no key's row; their ids still join, so a new row from one of them is not
        # mistaken for a lineage gap.
        sources = [(-1 - i if o is None else o, _file_row_ids(io, e.data_file)) for i, (e, o) in enumerate(zip(removed, known))]
        target_refs = [_file_ref(metadata, e.data_file) for e in added]
        # Files given their ordinal here are reached through maps only. One that already had
        # an ordinal (a replayed catch-up) may have been indexed directly since.
        fresh = [o is None for o in index.known_ordinals(target_refs)]
        targets = [(index.file_ordinal(ref), _file_row_ids(io, e.data_file)) for ref, e in zip(target_refs, added)]
    except FileNotFoundError:
        return False
    maps = maps_from_row_ids(sources, targets)
    if maps is None:
        return False
    map_only = [o for (o, _), new in zip(targets, fresh) if new]
    index.record_moves({o: places for o, places in maps.items() if o >= 0}, map_only)
    fault_point("index_moves_recorded")  # tests: a crash before the catch-up reaches its state
    return True


# Move maps are folded once they hold more row positions than this many times the keys
# (8 bytes a position against ~50 bytes a key), or than FOLD_MIN_ROWS on a small index.
FOLD_RATIO = 2
FOLD_MIN_ROWS = 1_000_000
# ... or once there are more maps than this: each keyed transaction opens every map (a few
# microseconds each), and a table of many small files (a wide fanout) would gather
# thousands per compaction.
FOLD_MAX_MAPS = 1024
# Rows re-indexed by one sync's fold at most (~2 s; a fold measured ~1 us a row): a large
# table's maps are folded over several batches rather than stalling one batch for a re-read
# of the whole table.
FOLD_BATCH_ROWS = 2_000_000


def fold_needed(index: ShardedIndex) -> bool:
    maps, positions = index.move_stats()
    return maps > FOLD_MAX_MAPS or positions > max(FOLD_MIN_ROWS, FOLD_RATIO * index.count())


def fold_moves(index: ShardedIndex, io: FileIO, metadata: TableMetadata, columns: KeyColumns) -> int:
    """Point the keys of (some of) the files the move maps lead to at their places directly,
    then retire the map entries leading into those files; a map left with no live entry is
    dropped. Every key that reads through a map has its row in one of those live files, so
    once a file is re-indexed no key needs an entry into it. The largest files go first, at
    most FOLD_BATCH_ROWS rows (and at least one file) per call. Returns the rows re-indexed."""
    targets = index.move_targets()
    by_ref = {index.file_path(o): o for o in targets if index.has_ordinal(o)}
    live = sorted(  # (entry, ordinal) of the live files the maps lead to, largest first
        ((e, by_ref[ref]) for e in live_data_files(io, metadata.current_snapshot()) if (ref := _file_ref(metadata, e.data_file)) in by_ref),
        key=lambda eo: -eo[0].data_file.record_count,
    )
    chosen: list[tuple[ManifestEntry, int]] = []
    rows = 0
    for entry, ordinal in live:
        if chosen and rows + entry.data_file.record_count > FOLD_BATCH_ROWS:
            break
        chosen.append((entry, ordinal))
        rows += entry.data_file.record_count
    index_files(index, io, metadata, [(e.data_file, e.sequence_number or 0) for e, _ in chosen], columns)
    # Entries into files gone from the table (or from the file table) lead nowhere any key needs.
    retired = {o for _, o in chosen} | (targets - {o for _, o in live})
    index.retire_move_targets(retired)
    log.info("lakesink: key index %s folded the moves into %d of %d files (%d rows)", index.path, len(chosen), len(live), rows)
    return rows


def _catch_up_name(metadata: TableMetadata, target: Snapshot | None) -> str:
    return f"{metadata.table_uuid}/{target.snapshot_id if target else 'none'}"


def _committed_writes(path: Iterable[Snapshot]) -> set[str]:
    return {s.summary.additional_properties[WRITE_ID] for s in path if s.summary and WRITE_ID in s.summary.additional_properties}


def _rollback_uncommitted(index: ShardedIndex, current_write: str, committed: set[str]) -> None:
    """Undo tokens of writes that are neither the current one nor known to be committed."""
    doomed = [t for t in index.pending_tokens() if _write_of(t) not in committed and _write_of(t) != current_write]
    if doomed:
        index.rollback_tokens(doomed)
