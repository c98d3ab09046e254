"""Following a compaction (`replace` snapshot) through row lineage: move maps and their fold.

A compaction moves live rows to new files without changing them. Where the rewrite kept
each row's `_row_id` (lakesink's compaction, Iceberg Java's `rewrite_data_files` on v3),
joining the row ids of the removed and the added files says where every row went: the
index keeps that as move maps (`row_moves.py`) instead of rewriting the moved keys, and
folds the maps back into the keys a few files at a time once they outgrow the index.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np
from pyiceberg.io import FileIO
from pyiceberg.manifest import DataFile, ManifestEntry, ManifestEntryStatus
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.snapshots import Snapshot

from lakesink_datasource.faults import fault_point
from lakesink_datasource.iceberg.live_files import data_entries_changed_by, live_data_files
from lakesink_datasource.iceberg.manifests import data_file_first_row_id
from lakesink_datasource.iceberg.row_lineage import read_with_row_ids, row_ids
from lakesink_datasource.index.key_columns import KeyColumns
from lakesink_datasource.index.key_shards import file_shard
from lakesink_datasource.index.reindex import file_ref, index_files
from lakesink_datasource.index.row_moves import maps_from_row_ids
from lakesink_datasource.index.sharded_index import ShardedIndex

log = logging.getLogger("lakesink")


def follow_compaction(index: ShardedIndex, io: FileIO, metadata: TableMetadata, snapshot: Snapshot, columns: KeyColumns) -> str:
    """Bring the index over compaction `snapshot`: the same live rows in new files. Returns
    how it was followed ("moves", "re-read", or "skipped": another key shard's files only)."""
    removed = data_entries_changed_by(io, snapshot, ManifestEntryStatus.DELETED)
    added = data_entries_changed_by(io, snapshot, ManifestEntryStatus.ADDED)
    if removed and all(columns.skips_file(e.data_file.file_path) for e in [*removed, *added]):
        return "skipped"  # another key shard's files, merged among themselves
    removed_refs = [file_ref(metadata, e.data_file) for e in removed]
    how = "moves"
    if not record_compaction_moves(index, io, metadata, snapshot, removed, removed_refs, columns):
        # Without usable lineage every key of the added files is pointed at its new place,
        # which moves exactly the keys that moved.
        index_files(index, io, metadata, added_files(io, snapshot), columns)
        # Removed files carry no maps yet; only a compaction output's marker may be left.
        # Maps leading into them are retired by the next fold (no longer live).
        index.forget_moves([o for o in index.known_ordinals(removed_refs) if o is not None])
        how = "re-read"
    index.forget_files(removed_refs)
    return how


def added_files(io: FileIO, snapshot: Snapshot) -> list[tuple[DataFile, int]]:
    return [(e.data_file, e.sequence_number or 0) for e in data_entries_changed_by(io, snapshot, ManifestEntryStatus.ADDED)]


def _file_row_ids(io: FileIO, data_file: DataFile) -> np.ndarray:
    """The `_row_id` of every position of a data file (stored, else inherited)."""
    positions = np.arange(data_file.record_count, dtype=np.int64)
    table = read_with_row_ids(io, data_file.file_path, [])
    return row_ids(table, positions, data_file_first_row_id(data_file))


def record_compaction_moves(
    index: ShardedIndex, io: FileIO, metadata: TableMetadata, snapshot: Snapshot,
    removed: Sequence[ManifestEntry], removed_refs: Sequence[str], columns: KeyColumns | None = None,
) -> bool:
    """Record where compaction `snapshot` (which removed `removed`, named `removed_refs` in
    the index) moved the rows the index points at, from row lineage; False (nothing
    recorded) when lineage cannot tell, or a file is unreadable."""
    if metadata.format_version < 3:
        return False
    added = data_entries_changed_by(io, snapshot, ManifestEntryStatus.ADDED)
    if columns is not None and added and all(file_shard(e.data_file.file_path) is not None for e in added):
        # Every output holds one key shard's rows, read from that shard's inputs only: an
        # index of one shard needs neither the other shards' inputs nor their outputs.
        kept = [(e, ref) for e, ref in zip(removed, removed_refs) if not columns.skips_file(e.data_file.file_path)]
        removed, removed_refs = [e for e, _ in kept], [ref for _, ref in kept]
        added = [e for e in added if not columns.skips_file(e.data_file.file_path)]
    known = index.known_ordinals(removed_refs)
    try:
        # Removed files the index never knew (a negative stand-in ordinal, dropped below)
        # hold no key's row; their ids still join, so a new row from one of them is not
        # mistaken for a lineage gap.
        sources = [(-1 - i if o is None else o, _file_row_ids(io, e.data_file)) for i, (e, o) in enumerate(zip(removed, known))]
        target_refs = [file_ref(metadata, e.data_file) for e in added]
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
        ((e, by_ref[ref]) for e in live_data_files(io, metadata.current_snapshot()) if (ref := file_ref(metadata, e.data_file)) in by_ref),
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


