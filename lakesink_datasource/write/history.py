"""History tables (`history=true`): every version of a key, with the interval it held.

A version is a row with `__start_at` and `__end_at` (the current one: `__end_at` null). The
key index points at each key's current version, as it points at a plain keyed table's row,
and keeps the sequence of the last change applied to the key. Per key shard, under its lock,
`decide_versions`:

- reads the current versions of the chunk's keys from their data files (`current_rows.py`);
  a key with a change older than its last (a late event) has all of its versions read from
  the table's live files (`scan_versions`);
- applies each key's changes (in sequence order, one per sequence) to its versions by the
  rules tests/history_model.py states in plain Python: a change of tracked columns ends the
  current version and starts one, a change of others updates it in place, a delete ends it,
  a late change splits the version it falls in (or fills a deleted period before a later
  version), a re-sent change does nothing;
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
        data: Sequence[str], partial: bool,
    ) -> None:
        self.n, self.m = changes.num_rows, existing.num_rows
        # bounds: each change's (the sequence it starts a version at), each existing row's
        # start, then its end; `open` is the null bound of a current version.
        self.bounds = pa.concat_arrays([
            change_bounds, existing.column(start).combine_chunks(), existing.column(end).combine_chunks(), pa.nulls(1, change_bounds.type),
        ])
        self.open = self.n + 2 * self.m
        self.order = encode_optional(self.bounds)
        columns = list(dict.fromkeys([*tracked, *data]))
        both = pa.concat_tables([changes.select(columns), existing.select(columns)]) if self.m else changes.select(columns)
        self._columns = {c: both.column(c).to_pylist() for c in columns}
        self.tracked, self.data, self.partial = list(tracked), list(data), partial

    def existing_version(self, row: int) -> Version:
        start, end = self.n + row, self.n + self.m + row
        return Version(start, end if self.order[end] is not None else self.open, self.n + row, row)

    def _same(self, a: int, b: int, columns: Sequence[str]) -> bool:
        return all(self._columns[c][a] == self._columns[c][b] for c in columns)

    def _before(self, a: int, b: int) -> bool:
        """Bound a comes before bound b (an open bound after every other)."""
        x, y = self.order[a], self.order[b]
        if y is None:
            return x is not None
        return x is not None and x < y

    def apply(self, versions: list[Version], last: bytes | None, changes: Sequence[tuple[int, bytes | None, bool]]) -> KeyOutcome:
        """A key's versions (by start) after its changes: (change row, sequence, delete), in
        sequence order, one per sequence."""
        out = KeyOutcome(sorted(versions, key=lambda v: self.order[v.start] or b""), last)
        for row, seq, delete in changes:
            if out.last is not None and seq == out.last:
                continue  # re-sent
            if out.last is None or seq is None or seq > out.last:
                if self._in_order(out.versions, row, delete):
                    out.last = seq
            else:
                self._late(out, row, delete)
        return out

    def _current(self, versions: list[Version]) -> Version | None:
        return next((v for v in versions if v.end == self.open), None)

    def _in_order(self, versions: list[Version], row: int, delete: bool) -> bool:
        """A change newer than the key's last one; False when it changes nothing."""
        current = self._current(versions)
        if delete:
            if current is not None:
                current.end, current.changed = row, True
            return True
        if current is not None and self._same(current.value, row, self.tracked):
            if self._same(current.value, row, self.data):
                return False  # nothing but the sequence differs (a re-sent event with a new offset)
            current.value, current.changed = row, True  # in place: the version keeps its start
            return True
        if current is not None:
            current.end, current.changed = row, True
        versions.append(Version(row, self.open, row, None, True))
        return True

    def _late(self, out: KeyOutcome, row: int, delete: bool) -> None:
        versions = out.versions
        holding = next((v for v in versions if not self._before(row, v.start) and self._before(row, v.end)), None)
        if holding is not None:
            if self.order[holding.start] == self.order[row]:
                return  # re-sent
            if holding.end == self.open and self.partial:
                return  # with untracked columns the current version took newer values in place
            if delete:
                holding.end, holding.changed = row, True
                return
            if self._same(holding.value, row, self.tracked):
                return
            was = holding.end
            holding.end, holding.changed = row, True
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
