"""History tables (`history=true`): every version of a key, with the interval it held.

A version is a row with `__start_at` and `__end_at` (the current one: `__end_at` null). The
key index points at each key's current version, as it points at a plain keyed table's row,
and keeps the sequence of the last change applied to the key. Per key shard, under its lock,
`decide`:

- reads the current versions of the chunk's keys from their data files (`current_rows.py`);
  a key with a change older than its last (a late event) has all of its versions read from
  the table's live files (`scan_versions`);
- applies each key's changes (in sequence order, one per sequence) to its versions, the
  rules of docs/usage.md's history section (tests/scd2_model.py is an independent model of
  them): a change of tracked columns ends the current version and starts one, a change of
  others (or of none) updates it in place and becomes the key's newest, a delete ends it, a
  late change splits the version it falls in (taking it up again where a later change of
  equal values extended it) or fills a deleted period before a later version, a re-sent
  change does nothing;
- gives back the versions that changed: each is hidden where it was and written as it is
  now, and the new current version is what the index points at.

No join and no rewrite: the rows a change replaces are hidden by the batch's deletion
vectors, as any keyed write's are.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.io import FileIO
from pyiceberg.table.metadata import TableMetadata

from lakesink_datasource.arrays import take_items
from lakesink_datasource.iceberg.live_files import live_data_files, live_position_deletes, without_hidden_rows
from lakesink_datasource.index.key_encoding import encode_keys


def encode_optional(values: pa.Array) -> list[bytes | None]:
    """Order-preserving encodings of a column's values, None for nulls."""
    out: list[bytes | None] = [None] * len(values)
    valid = np.flatnonzero(np.asarray(values.is_valid().to_numpy(zero_copy_only=False), dtype=bool))
    if len(valid):
        for i, e in zip(valid.tolist(), encode_keys([values.take(pa.array(valid))])):
            out[i] = e
    return out


@dataclass
class Version:
    start: int  # into the bounds (`Versions.bounds`)
    end: int  # into the bounds; `Versions.open`: none (the current version)
    value: int  # into the values: a change (< n) or an existing row (n + its row)
    existing: int | None = None  # the existing row it was read from (None: new)
    changed: bool = False


@dataclass
class KeyOutcome:
    versions: list[Version]
    last: bytes | None
    dropped: list[int] = field(default_factory=list)  # existing rows merged away


class Versions:
    """A key shard's chunk: its changes (the rows to write, in the table's schema), the
    existing versions read from the table, and the bounds both give."""

    def __init__(
        self, changes: pa.Table, existing: pa.Table, change_bounds: pa.Array, start: str, end: str, tracked: Sequence[str],
        data: Sequence[str], partial: bool, existing_latest: pa.Array | None = None, sequenced: bool = True,
    ) -> None:
        self.n, self.m = changes.num_rows, existing.num_rows
        self.changes, self.existing = changes, existing
        starts = existing.column(start).combine_chunks()
        # bounds: each change's (the sequence it starts a version at), each existing row's
        # start, its end, the sequence of the last change it took (a version a change of
        # equal values extended keeps that change's sequence: a late change before it must
        # not run past it); `open` is the null bound of a current version.
        self.bounds = pa.concat_arrays([
            change_bounds, starts, existing.column(end).combine_chunks(),
            existing_latest if existing_latest is not None else starts, pa.nulls(1, change_bounds.type),
        ])
        self.open = self.n + 3 * self.m
        self.tracked, self.data, self.partial = list(tracked), list(data), partial
        # Without a sequence no change is late: a change of nothing but the batch's time
        # leaves its version's row alone (a nightly snapshot rewrites no unchanged row).
        self.sequenced = sequenced
        # What the one-by-one rules compare: made when a key first needs them (most chunks
        # have none, see `decide`).
        self._order: list[bytes | None] | None = None
        self._columns: dict[str, list[object]] = {}

    @property
    def order(self) -> list[bytes | None]:
        if self._order is None:
            self._order = encode_optional(self.bounds)
        return self._order

    def _column(self, name: str) -> list[object]:
        values = self._columns.get(name)
        if values is None:
            both = [self.changes.column(name), *([self.existing.column(name)] if self.m else [])]
            values = self._columns[name] = [v for part in both for v in part.to_pylist()]
        return values

    def existing_version(self, row: int) -> Version:
        start, end = self.n + row, self.n + self.m + row
        return Version(start, end if self.order[end] is not None else self.open, self.n + row, row)

    def latest(self, value: int) -> int:
        """The bound of the last change a version's values took: a change's own, an existing
        row's recorded one."""
        return value if value < self.n else self.n + 2 * self.m + (value - self.n)

    def _same(self, a: int, b: int, columns: Sequence[str]) -> bool:
        return all(self._column(c)[a] == self._column(c)[b] for c in columns)

    def _before(self, a: int, b: int) -> bool:
        """Bound a comes before bound b (an open bound after every other)."""
        x, y = self.order[a], self.order[b]
        if y is None:
            return x is not None
        return x is not None and x < y

    def apply(self, versions: list[Version], last: bytes | None, changes: Sequence[tuple[int, bytes | None, bool]]) -> KeyOutcome:
        """A key's versions (by start) after its changes: (change row, sequence, delete), in
        sequence order, one per sequence. Every change counts, one equal to the current
        version's values too: it is the key's newest, and the version keeps its sequence."""
        out = KeyOutcome(sorted(versions, key=lambda v: self.order[v.start] or b""), last)
        for row, seq, delete in changes:
            if out.last is not None and seq == out.last:
                continue  # re-sent
            if out.last is None or seq is None or seq > out.last:
                self._in_order(out.versions, row, delete)
                out.last = seq
            else:
                self._late(out, row, delete)
        return out

    def _current(self, versions: list[Version]) -> Version | None:
        return next((v for v in versions if v.end == self.open), None)

    def _in_order(self, versions: list[Version], row: int, delete: bool) -> None:
        """A change newer than the key's last one."""
        current = self._current(versions)
        if delete:
            if current is not None:
                current.end, current.changed = row, True
            return
        if current is not None and self._same(current.value, row, self.tracked):
            # In place: the version keeps its start and takes the change's values (equal ones
            # too: the row then records the change's sequence, which a late change must see).
            if self.sequenced or not self._same(current.value, row, self.data):
                current.value, current.changed = row, True
            return
        if current is not None:
            current.end, current.changed = row, True
        versions.append(Version(row, self.open, row, None, True))

    def _late(self, out: KeyOutcome, row: int, delete: bool) -> None:
        versions = out.versions
        if any(v.end != self.open and self.order[v.end] == self.order[row] for v in versions):
            return  # re-sent: a version ends there, at the change (a delete, or the next version's start) once applied
        holding = next((v for v in versions if not self._before(row, v.start) and self._before(row, v.end)), None)
        if holding is not None:
            latest = self.latest(holding.value)
            if self.order[holding.start] == self.order[row] or self.order[latest] == self.order[row]:
                return  # re-sent
            if not delete and self._same(holding.value, row, self.tracked):
                return  # equal values: the version goes on
            was = holding.end
            holding.end, holding.changed = row, True
            if self._before(row, latest) and self._before(latest, was):
                # A change of equal values extended the version after the late one: the
                # version takes up again there.
                resumed = Version(latest, was, holding.value, None, True)
                if not delete:
                    self._insert(out, Version(row, latest, row, None, True))
                self._insert(out, resumed)
                return
            if not delete:
                self._insert(out, Version(row, was, row, None, True))
            return
        later = [v for v in versions if self._before(row, v.start)]
        if delete or not later:
            # A delete outside every version changes nothing; a write after the key's last
            # version, in the period its last delete ended, has no known end: not recorded.
            return
        self._insert(out, Version(row, later[0].start, row, None, True))

    def _insert(self, out: KeyOutcome, new: Version) -> None:
        """A version made by a late change, merged with the version it runs into when their
        tracked columns are equal (that version's start was no change after all)."""
        out.versions.append(new)
        out.versions.sort(key=lambda v: self.order[v.start] or b"")
        following = next((v for v in out.versions if v is not new and new.end != self.open and self.order[v.start] == self.order[new.end]), None)
        if following is not None and self._same(following.value, new.value, self.tracked):
            new.end, new.value = following.end, following.value
            out.versions.remove(following)
            if following.existing is not None:
                out.dropped.append(following.existing)


def scan_versions(io: FileIO, metadata: TableMetadata, key_columns: Sequence[str], wanted: set[bytes]) -> list[tuple[str, np.ndarray, list[bytes]]]:
    """Where every live row of the keys `wanted` (encoded) is: per data file, the rows'
    positions and keys. A late change needs its key's whole history, and the index knows
    only each key's current version."""
    snapshot = metadata.current_snapshot()
    deletes = live_position_deletes(io, snapshot)
    found = []
    for entry in live_data_files(io, snapshot):
        path = entry.data_file.file_path
        with io.new_input(path).open() as stream:
            keys_table = pq.read_table(stream, columns=list(key_columns))
        visible, positions = without_hidden_rows(io, keys_table, deletes.get(path))
        if visible.num_rows == 0:
            continue
        keys = encode_keys([visible.column(c) for c in key_columns], names=list(key_columns))
        hit = [i for i, k in enumerate(keys) if k in wanted]
        if hit:
            found.append((path, np.asarray(positions)[hit], [keys[i] for i in hit]))
    return found


def with_bounds(rows: pa.Table, start: str, end: str, starts: pa.Array, ends: pa.Array) -> pa.Table:
    """`rows` with their start and end columns set."""
    rows = rows.set_column(rows.schema.get_field_index(start), rows.schema.field(start), starts.cast(rows.schema.field(start).type))
    return rows.set_column(rows.schema.get_field_index(end), rows.schema.field(end), ends.cast(rows.schema.field(end).type))


def take_rows(changes: pa.Table, existing: pa.Table, values: Sequence[int]) -> pa.Table:
    """Rows by value index: a change (< n) or an existing row (n + its row)."""
    both = pa.concat_tables([changes, existing]) if existing.num_rows else changes
    return both.take(pa.array(values, pa.int64()))


def unchanged(a: pa.Array, b: pa.Array) -> np.ndarray:
    """Element-wise equality with null equal to null (any type)."""
    if len(a) == 0:
        return np.zeros(0, dtype=bool)
    if pa.types.is_nested(a.type) or not a.type.equals(b.type):
        return np.fromiter((x == y for x, y in zip(a.to_pylist(), b.to_pylist())), dtype=bool, count=len(a))
    equal = pc.fill_null(pc.equal(a, b), False)
    return np.asarray(pc.or_(equal, pc.and_(a.is_null(), b.is_null())).to_numpy(zero_copy_only=False), dtype=bool)


Change = tuple[int, bytes | None, bool]  # (change row, sequence, delete)


class Runs:
    """A chunk's changes grouped by key: one change per key and sequence (the later row of
    equal ones; without a sequence, the key's last row), each key's in sequence order."""

    def __init__(self, keys: list[bytes], sequences: list[bytes] | None, deletes: np.ndarray, keep: np.ndarray | None = None) -> None:
        n = len(keys)
        columns: dict[str, pa.Array] = {"k": pa.array(keys, pa.binary())}
        if sequences is not None:
            columns["s"] = pa.array(sequences, pa.binary())
        columns["r"] = pa.array(np.arange(n, dtype=np.int64))
        order = pc.sort_indices(pa.table(columns), sort_keys=[(c, "ascending") for c in columns]).to_numpy().astype(np.int64)
        if keep is not None:
            order = order[keep[order]]
        k = columns["k"].take(pa.array(order))
        m = len(order)
        same_key = np.zeros(m, dtype=bool)  # row i has the key of row i + 1
        if m > 1:
            same_key[:-1] = pc.equal(k.slice(0, m - 1), k.slice(1)).to_numpy(zero_copy_only=False)
        later = same_key.copy()  # row i is replaced by row i + 1 (same key and sequence, or no sequence)
        if sequences is not None and m > 1:
            s = columns["s"].take(pa.array(order))
            later[:-1] &= pc.equal(s.slice(0, m - 1), s.slice(1)).to_numpy(zero_copy_only=False)
        kept = np.flatnonzero(~later)
        self.rows = order[kept]  # change rows, by key then sequence
        starts = np.ones(len(kept), dtype=bool)
        if len(kept) > 1:
            starts[1:] = ~same_key[kept[:-1]]
        self.first = np.flatnonzero(starts)  # each key's first change (into `rows`)
        self.count = np.diff(np.append(self.first, len(kept)))
        self.keys: list[bytes] = k.take(pa.array(kept[self.first])).to_pylist() if len(kept) else []
        self._sequences = sequences
        self._deletes = deletes

    def sequence(self, row: int) -> bytes | None:
        return self._sequences[row] if self._sequences is not None else None

    def sequences_of(self, rows: np.ndarray) -> list[bytes | None]:
        if self._sequences is None:
            return [None] * len(rows)
        return take_items(self._sequences, rows)

    def delete(self, row: int) -> bool:
        return bool(self._deletes[row])

    def of(self, key: int) -> list[Change]:
        """Key `key`'s changes (by its place in `keys`)."""
        rows = self.rows[self.first[key] : self.first[key] + self.count[key]].tolist()
        return [(r, self.sequence(r), self.delete(r)) for r in rows]


@dataclass
class Decision:
    """What a key shard's chunk does: rows to write (their values, into the changes then the
    existing rows; their bounds, into `Versions.bounds`), which of them is its key's current
    version, the existing rows that go, and the keys left without a current version."""

    values: np.ndarray
    starts: np.ndarray
    ends: np.ndarray
    current: np.ndarray  # bool per row written
    owner: np.ndarray  # the key of each row written
    hidden: np.ndarray  # existing rows
    tombstones: list[tuple[int, int, bytes | None]]  # (key, the change that deleted it, its last sequence)
    last: list[bytes | None]  # each key's last sequence after the chunk


def decide(
    versions: Versions, runs: Runs, which: np.ndarray, last: Sequence[bytes | None], live: np.ndarray,
    existing_of: dict[int, list[int]], late: np.ndarray,
) -> Decision:
    """The versions a shard's keys' changes make: keys `which` of `runs`, their last sequence,
    whether they have a current version, and their existing rows (`existing_of`: the current
    version, or every version of a key a late change reaches). One change of a key, in order
    (the common case), is decided for all such keys at once; the rest one by one."""
    count = runs.count[which]
    simple = (count == 1) & ~late
    for j in np.flatnonzero(simple).tolist():
        if last[j] is None:
            continue
        seq = runs.sequence(int(runs.rows[runs.first[which[j]]]))
        if seq is not None and not seq > last[j]:
            simple[j] = False  # a re-sent change: the rules say
    parts = [_decide_simple(versions, runs, which, live, existing_of, np.flatnonzero(simple))]
    complex_keys = np.flatnonzero(~simple)
    if len(complex_keys):
        changes = {int(j): runs.of(int(which[j])) for j in complex_keys}
        parts.append(_decide_each(versions, changes, last, live, existing_of, complex_keys))
    final = list(last)
    for part in parts:
        for i, seq in zip(part.last_keys.tolist(), part.last_values):
            final[i] = seq
    return Decision(
        np.concatenate([p.values for p in parts]), np.concatenate([p.starts for p in parts]), np.concatenate([p.ends for p in parts]),
        np.concatenate([p.current for p in parts]), np.concatenate([p.owner for p in parts]), np.concatenate([p.hidden for p in parts]),
        [t for p in parts for t in p.tombstones], final,
    )


@dataclass
class _Part:
    values: np.ndarray
    starts: np.ndarray
    ends: np.ndarray
    current: np.ndarray
    owner: np.ndarray
    hidden: np.ndarray
    tombstones: list[tuple[int, int, bytes | None]]
    last_keys: np.ndarray  # keys whose last sequence changed...
    last_values: list[bytes | None]  # ...and to what


def _decide_simple(
    v: Versions, runs: Runs, which: np.ndarray, live: np.ndarray, existing_of: dict[int, list[int]], keys: np.ndarray,
) -> _Part:
    """Keys with one change, newer than their last: with array operations."""
    k = len(keys)
    row = runs.rows[runs.first[which[keys]]] if k else np.zeros(0, dtype=np.int64)
    delete = np.asarray(runs._deletes[row], dtype=bool) if k else np.zeros(0, dtype=bool)
    alive = live[keys] if k else np.zeros(0, dtype=bool)
    current = np.full(k, -1, dtype=np.int64)
    for j in np.flatnonzero(alive).tolist():
        current[j] = existing_of[int(keys[j])][0]
    tracked_same = np.zeros(k, dtype=bool)
    data_same = np.zeros(k, dtype=bool)  # without a sequence: equal in every column (nothing to write)
    compared = np.flatnonzero(alive & ~delete)
    if len(compared):
        new = v.changes.take(pa.array(row[compared]))
        old = v.existing.take(pa.array(current[compared]))
        same_tracked = np.ones(len(compared), dtype=bool)
        for c in v.tracked:
            same_tracked &= unchanged(new.column(c).combine_chunks(), old.column(c).combine_chunks())
        tracked_same[compared] = same_tracked
        if not v.sequenced:
            same_data = same_tracked.copy()
            for c in v.data:
                if c not in v.tracked:
                    same_data &= unchanged(new.column(c).combine_chunks(), old.column(c).combine_chunks())
            data_same[compared] = same_data
    opens = ~delete & ~(alive & tracked_same)  # a new version starts at the change
    # The current version takes the change's values, equal ones too where there is a
    # sequence: its row then records the change's sequence (the key's newest, which a late
    # change must be placed before).
    in_place = ~delete & alive & tracked_same & ~data_same
    closes = alive & (delete | ~tracked_same)  # the current version ends at the change
    n = v.n
    values = np.concatenate([current[closes] + n, row[opens], row[in_place]])
    starts = np.concatenate([n + current[closes], row[opens], n + current[in_place]])
    ends = np.concatenate([row[closes], np.full(int(opens.sum()) + int(in_place.sum()), v.open, dtype=np.int64)])
    is_current = np.concatenate([np.zeros(int(closes.sum()), dtype=bool), np.ones(int(opens.sum()) + int(in_place.sum()), dtype=bool)])
    owner = np.concatenate([keys[closes], keys[opens], keys[in_place]])
    hidden = np.concatenate([current[closes], current[in_place & ~closes]])
    # A delete leaves its key without a current version: a tombstone (the index keeps the
    # delete's sequence), for a key that had one or a sequence it had not seen.
    tombstones = [(int(keys[j]), int(row[j]), runs.sequence(int(row[j]))) for j in np.flatnonzero(delete).tolist()]
    # Every change here counts as its key's last.
    return _Part(values, starts, ends, is_current, owner, hidden, tombstones, keys, runs.sequences_of(row))


def _decide_each(
    v: Versions, changes: dict[int, list[Change]], last: Sequence[bytes | None], live: np.ndarray, existing_of: dict[int, list[int]],
    keys: np.ndarray,
) -> _Part:
    """Keys with several changes or late ones: by the rules, one by one."""
    values: list[int] = []
    starts: list[int] = []
    ends: list[int] = []
    current: list[bool] = []
    owner: list[int] = []
    hidden: list[int] = []
    tombstones: list[tuple[int, int, bytes | None]] = []
    last_of: dict[int, bytes | None] = {}
    for i in keys.tolist():
        before = [v.existing_version(r) for r in existing_of.get(i, ())]
        outcome = v.apply(before, last[i], changes[i])
        for version in outcome.versions:
            if version.existing is None or version.changed:
                if version.existing is not None:
                    hidden.append(version.existing)
                values.append(version.value)
                starts.append(version.start)
                ends.append(version.end)
                current.append(version.end == v.open)
                owner.append(i)
        hidden += outcome.dropped
        if outcome.last != last[i]:
            last_of[i] = outcome.last
        has_current = any(version.end == v.open for version in outcome.versions)
        if not has_current and (live[i] or outcome.last != last[i]):
            # The tombstone file holds the change that left the key deleted (its sequence).
            row = next((r for r, seq, _ in changes[i] if seq == outcome.last), changes[i][-1][0])
            tombstones.append((i, row, outcome.last))
    return _Part(
        np.asarray(values, dtype=np.int64), np.asarray(starts, dtype=np.int64), np.asarray(ends, dtype=np.int64),
        np.asarray(current, dtype=bool), np.asarray(owner, dtype=np.int64), np.asarray(hidden, dtype=np.int64), tombstones,
        np.asarray(list(last_of), dtype=np.int64), list(last_of.values()),
    )
