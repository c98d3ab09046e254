"""Debezium change events as Spark's Kafka source hands them over, and a plain model of the
replica they describe.

Written here from Debezium's documented message shapes (the PostgreSQL, MySQL and SQL Server
connector pages: envelope, `source` blocks, tombstones, truncates, transaction markers,
heartbeats, schema-change records; Kafka Connect's JsonConverter with and without its
`{"schema", "payload"}` wrapper; the logical types Decimal, Date, MicroTimestamp,
ZonedTimestamp, Time, VariableScaleDecimal). Each source table has a list of columns with
their Connect type; values are given as Python values and encoded the way the connector
writes them.

The model applies a table's events in the order Debezium documents for every connector: the
source's commit order, the order the connector emits its changes in (each event's `order`,
counted as the connector emits it; not read from `source`). A connector restart re-sends
events at new Kafka offsets with their `order` unchanged: a duplicate, ignored. A key's newest
change wins, a delete removes it, an older late change is ignored, a truncate removes every
row ordered before it, an unchanged TOASTed value keeps what the key held, and a table
without a key keeps every event as a row of its change log.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

PLACEHOLDER = "__debezium_unavailable_value"
EPOCH = dt.date(1970, 1, 1)
KAFKA_ARROW = pa.schema([("key", pa.binary()), ("value", pa.binary()), ("topic", pa.string()), ("partition", pa.int32()), ("offset", pa.int64())])


@dataclass(frozen=True)
class Column:
    name: str
    kind: str  # int32 | int64 | string | boolean | float32 | float64 | decimal | date | micro_timestamp | zoned_timestamp | bytes | micro_time | json | variable_decimal
    scale: int = 2
    precision: int = 10
    optional: bool = True


@dataclass(frozen=True)
class SourceTable:
    db: str
    schema: str | None  # PostgreSQL and SQL Server: a schema; MySQL: None
    table: str
    columns: tuple[Column, ...]
    key: tuple[str, ...]  # () : no primary key at the source

    def column(self, name: str) -> Column:
        return next(c for c in self.columns if c.name == name)


# Kafka's JsonConverter writes Connect's FLOAT32/FLOAT64 under its own JSON schema names
# (org.apache.kafka.connect.json.JsonSchema: FLOAT_TYPE_NAME "float", DOUBLE_TYPE_NAME "double").
JSON_CONVERTER_NAMES = {"float32": "float", "float64": "double"}


def _connect_field(c: Column) -> dict[str, Any]:
    base: dict[str, Any] = {"optional": c.optional, "field": c.name}
    match c.kind:
        case "int32" | "int64" | "string" | "boolean" | "bytes":
            base["type"] = c.kind
        case "float32" | "float64":
            base["type"] = JSON_CONVERTER_NAMES[c.kind]
        case "decimal":
            base.update(type="bytes", name="org.apache.kafka.connect.data.Decimal", version=1,
                        parameters={"scale": str(c.scale), "connect.decimal.precision": str(c.precision)})
        case "date":
            base.update(type="int32", name="io.debezium.time.Date", version=1)
        case "micro_timestamp":
            base.update(type="int64", name="io.debezium.time.MicroTimestamp", version=1)
        case "zoned_timestamp":
            base.update(type="string", name="io.debezium.time.ZonedTimestamp", version=1)
        case "micro_time":
            base.update(type="int64", name="io.debezium.time.MicroTime", version=1)
        case "json":
            base.update(type="string", name="io.debezium.data.Json", version=1)
        case "variable_decimal":
            base.update(type="struct", name="io.debezium.data.VariableScaleDecimal", version=1,
                        fields=[{"type": "int32", "optional": False, "field": "scale"}, {"type": "bytes", "optional": False, "field": "value"}])
        case _:
            raise ValueError(c.kind)
    return base


def _unscaled_bytes(value: int) -> bytes:
    length = max(1, (value.bit_length() + 8) // 8)
    return value.to_bytes(length, "big", signed=True)


def encode_value(c: Column, value: Any) -> Any:
    """A Python value as the connector writes it in JSON (with Connect's logical types)."""
    if value is None:
        return None
    if value == PLACEHOLDER:
        return base64.b64encode(PLACEHOLDER.encode()).decode() if c.kind == "bytes" else PLACEHOLDER
    match c.kind:
        case "decimal":
            unscaled = int(decimal.Decimal(value).scaleb(c.scale).to_integral_exact())
            return base64.b64encode(_unscaled_bytes(unscaled)).decode()
        case "variable_decimal":
            d = decimal.Decimal(value)
            exponent = d.as_tuple().exponent
            assert isinstance(exponent, int)
            scale = -exponent
            return {"scale": scale, "value": base64.b64encode(_unscaled_bytes(int(d.scaleb(scale)))).decode()}
        case "date":
            return (value - EPOCH).days
        case "micro_timestamp":
            delta = value - dt.datetime(1970, 1, 1)
            return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
        case "zoned_timestamp":
            return value.isoformat().replace("+00:00", "Z")
        case "micro_time":
            return ((value.hour * 60 + value.minute) * 60 + value.second) * 1_000_000 + value.microsecond
        case "bytes":
            return base64.b64encode(value).decode()
        case _:
            return value


def plain_value(c: Column, value: Any) -> Any:
    """What a reader of the replica sees (DuckDB / pyiceberg Python values)."""
    if value is None:
        return None
    match c.kind:
        case "decimal":
            return decimal.Decimal(value).quantize(decimal.Decimal(1).scaleb(-c.scale))
        case "variable_decimal":
            return str(decimal.Decimal(value))
        case "zoned_timestamp":
            return value.astimezone(dt.timezone.utc).replace(tzinfo=None)  # as lakesink_testing.rows normalises it
        case _:
            return value


@dataclass
class Connector:
    """One Debezium connector writing to Kafka: its topics, its source positions, its
    converter (with or without JsonConverter's schema wrapper)."""

    kind: str  # postgresql | mysql | sqlserver | oracle
    prefix: str
    wrapper: bool = True
    partitions: int = 1  # partitions of each table's topic (a key's events stay in one)
    lsn: int = 1000  # PostgreSQL lsn / SQL Server change counter
    last_commit: int = 900
    binlog_file: int = 1
    binlog_pos: int = 4
    offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    emitted: int = 0  # changes emitted so far: the commit order the model applies them in
    # The next change's transaction began before the last ones committed: its change sits
    # lower in the log than theirs, its commit after them (not in MySQL's binlog, which holds
    # a transaction whole at its commit).
    in_flight: bool = False

    def topic(self, t: SourceTable) -> str:
        return f"{self.prefix}.{t.schema if self.kind != 'mysql' else t.db}.{t.table}"

    # -- positions ----------------------------------------------------------------------------

    def advance(self, rows: int = 1) -> None:
        """The log moves on (a new transaction for PostgreSQL)."""
        self.last_commit = self.lsn
        self.lsn += 10 * rows
        self.binlog_pos += 100 * rows

    def rotate(self) -> None:
        """MySQL starts a new binlog file: the position starts low again."""
        self.binlog_file += 1
        self.binlog_pos = 4

    def _source(self, t: SourceTable, row: int, snapshot: bool) -> tuple[dict[str, Any], tuple[Any, ...]]:
        common = {"version": "2.7.3.Final", "connector": self.kind, "name": self.prefix, "ts_ms": 1_700_000_000_000,
                  "snapshot": "true" if snapshot else "false", "db": t.db}
        # An in-flight transaction's change: below every change sent so far (a long transaction).
        began = 500 if self.in_flight and not snapshot else self.lsn
        self.in_flight = False
        if self.kind == "postgresql":
            lsn = began + row
            source = {**common, "sequence": json.dumps([str(self.last_commit), str(lsn)]), "schema": t.schema, "table": t.table,
                      "txId": 500 + self.lsn, "lsn": lsn, "xmin": None}
            return source, (lsn, self.last_commit)
        if self.kind == "mysql":
            source = {**common, "table": t.table, "server_id": 223344, "gtid": None, "file": f"mysql-bin.{self.binlog_file:06d}",
                      "pos": self.binlog_pos, "row": row, "thread": 7, "query": None}
            return source, (self.binlog_file, self.binlog_pos, row)
        if self.kind == "oracle":
            scn, commit = began + row, self.lsn + 9  # the transaction commits after its changes
            oracle = {**common, "schema": t.schema, "table": t.table, "scn": str(scn), "commit_scn": None if snapshot else str(commit)}
            return oracle, (scn,)
        lsn = f"{began:08x}:{row:08x}:0002"
        change = None if snapshot else lsn
        source = {**common, "schema": t.schema, "table": t.table, "change_lsn": change, "commit_lsn": f"{self.lsn:08x}:00000000:0005",
                  "event_serial_no": None if snapshot else 1}
        return source, (change or "", f"{self.lsn:08x}:00000000:0005", -1 if snapshot else 1)

    # -- records ------------------------------------------------------------------------------

    def _envelope_schema(self, t: SourceTable) -> dict[str, Any]:
        value = {"type": "struct", "fields": [_connect_field(c) for c in t.columns], "optional": True,
                 "name": f"{self.prefix}.{t.schema or t.db}.{t.table}.Value"}
        source = {"type": "struct", "fields": [{"type": "string", "optional": True, "field": "table"}], "optional": False,
                  "name": f"io.debezium.connector.{self.kind}.Source", "field": "source"}
        return {"type": "struct", "optional": False, "name": f"{self.prefix}.{t.table}.Envelope", "fields": [
            {**value, "field": "before"}, {**value, "field": "after"}, source,
            {"type": "string", "optional": False, "field": "op"}, {"type": "int64", "optional": True, "field": "ts_ms"},
        ]}

    def _key_schema(self, t: SourceTable) -> dict[str, Any]:
        return {"type": "struct", "optional": False, "name": f"{self.prefix}.{t.schema or t.db}.{t.table}.Key",
                "fields": [{**_connect_field(t.column(k)), "optional": False} for k in t.key]}

    def _wrap(self, schema: dict[str, Any], payload: Any) -> bytes:
        return json.dumps({"schema": schema, "payload": payload} if self.wrapper else payload).encode()

    def _partition(self, t: SourceTable, key: dict[str, Any] | None) -> int:
        if key is None:
            return 0
        return hash(tuple(sorted(key.items()))) % self.partitions

    def _record(self, topic: str, partition: int, key: bytes | None, value: bytes | None) -> dict[str, Any]:
        offset = self.offsets.get((topic, partition), 0)
        self.offsets[(topic, partition)] = offset + 1
        return {"key": key, "value": value, "topic": topic, "partition": partition, "offset": offset}

    def change(self, t: SourceTable, op: str, row: dict[str, Any] | None, *, before: dict[str, Any] | None = None,
               snapshot: bool = False, index: int = 0, tombstone: bool = True,
               source: dict[str, Any] | None = None) -> tuple[list[dict[str, Any]], Event]:
        """A change event (and its tombstone, for a delete), and the model's event. `source`
        replaces fields of the event's `source` block (a hand-written position)."""
        made, position = self._source(t, index, snapshot)
        source = {**made, **(source or {})}
        self.emitted += 1
        image = row if op != "d" else None
        deleted = before if before is not None else row
        payload = {
            "before": None if deleted is None or op == "c" or op == "r" else {c.name: encode_value(c, deleted.get(c.name)) for c in t.columns},
            "after": None if image is None else {c.name: encode_value(c, image.get(c.name)) for c in t.columns},
            "source": source, "op": op, "ts_ms": 1_700_000_000_123,
        }
        if op == "u" and before is None:
            payload["before"] = None  # REPLICA IDENTITY DEFAULT: updates carry no before
        key_fields = {k: (row or deleted or {})[k] for k in t.key} if t.key else None
        key = self._wrap(self._key_schema(t), {k: encode_value(t.column(k), v) for k, v in key_fields.items()}) if key_fields else None
        topic = self.topic(t)
        partition = self._partition(t, key_fields)
        records = [self._record(topic, partition, key, self._wrap(self._envelope_schema(t), payload))]
        if op == "d" and key is not None and tombstone:
            records.append(self._record(topic, partition, key, None))
        offset = records[0]["offset"]
        # A delete of a table without a key is logged with the row it deleted (its `before`).
        return records, Event(t, op, row if op != "d" else (key_fields if t.key else deleted), (*position, offset), self.emitted)

    def truncate(self, t: SourceTable) -> tuple[list[dict[str, Any]], Event]:
        source, position = self._source(t, 0, False)
        payload = {"source": source, "op": "t", "ts_ms": 1_700_000_000_500}
        topic = self.topic(t)
        record = self._record(topic, 0, None, self._wrap(self._envelope_schema(t), payload))
        self.emitted += 1
        return [record], Event(t, "t", None, (*position, record["offset"]), self.emitted)

    def heartbeat(self) -> dict[str, Any]:
        payload = {"ts_ms": 1_700_000_000_999}
        schema = {"type": "struct", "fields": [{"type": "int64", "optional": False, "field": "ts_ms"}], "optional": False,
                  "name": "io.debezium.connector.common.Heartbeat"}
        return self._record(f"__debezium-heartbeat.{self.prefix}", 0, self._wrap({"type": "string"}, self.prefix), self._wrap(schema, payload))

    def transaction(self, status: str) -> dict[str, Any]:
        payload = {"status": status, "id": f"{self.lsn}", "ts_ms": 1_700_000_000_000, "event_count": None if status == "BEGIN" else 2,
                   "data_collections": None}
        schema = {"type": "struct", "fields": [{"type": "string", "optional": False, "field": "status"}], "optional": False,
                  "name": "io.debezium.connector.common.TransactionMetadataValue"}
        return self._record(f"{self.prefix}.transaction", 0, None, self._wrap(schema, payload))

    def schema_change(self, t: SourceTable) -> dict[str, Any]:
        source, _ = self._source(t, 0, False)
        payload = {"source": source, "ts_ms": 1_700_000_000_000, "databaseName": t.db, "schemaName": None,
                   "ddl": f"ALTER TABLE {t.table} ADD COLUMN note VARCHAR(40)", "tableChanges": []}
        schema = {"type": "struct", "fields": [], "optional": False, "name": "io.debezium.connector.mysql.SchemaChangeValue"}
        return self._record(self.prefix, 0, self._wrap({"type": "struct", "fields": []}, {"databaseName": t.db}), self._wrap(schema, payload))


@dataclass(frozen=True)
class Event:
    table: SourceTable
    op: str
    row: dict[str, Any] | None  # the row written (c/r/u), the key (d), None (t)
    position: tuple[Any, ...]  # source position, Kafka offset last (for reading; not what the model orders by)
    order: int = 0  # commit order: the connector's emission order, kept by a re-send


def to_arrow(records: Iterable[dict[str, Any]], schema: pa.Schema = KAFKA_ARROW) -> pa.Table:
    return pa.Table.from_pylist(list(records), schema=schema)


class Replica:
    """The plain model: each keyed table's live rows by key, each keyless table's log."""

    def __init__(self, schemas: bool = True) -> None:
        # Without JsonConverter's schemas a replica holds values as the JSON gives them.
        self.value = plain_value if schemas else (lambda c, v: encode_value(c, v) if v != PLACEHOLDER else v)
        self.live: dict[str, dict[tuple[Any, ...], tuple[int, dict[str, Any] | None]]] = {}
        self.truncated: dict[str, int] = {}
        self.logs: dict[str, list[dict[str, Any]]] = {}

    def apply(self, events: Iterable[Event], identifier: Any) -> None:
        """Apply a batch's events as lakesink must: per key in commit order, whatever order they
        arrive in."""
        events = list(events)
        # A change log a batch starts: its truncates ordered before the batch's first change of
        # it (re-sent ones too) have nothing to empty and are left out (docs/limits.md).
        first: dict[str, int] = {}
        for e in events:
            name = identifier(e.table)
            if not e.table.key and e.op != "t" and name not in self.logs:
                first[name] = min(first.get(name, e.order), e.order)
        for e in events:
            name = identifier(e.table)
            if not e.table.key:
                if e.op == "t" and name not in self.logs:
                    continue  # a truncate of a table never written: nothing to keep it in
                if e.op == "t" and name in first and e.order < first[name]:
                    continue
                log = self.logs.setdefault(name, [])
                row = {c.name: self.value(c, (e.row or {}).get(c.name)) for c in e.table.columns}
                log.append({**row, "__op": e.op})
                continue
            table = self.live.setdefault(name, {})
            floor = self.truncated.get(name)
            if e.op == "t":
                if floor is None or e.order > floor:
                    self.truncated[name] = e.order
                for k, (order, _row) in list(table.items()):
                    if order < e.order:
                        del table[k]
                continue
            if floor is not None and e.order < floor:
                continue  # ordered before a truncate
            assert e.row is not None
            key = tuple(e.row[k] for k in e.table.key)
            held = table.get(key)
            if held is not None and held[0] >= e.order:
                continue  # a late change, or a re-sent one
            if e.op == "d":
                table[key] = (e.order, None)
                continue
            row = {c.name: self.value(c, e.row.get(c.name)) for c in e.table.columns}
            for c in e.table.columns:
                if e.row.get(c.name) == PLACEHOLDER:
                    kept = held[1] if held is not None and held[1] is not None else None
                    row[c.name] = kept[c.name] if kept is not None else PLACEHOLDER
            table[key] = (e.order, row)

    def rows(self, name: str, columns: list[str]) -> Counter:
        if name in self.logs:
            return Counter(tuple(r.get(c) for c in columns) for r in self.logs[name])
        return Counter(tuple(row[c] for c in columns) for _, row in self.live.get(name, {}).values() if row is not None)


class SourceDatabase:
    """A source database behind one connector: its rows, and the events each change emits
    (a TOASTed column left unchanged by an update is sent as the placeholder)."""

    def __init__(self, connector: Connector, tables: Iterable[SourceTable], toasted: Iterable[str] = ()) -> None:
        self.connector = connector
        self.tables = {t.table: t for t in tables}
        self.rows: dict[str, dict[tuple[Any, ...], dict[str, Any]]] = {t: {} for t in self.tables}
        self.toasted = set(toasted)  # columns sent as the placeholder when an update leaves them alone
        self.records: list[dict[str, Any]] = []  # every Kafka record, in the order written
        self.events: list[Event] = []  # the model's events, one per change record
        self._sent: list[tuple[dict[str, Any], Event]] = []
        self._serial = 0

    def _emit(self, made: tuple[list[dict[str, Any]], Event]) -> None:
        records, event = made
        self.records += records
        self.events.append(event)
        self._sent.append((records[0], event))
        self.connector.advance()

    def snapshot(self, table: str, row: dict[str, Any]) -> None:
        t = self.tables[table]
        self.rows[table][tuple(row[k] for k in t.key)] = dict(row)
        self._emit(self.connector.change(t, "r", row, snapshot=True))

    def insert(self, table: str, row: dict[str, Any]) -> None:
        t = self.tables[table]
        if t.key:
            key = tuple(row[k] for k in t.key)
            if key in self.rows[table]:
                return
            self.rows[table][key] = dict(row)
        self._emit(self.connector.change(t, "c", row))

    def update(self, table: str, key: tuple[Any, ...], changes: dict[str, Any], *, in_flight: bool = False) -> None:
        """`in_flight`: the update's transaction began before the last ones committed."""
        t = self.tables[table]
        current = self.rows[table].get(key)
        if current is None:
            return
        current.update(changes)
        sent = {c: (PLACEHOLDER if c in self.toasted and c not in changes else v) for c, v in current.items()}
        self.connector.in_flight = in_flight
        self._emit(self.connector.change(t, "u", sent))

    def delete(self, table: str, key: tuple[Any, ...]) -> None:
        t = self.tables[table]
        current = self.rows[table].pop(key, None)
        if current is None:
            return
        self._emit(self.connector.change(t, "d", current))

    def truncate(self, table: str) -> None:
        self.rows[table].clear()
        self._emit(self.connector.truncate(self.tables[table]))

    def resend(self, last: int) -> None:
        """A connector restart: its last `last` change events come again, with their source
        positions and new Kafka offsets."""
        for record, event in self._sent[-last:] if last else []:
            copy = self.connector._record(record["topic"], record["partition"], record["key"], record["value"])
            self.records.append(copy)
            self.events.append(Event(event.table, event.op, event.row, (*event.position[:-1], copy["offset"]), event.order))

    def live(self, table: str, columns: list[str]) -> Counter:
        """The source's rows now (what a complete replica of a keyed table holds)."""
        t = self.tables[table]
        return Counter(tuple(plain_value(t.column(c), row.get(c)) for c in columns) for row in self.rows[table].values())


# -- hand-written order cases -------------------------------------------------------------------
# Each connector's events in the order the connector sends them (its commit order), with the
# `source` fields Debezium's code gives them (PostgresOffsetContext/SourceInfo: `sequence` is
# [commit LSN of the transaction sent before, this change's LSN], a snapshot read carries the
# snapshot's LSN; Oracle's snapshot rows carry the snapshot SCN and no commit_scn, streamed ones
# their transaction's commit_scn; SQL Server's snapshot rows a commit_lsn and no change_lsn,
# TxLogPosition ordering commit_lsn then change_lsn; Flink CDC's MySQL snapshot rows file ""
# and pos 0), and the table the source holds at the end, written by hand.

ITEM_COLUMNS = (Column("id", "int32", optional=False), Column("v", "string"))


@dataclass(frozen=True)
class OrderCase:
    connector: str
    table: SourceTable
    steps: tuple[tuple[str, int, str, dict[str, Any]], ...]  # op, id, v, the source's position fields
    expected: dict[int, str]  # id -> v: the source's rows at the end
    cut: int  # a two-batch run ends its first batch before this step
    name: str = ""  # the test id (default: the connector)

    @property
    def id(self) -> str:
        return self.name or self.connector

    def records(self, prefix: str) -> list[list[dict[str, Any]]]:
        """Each step's Kafka records (one partition: a key's events share one)."""
        c = Connector(self.connector, prefix, wrapper=self.connector != "sqlserver")
        out = []
        for op, i, v, source in self.steps:
            made, _ = c.change(self.table, op, {"id": i, "v": v}, snapshot=op == "r", source=source)
            out.append(made)
        return out


def resent(records: list[dict[str, Any]], first_offset: int) -> list[dict[str, Any]]:
    """A connector restart: the same records (source positions and all) at new offsets."""
    return [{**r, "offset": first_offset + n} for n, r in enumerate(records)]


def _pg(lsn: int, last_commit: int | None, snapshot: str = "false") -> dict[str, Any]:
    return {"lsn": lsn, "sequence": json.dumps([None if last_commit is None else str(last_commit), str(lsn)]), "snapshot": snapshot}


def _ora(scn: int, commit: int | None, snapshot: str = "false") -> dict[str, Any]:
    return {"scn": str(scn), "commit_scn": None if commit is None else str(commit), "snapshot": snapshot}


# The snapshot reads rows 1-3 at LSN/SCN 100. T2 (in flight then: its change at 90) commits at
# 110, after the snapshot, which could not see it. T3 changes row 2 at 120, commits at 125. T4
# changes row 3 at 130 and T5 at 140; T5 commits first (150), T4 last (160): row 3 ends as T4
# left it, though its change sits lower in the log.
PG_IN_FLIGHT = OrderCase("postgresql", SourceTable("shop", "public", "pg_items", ITEM_COLUMNS, ("id",)), (
    ("r", 1, "snap1", _pg(100, None, "first")), ("r", 2, "snap2", _pg(100, None, "true")), ("r", 3, "snap3", _pg(100, None, "last")),
    ("u", 1, "T2", _pg(90, None)),  # the first transaction streamed: no commit sent before it
    ("u", 2, "T3", _pg(120, 110)),
    ("u", 3, "T5", _pg(140, 125)),
    ("u", 3, "T4", _pg(130, 150)),
), {1: "T2", 2: "T3", 3: "T4"}, cut=3)
ORACLE_IN_FLIGHT = OrderCase("oracle", SourceTable("ORCL", "inventory", "ora_items", ITEM_COLUMNS, ("id",)), (
    ("r", 1, "snap1", _ora(100, None, "first")), ("r", 2, "snap2", _ora(100, None, "true")), ("r", 3, "snap3", _ora(100, None, "last")),
    ("u", 1, "T2", _ora(90, 110)),
    ("u", 2, "T3", _ora(120, 125)),
    ("u", 3, "T5", _ora(140, 150)),
    ("u", 3, "T4", _ora(130, 160)),
), {1: "T2", 2: "T3", 3: "T4"}, cut=3)


def _ms(commit: str, change: str | None, serial: int | None, snapshot: str = "false") -> dict[str, Any]:
    return {"commit_lsn": commit, "change_lsn": change, "event_serial_no": serial, "snapshot": snapshot}


# Streamed changes, then a re-snapshot (the connector's offsets reset: `snapshot.mode=always`)
# whose rows have a later commit_lsn and no change_lsn, then a change of a transaction that was
# in flight during the re-snapshot (its change below the snapshot's LSN, its commit after).
SQLSERVER_RESNAPSHOT = OrderCase("sqlserver", SourceTable("testDB", "dbo", "ms_items", ITEM_COLUMNS, ("id",)), (
    ("c", 1, "s1", _ms("0000002a:00000110:0005", "0000002a:00000100:0002", 1)),
    ("u", 1, "s2", _ms("0000002a:00000110:0005", "0000002a:00000100:0002", 2)),  # the same change LSN, the next serial
    ("c", 2, "x", _ms("0000002b:00000010:0003", "0000002b:00000008:0002", 1)),
    ("r", 1, "resnap1", _ms("00000030:00000000:0001", None, None, "first")),
    ("r", 2, "resnap2", _ms("00000030:00000000:0001", None, None, "last")),
    ("u", 2, "later", _ms("00000031:00000010:0003", "0000002f:00000020:0002", 1)),
), {1: "resnap1", 2: "later"}, cut=3)


def _my(file: str, pos: int, row: int = 0, snapshot: str = "false") -> dict[str, Any]:
    return {"file": file, "pos": pos, "row": row, "snapshot": snapshot, "server_id": 223344}


# Flink CDC re-publishes its snapshot in Debezium's format with no binlog file and pos 0 (and
# `snapshot` false); then the binlog. Row 3's snapshot read and its first streamed change share
# the binlog position the snapshot began at.
MYSQL_FLINK_SNAPSHOT = OrderCase("mysql", SourceTable("inventory", None, "my_items", ITEM_COLUMNS, ("id",)), (
    ("r", 1, "snap1", _my("", 0)), ("r", 2, "snap2", _my("", 0)),
    ("r", 3, "snap3", _my("mysql-bin.000003", 154, 0, "last")),
    ("u", 3, "streamed3", _my("mysql-bin.000003", 154, 0)),
    ("u", 1, "streamed1", _my("mysql-bin.000003", 500, 0)),
    ("u", 1, "rotated1", _my("mysql-bin.000004", 4, 1)),
), {1: "rotated1", 2: "snap2", 3: "streamed3"}, cut=3)


def _gtid(file: str, pos: int, gtid: str | None, snapshot: str = "false") -> dict[str, Any]:
    return {**_my(file, pos, 0, snapshot), "gtid": gtid}


_OLD_PRIMARY, _NEW_PRIMARY = "3e11fa47-71ca-11e1-9e33-c80aa9429562", "6f1b2c3d-0a0b-11ef-8f2e-0242ac120003"
# GTIDs on; the snapshot and the first changes come from the old primary's binlog 120. The
# primary fails over to a replica whose binlog is at 3: its own transactions (a GTID of its
# uuid) sit below everything before, and are the newest changes.
MYSQL_FAILOVER = OrderCase("mysql", SourceTable("inventory", None, "my_failover", ITEM_COLUMNS, ("id",)), (
    ("r", 1, "snap1", _gtid("mysql-bin.000120", 900, None, "first")), ("r", 2, "snap2", _gtid("mysql-bin.000120", 900, None, "last")),
    ("u", 1, "old primary", _gtid("mysql-bin.000120", 1200, f"{_OLD_PRIMARY}:57")),
    ("u", 1, "new primary", _gtid("mysql-bin.000003", 200, f"{_NEW_PRIMARY}:1")),
    ("u", 2, "new primary", _gtid("mysql-bin.000003", 350, f"{_NEW_PRIMARY}:2")),
), {1: "new primary", 2: "new primary"}, cut=2, name="mysql-failover")

ORDER_CASES = (PG_IN_FLIGHT, ORACLE_IN_FLIGHT, SQLSERVER_RESNAPSHOT, MYSQL_FLINK_SNAPSHOT, MYSQL_FAILOVER)
