"""Streaming reads: what each snapshot between two offsets added (and, for a change feed,
removed), planned on the driver, read on the executors.

An offset is a snapshot id of the branch being read: everything through it has been
emitted. A new query starts with the whole table as of the oldest snapshot still retained
(so nothing an expired snapshot appended is missed), then each later snapshot's changes; or,
with `starting_snapshot_id` / `starting_timestamp`, with the changes of that snapshot on.

Per snapshot, by operation:
- `append`: the rows of the data files it added;
- `replace` (a compaction, lakesink's or another engine's): nothing, the rows did not change;
- `overwrite` / `delete`: rows were hidden or removed. A plain stream fails there, naming the
  snapshot (it would silently miss the deletes); with `read_changes=true` the stream is a
  change feed: inserted rows, and deleted rows read back from the positions the snapshot's
  deletion vectors newly hide (DV now minus DV before) or from the files it removed, each with
  `_change_type` and `_commit_snapshot_id`. A key deleted and inserted by one snapshot is an
  update (`update_before`, `update_after`).

Every unit of work is one data file and the row positions to emit or to leave out, so a
unit reads the same rows whenever it is replayed: exactly once comes from Spark's checkpoint
of the offsets.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.expressions import AlwaysTrue
from pyiceberg.io import FileIO
from pyiceberg.io.pyarrow import ArrowScan, schema_to_pyarrow
from pyiceberg.manifest import DataFile, DataFileContent, ManifestContent, ManifestEntry, ManifestEntryStatus
from pyiceberg.schema import Schema
from pyiceberg.table import FileScanTask
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.snapshots import Snapshot
from pyroaring import BitMap64

from lakesink_datasource.errors import LakesinkError
from lakesink_datasource.iceberg.live_files import (
    entries_changed_by,
    keep_mask,
    live_data_files,
    live_entries,
    live_position_deletes,
    read_hidden_positions,
)
from lakesink_datasource.iceberg.manifests import deleted_data_file
from lakesink_datasource.table import metadata_cache

CHANGE_TYPE = "_change_type"
COMMIT_SNAPSHOT_ID = "_commit_snapshot_id"
# Commit order: the snapshot's sequence number, which every commit of the table raises (so it
# is the same in every read and stream of the table, unlike a position within one scan).
CHANGE_ORDINAL = "_change_ordinal"
COMMIT_TIMESTAMP = "_commit_timestamp"  # the snapshot's commit time
NOTHING = -1  # the offset before any snapshot was emitted


class StreamReadError(LakesinkError, ValueError):
    """The stream cannot go on from its offset as configured (named snapshot, what to do)."""


@dataclass(frozen=True)
class Unit:
    """One data file's rows to emit for one snapshot: all of them except `positions`
    (`keep=False`), or exactly `positions` (`keep=True`)."""

    snapshot_id: int
    change: str  # insert | delete
    data_file: DataFile
    positions: bytes  # a serialized BitMap64
    keep: bool
    sequence_number: int = 0  # the snapshot's: its place in commit order
    timestamp_ms: int = 0  # the snapshot's commit time

    @property
    def size(self) -> int:
        return int(self.data_file.file_size_in_bytes)


def snapshots_between(metadata: TableMetadata, start: int, end: int) -> list[Snapshot]:
    """The snapshots after `start` up to `end`, oldest first, along `end`'s ancestry. From
    NOTHING the walk ends at the root or at the oldest retained ancestor; from a snapshot it
    must reach that snapshot, else the changes in between are not all knowable."""
    snapshot = metadata.snapshot_by_id(end)
    if snapshot is None:
        raise StreamReadError(f"snapshot {end} is not in the table's history (expired?); start a new query")
    chain: list[Snapshot] = []
    while True:
        chain.append(snapshot)
        parent_id = snapshot.parent_snapshot_id
        if parent_id is not None and parent_id == start:
            break
        parent = metadata.snapshot_by_id(parent_id) if parent_id is not None else None
        if parent is None:
            if start == NOTHING:
                break  # the root, or the oldest snapshot still retained
            raise StreamReadError(
                f"snapshot {start}, where this stream stopped reading, is not an ancestor of snapshot {end} that is "
                "still retained (it expired, or the table was rolled back); the changes since cannot all be read. "
                "Start a new query (new checkpoint), with starting_snapshot_id set to a retained snapshot if needed"
            )
        snapshot = parent
    return list(reversed(chain))


def _bitmap(io: FileIO, entry: ManifestEntry | None) -> BitMap64:
    return BitMap64() if entry is None else read_hidden_positions(io, entry.data_file)


def _operation(snapshot: Snapshot) -> str:
    return snapshot.summary.operation.value if snapshot.summary is not None else "append"


def _changes_rows(snapshot: Snapshot) -> bool:
    """Does the snapshot hide or remove rows (not counting a compaction's rewrite)?"""
    summary = snapshot.summary
    if summary is None:
        return False
    removed = sum(int(summary.get(k) or 0) for k in ("deleted-records", "added-position-deletes", "removed-data-files"))
    return removed > 0 or int(summary.get("added-dvs") or 0) > 0 or int(summary.get("added-delete-files") or 0) > 0


def _refuse_other_deletes(entries: list[ManifestEntry], sid: int) -> None:
    """Equality deletes, or position deletes that cover several files, cannot be read as
    rows here: emitting around them would emit deleted rows or miss deletes."""
    for e in entries:
        if e.data_file.content == DataFileContent.EQUALITY_DELETES or deleted_data_file(e.data_file) is None:
            raise StreamReadError(
                f"snapshot {sid} has delete file {e.data_file.file_path} ({e.data_file.content.name.lower()}, not one "
                "data file's position deletes), which a lakesink stream cannot read; rewrite the table's deletes "
                "(Iceberg Java: rewrite_data_files or rewrite_position_delete_files) or start after it"
            )


def units_for(
    metadata: TableMetadata, io: FileIO, snapshot: Snapshot, *, full: bool, read_changes: bool, skip: frozenset[str] = frozenset()
) -> list[Unit]:
    """The rows `snapshot` contributes to the stream (its whole state when `full`).

    Its changes are read from the entries it wrote itself: data files ADDED and DELETED, and
    position deletes ADDED (its new DVs) and DELETED (the DVs they replace, or of files it
    removed), so no parent state is needed and an expired parent changes nothing."""
    sid = snapshot.snapshot_id
    order = {"sequence_number": snapshot.sequence_number or 0, "timestamp_ms": snapshot.timestamp_ms}
    if full:
        _refuse_other_deletes(live_entries(io, snapshot, ManifestContent.DELETES), sid)
        dvs = live_position_deletes(io, snapshot)
        return [Unit(sid, "insert", e.data_file, _bitmap(io, dvs.get(e.data_file.file_path)).serialize(), False, **order)
                for e in live_data_files(io, snapshot)]
    operation = _operation(snapshot)
    if operation == "replace":
        return []
    if operation in skip and not read_changes:
        return []  # skip_delete_snapshots / skip_overwrite_snapshots: the user chose to miss it whole, as Iceberg does
    if operation != "append" and _changes_rows(snapshot) and not read_changes:
        raise StreamReadError(
            f"snapshot {sid} ({operation}) deletes or replaces rows, which a streaming read of appends cannot emit; "
            "set read_changes=true to read a change feed (inserts, deletes and updates), "
            f"skip_{operation}_snapshots=true to skip such snapshots whole, or start a new query after it with "
            "starting_snapshot_id"
        )
    added_deletes = entries_changed_by(io, snapshot, ManifestEntryStatus.ADDED, ManifestContent.DELETES)
    _refuse_other_deletes(added_deletes, sid)
    now = {deleted_data_file(e.data_file): e for e in added_deletes}
    before = {deleted_data_file(e.data_file): e for e in entries_changed_by(io, snapshot, ManifestEntryStatus.DELETED, ManifestContent.DELETES)}
    units = []
    added_files = set()
    for e in entries_changed_by(io, snapshot, ManifestEntryStatus.ADDED):
        if e.data_file.content == DataFileContent.DATA:
            added_files.add(e.data_file.file_path)
            hidden = _bitmap(io, now.get(e.data_file.file_path))  # rows its own snapshot already hid
            units.append(Unit(sid, "insert", e.data_file, hidden.serialize(), False, **order))
    if not read_changes:
        return units
    for e in entries_changed_by(io, snapshot, ManifestEntryStatus.DELETED):
        path = e.data_file.file_path
        units.append(Unit(sid, "delete", e.data_file, _bitmap(io, before.get(path)).serialize(), False, **order))
    targets = [t for t in now if t is not None and t not in added_files]
    if targets:
        data_files = {e.data_file.file_path: e.data_file for e in live_data_files(io, snapshot)}
        for target in targets:
            newly = _bitmap(io, now[target]) - _bitmap(io, before.get(target))
            if newly and target in data_files:
                units.append(Unit(sid, "delete", data_files[target], newly.serialize(), True, **order))
    return units


def _file_rows(metadata: TableMetadata, io: FileIO, schema: Schema, unit: Unit) -> pa.Table:
    """The unit's rows, columns by field id as `schema` (in file order, then picked)."""
    scan = ArrowScan(metadata, io, schema, AlwaysTrue(), case_sensitive=False)
    batches = list(scan.to_record_batches([FileScanTask(unit.data_file)]))
    table = pa.Table.from_batches(batches) if batches else schema_to_pyarrow(schema).empty_table()
    positions = np.fromiter(BitMap64.deserialize(unit.positions), dtype=np.int64)
    if unit.keep:
        return table.take(pa.array(positions[positions < table.num_rows]))
    if positions.size == 0:
        return table
    return table.filter(pa.array(keep_mask(positions, 0, table.num_rows)))


def read_units(plan_metadata: str, io_properties: dict[str, str], schema_json: str, units: list[Unit],
               key_columns: tuple[str, ...], with_changes: bool) -> Iterator[pa.Table]:
    """The rows of `units` (one snapshot's units together when `with_changes`, so a key both
    deleted and inserted by it can be told as an update)."""
    metadata = metadata_cache.load(plan_metadata, io_properties)
    io = metadata_cache.file_io(io_properties, plan_metadata)
    schema = Schema.model_validate_json(schema_json)
    by_snapshot: dict[int, list[tuple[Unit, pa.Table]]] = {}  # in the order of `units`: commit order
    for unit in units:
        rows = _file_rows(metadata, io, schema, unit)
        if not with_changes:
            yield rows
            continue
        by_snapshot.setdefault(unit.snapshot_id, []).append((unit, rows))
    for snapshot_id, parts in by_snapshot.items():
        yield from _label(snapshot_id, parts, key_columns)


def _keys(table: pa.Table, key_columns: tuple[str, ...]) -> list[tuple[object, ...]]:
    columns = [table.column(c).to_pylist() for c in key_columns]
    return list(zip(*columns)) if columns else [()] * table.num_rows


def _rows_of(parts: list[tuple[Unit, pa.Table]], change: str, keys: set[tuple[object, ...]],
             key_columns: tuple[str, ...]) -> dict[tuple[object, ...], tuple[object, ...]]:
    """Whole rows (as tuples) of the units of one kind, by key, for `keys` only."""
    out = {}
    for unit, rows in parts:
        if unit.change == change:
            for key, row in zip(_keys(rows, key_columns), zip(*(rows.column(i).to_pylist() for i in range(rows.num_columns)))):
                if key in keys:
                    out[key] = row
    return out


def _label(snapshot_id: int, parts: list[tuple[Unit, pa.Table]], key_columns: tuple[str, ...]) -> Iterator[pa.Table]:
    deleted_keys: set[tuple[object, ...]] = set()
    inserted_keys: set[tuple[object, ...]] = set()
    if key_columns:
        for unit, rows in parts:
            (deleted_keys if unit.change == "delete" else inserted_keys).update(_keys(rows, key_columns))
    updated = deleted_keys & inserted_keys
    # A key rewritten with exactly the same values (an upsert of an unchanged row, another
    # engine's copy-on-write rewrite) changed nothing: its before/after pair is a carry-over,
    # left out as Iceberg's changelog view leaves it out.
    before, after = _rows_of(parts, "delete", updated, key_columns), _rows_of(parts, "insert", updated, key_columns)
    carried = {k for k in updated if before.get(k) == after.get(k)}
    updated -= carried
    for unit, rows in parts:
        if rows.num_rows and carried:
            rows = rows.filter(pa.array([k not in carried for k in _keys(rows, key_columns)]))
        if rows.num_rows == 0:
            continue
        if updated:
            is_update = pa.array([k in updated for k in _keys(rows, key_columns)])
            kind = "update_before" if unit.change == "delete" else "update_after"
            labels = pc.if_else(is_update, pa.scalar(kind), pa.scalar(unit.change))
        else:
            labels = pa.array([unit.change] * rows.num_rows, pa.string())
        rows = rows.append_column(CHANGE_TYPE, labels)
        rows = rows.append_column(COMMIT_SNAPSHOT_ID, pa.array(np.full(rows.num_rows, snapshot_id, dtype=np.int64)))
        rows = rows.append_column(CHANGE_ORDINAL, pa.array(np.full(rows.num_rows, unit.sequence_number, dtype=np.int64)))
        yield rows.append_column(
            COMMIT_TIMESTAMP, pa.array(np.full(rows.num_rows, unit.timestamp_ms * 1000, dtype=np.int64), pa.timestamp("us", tz="UTC"))
        )
