"""Re-decide the keys a keyed batch and a concurrent commit both wrote, instead of refusing.

A keyed batch resolves its keys against the snapshot it was planned on. When another
commit lands meanwhile and writes a row for one of those keys (another lakesink stream or
batch, Iceberg Java's MERGE/UPDATE with deletion vectors or position deletes, a plain
append), both rows would stay live. Refusing the batch stops a streaming query (Spark
gives a sink no way to re-run a micro-batch), so the commit decides those keys itself, as
the later writer, with the same rule a task applies against the index:

* `upsert` (and `cdc` without a sequence column): commit order, this batch is last: the
  other commits' rows of the key are hidden, whatever this batch did with it;
* `cdc` with a sequence column: the highest sequence wins, a tie goes to the later commit
  (as in a task, where an equal sequence applies): this batch may hide the other's row, its
  own new row, or both (a concurrent delete with a higher sequence);
* `dedupe`: the first row kept wins: this batch hides its own duplicate.

Hiding is by position (DVs, or v2 position deletes), merged into the commit's own deletes,
so the batch lands as one snapshot. The outcome per key (the winning row's file and
position, or a delete and its sequence) is written to a small Parquet file named in the
summary (`lakesink.redecided-keys`): every host's key index applies it when it walks the
snapshot, after following the other commits, so the indexes end where the table is.

Only rows written since the planned snapshot can conflict: files added by non-compaction
snapshots since then, and the outputs of compactions that rewrote such files. A concurrent
snapshot with equality deletes cannot be decided by position, nor can `cdc` whose
sequence column is not stored in the table: those still refuse (KEY_WRITTEN_CONCURRENTLY).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.io import FileIO
from pyiceberg.manifest import DataFile, DataFileContent, ManifestContent, ManifestEntry, ManifestEntryStatus
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.snapshots import Operation
from pyroaring import BitMap64

from lakesink_datasource.commit.deletion_vectors import PendingDeletes
from lakesink_datasource.commit.validation import ConflictError, ConflictKind
from lakesink_datasource.iceberg.history import snapshots_after
from lakesink_datasource.iceberg.live_files import (
    entries_changed_by,
    live_data_files,
    live_position_deletes,
    read_hidden_positions,
)
from lakesink_datasource.iceberg.summary_keys import TOMBSTONES
from lakesink_datasource.index.key_columns import (
    WINNER_FILE,
    WINNER_POSITION,
    encode_sequences,
    sequence_columns_in,
    sequence_names,
)
from lakesink_datasource.index.key_encoding import encode_keys, key_hashes
from lakesink_datasource.index.reindex import file_ref

_NEVER = 1 << 62  # this batch's commit order: after every commit it conflicts with


@dataclass(frozen=True)
class KeyRules:
    """How a keyed batch decides a key, and where its own changes are recorded."""

    operation: str  # upsert | cdc | dedupe
    key_columns: tuple[str, ...]
    sequence: tuple[str, ...]  # the table's sequence columns (cdc with them stored in the table; () otherwise)
    sequenced: bool  # cdc with sequence columns, stored in the table or not
    tombstones: tuple[str, ...] = ()  # the batch's sequenced deletes (key columns + SEQUENCE...)
    history: bool = False  # a history table: its rows are versions, not one live row per key
    deleted_keys: tuple[str, ...] = ()  # the batch's deletes without a sequence (key columns)


@dataclass
class Redecision:
    """What the commit decided for the keys it shares with concurrent commits."""

    hide: dict[str, PendingDeletes] = field(default_factory=dict)  # more positions to hide, by data file
    keep: dict[str, BitMap64] = field(default_factory=dict)  # positions of the batch's deletes that win after all
    keys: int = 0  # keys decided at commit
    outcome: pa.Table | None = None  # key columns, SEQUENCE..., WINNER_FILE, WINNER_POSITION


@dataclass(eq=False)
class _Rows:
    """Candidate rows or deletes of the shared keys, one source at a time."""

    keys: list[bytes] = field(default_factory=list)
    sequences: list[bytes | None] = field(default_factory=list)
    orders: list[int] = field(default_factory=list)  # commit order (data sequence number; _NEVER: this batch)
    entries: list[DataFile | None] = field(default_factory=list)  # the row's data file; None: a delete
    positions: list[int] = field(default_factory=list)
    # Where each candidate's key columns (+ SEQUENCE...) are: a table read from a file, and the row.
    values: list[tuple[pa.Table, int]] = field(default_factory=list)


def redecide(
    io: FileIO,
    base: TableMetadata,
    planned_snapshot_id: int | None,
    touched: np.ndarray,
    rules: KeyRules,
    added: Sequence[DataFile],
    pending: Mapping[str, PendingDeletes],
) -> Redecision:
    """Decide the keys of this batch (hashes `touched`) that commits after the planned
    snapshot also wrote. `added`: the batch's data files; `pending`: the positions it hides
    as they apply to `base` (after the rebase onto compactions)."""
    if not len(touched):
        return Redecision()
    theirs = _rows_written_since(io, base, planned_snapshot_id, touched, rules, own={f.file_path for f in added})
    if not theirs.keys:
        return Redecision()
    for check in _DECIDABLE:
        check(rules)
    shared = set(theirs.keys)
    return _decide(theirs, _our_rows(io, rules, added, pending, shared), rules, base)


def _rows_written_since(
    io: FileIO, base: TableMetadata, planned_snapshot_id: int | None, touched: np.ndarray, rules: KeyRules, own: set[str]
) -> _Rows:
    """The live rows (and, sequenced, the deletes) of keys in `touched` that commits after
    the planned snapshot wrote, oldest commit first; `own`: the batch's own files, skipped."""
    theirs = _Rows()
    newest_first, _found = snapshots_after(base, planned_snapshot_id)
    if not newest_first:
        return theirs
    state = _BaseFiles(io, base)
    written_since: set[str] = set()
    tombstone_files: list[tuple[str, int]] = []
    for snapshot in reversed(newest_first):
        adds = [e for e in entries_changed_by(io, snapshot, ManifestEntryStatus.ADDED) if e.data_file.content == DataFileContent.DATA]
        paths = [e.data_file.file_path for e in adds]
        if snapshot.summary is not None and snapshot.summary.operation == Operation.REPLACE:
            # A compaction carries rows written since the planned snapshot only if it
            # rewrote files added since then.
            removed = entries_changed_by(io, snapshot, ManifestEntryStatus.DELETED)
            if not any(e.data_file.file_path in written_since for e in removed):
                continue
        written_since.update(paths)
        equality = any(
            e.data_file.content == DataFileContent.EQUALITY_DELETES
            for e in entries_changed_by(io, snapshot, ManifestEntryStatus.ADDED, ManifestContent.DELETES)
        )
        order = snapshot.sequence_number or 0
        for entry in adds:
            path = entry.data_file.file_path
            if path in own:
                continue
            # Only the base's DVs count as hidden here: a position of the batch's own deletes in
            # a file written since it was planned was put there by the rebase (a row moved by a
            # compaction, or found by key), and is decided again like any other row.
            found = _touched_rows(io, path, rules, touched, hidden=partial(state.hidden, path))
            if found is None or path not in state.live:
                continue
            if equality:
                raise _undecidable(snapshot.snapshot_id, "it adds equality deletes, which hide rows by value, not by position")
            _add_rows(theirs, found, state.live[path].data_file, order)
        props = snapshot.summary.additional_properties if snapshot.summary else {}
        tombstone_files += [(p, order) for p in props.get(TOMBSTONES, "").split(",") if p]
    if rules.sequenced:
        for path, order in tombstone_files:
            _add_deletes(theirs, _read_keys_in(io, path, rules, touched, sequenced=True), order, sequenced=True)
    return theirs


# What makes keys another commit also wrote undecidable at commit, checked in this order once
# such keys are found (equality deletes are refused while the commits are read).
def _refuse_history(rules: KeyRules) -> None:
    if rules.history:
        raise _undecidable(
            None, "the table keeps history, and the versions each commit wrote for those keys cannot be merged at commit "
            "(each ended the version the other also ended)"
        )


def _refuse_unstored_sequence(rules: KeyRules) -> None:
    if rules.sequenced and not rules.sequence:
        raise _undecidable(
            None, "the table does not store the sequence column, so the other commit's sequences are unknown "
            "(keep the sequence column in the table to let lakesink decide such keys at commit)"
        )


_DECIDABLE: tuple[Callable[[KeyRules], None], ...] = (_refuse_history, _refuse_unstored_sequence)


def _our_rows(
    io: FileIO, rules: KeyRules, added: Sequence[DataFile], pending: Mapping[str, PendingDeletes], shared: set[bytes]
) -> _Rows:
    """This batch's side of the `shared` keys: its live rows, its tombstones and deletes."""
    # Filtered by the shared keys only: a much smaller filter than every key the batch touched.
    narrowed = np.unique(key_hashes(list(shared)))
    ours = _Rows()
    for f in added:
        found = _touched_rows(io, f.file_path, rules, narrowed, hidden=partial(_hidden, None, pending.get(f.file_path)))
        _add_rows(ours, _only(found, shared), f, _NEVER)
    for path in rules.tombstones:
        _add_deletes(ours, _only(_read_keys_in(io, path, rules, narrowed, sequenced=True), shared), _NEVER, sequenced=True)
    for path in rules.deleted_keys:
        _add_deletes(ours, _only(_read_keys_in(io, path, rules, narrowed, sequenced=False), shared), _NEVER, sequenced=False)
    return ours


class _BaseFiles:
    """The base's live data files and DVs, read only when a shared key is found (a batch
    whose concurrent commits share no key never needs them)."""

    def __init__(self, io: FileIO, base: TableMetadata) -> None:
        self._io, self._base = io, base
        self._live: dict[str, ManifestEntry] | None = None
        self._dvs: dict[str, ManifestEntry] | None = None

    @property
    def live(self) -> dict[str, ManifestEntry]:
        if self._live is None:
            self._live = {e.data_file.file_path: e for e in live_data_files(self._io, self._base.current_snapshot())}
        return self._live

    def hidden(self, path: str) -> BitMap64:
        if self._dvs is None:
            self._dvs = live_position_deletes(self._io, self._base.current_snapshot())
        dv = self._dvs.get(path)
        return _hidden(read_hidden_positions(self._io, dv.data_file) if dv is not None else None, None)


def _decide(theirs: _Rows, ours: _Rows, rules: KeyRules, base: TableMetadata) -> Redecision:
    """Per shared key: the winner, the rows to hide, the outcome row."""
    by_key: dict[bytes, list[tuple[_Rows, int]]] = defaultdict(list)
    for rows in (theirs, ours):
        for i, key in enumerate(rows.keys):
            by_key[key].append((rows, i))
    out = Redecision()
    outcome: dict[int, tuple[pa.Table, list[int], list[str | None], list[int | None]]] = {}  # by source table
    refs: dict[str, str] = {}  # data file path -> the index's name of it
    for candidates in by_key.values():
        mine = [(r, i) for r, i in candidates if r is ours]
        if not mine:
            continue  # this batch left the key alone (a late change it ignored): nothing to decide
        # This batch's own state of the key: its live row if it has one, else its delete.
        own_rows = [(r, i) for r, i in mine if r.entries[i] is not None]
        own = own_rows[0] if own_rows else max(mine, key=lambda c: c[0].sequences[c[1]] or b"")
        others = [(r, i) for r, i in candidates if r is theirs]
        if rules.operation == "dedupe":
            first = min((c for c in others if c[0].entries[c[1]] is not None), key=lambda c: c[0].orders[c[1]], default=None)
            winner = own if first is None else first
        elif rules.sequenced:
            winner = max([*others, own], key=lambda c: (c[0].sequences[c[1]] or b"", c[0].orders[c[1]]))
        else:
            winner = own
        for rows, i in [*others, *own_rows]:
            entry = rows.entries[i]
            if entry is not None and not (rows is winner[0] and i == winner[1]):
                _hide(out.hide, base, entry, rows.positions[i])
        rows, i = winner
        entry = rows.entries[i]
        if entry is not None and rows is theirs:
            out.keep.setdefault(entry.file_path, BitMap64()).add(rows.positions[i])
        if entry is not None and entry.file_path not in refs:
            refs[entry.file_path] = file_ref(base, entry)
        source, row = rows.values[i]
        _table, taken, files, positions = outcome.setdefault(id(source), (source, [], [], []))
        taken.append(row)
        files.append(refs[entry.file_path] if entry is not None else None)
        positions.append(rows.positions[i] if entry is not None else None)
        out.keys += 1
    if outcome:
        parts = []
        for source, taken, files, positions in outcome.values():
            part = source.take(pa.array(taken, pa.int64()))
            for name in sequence_names(max(len(rules.sequence), 1)):
                if name not in part.column_names:
                    part = part.append_column(name, pa.nulls(part.num_rows, pa.null()))
            parts.append(part.append_column(WINNER_FILE, pa.array(files, pa.string())).append_column(WINNER_POSITION, pa.array(positions, pa.int64())))
        out.outcome = pa.concat_tables(parts, promote_options="permissive")
    return out


def _undecidable(snapshot_id: int | None, why: str) -> ConflictError:
    where = f"snapshot {snapshot_id}, committed concurrently," if snapshot_id is not None else "a commit since this batch was planned"
    return ConflictError(
        ConflictKind.KEY_WRITTEN_CONCURRENTLY,
        f"{where} wrote keys this batch also changed, and lakesink cannot decide them at commit: {why}. "
        "The batch is refused so no key gets two live rows (restart the query: the replay resolves the keys against the new state)",
    )


def _hidden(dv: BitMap64 | None, pending: PendingDeletes | None) -> BitMap64:
    hidden = BitMap64() if dv is None else dv
    return hidden | pending.positions if pending is not None else hidden


def _matching(hashes: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """Indices of `hashes` found in the sorted, unique `wanted` (a binary search each: no
    sort or hash table of the file's keys)."""
    if not len(wanted) or not len(hashes):
        return np.zeros(0, dtype=np.int64)
    at = np.minimum(np.searchsorted(wanted, hashes), len(wanted) - 1)
    return np.flatnonzero(wanted[at] == hashes)


def _hide(hide: dict[str, PendingDeletes], base: TableMetadata, entry: DataFile, position: int) -> None:
    pending = hide.get(entry.file_path)
    if pending is None:
        pending = hide[entry.file_path] = PendingDeletes(entry.spec_id, entry.partition, BitMap64())
    pending.positions.add(position)


@dataclass(frozen=True)
class _Found:
    table: pa.Table  # key columns (+ the sequence columns as SEQUENCE...) of the touched rows
    keys: list[bytes]
    positions: np.ndarray


def _touched_rows(io: FileIO, path: str, rules: KeyRules, touched: np.ndarray, hidden: Callable[[], BitMap64]) -> _Found | None:
    """The visible rows of a data file whose key hash this batch touched (`hidden`: the
    positions not visible, read only when some row matched)."""
    columns = list(rules.key_columns) + list(rules.sequence)
    with io.new_input(path).open() as stream:
        table = pq.read_table(stream, columns=columns)
    keys = encode_keys([table.column(c) for c in rules.key_columns], names=list(rules.key_columns))
    chosen = _matching(key_hashes(keys), touched)
    if len(chosen):
        invisible = hidden()
        if len(invisible):
            chosen = chosen[np.fromiter((p not in invisible for p in chosen.tolist()), dtype=bool, count=len(chosen))]
    if not len(chosen):
        return None
    picked = table.take(pa.array(chosen))
    if rules.sequence:
        picked = picked.rename_columns([*rules.key_columns, *sequence_names(len(rules.sequence))])
    return _Found(picked, [keys[i] for i in chosen.tolist()], chosen)


def _read_keys_in(io: FileIO, path: str, rules: KeyRules, touched: np.ndarray, sequenced: bool) -> _Found | None:
    """The rows of a deletes report (tombstones, deleted keys) whose key hash this batch touched."""
    with io.new_input(path).open() as stream:
        table = pq.read_table(stream)
    table = table.select([*rules.key_columns, *(sequence_columns_in(table) if sequenced else [])])
    keys = encode_keys([table.column(c) for c in rules.key_columns], names=list(rules.key_columns))
    chosen = _matching(key_hashes(keys), touched)
    if not len(chosen):
        return None
    return _Found(table.take(pa.array(chosen)), [keys[i] for i in chosen.tolist()], chosen)


def _only(found: _Found | None, keys: set[bytes]) -> _Found | None:
    if found is None:
        return None
    chosen = [i for i, k in enumerate(found.keys) if k in keys]
    if not chosen:
        return None
    return _Found(found.table.take(pa.array(chosen, pa.int64())), [found.keys[i] for i in chosen], found.positions[chosen])


def _add_rows(rows: _Rows, found: _Found | None, data_file: DataFile, order: int) -> None:
    if found is None:
        return
    sequences = _sequences(found.table)
    for i, key in enumerate(found.keys):
        rows.keys.append(key)
        rows.sequences.append(sequences[i])
        rows.orders.append(order)
        rows.entries.append(data_file)
        rows.positions.append(int(found.positions[i]))
        rows.values.append((found.table, i))


def _add_deletes(rows: _Rows, found: _Found | None, order: int, sequenced: bool) -> None:
    if found is None:
        return
    sequences = _sequences(found.table) if sequenced else [None] * len(found.keys)
    for i, key in enumerate(found.keys):
        rows.keys.append(key)
        rows.sequences.append(sequences[i])
        rows.orders.append(order)
        rows.entries.append(None)
        rows.positions.append(-1)
        rows.values.append((found.table, i))


def _sequences(table: pa.Table) -> list[bytes | None]:
    if not sequence_columns_in(table):
        return [None] * table.num_rows
    sequences = encode_sequences(table)
    if sequences is None:
        raise ConflictError(ConflictKind.KEY_WRITTEN_CONCURRENTLY, "a concurrent row has no sequence value; cannot decide its key at commit")
    return list(sequences)
