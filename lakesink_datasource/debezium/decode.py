"""A task's Kafka records of Debezium connectors -> each source table's rows, typed.

Two ways through, one result:
- in bulk (most records, `in_bulk.py`): JsonConverter writes a topic's values as
  `{"schema":<the same schema>,"payload":<the change>}`. Once a topic's prefix is known
  (`envelope.py`), its records' payloads are cut out and Arrow's JSON reader parses them in
  one call against the Connect schema: op, the `source` fields a position needs, `before` and
  `after`, each column in its JSON form, then turned into its type (`connect_schema.py`,
  `json_rows.py`);
- record by record (`one_by_one.py`: a topic's first record in a process, values without the
  wrapper or in a struct, anything the bulk read refuses): msgspec reads op and source, and a
  table's rows are parsed together by schema.
Which table a record goes to is `naming.py`'s; this module splits the task's records between
the two ways and puts each table's parts together.
Records that are not changes (tombstones, heartbeats, transaction markers, schema changes,
logical messages) are counted and skipped. Per table: the message key's fields (they win over
the row's: a delete's row may be the key alone), the op, and the position in the source's
log (`positions.py`), the sequence a key's changes are ordered by.

A truncate empties its table of every row ordered before it: this task's earlier rows of the
table are dropped here (a history table keeps them as versions, and deletes each of the
task's keys at the truncate), and its position travels to the commit, which hides the rows
already in the table (and other tasks' rows) ordered before it (a history table: ends the
versions that held at it). A table whose events carry no key
(no primary key at the source) is kept as a change log: every event a row, with its op and
position (a truncate too).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lakesink_datasource.debezium.connect_schema import nulls_counted
from lakesink_datasource.debezium.envelope import (
    DELETE_OP,
    TRUNCATE_OP,
    DebeziumInputError,
    known_prefixes,
    read_value,
)
from lakesink_datasource.debezium.failovers import count_failovers, encode_binlogs, read_binlogs, without_failovers
from lakesink_datasource.debezium.in_bulk import read_in_bulk
from lakesink_datasource.debezium.one_by_one import read_one_by_one, struct_events
from lakesink_datasource.debezium.options import DebeziumOptions
from lakesink_datasource.debezium.positions import FAILOVERS, GTID, POSITION_COLUMN
from lakesink_datasource.debezium.records import (
    OP_COLUMN,
    RECORD,
    Part,
    Records,
    SourceName,
    TableSchema,
    Texts,
    payloads,
)
from lakesink_datasource.index.key_encoding import encode_keys
from lakesink_datasource.index.key_shards import SHARD_COLUMN

UNWRITTEN_TRUNCATES = "truncates of tables not written yet"


@dataclass(frozen=True)
class DecodedTable:
    identifier: str
    rows: pa.Table  # key fields, the row's fields, OP_COLUMN, POSITION_COLUMN
    key: tuple[str, ...]  # the message key's fields (): none in this batch (a change log, or only a truncate)
    keyed: bool  # False: a table without a primary key at the source, kept as a change log
    connector: str
    truncated_at: bytes | None = None  # the newest truncate's position (encoded as the sequence is)
    # Every truncate's position, in order: a history table ends each version at the first after it.
    truncates: tuple[bytes, ...] = ()
    events: int = 0
    # The source table (db, schema, table) its events name; None: option table_name given (a
    # template may gather several source tables on purpose).
    source: SourceName | None = None
    binlogs: str | None = None  # MySQL/MariaDB: what its partitions showed of the binlogs (failovers.py)


@dataclass
class Decoded:
    tables: list[DecodedTable] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)
    # Truncates of tables that did not exist when the task looked, by table: their newest
    # position. Another task of the batch may create the table; the commit applies them then.
    truncates: dict[str, bytes] = field(default_factory=dict)

# A table's BINLOGS_PROPERTY (None: none, or no such table).
KnownBinlogs = Callable[[str], str | None]


def decode(
    records: pa.Table, options: DebeziumOptions, table_schema: TableSchema, *, bulk: bool = True,
    keeps_history: Callable[[str], bool] = lambda _: False, binlogs: KnownBinlogs = lambda _: None,
) -> Decoded:
    """Every table's rows of a task's records (columns as options names them). `bulk=False`
    reads every record one by one (the tests hold the two ways to the same result). Values
    written as null (PostgreSQL's infinity...) are counted with the records skipped."""
    with nulls_counted() as nulled:
        out = _decode(records, options, table_schema, bulk, keeps_history, binlogs)
    for what, count in nulled.items():
        out.skipped[what] = out.skipped.get(what, 0) + count
    return out


def _decode(
    records: pa.Table, options: DebeziumOptions, table_schema: TableSchema, bulk: bool, keeps_history: Callable[[str], bool],
    binlogs: KnownBinlogs,
) -> Decoded:
    out = Decoded()
    n = records.num_rows
    if n == 0:
        return out
    value = records.column(options.value_column).combine_chunks()
    key = records.column(options.key_column).combine_chunks() if options.key_column in records.column_names else None
    structured = pa.types.is_struct(value.type)
    key_struct = key if key is not None and pa.types.is_struct(key.type) else None
    task = Records(
        options, Texts(value if not structured else None, n), Texts(key if key_struct is None else None, n),
        _list(records, options.topic_column, n), _list(records, options.partition_column, n), _list(records, options.offset_column, n),
        key_struct, value if structured else None,
    )
    parts: dict[str, list[Part]] = {}
    connectors: dict[str, str] = {}
    skipped: dict[str, int] = {}
    if structured:
        read_one_by_one(task, range(n), struct_events(value), parts, connectors, skipped, table_schema)
    else:
        groups, single = _split(task, skipped) if bulk else ({}, _present(task, skipped))
        for (topic, prefix, schema), (members, blob) in groups.items():
            if not read_in_bulk(task, topic, prefix, schema, members, blob, parts, connectors):
                single += members.tolist()
        if single:
            single.sort()
            read_one_by_one(task, single, None, parts, connectors, skipped, table_schema)
    out.skipped = skipped
    route = records.column(SHARD_COLUMN).combine_chunks() if SHARD_COLUMN in records.column_names else None
    for identifier in sorted(parts):
        existing = table_schema(identifier)
        table_parts = parts[identifier]
        part, seen = _across_failovers(table_parts[0] if len(table_parts) == 1 else _merged(table_parts), existing, task, binlogs(identifier))
        decoded = _table(identifier, connectors[identifier], part, existing, route, task, keeps_history(identifier))
        if decoded is not None:
            decoded = dataclasses.replace(decoded, binlogs=seen, source=task.sources[identifier] if not options.table_name_given else None)
            out.tables.append(decoded)
        else:
            out.truncates[identifier] = max(encode_position(part.position))
    return out


def _across_failovers(part: Part, existing: pa.Schema | None, task: Records, known: str | None) -> tuple[Part, str | None]:
    """A MySQL/MariaDB table's positions with the failovers its partitions showed (and what
    they showed, for the table's property); other connectors' as they are."""
    if GTID not in part.position.type.names:
        return part, None
    stored = existing.field(POSITION_COLUMN).type if existing is not None and POSITION_COLUMN in existing.names else None
    if stored is not None and FAILOVERS not in [f.name for f in stored]:
        return dataclasses.replace(part, position=without_failovers(part.position)), None
    indices = part.indices.tolist()
    where = [f"{task.topics[i]}/{task.partitions[i]}" for i in indices]
    position, binlogs = count_failovers(part.position, where, [task.offsets[i] for i in indices], read_binlogs(known))
    return dataclasses.replace(part, position=position), encode_binlogs(binlogs)


def _list(records: pa.Table, column: str | None, n: int) -> list[Any]:
    if column is None or column not in records.column_names:
        return [None] * n
    return records.column(column).to_pylist()


def _present(task: Records, skipped: dict[str, int]) -> list[int]:
    """Every record with a value; tombstones counted."""
    present = np.flatnonzero(task.values._valid)
    if task.values.n - len(present):
        skipped["tombstones"] = skipped.get("tombstones", 0) + task.values.n - len(present)
    return present.tolist()


def _split(task: Records, skipped: dict[str, int]) -> tuple[dict[tuple[Any, bytes, bytes], tuple[np.ndarray, bytes]], list[int]]:
    """Records by how they are read: in bulk by topic and schema (JsonConverter's prefix known:
    the records and their payloads), or one by one; tombstones counted and left out."""
    bulk: dict[tuple[Any, bytes, bytes], tuple[np.ndarray, bytes]] = {}
    single: list[int] = []
    values = task.values
    present = np.flatnonzero(values._valid)
    tombstones = values.n - len(present)
    if tombstones:
        skipped["tombstones"] = skipped.get("tombstones", 0) + tombstones
    if not len(present):
        return bulk, single
    # Records by topic: one dictionary encoding (a null topic is a topic of its own).
    topics = pa.array(task.topics, pa.string()).take(pa.array(present))
    encoded = pc.dictionary_encode(pc.fill_null(topics, "\x00"))
    codes = encoded.indices.to_numpy(zero_copy_only=False)
    order = np.argsort(codes, kind="stable")
    bounds = np.concatenate([[0], np.cumsum(np.bincount(codes, minlength=len(encoded.dictionary)))])
    for code, name in enumerate(encoded.dictionary.to_pylist()):
        topic = None if name == "\x00" else name
        left = present[order[bounds[code] : bounds[code + 1]]]
        tried: set[bytes] = set()
        for _ in range(2):
            for prefix, schema in known_prefixes(topic):
                if not len(left) or prefix in tried:
                    continue
                tried.add(prefix)
                mask, blob = payloads(values.array.take(pa.array(left)), prefix)
                if mask.any():
                    bulk[(topic, prefix, schema)] = (left[mask], blob)
                    left = left[~mask]
            if len(left) < 2:
                break
            # A topic this process has not read yet (or a new schema of it): its next record,
            # read whole, teaches its prefix; the rest of the topic then goes in bulk.
            try:
                read_value(values[int(left[0])], topic, RECORD)
            except DebeziumInputError:
                break  # the record-by-record read names it
        single += left.tolist()
    return bulk, single


# -- a table's parts together -------------------------------------------------------------------


def _table(
    identifier: str, connector: str, part: Part, existing: pa.Schema | None, route: pa.Array | None, task: Records, history: bool,
) -> DecodedTable | None:
    ops = part.ops.to_pylist()
    n = len(ops)
    changes = np.fromiter((op != TRUNCATE_OP for op in ops), dtype=bool, count=n)
    with_key = changes & ~part.keyless
    if with_key.any() and (with_key != changes).any():
        j = int(part.indices[np.flatnonzero(changes & part.keyless)[0]])
        raise DebeziumInputError(
            f"{task.where(j)}: table {identifier} gets events with a message key and without one in one batch; Debezium keys "
            "every event of a table with a primary key. Nothing was written"
        )
    if not changes.any() and existing is None:
        return None  # only truncates of a table not written yet: the commit decides (Decoded.truncates)
    # Keyed: its events carry keys, or (a batch with only a truncate of it) the table is no change log.
    keyed = bool(with_key.any()) if changes.any() else OP_COLUMN not in existing.names  # type: ignore[union-attr]
    rows = part.rows
    keys = _in_types(part.keys, existing) if existing is not None and part.keys is not None else part.keys
    key_names: tuple[str, ...] = ()
    if with_key.any() and keys is not None:
        key_names = tuple(keys.column_names)
        rows = rows.drop_columns([c for c in key_names if c in rows.column_names])
        for i, name in enumerate(key_names):
            rows = rows.add_column(i, keys.schema.field(name), keys.column(name))
    rows = rows.append_column(OP_COLUMN, part.ops).append_column(POSITION_COLUMN, part.position)
    if route is not None and keyed:
        rows = rows.append_column(SHARD_COLUMN, route.take(pa.array(part.indices)))
    truncated_at = None
    truncates_at: tuple[bytes, ...] = ()
    if not keyed and existing is None and not changes.all():
        # A change log starts with its table's first change: a truncate ordered before it, in
        # the batch that creates the table, has nothing to empty and is left out.
        encoded = encode_position(part.position)
        first = min(encoded[i] for i in np.flatnonzero(changes).tolist())
        rows = rows.filter(pa.array([changes[i] or encoded[i] > first for i in range(n)]))
    if keyed and not changes.all():
        # The truncate is applied, not stored. A replica: this task's rows ordered before the
        # newest one go here; the commit hides the table's own (and other tasks') rows before
        # it. A history table keeps the past: those rows become versions, each of this task's
        # keys is deleted at the truncate (ending its version there, as the source did), and
        # the commit ends the other versions that held at it (commit/history_truncate.py).
        encoded = encode_position(part.position)
        truncates = np.flatnonzero(~changes)
        truncated_at = max(encoded[i] for i in truncates.tolist())
        truncates_at = tuple(sorted({encoded[i] for i in truncates.tolist()}))
        if history:
            rows = _deleted_at_truncates(rows, changes, key_names, truncates)
        else:
            keep = np.fromiter((changes[i] and encoded[i] > truncated_at for i in range(n)), dtype=bool, count=n)
            rows = rows.filter(pa.array(keep))
    return DecodedTable(identifier, rows, key_names, keyed, connector, truncated_at, truncates_at, n)


def _deleted_at_truncates(rows: pa.Table, changes: np.ndarray, key_names: tuple[str, ...], truncates: np.ndarray) -> pa.Table:
    """A history table's rows of a task that met truncates: its changes, and a delete of each
    of its keys at each truncate's position (the row of the key's last change, as a delete's
    before image, with op and position replaced)."""
    kept = rows.filter(pa.array(changes))
    if not key_names or kept.num_rows == 0:
        return kept
    numbered = kept.select(list(key_names)).append_column("__row", pa.array(np.arange(kept.num_rows, dtype=np.int64)))
    last = numbered.group_by(list(key_names), use_threads=False).aggregate([("__row", "max")]).column("__row_max")
    keys = kept.take(last)
    op = keys.schema.get_field_index(OP_COLUMN)
    at = keys.schema.get_field_index(POSITION_COLUMN)
    positions = rows.column(POSITION_COLUMN)
    deletes = [
        keys.set_column(op, keys.schema.field(op), pa.array([DELETE_OP] * keys.num_rows, keys.schema.field(op).type))
        .set_column(at, keys.schema.field(at), pa.repeat(positions[int(t)], keys.num_rows))
        for t in truncates.tolist()
    ]
    return pa.concat_tables([kept, *deletes])


def _merged(parts: list[Part]) -> Part:
    """A table's parts read both ways as one, in the records' order."""
    indices = np.concatenate([p.indices for p in parts])
    order = pa.array(np.argsort(indices, kind="stable"))
    rows = pa.concat_tables([p.rows for p in parts], promote_options="permissive").take(order)
    key_parts = [p.keys if p.keys is not None else pa.table({"__none": pa.nulls(len(p.indices))}) for p in parts]
    keys = pa.concat_tables(key_parts, promote_options="permissive").take(order) if any(p.keys is not None for p in parts) else None
    if keys is not None and "__none" in keys.column_names:
        keys = keys.drop_columns(["__none"])
    return Part(
        indices[np.argsort(indices, kind="stable")],
        pa.concat_arrays([p.ops for p in parts]).take(order),
        rows,
        keys,
        np.concatenate([p.keyless for p in parts])[np.argsort(indices, kind="stable")],
        pa.concat_arrays([p.position for p in parts]).take(order),
    )


def _in_types(keys: pa.Table, existing: pa.Schema) -> pa.Table:
    """Key fields in the table's types where it has them (the table's own check names a value
    its type cannot hold)."""
    for i, name in enumerate(keys.column_names):
        if name in existing.names and keys.schema.field(name).type != existing.field(name).type:
            try:
                keys = keys.set_column(i, name, keys.column(name).cast(existing.field(name).type))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                pass
    return keys


def encode_position(position: pa.StructArray) -> list[bytes]:
    """Positions encoded as a keyed write encodes its sequence (its parts one after another)."""
    return encode_keys([position.field(j) for j in range(position.type.num_fields)])
