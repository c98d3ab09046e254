"""Following a snapshot's row-level changes, whoever made them: no whole-table rebuild.

A snapshot other than a compaction may add rows (an append, the rows of a keyed batch),
hide rows (deletion vectors, v2 position deletes) and remove whole data files (an
overwrite, copy-on-write MERGE/DELETE). A host's index follows it from what changed:

1. Keys deleted. A keyed lakesink batch reports every key it deleted (the tombstone files of
   sequenced deletes, the deleted-key files of others; summary `lakesink.deletes-reported`),
   so those keys are taken out of the index, or become tombstones. Any other snapshot's
   hidden rows are read back to keys from the positions its deletes set, and its removed
   files' rows from the files; a key leaves the index only when it points at exactly such
   a row (rows hidden earlier are not pointed at, and a key written again elsewhere keeps
   its new place).
2. Keys written: the live rows of the added files (minus the rows the snapshot's own
   deletes hide in them) point their keys at their new places, after the removals, so a key
   deleted and written again ends at its new row.
3. Files removed are forgotten by the file table.

The host's own part of a batch made on several hosts is already in its index (its undo
tokens): its files and its delete reports are skipped. What cannot be followed (equality
deletes) raises CannotFollow, and the caller rebuilds.

A keyed batch that shared keys with commits made while it was in flight decided them at
commit (commit/key_conflicts.py) and names the outcome in its summary: a host applies it
after the snapshot's other changes (`follow_redecided`). (A host that made part of such a
batch holds it already and starts over instead of walking the commits that overtook it:
sync._overtaken.)
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.io import FileIO
from pyiceberg.manifest import DataFile, DataFileContent, ManifestContent, ManifestEntry, ManifestEntryStatus
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.snapshots import Snapshot

from lakesink_datasource.iceberg.live_files import entries_changed_by, read_hidden_positions
from lakesink_datasource.iceberg.manifests import deleted_data_file
from lakesink_datasource.iceberg.partition_key import encode_partition
from lakesink_datasource.iceberg.summary_keys import DELETED_KEYS, DELETES_REPORTED, REDECIDED_KEYS, TOMBSTONES
from lakesink_datasource.index.file_refs import FileRef, decode_ref, encode_ref
from lakesink_datasource.index.key_columns import TOMBSTONE, WINNER_FILE, WINNER_POSITION, KeyColumns, encode_sequences
from lakesink_datasource.index.key_encoding import encode_keys
from lakesink_datasource.index.location_codec import pack_positions
from lakesink_datasource.index.reindex import file_ref, index_files, read_keys
from lakesink_datasource.index.sharded_index import ShardedIndex

log = logging.getLogger("lakesink")


class CannotFollow(Exception):
    """The snapshot's changes cannot be followed key by key (the reason is the message)."""


@dataclass(frozen=True)
class Followed:
    keys_written: int
    keys_deleted: int


def follow_changes(
    index: ShardedIndex, io: FileIO, metadata: TableMetadata, snapshot: Snapshot, columns: KeyColumns,
    *, own_digest: str | None = None,
) -> Followed:
    """Bring the index over `snapshot` (not a compaction). `own_digest`: this host took part
    in the batch and its part is in the index already (skip its files and reports)."""
    deletes = entries_changed_by(io, snapshot, ManifestEntryStatus.ADDED, ManifestContent.DELETES)
    if any(e.data_file.content == DataFileContent.EQUALITY_DELETES for e in deletes):
        raise CannotFollow(f"snapshot {snapshot.snapshot_id} adds equality deletes, which the key index cannot follow by position")
    added = [e for e in entries_changed_by(io, snapshot, ManifestEntryStatus.ADDED) if e.data_file.content == DataFileContent.DATA]
    added_paths = {e.data_file.file_path for e in added}
    # The snapshot's own deletes of the rows it adds (a key written, then deleted by another
    # task of the same batch): those rows are not indexed.
    on_added: dict[str, ManifestEntry] = {}
    on_earlier: list[ManifestEntry] = []
    for entry in deletes:
        target = deleted_data_file(entry.data_file)
        if target in added_paths:
            if target in on_added:
                raise CannotFollow(f"snapshot {snapshot.snapshot_id} adds two position-delete files for {target}")
            on_added[target] = entry
        else:
            on_earlier.append(entry)
    removed = [e for e in entries_changed_by(io, snapshot, ManifestEntryStatus.DELETED) if e.data_file.content == DataFileContent.DATA]
    props = snapshot.summary.additional_properties if snapshot.summary else {}

    if props.get(DELETES_REPORTED) == "true":
        deleted = _apply_reported_deletes(index, io, props, columns, own_digest)
    else:
        # A delete file carries its data file's spec and partition: enough to name the file.
        hidden = [
            (_ref(metadata, deleted_data_file(e.data_file) or "", e.data_file), np.fromiter(read_hidden_positions(io, e.data_file), dtype=np.int64))
            for e in on_earlier
        ]
        deleted = _remove_keys_at(index, io, columns, hidden)
    deleted += _remove_keys_at(index, io, columns, [(file_ref(metadata, e.data_file), None) for e in removed])

    if own_digest is not None:
        mine = [o is not None for o in index.known_ordinals(file_ref(metadata, e.data_file) for e in added)]
        added = [e for e, known in zip(added, mine) if not known]
    written = index_files(index, io, metadata, [(e.data_file, e.sequence_number or 0) for e in added], columns, deletes=on_added)
    if props.get(DELETES_REPORTED) == "true" and columns.sequence:
        _restore_reported_tombstones(index, io, props, columns, own_digest)
    index.forget_files([file_ref(metadata, e.data_file) for e in removed])
    return Followed(written, deleted)


def _ref(metadata: TableMetadata, path: str, like: DataFile) -> str:
    """The index's name of data file `path`, whose spec and partition `like` shares."""
    spec = metadata.specs()[like.spec_id]
    return encode_ref(FileRef(path, like.spec_id, encode_partition(spec, metadata.schema(), like.partition)))


def _report_files(props: dict[str, str], key: str, own_digest: str | None) -> list[str]:
    files = [p for p in props.get(key, "").split(",") if p]
    if own_digest is None:
        return files
    return [p for p in files if f"-{own_digest}-" not in os.path.basename(p)]


def _read_reports(io: FileIO, paths: Iterable[str]) -> pa.Table | None:
    parts = []
    for path in paths:
        try:
            with io.new_input(path).open() as stream:
                parts.append(pq.read_table(stream))
        except FileNotFoundError as exc:
            raise CannotFollow(f"the deletes report {path} is gone") from exc
    return pa.concat_tables(parts, promote_options="permissive") if parts else None


def _apply_reported_deletes(index: ShardedIndex, io: FileIO, props: dict[str, str], columns: KeyColumns, own_digest: str | None) -> int:
    """Take the keys another host's tasks deleted out of the index."""
    rows = _read_reports(io, _report_files(props, DELETED_KEYS, own_digest) + _report_files(props, TOMBSTONES, own_digest))
    if rows is not None:
        rows, _ = columns.own_rows(rows)
    if rows is None or rows.num_rows == 0:
        return 0
    keys = encode_keys([rows.column(c) for c in columns.key], names=list(columns.key))
    index.remove_keys(keys)
    return len(keys)


def _restore_reported_tombstones(index: ShardedIndex, io: FileIO, props: dict[str, str], columns: KeyColumns, own_digest: str | None) -> None:
    """The tombstones of another host's sequenced deletes, for keys no row holds now."""
    rows = _read_reports(io, _report_files(props, TOMBSTONES, own_digest))
    if rows is not None:
        rows, _ = columns.own_rows(rows)
    if rows is None or rows.num_rows == 0:
        return
    keys = encode_keys([rows.column(c) for c in columns.key], names=list(columns.key))
    sequences = encode_sequences(rows)
    if sequences is None:
        return
    newest: dict[bytes, bytes] = {}
    for key, seq in zip(keys, sequences):
        if key not in newest or newest[key] < seq:
            newest[key] = seq
    absent = [k for k, loc in zip(newest, index.lookup(list(newest))) if loc is None]
    if absent:
        index.overwrite_packed(absent, pack_positions(TOMBSTONE, np.zeros(len(absent), dtype=np.uint64), [newest[k] for k in absent]))


def _remove_keys_at(index: ShardedIndex, io: FileIO, columns: KeyColumns, rows: Sequence[tuple[str, np.ndarray | None]]) -> int:
    """Take out the keys that point at these rows (file ref, positions; None: every row),
    read back from the files."""
    ordinals = index.known_ordinals(ref for ref, _ in rows)
    removed = 0
    for (ref, positions), ordinal in zip(rows, ordinals):
        if ordinal is None:
            continue  # no key points into a file the index does not know
        keys, _sequences, at = read_keys(io, decode_ref(ref).path, columns, None)
        if positions is not None:
            chosen = np.isin(at, positions)
            keys = [k for k, c in zip(keys, chosen.tolist()) if c]
            at = at[chosen]
        if not keys:
            continue
        found = index.lookup(keys)
        doomed = [k for k, loc, pos in zip(keys, found, at.tolist()) if loc is not None and loc.file_ordinal == ordinal and loc.position == pos]
        if doomed:
            index.remove_keys(doomed)
            removed += len(doomed)
    return removed


def follow_redecided(index: ShardedIndex, io: FileIO, snapshot: Snapshot, columns: KeyColumns) -> int:
    """Set the keys a batch decided at commit to their outcome: the winning row's place, or
    deleted (a tombstone with the delete's sequence, when the table has one)."""
    props = snapshot.summary.additional_properties if snapshot.summary else {}
    path = props.get(REDECIDED_KEYS)
    if not path:
        return 0
    rows = _read_reports(io, [path])
    if rows is not None:
        rows, _ = columns.own_rows(rows)
    if rows is None or rows.num_rows == 0:
        return 0
    keys = encode_keys([rows.column(c) for c in columns.key], names=list(columns.key))
    sequences = encode_sequences(rows) if columns.sequence else None
    winners = rows.column(WINNER_FILE).to_pylist()
    positions = rows.column(WINNER_POSITION).to_pylist()
    by_file: dict[str | None, list[int]] = {}
    for i, ref in enumerate(winners):
        by_file.setdefault(ref, []).append(i)
    for ref, which in by_file.items():
        chosen = [keys[i] for i in which]
        if ref is None:
            if sequences is None:
                index.remove_keys(chosen)
            else:
                index.overwrite_packed(chosen, pack_positions(TOMBSTONE, np.zeros(len(which), dtype=np.uint64), [sequences[i] for i in which]))
            continue
        (ordinal,) = index.known_ordinals([ref])
        if ordinal is None:
            raise CannotFollow(f"snapshot {snapshot.snapshot_id} decided keys for rows of {decode_ref(ref).path}, which the index does not know")
        # Keys now point into the file directly (a compaction's output may have had only
        # move maps leading into it): when it moves in turn, they must move with it.
        index.mark_direct(ordinal)
        at = np.array([positions[i] for i in which], dtype=np.uint64)
        index.overwrite_packed(chosen, pack_positions(ordinal, at, [sequences[i] for i in which] if sequences is not None else None))
    return rows.num_rows
