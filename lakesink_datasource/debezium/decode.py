"""A task's Kafka records of Debezium connectors -> each source table's rows, typed.

Per record (`envelope.py`): what it is, its op, its `source` and its row as raw JSON; records
that are not changes (tombstones, heartbeats, transaction markers, schema changes, logical
messages) are counted and skipped. Per table: the rows of each value schema parsed by Arrow's
JSON reader in one call (each column in its JSON form, then turned into its type,
`connect_schema.py`), the key's fields from the message key (they win over the row's: a
delete's row is the key alone), the op, and the position in the source's log
(`positions.py`), the sequence a key's changes are ordered by.

A truncate empties its table of every row ordered before it: this task's earlier rows of the
table are dropped here, and its position travels to the commit, which hides the rows already
in the table (and other tasks' rows) ordered before it.

A table whose events carry no key (no primary key at the source) is kept as a change log:
every event a row, with its op and position (a truncate too).
"""

from __future__ import annotations

import gc
import io
from collections.abc import Callable, Sequence
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
    parse_schema,
    read_type,
)
from lakesink_datasource.debezium.envelope import (
    DELETE_OP,
    TRUNCATE_OP,
    DebeziumInputError,
    Event,
    Kind,
    Source,
    read_key,
    read_value,
    where,
)
from lakesink_datasource.debezium.options import DebeziumOptions
from lakesink_datasource.debezium.positions import POSITION_COLUMN, positions
from lakesink_datasource.index.key_encoding import encode_keys
from lakesink_datasource.index.key_route import ROUTE_COLUMN

OP_COLUMN = "__op"
RECORD = "\x00the record\x00"  # stands for a record's place in errors, until one is raised
UNWRITTEN_TRUNCATES = "truncates of tables not written yet"


@dataclass(frozen=True)
class DecodedTable:
    identifier: str
    rows: pa.Table  # key fields, the row's fields, OP_COLUMN, POSITION_COLUMN
    key: tuple[str, ...]  # the message key's fields (): none in this batch (a change log, or only a truncate)
    keyed: bool  # False: a table without a primary key at the source, kept as a change log
    connector: str
    truncated_at: bytes | None = None  # the newest truncate's position (encoded as the sequence is)
    events: int = 0


@dataclass
class Decoded:
    tables: list[DecodedTable] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)


# The Arrow schema a table already has (None: it does not exist): a row read without
# Connect schemas takes its column types from it, as any routed JSON payload does.
TableSchema = Callable[[str], pa.Schema | None]
# Raw JSON: msgspec's view of the record's bytes, or bytes.
Json = bytes | msgspec.Raw


@dataclass
class _Table:
    identifier: str
    connector: str
    indices: list[int] = field(default_factory=list)  # into the task's records
    ops: list[str] = field(default_factory=list)
    rows: list[Json | None] = field(default_factory=list)
    schemas: list[Json | None] = field(default_factory=list)
    keys: list[Json | None] = field(default_factory=list)
    key_schemas: list[Json | None] = field(default_factory=list)
    sources: list[Source] = field(default_factory=list)
    offsets: list[int | None] = field(default_factory=list)
    struct_rows: list[int] = field(default_factory=list)  # rows of a struct value column


def decode(records: pa.Table, options: DebeziumOptions, table_schema: TableSchema) -> Decoded:
    """Every table's rows of a task's records (columns as options names them)."""
    out = Decoded()
    n = records.num_rows
    if n == 0:
        return out
    value = records.column(options.value_column).combine_chunks()
    key = records.column(options.key_column).combine_chunks() if options.key_column in records.column_names else None
    topics = _list(records, options.topic_column, n)
    partitions = _list(records, options.partition_column, n)
    offsets = _list(records, options.offset_column, n)
    structured = pa.types.is_struct(value.type)
    events = _struct_events(value) if structured else None
    values = value.to_pylist() if events is None else []
    keys: list[Any] = key.to_pylist() if key is not None and not pa.types.is_struct(key.type) else [None] * n
    key_struct = key if key is not None and pa.types.is_struct(key.type) else None
    tables: dict[str, _Table] = {}
    names: dict[tuple[Any, ...], str] = {}
    skipped: dict[str, int] = {}
    # The loop makes a few objects per record and keeps them (rows, sources): the collector's
    # full passes over them cost a quarter of it, and nothing it makes is cyclic.
    collecting = gc.isenabled()
    gc.disable()
    i = 0
    try:
        for i in range(n):
            event = events[i] if events is not None else read_value(values[i], topics[i], RECORD)
            if event.kind is not Kind.CHANGE and event.kind is not Kind.TRUNCATE:
                skipped[event.kind.value] = skipped.get(event.kind.value, 0) + 1
                continue
            source = event.source
            naming = (source.db, source.schema, source.table, topics[i])
            identifier = names.get(naming)
            if identifier is None:
                identifier = names[naming] = _identifier(options, naming, RECORD)
            table = tables.get(identifier)
            if table is None:
                table = tables[identifier] = _Table(identifier, str(source.connector or ""))
            elif table.connector != (source.connector or ""):
                raise DebeziumInputError(
                    f"{RECORD}: table {identifier} gets events of connectors {table.connector!r} and {source.connector!r}"
                )
            table.indices.append(i)
            table.ops.append(event.op or "")
            table.rows.append(event.row)
            table.schemas.append(event.schema)
            table.sources.append(source)
            table.offsets.append(offsets[i])
            if key_struct is not None:
                table.keys.append(None if not key_struct[i].is_valid or event.kind is Kind.TRUNCATE else b"")
                table.key_schemas.append(None)
            else:
                fields, schema = read_key(keys[i], RECORD) if event.kind is Kind.CHANGE else (None, None)
                table.keys.append(fields)
                table.key_schemas.append(schema)
            if structured:
                table.struct_rows.append(i)
    except DebeziumInputError as exc:
        # Named once, when it fails: formatting every record's place cost more than reading it.
        raise DebeziumInputError(str(exc).replace(RECORD, where(topics[i], partitions[i], offsets[i], i))) from None
    finally:
        if collecting:
            gc.enable()
    out.skipped = skipped
    with_offset = options.offset_column is not None
    # cluster_by_key's route travels with each row of a keyed table (write/task.py reads it).
    route = records.column(ROUTE_COLUMN).combine_chunks() if ROUTE_COLUMN in records.column_names else None
    for identifier in sorted(tables):
        decoded = _table_rows(
            tables[identifier], value if structured else None, key_struct, table_schema(identifier), options, with_offset, topics, partitions, offsets,
            route,
        )
        if decoded is not None:
            out.tables.append(decoded)
        else:
            skipped[UNWRITTEN_TRUNCATES] = skipped.get(UNWRITTEN_TRUNCATES, 0) + len(tables[identifier].ops)
    return out


def _list(records: pa.Table, column: str | None, n: int) -> list[Any]:
    if column is None or column not in records.column_names:
        return [None] * n
    return records.column(column).to_pylist()


def _identifier(options: DebeziumOptions, naming: tuple[Any, ...], what: str) -> str:
    db, schema, table, topic = naming
    if not table:
        raise DebeziumInputError(f"{what} is a change event without source.table: lakesink cannot tell its table. Nothing was written")
    parts = {"db": db, "schema": schema, "table": table, "topic": topic}
    try:
        name = options.table_name.format(**{k: _name_part(v) for k, v in parts.items()})
    except (KeyError, IndexError, ValueError) as exc:
        raise DebeziumInputError(f"option 'table_name' {options.table_name!r}: {exc!r} (use {{db}}, {{schema}}, {{table}}, {{topic}})") from None
    if "." in name:
        return name
    if options.namespace is None:
        raise DebeziumInputError(f"option 'table_name' gives {name!r} for {what}: give option 'namespace' for its namespace")
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
        elif op not in ("c", "r", "u", "d", "t"):
            raise DebeziumInputError(f"a record has op {op!r}: Debezium's ops are c, r, u, d, t, m. Nothing was written")
        else:
            known = {k: v for k, v in (source or {}).items() if k in Source.__struct_fields__}
            events.append(Event(Kind.TRUNCATE if op == TRUNCATE_OP else Kind.CHANGE, op, Source(**known)))
    return events


def _table_rows(
    table: _Table, struct_value: pa.StructArray | None, key_struct: pa.StructArray | None, existing: pa.Schema | None,
    options: DebeziumOptions, with_offset: bool, topics: Sequence[Any], partitions: Sequence[Any], offsets: Sequence[Any],
    route: pa.Array | None = None,
) -> DecodedTable | None:
    n = len(table.indices)
    changes = [i for i, op in enumerate(table.ops) if op != TRUNCATE_OP]
    with_key = [i for i in changes if table.keys[i] is not None]
    if with_key and len(with_key) != len(changes):
        j = table.indices[next(i for i in changes if table.keys[i] is None)]
        raise DebeziumInputError(
            f"{where(topics[j], partitions[j], offsets[j], j)}: table {table.identifier} gets events with a message key and "
            "without one in one batch; Debezium keys every event of a table with a primary key. Nothing was written"
        )
    # Keyed: its events carry keys, or (a batch with only a truncate of it) the table is no change log.
    keyed = bool(with_key) if changes else existing is not None and not _is_change_log(existing)
    if not changes and existing is None:
        return None  # a truncate of a table never written: nothing to empty
    position = positions(table.connector, table.sources, table.offsets if with_offset else None)
    after = _struct_rows(struct_value, table) if struct_value is not None else _json_rows(table, existing)
    key_names: tuple[str, ...] = ()
    if with_key:
        key = _struct_keys(key_struct, table) if key_struct is not None else _json_keys(table, existing)
        key_names = tuple(key.column_names)
        after = after.drop_columns([c for c in key_names if c in after.column_names])
        for i, name in enumerate(key_names):
            after = after.add_column(i, key.schema.field(name), key.column(name))
    rows = after.append_column(OP_COLUMN, pa.array(table.ops, pa.string())).append_column(POSITION_COLUMN, position)
    if route is not None and keyed:
        rows = rows.append_column(ROUTE_COLUMN, route.take(pa.array(table.indices, pa.int64())))
    truncated_at = None
    truncates = [i for i, op in enumerate(table.ops) if op == TRUNCATE_OP]
    if keyed and truncates:
        # The truncate is applied, not stored: this task's rows ordered before the newest one
        # go here; the commit hides the table's own (and other tasks') rows before it.
        encoded = encode_position(position)
        truncated_at = max(encoded[i] for i in truncates)
        keep = np.fromiter((op != TRUNCATE_OP and encoded[i] > truncated_at for i, op in enumerate(table.ops)), dtype=bool, count=n)
        rows = rows.filter(pa.array(keep))
    return DecodedTable(table.identifier, rows, key_names, keyed, table.connector, truncated_at, n)


def _is_change_log(schema: pa.Schema) -> bool:
    return OP_COLUMN in schema.names


def encode_position(position: pa.StructArray) -> list[bytes]:
    """Positions encoded as a keyed write encodes its sequence (its parts one after another)."""
    return encode_keys([position.field(j) for j in range(position.type.num_fields)])


# -- rows of JSON values ------------------------------------------------------------------------


def _json_rows(table: _Table, existing: pa.Schema | None) -> pa.Table:
    """Each event's row (`after`; a delete's `before` for a change log), by value schema."""
    groups: dict[bytes | None, list[int]] = {}
    for i, schema in enumerate(table.schemas):
        groups.setdefault(schema, []).append(i)
    parts: list[pa.Table] = []
    order: list[int] = []
    for schema_json, members in groups.items():
        raws = [table.rows[i] for i in members]
        connect = _row_schema(schema_json) if schema_json is not None else None
        parts.append(_parse_rows(raws, connect, existing))
        order += members
    if len(parts) == 1:
        return parts[0]
    merged = pa.concat_tables(parts, promote_options="permissive")
    return merged.take(pa.array(np.argsort(np.asarray(order), kind="stable")))


_row_schemas: dict[bytes, ConnectSchema | None] = {}
_key_schemas: dict[bytes, ConnectSchema] = {}


def _row_schema(envelope_schema: bytes) -> ConnectSchema | None:
    """The Connect schema of an envelope's rows (its `after`, else `before`), parsed once."""
    cached = _row_schemas.get(envelope_schema, False)
    if cached is not False:
        return cached  # type: ignore[return-value]
    envelope = parse_schema(envelope_schema)
    row = envelope.child("after") or envelope.child("before")
    if len(_row_schemas) > 4096:
        _row_schemas.clear()  # a long-lived worker meets many schema versions: keep the cache bounded
    _row_schemas[envelope_schema] = row
    return row


def _key_schema(raw: bytes) -> ConnectSchema:
    cached = _key_schemas.get(raw)
    if cached is None:
        if len(_key_schemas) > 4096:
            _key_schemas.clear()
        cached = _key_schemas[raw] = parse_schema(raw)
    return cached


def _parse_rows(raws: Sequence[Json | None], connect: ConnectSchema | None, existing: pa.Schema | None) -> pa.Table:
    """Rows as JSON objects -> their columns: by their Connect schema (each column read in its
    JSON form, then converted), else typed as the table has them or as the JSON gives them."""
    blob = _lines(raws)
    if connect is not None:
        fields = list(connect.fields or ())
        if not fields:
            return pa.table({"__empty": pa.nulls(len(raws))}).drop_columns(["__empty"])
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
    explicit = pa.schema([pa.field(f.name, f.type) for f in existing if f.name not in (OP_COLUMN, POSITION_COLUMN)]) if existing is not None else None
    try:
        parsed = _read(blob, explicit, "infer")
    except pa.ArrowInvalid as exc:
        raise DebeziumSchemaError(f"the rows cannot be read as the table's columns: {exc}") from None
    nulls = [f.name for f in parsed.schema if pa.types.is_null(f.type)]
    return parsed.drop_columns(nulls) if nulls else parsed


def _lines(raws: Sequence[Json | None]) -> bytes:
    # One JSON object per line: a null row (a delete's) is an object of nulls. A value written
    # across lines (pretty-printed JSON) is written again on one.
    texts = [r if r is not None else b"{}" for r in raws]
    blob = b"\n".join(texts)
    if blob.count(b"\n") != len(texts) - 1:
        blob = b"\n".join(msgspec.json.encode(msgspec.json.decode(r)) if b"\n" in bytes(r) else r for r in texts)
    return blob


def _read(blob: bytes, explicit: pa.Schema | None, unexpected: str) -> pa.Table:
    parse = pa_json.ParseOptions(explicit_schema=explicit, unexpected_field_behavior=unexpected)
    # One block for the whole blob: Arrow infers a block's types on its own, and blocks that
    # disagree (a field null in one, text in the next) would fail the read.
    read = pa_json.ReadOptions(block_size=max(1 << 20, len(blob) + 1))
    return pa_json.read_json(io.BytesIO(blob), read_options=read, parse_options=parse)


def _json_keys(table: _Table, existing: pa.Schema | None) -> pa.Table:
    """The message keys' fields, in their Connect types (or the table's); a row without a key
    (a truncate's) gets nulls, and is dropped by the caller."""
    groups: dict[bytes | None, list[int]] = {}
    for i, schema in enumerate(table.key_schemas):
        if table.keys[i] is not None:
            groups.setdefault(schema, []).append(i)
    first = next(iter(groups))
    groups[first] += [i for i, k in enumerate(table.keys) if k is None]
    parts, order = [], []
    for schema_json, members in groups.items():
        connect = _key_schema(schema_json) if schema_json is not None else None
        parts.append(_parse_rows([table.keys[i] for i in members], connect, None))
        order += members
    keys = parts[0] if len(parts) == 1 else pa.concat_tables(parts, promote_options="permissive")
    if order != sorted(order):
        keys = keys.take(pa.array(np.argsort(np.asarray(order), kind="stable")))
    if existing is not None:
        for i, name in enumerate(keys.column_names):
            if name in existing.names and keys.schema.field(name).type != existing.field(name).type:
                try:
                    keys = keys.set_column(i, name, keys.column(name).cast(existing.field(name).type))
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                    pass  # the table's own check names the column
    return keys


def _struct_rows(value: pa.StructArray, table: _Table) -> pa.Table:
    """The rows of a decoded (struct) value column: `after`, a delete's `before`."""
    rows = pa.array(table.struct_rows, pa.int64())
    names = {f.name for f in value.type}
    after = value.field("after").take(rows) if "after" in names else None
    before = value.field("before").take(rows) if "before" in names else None
    if after is None or (before is not None and before.type == after.type):
        if after is None and before is None:
            raise DebeziumInputError("the value column is a struct without 'after' or 'before': give Debezium's envelope")
        if after is None:
            after = before
        elif before is not None:
            after = pc.if_else(pa.array([op == DELETE_OP for op in table.ops]), before, after)
    assert after is not None
    if isinstance(after, pa.ChunkedArray):
        after = after.combine_chunks()
    return pa.Table.from_arrays(after.flatten(), names=[f.name for f in after.type])


def _struct_keys(key: pa.StructArray, table: _Table) -> pa.Table:
    taken = key.take(pa.array(table.struct_rows, pa.int64()))
    return pa.Table.from_arrays(taken.flatten(), names=[f.name for f in taken.type])
