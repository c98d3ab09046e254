"""Reading keys back from the table: indexing data files, restoring tombstones, rebuilding.

What every way of bringing an index forward falls back on: the keys of data files read
from their key (and sequence) columns, minus the rows deletes hide, written without undo
(`ShardedIndex.overwrite_packed`; only before the index's state moves, see sync.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.io import FileIO
from pyiceberg.manifest import DataFile, ManifestEntry
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.snapshots import Snapshot

from lakesink_datasource.errors import LakesinkError
from lakesink_datasource.faults import fault_point
from lakesink_datasource.iceberg.history import ancestors
from lakesink_datasource.iceberg.live_files import live_data_files, live_position_deletes, without_hidden_rows
from lakesink_datasource.iceberg.partition_key import encode_partition
from lakesink_datasource.iceberg.properties import TOMBSTONE_MAX_SEQUENCE
from lakesink_datasource.iceberg.summary_keys import TOMBSTONES
from lakesink_datasource.index.environment import IndexState
from lakesink_datasource.index.file_refs import FileRef, encode_ref
from lakesink_datasource.index.key_columns import TOMBSTONE, KeyColumns, encode_sequences
from lakesink_datasource.index.key_encoding import encode_keys
from lakesink_datasource.index.location_codec import Location, pack_positions
from lakesink_datasource.index.sharded_index import ShardedIndex

log = logging.getLogger("lakesink")

_REBUILD_TOKEN = "rebuild"


def file_ref(metadata: TableMetadata, data_file: DataFile) -> str:
    """The index's name of a data file (its encoded file ref)."""
    spec = metadata.specs()[data_file.spec_id]
    return encode_ref(FileRef(data_file.file_path, data_file.spec_id, encode_partition(spec, metadata.schema(), data_file.partition)))


def read_keys(io: FileIO, path: str, columns: KeyColumns, deletes: ManifestEntry | None) -> tuple[list[bytes], list[bytes] | None, np.ndarray]:
    """The encoded keys (and sequences) of a data file's rows `deletes` leaves visible, with
    each row's position."""
    read = list(columns.key) + list(columns.sequence) + ([columns.current] if columns.current else [])
    with io.new_input(path).open() as stream:
        table = pq.read_table(stream, columns=read)
    table, positions = without_hidden_rows(io, table, deletes)
    if columns.current is not None and table.num_rows:
        # A history table: a key is its current version's (the ended ones are history).
        current = table.column(columns.current).is_null()
        table, positions = table.filter(current), np.asarray(positions)[np.asarray(current.to_numpy(zero_copy_only=False), dtype=bool)]
    # An index of one key shard holds only that shard's keys, whoever wrote the file.
    table, kept = columns.own_rows(table)
    if kept is not None:
        positions = np.asarray(positions)[kept]
    if table.num_rows == 0:
        return [], None, positions
    keys = encode_keys([table.column(c) for c in columns.key], names=list(columns.key))
    sequences = encode_keys([table.column(c) for c in columns.sequence], names=list(columns.sequence)) if columns.sequence else None
    return keys, sequences, positions


def index_files(
    index: ShardedIndex, io: FileIO, metadata: TableMetadata, files: Sequence[tuple[DataFile, int]], columns: KeyColumns,
    deletes: Mapping[str, ManifestEntry] | None = None,
) -> int:
    """Index every live row of `files` ((data file, data sequence number) pairs), oldest
    data first so a newer row of a key wins; positions hidden by `deletes` (the position
    deletes by data file path; default: those live in the current snapshot) are skipped.
    Without undo (`KeyShard.overwrite_packed`): only for catch-up and rebuild, before the
    index's state moves."""
    dvs = live_position_deletes(io, metadata.current_snapshot()) if deletes is None else deletes
    indexed = 0
    for data_file, _seq in sorted(files, key=lambda fs: fs[1]):
        if columns.skips_file(data_file.file_path):
            continue  # another key shard's file
        keys, sequences, positions = read_keys(io, data_file.file_path, columns, dvs.get(data_file.file_path))
        if not keys:
            continue
        ordinal = index.file_ordinal(file_ref(metadata, data_file))
        index.mark_direct(ordinal)
        index.overwrite_packed(keys, pack_positions(ordinal, np.asarray(positions, dtype=np.uint64), sequences))
        indexed += len(keys)
        fault_point("index_file_done")  # tests: a crash between two files of a catch-up
    return indexed


# A source of stored tombstone rows (key columns + the sequence columns, SEQUENCE...): the companion table. Returns
# None when there is none; raises TombstonesUnreadable when it exists but cannot be read.
StoredTombstones = Callable[[], pa.Table | None]


class TombstonesUnreadable(LakesinkError, RuntimeError):
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
    if not columns.sequence:
        return True
    newest: dict[bytes, bytes] = {}

    def add(table: pa.Table) -> None:
        table, _ = columns.own_rows(table)
        if table.num_rows == 0:
            return
        keys = encode_keys([table.column(c) for c in columns.key], names=list(columns.key))
        sequences = encode_sequences(table)
        if sequences is None:
            return
        for key, seq in zip(keys, sequences):
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
    index: ShardedIndex, io: FileIO, metadata: TableMetadata, columns: KeyColumns, stored: StoredTombstones | None = None,
    *, reason: str,
) -> None:
    """Index the table's current snapshot from scratch: every live row's key, plus the
    tombstones. Costs a read of the whole table's key columns: only for what cannot be
    followed (`reason`, logged)."""
    log.warning("lakesink: rebuilding key index %s from the table: %s", index.path, reason)
    snapshot = metadata.current_snapshot()
    index.clear()
    entries = live_data_files(io, snapshot)
    rows = index_files(index, io, metadata, [(e.data_file, e.sequence_number or 0) for e in entries], columns)
    readable = restore_tombstones(index, io, metadata, columns, _REBUILD_TOKEN, stored)
    index.commit_tokens([_REBUILD_TOKEN], index_state(metadata, snapshot, None if readable else tombstone_floor(metadata)))
    log.info("lakesink: rebuilt key index %s from snapshot %s: %d keys from %d files", index.path, snapshot and snapshot.snapshot_id, rows, len(entries))


def index_state(metadata: TableMetadata, snapshot: Snapshot | None, floor: bytes | None = None) -> IndexState:
    return IndexState(
        table_uuid=str(metadata.table_uuid),
        snapshot_id=snapshot.snapshot_id if snapshot else None,
        sequence_number=snapshot.sequence_number if snapshot else None,
        tombstone_floor=floor,
    )


def floor_lifted(stored: StoredTombstones | None) -> bool:
    """Whether the stored tombstones an earlier rebuild could not read can be read now."""
    if stored is None:
        return True
    try:
        stored()
    except TombstonesUnreadable:
        return False
    return True
