"""The row a key holds now, read from its data file through the key index.

The index knows where each key's live row is (a data file and a row position, moves of
compactions translated); this reads the wanted columns of those rows, touching only the
row groups that hold them. What needs it: an unchanged value a change did not send (a
TOASTed column, `unchanged_values.py`), and a history table closing a key's current version.

A key the index holds no live row for (absent, or a tombstone) has `present` False and nulls.
The rows are the table's as of the state the index was synced to (the batch's planned
snapshot), the rows a task of this batch wrote before this call excepted: those are not in
files yet. Callers read keys before writing any of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.io import FileIO

from lakesink_datasource.index.file_refs import decode_ref
from lakesink_datasource.index.key_columns import TOMBSTONE
from lakesink_datasource.index.sharded_index import ShardedIndex
from lakesink_datasource.write.changes import KeyedInputError


@dataclass(frozen=True)
class CurrentRows:
    present: np.ndarray  # bool per key: the table holds a live row for it
    rows: pa.Table  # the wanted columns per key (nulls where not present)
    paths: list[str | None]  # the data file of each key's row
    positions: np.ndarray  # int64: its position there (-1 where not present)


def read_current_rows(index: ShardedIndex, io: FileIO, keys: Sequence[bytes], schema: pa.Schema) -> CurrentRows:
    """The live rows of `keys` (encoded as the index encodes them), as the columns of `schema`
    (the table's Arrow types; columns a data file predates are null)."""
    n = len(keys)
    locations = index.lookup(keys)
    present = np.fromiter((loc is not None and loc.file_ordinal != TOMBSTONE for loc in locations), dtype=bool, count=n)
    positions = np.full(n, -1, dtype=np.int64)
    by_file: dict[int, list[int]] = {}
    for i, loc in enumerate(locations):
        if present[i]:
            assert loc is not None
            positions[i] = loc.position
            by_file.setdefault(loc.file_ordinal, []).append(i)
    paths: list[str | None] = [None] * n
    parts: list[pa.Table] = []
    order: list[int] = []
    for ordinal, which in by_file.items():
        path = decode_ref(index.file_path(ordinal)).path
        for i in which:
            paths[i] = path
        parts.append(read_rows_at(io, path, positions[which], schema))
        order += which
    if not parts:
        return CurrentRows(present, _nulls(schema, n), paths, positions)
    found = pa.concat_tables(parts)
    # Row j of `found` is key order[j]; absent keys take a row of nulls appended last.
    take = np.full(n, len(order), dtype=np.int64)
    take[np.asarray(order, dtype=np.int64)] = np.arange(len(order))
    rows = pa.concat_tables([found, _nulls(schema, 1)]).take(pa.array(take))
    return CurrentRows(present, rows, paths, positions)


def _nulls(schema: pa.Schema, n: int) -> pa.Table:
    return pa.Table.from_arrays([pa.nulls(n, f.type) for f in schema], schema=schema)


class RowGroups:
    """Row groups read while deciding one chunk, kept for the chunk: the key index's shards
    are decided one after another, and their keys' rows share files."""

    def __init__(self) -> None:
        self._groups: dict[tuple[str, int], pa.Table] = {}
        self._sizes: dict[str, np.ndarray] = {}
        self._names: dict[str, list[str]] = {}

    def read(self, io: FileIO, path: str, groups: list[int], names: list[str], sizes: np.ndarray) -> list[pa.Table]:
        missing = [g for g in groups if (path, g) not in self._groups]
        if missing:
            with io.new_input(path).open() as stream:
                parquet = pq.ParquetFile(stream)
                for g in missing:
                    self._groups[(path, g)] = parquet.read_row_group(g, columns=names)
        return [self._groups[(path, g)] for g in groups]

    def sizes(self, io: FileIO, path: str) -> tuple[np.ndarray, list[str]]:
        """A file's row group sizes and column names (its footer, read once)."""
        if path not in self._sizes:
            with io.new_input(path).open() as stream:
                meta = pq.ParquetFile(stream)
                self._sizes[path] = np.array([meta.metadata.row_group(g).num_rows for g in range(meta.metadata.num_row_groups)], dtype=np.int64)
                self._names[path] = meta.schema_arrow.names
        return self._sizes[path], self._names[path]


def read_rows_at(io: FileIO, path: str, positions: np.ndarray, schema: pa.Schema, cache: RowGroups | None = None) -> pa.Table:
    """Rows at `positions` of one data file: only the row groups holding them are read (once
    per `cache`)."""
    cache = cache if cache is not None else RowGroups()
    try:
        sizes, present = cache.sizes(io, path)
        starts = np.concatenate([[0], np.cumsum(sizes)])
        groups = np.searchsorted(starts, positions, side="right") - 1
        wanted = sorted(set(groups.tolist()))
        names = [f.name for f in schema if f.name in present]
        read = pa.concat_tables(cache.read(io, path, wanted, names, sizes))
    except FileNotFoundError:
        raise KeyedInputError(
            f"the key index points a key at {path}, which is not there: a task of this batch on this host is writing it "
            "(the same key in two tasks of one batch; repartition the input by key), or the index is stale. Nothing was written"
        ) from None
    # Positions in the rows read: each group's rows follow the groups before it in `wanted`.
    offset_of = {g: int(sum(sizes[w] for w in wanted[:k])) for k, g in enumerate(wanted)}
    local = np.array([offset_of[g] + (p - starts[g]) for g, p in zip(groups.tolist(), positions.tolist())], dtype=np.int64)
    picked = read.take(pa.array(local))
    columns = []
    for f in schema:
        if f.name in picked.column_names:
            column = picked.column(f.name)
            columns.append(column.cast(f.type) if column.type != f.type else column)
        else:
            columns.append(pa.nulls(len(local), f.type))
    return pa.Table.from_arrays([c.combine_chunks() if isinstance(c, pa.ChunkedArray) else c for c in columns], schema=schema)
