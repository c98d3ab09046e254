"""A task's Kafka records of Debezium connectors -> each source table's rows, typed.

Two ways through, one result:
- in bulk (most records): JsonConverter writes a topic's values as `{"schema":<the same
  schema>,"payload":<the change>}`. Once a topic's prefix is known (`envelope.py`), its
  records' payloads are cut out and Arrow's JSON reader parses them in one call against the
  Connect schema: op, the `source` fields a position needs, `before` and `after`, each column
  in its JSON form, then turned into its type (`connect_schema.py`);
- record by record (a topic's first record in a process, values without the wrapper or in
  a struct, anything the bulk read refuses): msgspec reads op and source, and a table's rows
  are parsed together by schema.
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
import decimal
import gc
import io
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json

from lakesink_datasource.debezium.connect_schema import (
    ConnectSchema,
    DebeziumSchemaError,
    arrow_type,
    convert,
    has_map,
    nulls_counted,
    parse_schema,
    read_type,
)
from lakesink_datasource.debezium.envelope import (
    DELETE_OP,
    TRUNCATE_OP,
    WRITE_OPS,
    DebeziumInputError,
    Event,
    Kind,
    Source,
    key_prefix,
    known_prefixes,
    read_key,
    read_value,
    refuse_mongodb,
    where,
)
from lakesink_datasource.debezium.failovers import count_failovers, encode_binlogs, read_binlogs, without_failovers
from lakesink_datasource.debezium.options import DebeziumOptions
from lakesink_datasource.debezium.positions import FAILOVERS, GTID, POSITION_COLUMN, SOURCE_FIELDS, positions, positions_of
from lakesink_datasource.index.key_encoding import encode_keys
from lakesink_datasource.index.key_route import ROUTE_COLUMN

OP_COLUMN = "__op"
RECORD = "\x00the record\x00"  # stands for a record's place in errors, until one is raised
UNWRITTEN_TRUNCATES = "truncates of tables not written yet"
_CHANGE_OPS = (*WRITE_OPS, DELETE_OP, TRUNCATE_OP)


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


# A source table as its events name it: (source.db, source.schema, source.table).
SourceName = tuple[str | None, str | None, str]


# The Arrow schema a table already has (None: it does not exist): a row read without
# Connect schemas takes its column types from it, as any routed JSON payload does.
TableSchema = Callable[[str], pa.Schema | None]
# A table's BINLOGS_PROPERTY (None: none, or no such table).
KnownBinlogs = Callable[[str], str | None]
# Raw JSON: msgspec's view of the record's bytes, a view of them, or bytes.
Json = bytes | msgspec.Raw | memoryview


@dataclass
class _Part:
    """Some of a table's events, read one way: which records, their ops, rows, keys, positions."""

    indices: np.ndarray  # int64, into the task's records
    ops: pa.Array  # string
    rows: pa.Table  # the row's fields (`after`; a delete's `before`)
    keys: pa.Table | None  # the message key's fields (None: no event here has a key)
    keyless: np.ndarray  # bool: the event has no message key
    position: pa.StructArray


class _Texts:
    """A binary or string column: the Arrow array for the bulk read's vectorised work, and
    `bytes` per value for records read one by one (one copy of the column, made when first
    asked for)."""

    def __init__(self, array: pa.Array | None, n: int) -> None:
        self.n = n
        if array is None or pa.types.is_null(array.type):
            array = pa.nulls(n, pa.binary())
        elif pa.types.is_string(array.type):
            array = array.cast(pa.binary())
        elif pa.types.is_large_string(array.type):
            array = array.cast(pa.large_binary())
        self.array: pa.Array = array
        self._valid = np.asarray(array.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
        self._offsets: np.ndarray | None = None
        self._whole = b""

    def __getitem__(self, i: int) -> bytes | None:
        if not self._valid[i]:
            return None
        if self._offsets is None:
            _validity, offsets, data = self.array.buffers()[:3]
            wide = pa.types.is_large_binary(self.array.type)
            self._offsets = np.frombuffer(offsets, dtype=np.int64 if wide else np.int32)[self.array.offset : self.array.offset + self.n + 1]
            self._whole = data.to_pybytes() if data is not None else b""
        return self._whole[self._offsets[i] : self._offsets[i + 1]]

    def valid(self, i: int) -> bool:
        return bool(self._valid[i])


def _payloads(values: pa.Array, prefix: bytes) -> tuple[np.ndarray, bytes]:
    """Which of `values` are JsonConverter's wrapper with `prefix` (a topic's schema) around a
    payload, and those payloads as one newline-delimited blob: vectorised, no Python per value."""
    text = prefix.decode("utf-8", errors="surrogateescape")
    wrapped = pc.and_(pc.starts_with(values, pattern=text), pc.ends_with(values, pattern="}"))
    mask = np.asarray(pc.fill_null(wrapped, False).to_numpy(zero_copy_only=False), dtype=bool)
    if not mask.any():
        return mask, b""
    chosen = values.filter(pa.array(mask))
    cut = pc.binary_replace_slice(chosen, start=0, stop=len(prefix), replacement="")
    lines = pc.binary_replace_slice(cut, start=-1, stop=1 << 30, replacement="\n")  # the wrapper's closing brace
    if isinstance(lines, pa.ChunkedArray):
        lines = lines.combine_chunks()
    _validity, offsets, data = lines.buffers()[:3]
    wide = pa.types.is_large_binary(lines.type)
    bounds = np.frombuffer(offsets, dtype=np.int64 if wide else np.int32)[lines.offset : lines.offset + len(lines) + 1]
    return mask, data.to_pybytes()[int(bounds[0]) : int(bounds[-1])]


@dataclass
class _Records:
    """The task's records as columns, and the options naming them."""

    options: DebeziumOptions
    values: _Texts
    keys: _Texts
    topics: list[Any]
    partitions: list[Any]
    offsets: list[Any]
    key_struct: pa.StructArray | None
    value_struct: pa.StructArray | None
    sources: dict[str, SourceName] = field(default_factory=dict)  # table -> the source table its events name

    def where(self, i: int) -> str:
        return where(self.topics[i], self.partitions[i], self.offsets[i], i)


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
    task = _Records(
        options, _Texts(value if not structured else None, n), _Texts(key if key_struct is None else None, n),
        _list(records, options.topic_column, n), _list(records, options.partition_column, n), _list(records, options.offset_column, n),
        key_struct, value if structured else None,
    )
    parts: dict[str, list[_Part]] = {}
    connectors: dict[str, str] = {}
    skipped: dict[str, int] = {}
    if structured:
        _record_by_record(task, range(n), _struct_events(value), parts, connectors, skipped, table_schema)
    else:
        groups, single = _split(task, skipped) if bulk else ({}, _present(task, skipped))
        for (topic, prefix, schema), (members, blob) in groups.items():
            if not _in_bulk(task, topic, prefix, schema, members, blob, parts, connectors):
                single += members.tolist()
        if single:
            single.sort()
            _record_by_record(task, single, None, parts, connectors, skipped, table_schema)
    out.skipped = skipped
    route = records.column(ROUTE_COLUMN).combine_chunks() if ROUTE_COLUMN in records.column_names else None
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


def _across_failovers(part: _Part, existing: pa.Schema | None, task: _Records, known: str | None) -> tuple[_Part, str | None]:
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


def _present(task: _Records, skipped: dict[str, int]) -> list[int]:
    """Every record with a value; tombstones counted."""
    present = np.flatnonzero(task.values._valid)
    if task.values.n - len(present):
        skipped["tombstones"] = skipped.get("tombstones", 0) + task.values.n - len(present)
    return present.tolist()


def _split(task: _Records, skipped: dict[str, int]) -> tuple[dict[tuple[Any, bytes, bytes], tuple[np.ndarray, bytes]], list[int]]:
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
                mask, blob = _payloads(values.array.take(pa.array(left)), prefix)
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


# -- record by record ---------------------------------------------------------------------------


@dataclass
class _Table:
    """A table's events read one by one, gathered before its rows are parsed together."""

    connector: str
    indices: list[int] = field(default_factory=list)
    ops: list[str] = field(default_factory=list)
    rows: list[Json | None] = field(default_factory=list)
    schemas: list[bytes | None] = field(default_factory=list)
    keys: list[Json | None] = field(default_factory=list)
    key_schemas: list[bytes | None] = field(default_factory=list)
    sources: list[Source] = field(default_factory=list)
    offsets: list[int | None] = field(default_factory=list)


def _record_by_record(
    task: _Records, which: Sequence[int], events: list[Event] | None, parts: dict[str, list[_Part]], connectors: dict[str, str],
    skipped: dict[str, int], table_schema: TableSchema,
) -> None:
    tables: dict[str, _Table] = {}
    names: dict[tuple[Any, ...], str] = {}
    # The loop makes a few objects per record and keeps them (rows, sources): the collector's
    # full passes over them cost a quarter of it, and nothing it makes is cyclic.
    collecting = gc.isenabled()
    gc.disable()
    i = -1
    try:
        for i in which:
            event = events[i] if events is not None else read_value(task.values[i], task.topics[i], RECORD)
            if event.kind is not Kind.CHANGE and event.kind is not Kind.TRUNCATE:
                skipped[event.kind.value] = skipped.get(event.kind.value, 0) + 1
                continue
            source = event.source
            naming = (source.db, source.schema, source.table, task.topics[i])
            identifier = names.get(naming)
            if identifier is None:
                identifier = names[naming] = _name(task, naming)
            table = tables.get(identifier)
            if table is None:
                table = tables[identifier] = _Table(str(source.connector or ""))
            table.indices.append(i)
            table.ops.append(event.op or "")
            table.rows.append(event.row)
            table.schemas.append(event.schema)
            table.sources.append(source)
            table.offsets.append(task.offsets[i])
            if task.key_struct is not None:
                table.keys.append(None if not task.key_struct[i].is_valid or event.kind is Kind.TRUNCATE else b"")
                table.key_schemas.append(None)
            else:
                fields, schema = read_key(task.keys[i], RECORD, task.topics[i]) if event.kind is Kind.CHANGE else (None, None)
                table.keys.append(fields)
                table.key_schemas.append(schema)
    except DebeziumInputError as exc:
        # Named once, when it fails: formatting every record's place cost more than reading it.
        raise DebeziumInputError(str(exc).replace(RECORD, task.where(i))) from None
    finally:
        if collecting:
            gc.enable()
    for identifier, table in tables.items():
        _connector(connectors, identifier, table.connector, task, table.indices[0])
        indices = np.asarray(table.indices, dtype=np.int64)
        position = positions(table.connector, table.sources, table.ops)
        rows = _struct_rows(task.value_struct, indices, table.ops) if task.value_struct is not None else _json_rows(table, table_schema(identifier))
        if task.key_struct is not None:
            taken = task.key_struct.take(pa.array(indices))
            keys: pa.Table | None = pa.Table.from_arrays(taken.flatten(), names=[f.name for f in taken.type])
        else:
            keys = _json_keys(table)
        keyless = np.fromiter((k is None for k in table.keys), dtype=bool, count=len(table.keys))
        parts.setdefault(identifier, []).append(_Part(indices, pa.array(table.ops, pa.string()), rows, keys, keyless, position))


def _connector(connectors: dict[str, str], identifier: str, connector: str, task: _Records, i: int) -> None:
    held = connectors.setdefault(identifier, connector)
    if held != connector:
        raise DebeziumInputError(f"{task.where(i)}: table {identifier} gets events of connectors {held!r} and {connector!r}")


def _name(task: _Records, naming: tuple[Any, ...]) -> str:
    """The table a source table's events go to; two source tables the default template names
    alike (`public.orders`, `sales.orders`) are refused, before their rows mix."""
    identifier = _identifier(task.options, naming)
    source: SourceName = (naming[0], naming[1], naming[2])
    held = task.sources.setdefault(identifier, source)
    if held != source and not task.options.table_name_given:
        raise DebeziumInputError(f"{RECORD}: {merged_sources(identifier, [held, source])}")
    return identifier


def merged_sources(identifier: str, sources: Sequence[Sequence[str | None]]) -> str:
    """Why the events of two source tables cannot go to one table under the default template,
    and the template that keeps them apart."""
    names = sorted({".".join(str(p) for p in s if p is not None) for s in sources})
    parts = ["{db}"] if len({s[0] for s in sources}) > 1 else []
    parts += ["{schema}"] if len({s[1] for s in sources}) > 1 else []
    template = "_".join([*(parts or ["{schema}"]), "{table}"])
    return (
        f"table {identifier} would get the events of source tables {' and '.join(names)}: option 'table_name' (default "
        f"'{{table}}') names both so, and their rows would mix. Give option table_name a template that keeps them apart, "
        f"e.g. '{template}' ({{db}}, {{schema}}, {{table}}, {{topic}} are the source's names). Nothing was written"
    )


# The table property a table made from one source table's events records it in (JSON: db,
# schema, table), so a later batch of another source table of the same name is refused.
SOURCE_PROPERTY = "lakesink.debezium.source"


def source_property(source: SourceName) -> str:
    return msgspec.json.encode(list(source)).decode()


def check_table_source(identifier: str, source: SourceName, properties: Mapping[str, str]) -> None:
    """Refuse events of `source` for a table another source table's events made."""
    recorded = properties.get(SOURCE_PROPERTY)
    if recorded is None or recorded == source_property(source):
        return
    try:
        held = msgspec.json.decode(recorded, type=tuple[str | None, str | None, str])
    except (msgspec.DecodeError, msgspec.ValidationError):
        return  # not lakesink's: nothing to compare
    raise DebeziumInputError(merged_sources(identifier, [held, source]))


def check_batch_sources(sources: Iterable[Mapping[str, Sequence[str | None]]]) -> None:
    """The driver's check over a batch's tasks (each saw some Kafka partitions): one source
    table per table."""
    seen: dict[str, Sequence[str | None]] = {}
    for task in sources:
        for identifier, source in task.items():
            held = seen.setdefault(identifier, source)
            if list(held) != list(source):
                raise DebeziumInputError(merged_sources(identifier, [held, source]))


def _identifier(options: DebeziumOptions, naming: tuple[Any, ...]) -> str:
    db, schema, table, topic = naming
    if not table:
        raise DebeziumInputError(f"{RECORD} is a change event without source.table: lakesink cannot tell its table. Nothing was written")
    parts = {"db": db, "schema": schema, "table": table, "topic": topic}
    try:
        name = options.table_name.format(**{k: _name_part(v) for k, v in parts.items()})
    except (KeyError, IndexError, ValueError) as exc:
        raise DebeziumInputError(f"option 'table_name' {options.table_name!r}: {exc!r} (use {{db}}, {{schema}}, {{table}}, {{topic}})") from None
    if "." in name:
        return name
    if options.namespace is None:
        raise DebeziumInputError(f"option 'table_name' gives {name!r} for {RECORD}: give option 'namespace' for its namespace")
    return f"{options.namespace}.{name}"


def _name_part(value: Any) -> str:
    # A source name becomes one part of a table name: a dot would start another part, and
    # slashes would make directories.
    text = "" if value is None else str(value)
    return text.replace(".", "_").replace("/", "_").replace("\\", "_")


def _struct_events(value: pa.StructArray) -> list[Event]:
    """Events of a value column decoded already (Avro, Protobuf): a struct per record."""
    names = {f.name for f in value.type}
    missing = {"op", "source"} - names
    if missing:
        raise DebeziumInputError(
            f"the value column is a struct without {', '.join(sorted(missing))}: give Debezium's envelope (before, after, "
            "source, op) as decoded from Avro or Protobuf, or the record's JSON"
        )
    ops = value.field("op").to_pylist()
    sources = value.field("source").to_pylist()
    valid = value.is_valid().to_pylist()
    events = []
    for op, source, here in zip(ops, sources, valid):
        if not here:
            events.append(Event(Kind.TOMBSTONE))
        elif op is None:
            events.append(Event(Kind.HEARTBEAT))
        elif op == "m":
            events.append(Event(Kind.MESSAGE))
        elif op not in _CHANGE_OPS:
            raise DebeziumInputError(f"a record has op {op!r}: Debezium's ops are c, r, u, d, t, m. Nothing was written")
        else:
            known = {k: v for k, v in (source or {}).items() if k in Source.__struct_fields__}
            read = Source(**known)
            if read.table is None:
                refuse_mongodb(read, f"record {len(events)} of the input")
            events.append(Event(Kind.TRUNCATE if op == TRUNCATE_OP else Kind.CHANGE, op, read))
    return events


def _json_rows(table: _Table, existing: pa.Schema | None) -> pa.Table:
    """Each event's row (`after`; a delete's `before`), parsed by value schema (without one,
    by the table's columns where it has them)."""
    groups: dict[bytes | None, list[int]] = {}
    for i, schema in enumerate(table.schemas):
        groups.setdefault(schema, []).append(i)
    parts: list[pa.Table] = []
    order: list[int] = []
    for schema_json, members in groups.items():
        connect = _row_schema(schema_json) if schema_json is not None else None
        parts.append(_parse_rows([table.rows[i] for i in members], connect, existing))
        order += members
    if len(parts) == 1:
        return parts[0]
    merged = pa.concat_tables(parts, promote_options="permissive")
    return merged.take(pa.array(np.argsort(np.asarray(order), kind="stable")))


def _json_keys(table: _Table) -> pa.Table | None:
    """The message keys' fields, in their Connect types; nulls for a record without a key."""
    groups: dict[bytes | None, list[int]] = {}
    for i, schema in enumerate(table.key_schemas):
        if table.keys[i] is not None:
            groups.setdefault(schema, []).append(i)
    if not groups:
        return None
    first = next(iter(groups))
    groups[first] += [i for i, k in enumerate(table.keys) if k is None]
    parts, order = [], []
    for schema_json, members in groups.items():
        connect = _key_schema(schema_json) if schema_json is not None else None
        parts.append(_parse_rows([table.keys[i] for i in members], connect))
        order += members
    keys = parts[0] if len(parts) == 1 else pa.concat_tables(parts, promote_options="permissive")
    if order != sorted(order):
        keys = keys.take(pa.array(np.argsort(np.asarray(order), kind="stable")))
    return keys


def _struct_rows(value: pa.StructArray, indices: np.ndarray, ops: list[str]) -> pa.Table:
    """The rows of a decoded (struct) value column: `after`, a delete's `before`."""
    rows = pa.array(indices)
    names = {f.name for f in value.type}
    after = value.field("after").take(rows) if "after" in names else None
    before = value.field("before").take(rows) if "before" in names else None
    if after is None and before is None:
        raise DebeziumInputError("the value column is a struct without 'after' or 'before': give Debezium's envelope")
    if after is None:
        after = before
    elif before is not None and before.type == after.type:
        after = pc.if_else(pa.array([op == DELETE_OP for op in ops]), before, after)
    assert after is not None
    if isinstance(after, pa.ChunkedArray):
        after = after.combine_chunks()
    return pa.Table.from_arrays(after.flatten(), names=[f.name for f in after.type])


# -- in bulk ------------------------------------------------------------------------------------


def _in_bulk(
    task: _Records, topic: Any, prefix: bytes, schema: bytes, members: np.ndarray, blob: bytes, parts: dict[str, list[_Part]],
    connectors: dict[str, str],
) -> bool:
    """A topic's records of one schema, their payloads parsed by Arrow in one call. False
    when the payloads are not all what the bulk read takes: read one by one instead."""
    envelope = _envelope_schema(schema)
    row = _row_schema(schema)
    if row is None or has_map(row):
        return False
    first = msgspec.json.decode(blob[: blob.index(b"\n")], type=dict[str, Any])
    connector = str((first.get("source") or {}).get("connector") or "")
    fields = SOURCE_FIELDS.get(connector.lower())
    if fields is None or envelope is None:
        return False
    if blob.count(b"\n") != len(members):
        return False  # a payload written across lines
    source = pa.struct([pa.field(n, pa.string()) for n in ("connector", "db", "schema", "table")] + [pa.field(n, t) for n, t in fields.items()])
    for numeric in (False, True):
        row_type = read_type(row, numeric)
        explicit = pa.schema([("op", pa.string()), ("before", row_type), ("after", row_type), ("source", source)])
        try:
            parsed = _read(blob, explicit, "ignore")
            break
        except pa.ArrowInvalid as exc:
            if numeric or "number" not in str(exc):
                return False
    ops = parsed.column("op").combine_chunks()
    if not pc.all(pc.is_in(ops, value_set=pa.array(_CHANGE_OPS))).as_py() or ops.null_count:
        return False  # other records in the topic (logical messages...): read one by one
    src = parsed.column("source").combine_chunks()
    if src.null_count or pc.any(pc.not_equal(src.field("connector"), connector)).as_py():
        return False
    indices = members
    after, before = parsed.column("after").combine_chunks(), parsed.column("before").combine_chunks()
    deleting = pc.equal(ops, DELETE_OP)
    image = pc.if_else(deleting, before, after) if pc.any(deleting).as_py() else after
    columns = [convert(image.field(j), f) for j, f in enumerate(row.fields or ())]
    rows = pa.Table.from_arrays(columns, schema=pa.schema([pa.field(f.field or "", arrow_type(f)) for f in row.fields or ()]))
    keys, keyless = _bulk_keys(task, topic, members, ops)
    position = positions_of(connector, src.field, len(members), ops)
    # A topic normally holds one table; grouped by source naming all the same.
    naming = pc.dictionary_encode(pc.binary_join_element_wise(
        pc.fill_null(src.field("db"), ""), pc.fill_null(src.field("schema"), ""), pc.fill_null(src.field("table"), ""), "\x00"
    ))
    codes = naming.indices.to_numpy(zero_copy_only=False)
    for code, name in enumerate(naming.dictionary.to_pylist()):
        db, schema_name, table = name.split("\x00")
        if not table:
            return False
        chosen = np.flatnonzero(codes == code)
        try:
            identifier = _name(task, (db or None, schema_name or None, table, topic))
        except DebeziumInputError as exc:
            raise DebeziumInputError(str(exc).replace(RECORD, task.where(int(members[int(chosen[0])])))) from None
        take = pa.array(chosen)
        _connector(connectors, identifier, connector, task, int(members[int(chosen[0])]))
        parts.setdefault(identifier, []).append(_Part(
            indices[chosen], ops.take(take), rows.take(take), keys.take(take) if keys is not None else None, keyless[chosen], position.take(take),
        ))
    return True


def _bulk_keys(task: _Records, topic: Any, members: np.ndarray, ops: pa.Array) -> tuple[pa.Table | None, np.ndarray]:
    """The message keys of a bulk read: by their own JsonConverter prefix where it is known
    (one Arrow read), else one by one. A truncate's key is none whatever it holds."""
    texts = task.keys
    truncate = pc.equal(ops, TRUNCATE_OP).to_numpy(zero_copy_only=False)
    keyless = ~texts._valid[members] | truncate
    present = np.flatnonzero(~keyless)
    if not len(present):
        return None, keyless
    known = key_prefix(topic)
    if known is not None:
        mask, blob = _payloads(texts.array.take(pa.array(members[present])), known[0])
        if mask.all():
            keys = _parse_blob(blob, len(present), _key_schema(known[1]), None)
            if len(present) == len(members):
                return keys, keyless
            at = np.full(len(members), len(present), dtype=np.int64)
            at[present] = np.arange(len(present))
            padded = pa.concat_tables([keys, pa.Table.from_arrays([pa.nulls(1, f.type) for f in keys.schema], schema=keys.schema)])
            return padded.take(pa.array(at)), keyless
    return _keys_one_by_one(task, members, keyless, topic)


def _keys_one_by_one(task: _Records, members: np.ndarray, keyless: np.ndarray, topic: Any) -> tuple[pa.Table | None, np.ndarray]:
    table = _Table("")
    for j, i in enumerate(members.tolist()):
        try:
            fields, schema = (None, None) if keyless[j] else read_key(task.keys[i], RECORD, topic)
        except DebeziumInputError as exc:  # named by its place in Kafka, as the one-by-one read names it
            raise DebeziumInputError(str(exc).replace(RECORD, task.where(i))) from None
        table.keys.append(fields)
        table.key_schemas.append(schema)
    return _json_keys(table), keyless


# -- a table's parts together -------------------------------------------------------------------


def _table(
    identifier: str, connector: str, part: _Part, existing: pa.Schema | None, route: pa.Array | None, task: _Records, history: bool,
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
        rows = rows.append_column(ROUTE_COLUMN, route.take(pa.array(part.indices)))
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


def _merged(parts: list[_Part]) -> _Part:
    """A table's parts read both ways as one, in the records' order."""
    indices = np.concatenate([p.indices for p in parts])
    order = pa.array(np.argsort(indices, kind="stable"))
    rows = pa.concat_tables([p.rows for p in parts], promote_options="permissive").take(order)
    key_parts = [p.keys if p.keys is not None else pa.table({"__none": pa.nulls(len(p.indices))}) for p in parts]
    keys = pa.concat_tables(key_parts, promote_options="permissive").take(order) if any(p.keys is not None for p in parts) else None
    if keys is not None and "__none" in keys.column_names:
        keys = keys.drop_columns(["__none"])
    return _Part(
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


# -- schemas and JSON -----------------------------------------------------------------------------

_envelopes: dict[bytes, ConnectSchema | None] = {}
_row_schemas: dict[bytes, ConnectSchema | None] = {}
_key_schemas: dict[bytes, ConnectSchema] = {}
_CACHED = 4096  # schemas kept per process (a long-lived worker meets many versions)


def _envelope_schema(raw: bytes) -> ConnectSchema | None:
    cached = _envelopes.get(raw, False)
    if cached is False:
        if len(_envelopes) > _CACHED:
            _envelopes.clear()
        cached = _envelopes[raw] = parse_schema(raw)
    return cached  # type: ignore[return-value]


def _row_schema(envelope_schema: bytes) -> ConnectSchema | None:
    """The Connect schema of an envelope's rows (its `after`, else `before`), parsed once."""
    cached = _row_schemas.get(envelope_schema, False)
    if cached is not False:
        return cached  # type: ignore[return-value]
    envelope = _envelope_schema(envelope_schema)
    row = envelope.child("after") or envelope.child("before") if envelope is not None else None
    if len(_row_schemas) > _CACHED:
        _row_schemas.clear()
    _row_schemas[envelope_schema] = row
    return row


def _key_schema(raw: bytes) -> ConnectSchema:
    cached = _key_schemas.get(raw)
    if cached is None:
        if len(_key_schemas) > _CACHED:
            _key_schemas.clear()
        cached = _key_schemas[raw] = parse_schema(raw)
    return cached


def _parse_rows(raws: Sequence[Json | None], connect: ConnectSchema | None, existing: pa.Schema | None = None) -> pa.Table:
    """Rows as JSON objects -> their columns: by their Connect schema (each column read in its
    JSON form, then converted), else typed as the table has them (`existing`) or as the JSON
    gives them."""
    return _parse_blob(_lines(raws), len(raws), connect, existing)


def _parse_blob(blob: bytes, n: int, connect: ConnectSchema | None, existing: pa.Schema | None) -> pa.Table:
    """`n` newline-delimited JSON objects as columns (see `_parse_rows`)."""
    if connect is not None:
        fields = list(connect.fields or ())
        if not fields:
            return pa.table({"__empty": pa.nulls(n)}).drop_columns(["__empty"])
        if has_map(connect):
            bad = next(f.field for f in fields if has_map(f))
            raise DebeziumSchemaError(
                f"column '{bad}' is a map (PostgreSQL hstore with hstore.handling.mode=map?): lakesink reads maps only as "
                "JSON text; set the connector's hstore.handling.mode=json"
            )
        for numeric in (False, True):
            explicit = pa.schema([pa.field(f.field or "", read_type(f, numeric)) for f in fields])
            try:
                parsed = _read(blob, explicit, "ignore")
                break
            except pa.ArrowInvalid as exc:
                if numeric or "number" not in str(exc):
                    raise DebeziumSchemaError(f"the rows do not match their Connect schema: {exc}") from None
        columns = [convert(parsed.column(f.field or ""), f) for f in fields]
        return pa.Table.from_arrays(columns, schema=pa.schema([pa.field(f.field or "", arrow_type(f)) for f in fields]))
    # Every column may be absent from a row (a delete's row is its key alone): all nullable.
    explicit = pa.schema([pa.field(f.name, f.type) for f in existing if f.name not in (OP_COLUMN, POSITION_COLUMN)]) if existing is not None else None
    try:
        parsed = _read(blob, explicit, "infer")
    except pa.ArrowInvalid as exc:
        raise DebeziumSchemaError(f"the rows cannot be read as the table's columns: {exc}") from None
    return _typed_only(parsed)


def _typed_only(parsed: pa.Table) -> pa.Table:
    """Rows read without a schema, less what no value typed: a field null in every row, an
    array empty in every row, a struct's field null throughout. Such a field is no column (yet):
    any type chosen for it could refuse the value that later gives it one (a string column
    given a number); the table's own columns were read in their types already."""
    for name in list(parsed.column_names):
        kind = parsed.schema.field(name).type
        typed = _typed_part(kind)
        if typed is None:
            parsed = parsed.drop_columns([name])
        elif typed != kind:
            parsed = parsed.set_column(parsed.column_names.index(name), name, parsed.column(name).cast(typed))
    return parsed


def _typed_part(kind: pa.DataType) -> pa.DataType | None:
    """`kind` less its parts of Arrow's null type (None: nothing is left)."""
    if pa.types.is_null(kind):
        return None
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        item = _typed_part(kind.value_type)
        if item is None:
            return None
        field = kind.value_field.with_type(item)
        return pa.list_(field) if pa.types.is_list(kind) else pa.large_list(field)
    if pa.types.is_struct(kind):
        fields = [f.with_type(t) for f in kind if (t := _typed_part(f.type)) is not None]
        return pa.struct(fields) if fields else None
    return kind


def _lines(raws: Sequence[Json | None]) -> bytes:
    # One JSON object per line: a null row (a delete's) is an object of nulls. A value written
    # across lines (pretty-printed JSON) is written again on one.
    texts = [r if r is not None else b"{}" for r in raws]
    blob = b"\n".join(texts)
    if blob.count(b"\n") != len(texts) - 1:
        blob = b"\n".join(msgspec.json.encode(msgspec.json.decode(r)) if b"\n" in bytes(r) else r for r in texts)
    return blob


def _read(blob: bytes, explicit: pa.Schema | None, unexpected: str) -> pa.Table:
    """Newline-delimited JSON objects as columns: the `explicit` ones in their types, others
    ignored or (`infer`) typed as the JSON gives them: text stays text (Arrow's reader would
    make timestamps of some), and JsonConverter's texts for a float's NaN and infinities are
    those floats."""
    if b'"NaN"' in blob or b'Infinity"' in blob:
        blob = _float_texts(blob, explicit, unexpected)
    parsed = _arrow_read(blob, explicit, unexpected)
    if unexpected != "infer":
        return parsed
    texts = _texts_kept(parsed.schema, explicit)
    return parsed if texts is None else _arrow_read(blob, texts, "ignore")


def _arrow_read(blob: bytes, explicit: pa.Schema | None, unexpected: str) -> pa.Table:
    parse = pa_json.ParseOptions(explicit_schema=explicit, unexpected_field_behavior=unexpected)
    # Inferring, one block for the whole blob: Arrow infers a block's types on its own, and
    # blocks that disagree (a field null in one, text in the next) would fail the read. With
    # every column's type given, blocks of 1 MiB are parsed on Arrow's threads.
    inferring = unexpected == "infer"
    read = pa_json.ReadOptions(block_size=max(1 << 20, len(blob) + 1) if inferring else 1 << 20)
    return pa_json.read_json(io.BytesIO(blob), read_options=read, parse_options=parse)


def _texts_kept(inferred: pa.Schema, explicit: pa.Schema | None) -> pa.Schema | None:
    """The schema that reads again, as text, what Arrow's inference made temporal (ISO dates
    and timestamps in text; pyarrow's JSON reader has no option to stop it); None: nothing was."""
    given = set(explicit.names) if explicit is not None else set()
    fields = [f if f.name in given else f.with_type(_as_text(f.type)) for f in inferred]
    if all(f.type == g.type for f, g in zip(fields, inferred)):
        return None
    return pa.schema(fields)


def _as_text(kind: pa.DataType) -> pa.DataType:
    if pa.types.is_temporal(kind):
        return pa.string()
    if pa.types.is_list(kind):
        return pa.list_(kind.value_field.with_type(_as_text(kind.value_type)))
    if pa.types.is_struct(kind):
        return pa.struct([f.with_type(_as_text(f.type)) for f in kind])
    return kind


# JsonConverter (Jackson) writes a float's NaN and infinities as these texts; Arrow's reader
# takes them as floats only unquoted, which Decimal's are when msgspec writes them as numbers.
_FLOAT_TEXTS = {"NaN": decimal.Decimal("NaN"), "Infinity": decimal.Decimal("Infinity"), "-Infinity": decimal.Decimal("-Infinity")}
# One of those texts where a value (not a key) stands.
_FLOAT_TEXT_VALUE = re.compile(rb'(?<=[:\[,])(\s*)"(?:NaN|-?Infinity)"(?=\s*[,\]}])')
# Numbers are read and written back as their own digits (a decimal of 40 digits stays exact).
_exact_decoder = msgspec.json.Decoder(float_hook=decimal.Decimal)
_exact_encoder = msgspec.json.Encoder(decimal_format="number")


def _float_texts(blob: bytes, explicit: pa.Schema | None, unexpected: str) -> bytes:
    """`blob` with the NaN and infinity texts of float fields unquoted. A float field is one
    `explicit` types so or, inferring, one whose other values are numbers (a field never
    seen as a number keeps its text). Only the lines holding such a text are rewritten."""
    types: pa.Schema | None = explicit
    if unexpected == "infer":
        try:
            types = _arrow_read(_FLOAT_TEXT_VALUE.sub(rb"\1null", blob), explicit, "infer").schema
        except pa.ArrowInvalid:
            return blob  # the read names what is wrong
    if types is None or not _has_float(pa.struct(list(types))):
        return blob
    row = pa.struct(list(types))
    lines = blob.split(b"\n")
    for i, line in enumerate(lines):
        if _FLOAT_TEXT_VALUE.search(line) is not None:
            try:
                lines[i] = _exact_encoder.encode(_floats_of(_exact_decoder.decode(line), row))
            except msgspec.DecodeError:
                pass  # not JSON: the read names it
    return b"\n".join(lines)


def _has_float(kind: pa.DataType) -> bool:
    if pa.types.is_floating(kind):
        return True
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return _has_float(kind.value_type)
    return pa.types.is_struct(kind) and any(_has_float(f.type) for f in kind)


def _floats_of(value: Any, kind: pa.DataType) -> Any:
    """`value` with the texts `_FLOAT_TEXTS` names as those numbers where `kind` is a float."""
    if isinstance(value, str):
        return _FLOAT_TEXTS.get(value, value) if pa.types.is_floating(kind) else value
    if isinstance(value, list) and (pa.types.is_list(kind) or pa.types.is_large_list(kind)):
        return [_floats_of(v, kind.value_type) for v in value]
    if isinstance(value, dict) and pa.types.is_struct(kind):
        for field in kind:
            if field.name in value and _has_float(field.type):
                value[field.name] = _floats_of(value[field.name], field.type)
    return value
