"""Move a batch's pending deletes onto the files a concurrent compaction wrote.

A keyed batch resolves its keys into row positions of the files live in the snapshot it
was planned against. When a compaction (a `replace` snapshot, lakesink's or another
engine's, e.g. Iceberg Java's `rewrite_data_files`) commits while the batch is in flight,
some of those files are no longer in the table: their live rows now sit in the
compaction's new files, at other positions. Failing the batch would stop a stream whenever
someone compacts beside it, so each hidden row is looked up where the compaction put it:

1. by row lineage: a v3 rewrite keeps every row's `_row_id`, and ids are unique in a table;
2. else by key (a rewrite that dropped lineage, or format version 2): in a keyed table the
   rows the batch hides are the live rows of their keys, and the compaction kept them.

A row found in neither way was hidden by another commit before the compaction dropped it:
there is nothing left to hide. Targets that a non-`replace` snapshot removed, or whose old
files cannot be read any more, are left as they are, so validation refuses the batch with
the reason.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np
from pyiceberg.io import FileIO
from pyiceberg.manifest import DataFile, ManifestEntry, ManifestEntryStatus
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.snapshots import Operation
from pyroaring import BitMap64

from lakesink_datasource.commit.deletion_vectors import PendingDeletes
from lakesink_datasource.iceberg.history import snapshots_after
from lakesink_datasource.iceberg.live_files import (
    data_entries_changed_by,
    live_data_files,
    live_position_deletes,
    without_hidden_rows,
)
from lakesink_datasource.iceberg.manifests import data_file_first_row_id
from lakesink_datasource.iceberg.row_lineage import UNKNOWN_ROW_ID, read_with_row_ids, row_ids
from lakesink_datasource.index.key_encoding import encode_keys


@dataclass(frozen=True)
class Rebased:
    pending: dict[str, PendingDeletes]
    # Targets of `pending` neither live in the base nor added by the commit: for validation
    # to refuse (it names the snapshot that removed them).
    missing: frozenset[str] = frozenset()
    moved_files: int = 0  # rewritten files whose hidden rows were moved
    by_row_id: int = 0  # rows found by `_row_id`
    by_key: int = 0  # rows found by key
    gone: int = 0  # rows no longer live anywhere (hidden by another commit first)


def rebase_onto_compactions(
    io: FileIO,
    base: TableMetadata,
    pending: Mapping[str, PendingDeletes],
    added: Iterable[str],
    planned_snapshot_id: int | None,
    key_columns: tuple[str, ...],
) -> Rebased:
    """`pending` with the positions of files that `replace` snapshots after the planned one
    removed moved onto the files they wrote (see the module docstring)."""
    missing = set(pending) - set(added)
    if not missing:
        return Rebased(dict(pending))
    live = {e.data_file.file_path: e for e in live_data_files(io, base.current_snapshot())}
    missing -= set(live)
    unchanged = Rebased(dict(pending), frozenset(missing))
    if not missing:
        return unchanged
    removed, written = _compactions_since(io, base, planned_snapshot_id, missing)
    movable = {path: removed[path] for path in missing if path in removed}
    if not movable:
        return unchanged
    targets = [live[p] for p in written if p in live]
    sources = _read_sources(io, base, planned_snapshot_id, movable, pending, key_columns)
    if sources is None:
        return unchanged
    found = _Targets(io, base, targets, key_columns)
    out = {path: p for path, p in pending.items() if path not in movable}
    by_row_id = by_key = gone = 0
    for source in sources:
        placed = found.place(source)
        if placed is None:
            return unchanged  # rows that cannot be found: validation refuses
        for target_path, positions, how in placed:
            entry = live[target_path].data_file
            earlier = out.get(target_path)
            hidden = BitMap64(positions.tolist())
            # A fresh PendingDeletes: the delta's own stay as planned for the next attempt.
            out[target_path] = PendingDeletes(
                entry.spec_id, entry.partition, hidden if earlier is None else earlier.positions | hidden
            )
            if how == "row_id":
                by_row_id += len(positions)
            else:
                by_key += len(positions)
        gone += source.gone
    return Rebased(out, frozenset(missing - set(movable)), len(movable), by_row_id, by_key, gone)


def _compactions_since(
    io: FileIO, base: TableMetadata, planned_snapshot_id: int | None, missing: set[str]
) -> tuple[dict[str, DataFile], list[str]]:
    """Of `missing`, those a `replace` snapshot since the planned one removed (with their
    entry as removed), and every data file those snapshots wrote (chains of compactions
    included: a file written by one and rewritten by the next is simply not live)."""
    removed: dict[str, DataFile] = {}
    written: list[str] = []
    newest_first, found = snapshots_after(base, planned_snapshot_id)
    if not found:
        return {}, []
    for snapshot in newest_first:
        if snapshot.summary is None or snapshot.summary.operation != Operation.REPLACE:
            continue
        for e in data_entries_changed_by(io, snapshot, ManifestEntryStatus.DELETED):
            if e.data_file.file_path in missing:
                removed[e.data_file.file_path] = e.data_file
        written += [e.data_file.file_path for e in data_entries_changed_by(io, snapshot, ManifestEntryStatus.ADDED)]
    return removed, written


@dataclass
class _Source:
    """The rows a batch hides in one rewritten file: their row ids and keys."""

    path: str
    ids: np.ndarray  # UNKNOWN_ROW_ID where the file carries no lineage
    keys: list[bytes] | None
    gone: int = 0


def _read_sources(
    io: FileIO,
    base: TableMetadata,
    planned_snapshot_id: int | None,
    movable: Mapping[str, DataFile],
    pending: Mapping[str, PendingDeletes],
    key_columns: tuple[str, ...],
) -> list[_Source] | None:
    """None when an old file cannot be read (an expiry deleted it): nothing can be moved."""
    planned = base.snapshot_by_id(planned_snapshot_id) if planned_snapshot_id is not None else None
    # Row ids are inherited from the entry as it was live; the planned snapshot has it, and
    # a rewrite's DELETED entry usually repeats it.
    first_ids = {e.data_file.file_path: data_file_first_row_id(e.data_file) for e in live_data_files(io, planned)} if planned else {}
    out = []
    for path, removed_entry in movable.items():
        positions = np.fromiter(pending[path].positions, dtype=np.int64)
        columns = list(key_columns)
        try:
            table = read_with_row_ids(io, path, columns)
        except FileNotFoundError:
            return None
        first = first_ids.get(path, data_file_first_row_id(removed_entry))
        ids = row_ids(table, positions, first)
        keys = None
        if columns:
            rows = table.select(columns).take(positions)
            keys = encode_keys([rows.column(c) for c in columns], names=columns)
        out.append(_Source(path, ids, keys))
    return out


class _Targets:
    """The live rows of the compactions' new files, looked up by row id and (only when
    some row has to be) by key."""

    def __init__(self, io: FileIO, base: TableMetadata, entries: list[ManifestEntry], key_columns: tuple[str, ...]):
        dvs = live_position_deletes(io, base.current_snapshot())
        self._paths = [e.data_file.file_path for e in entries]
        self._key_columns = list(key_columns)
        ids, files, positions, self._key_tables = [], [], [], []
        for n, entry in enumerate(entries):
            table = read_with_row_ids(io, entry.data_file.file_path, self._key_columns)
            table_live, live_positions = without_hidden_rows(io, table, dvs.get(entry.data_file.file_path))
            ids.append(row_ids(table, live_positions, data_file_first_row_id(entry.data_file)))
            files.append(np.full(len(live_positions), n, dtype=np.int64))
            positions.append(live_positions)
            if key_columns:
                self._key_tables.append(table_live.select(self._key_columns))
        empty = np.empty(0, dtype=np.int64)
        all_ids = np.concatenate(ids) if ids else empty
        self._files = np.concatenate(files) if files else empty
        self._positions = np.concatenate(positions) if positions else empty
        self._order = np.argsort(all_ids, kind="stable")
        self._sorted_ids = all_ids[self._order]
        self._by_key: dict[bytes, int] | None = None

    def _slot_of_key(self) -> dict[bytes, int]:
        if self._by_key is None:
            keys: list[bytes] = []
            for t in self._key_tables:
                keys += encode_keys([t.column(c) for c in self._key_columns], names=self._key_columns)
            self._by_key = {k: i for i, k in enumerate(keys)}
        return self._by_key

    def place(self, source: _Source) -> list[tuple[str, np.ndarray, str]] | None:
        """(target file, positions, "row_id" | "key") for the rows of `source` still live;
        None when rows lack both a known row id and a key."""
        slots = np.full(len(source.ids), -1, dtype=np.int64)
        at = np.searchsorted(self._sorted_ids, source.ids)
        hit = (source.ids != UNKNOWN_ROW_ID) & (at < len(self._sorted_ids))
        hit[hit] = self._sorted_ids[at[hit]] == source.ids[hit]
        slots[hit] = self._order[at[hit]]
        unresolved = np.flatnonzero(~hit)
        if len(unresolved):
            if source.keys is None:
                return None
            by_key = self._slot_of_key()
            for i in unresolved:
                slots[i] = by_key.get(source.keys[i], -1)
        source.gone = int(np.count_nonzero(slots < 0))
        out = []
        for chosen_mask, how in ((hit, "row_id"), (~hit & (slots >= 0), "key")):
            chosen = slots[chosen_mask]
            for n in np.unique(self._files[chosen]):
                mine = chosen[self._files[chosen] == n]
                out.append((self._paths[n], np.sort(self._positions[mine]), how))
        return out
