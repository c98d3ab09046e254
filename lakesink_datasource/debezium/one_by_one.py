"""Debezium records read one by one: msgspec reads each record's op and source, and a table's
rows and keys are then parsed together, by schema (the way for a topic's first record in a
process, values without JsonConverter's wrapper or decoded into a struct, and anything the
bulk read refuses).
"""

from __future__ import annotations

import gc
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lakesink_datasource.debezium.envelope import (
    DELETE_OP,
    TRUNCATE_OP,
    DebeziumInputError,
    Event,
    Kind,
    Source,
    read_key,
    read_value,
    refuse_mongodb,
)
from lakesink_datasource.debezium.json_rows import key_schema, parse_rows, row_schema
from lakesink_datasource.debezium.naming import check_connector, table_named
from lakesink_datasource.debezium.positions import positions
from lakesink_datasource.debezium.records import CHANGE_OPS, RECORD, Json, Part, Records, TableSchema


@dataclass
class TableEvents:
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


def read_one_by_one(
    task: Records, which: Sequence[int], events: list[Event] | None, parts: dict[str, list[Part]], connectors: dict[str, str],
    skipped: dict[str, int], table_schema: TableSchema,
) -> None:
    tables: dict[str, TableEvents] = {}
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
                identifier = names[naming] = table_named(task, naming)
            table = tables.get(identifier)
            if table is None:
                table = tables[identifier] = TableEvents(str(source.connector or ""))
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
        check_connector(connectors, identifier, table.connector, task, table.indices[0])
        indices = np.asarray(table.indices, dtype=np.int64)
        position = positions(table.connector, table.sources, table.ops)
        rows = _struct_rows(task.value_struct, indices, table.ops) if task.value_struct is not None else _json_rows(table, table_schema(identifier))
        if task.key_struct is not None:
            taken = task.key_struct.take(pa.array(indices))
            keys: pa.Table | None = pa.Table.from_arrays(taken.flatten(), names=[f.name for f in taken.type])
        else:
            keys = json_keys(table)
        keyless = np.fromiter((k is None for k in table.keys), dtype=bool, count=len(table.keys))
        parts.setdefault(identifier, []).append(Part(indices, pa.array(table.ops, pa.string()), rows, keys, keyless, position))



def struct_events(value: pa.StructArray) -> list[Event]:
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
        elif op not in CHANGE_OPS:
            raise DebeziumInputError(f"a record has op {op!r}: Debezium's ops are c, r, u, d, t, m. Nothing was written")
        else:
            known = {k: v for k, v in (source or {}).items() if k in Source.__struct_fields__}
            read = Source(**known)
            if read.table is None:
                refuse_mongodb(read, f"record {len(events)} of the input")
            events.append(Event(Kind.TRUNCATE if op == TRUNCATE_OP else Kind.CHANGE, op, read))
    return events


def _json_rows(table: TableEvents, existing: pa.Schema | None) -> pa.Table:
    """Each event's row (`after`; a delete's `before`), parsed by value schema (without one,
    by the table's columns where it has them)."""
    groups: dict[bytes | None, list[int]] = {}
    for i, schema in enumerate(table.schemas):
        groups.setdefault(schema, []).append(i)
    parts: list[pa.Table] = []
    order: list[int] = []
    for schema_json, members in groups.items():
        connect = row_schema(schema_json) if schema_json is not None else None
        parts.append(parse_rows([table.rows[i] for i in members], connect, existing))
        order += members
    if len(parts) == 1:
        return parts[0]
    merged = pa.concat_tables(parts, promote_options="permissive")
    return merged.take(pa.array(np.argsort(np.asarray(order), kind="stable")))


def json_keys(table: TableEvents) -> pa.Table | None:
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
        connect = key_schema(schema_json) if schema_json is not None else None
        parts.append(parse_rows([table.keys[i] for i in members], connect))
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
