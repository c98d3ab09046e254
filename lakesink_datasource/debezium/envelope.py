"""One Kafka record of a Debezium connector -> what it is and where it goes.

A record's value is a change event's envelope (`before`, `after`, `source`, `op`), with or
without Kafka Connect's JsonConverter wrapper (`{"schema": ..., "payload": ...}`), or one of
the records Debezium writes beside them: the tombstone after a delete (a null value),
heartbeats, transaction boundaries (BEGIN/END) and schema changes. msgspec reads the small
parts (op, source) and leaves the rows (`before`, `after`) and the schemas as raw JSON, for
Arrow's reader to parse a table's rows together (`decode.py`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

import msgspec

from lakesink_datasource.debezium.memo import Memo
from lakesink_datasource.errors import LakesinkError

NOTHING = msgspec.Raw()
NULL = b"null"
WRITE_OPS = ("c", "r", "u")
DELETE_OP = "d"
TRUNCATE_OP = "t"
MESSAGE_OP = "m"


class DebeziumInputError(LakesinkError, ValueError):
    """A record is not one Debezium writes, or cannot be applied. Raised before any table
    changes; names the record (topic, partition, offset)."""


class Kind(enum.Enum):
    CHANGE = "change"  # c, r, u, d
    TRUNCATE = "truncate"
    TOMBSTONE = "tombstones"
    HEARTBEAT = "heartbeats"
    TRANSACTION = "transaction markers"
    SCHEMA_CHANGE = "schema changes"
    MESSAGE = "logical messages"


class Source(msgspec.Struct):
    """The parts of an event's `source` lakesink reads: where it goes, where it sits in the log."""

    connector: Any = None
    db: Any = None
    schema: Any = None
    table: Any = None
    snapshot: Any = None
    lsn: Any = None  # PostgreSQL
    sequence: Any = None
    file: Any = None  # MySQL, MariaDB
    pos: Any = None
    row: Any = None
    gtid: Any = None
    change_lsn: Any = None  # SQL Server
    commit_lsn: Any = None
    event_serial_no: Any = None
    scn: Any = None  # Oracle
    commit_scn: Any = None
    collection: Any = None  # MongoDB's (refused, named: `refuse_mongodb`)


class _Envelope(msgspec.Struct):
    op: Any = None
    before: msgspec.Raw = NOTHING
    after: msgspec.Raw = NOTHING
    source: Source | None = None
    # transaction boundaries: {"status": "BEGIN" | "END", "id": ...} (`_TRANSACTION_FIELDS`)
    status: Any = None
    # schema changes (MySQL's, SQL Server's schema change topic: `_SCHEMA_CHANGE_FIELDS`)
    ddl: Any = None
    tableChanges: msgspec.Raw = NOTHING
    databaseName: Any = None


class _Wrapped(_Envelope):
    """A value as it comes: JsonConverter's wrapper (schema, payload) or the envelope itself."""

    schema: msgspec.Raw = NOTHING
    payload: _Envelope | None = None


class _Key(msgspec.Struct):
    schema: msgspec.Raw = NOTHING
    payload: msgspec.Raw = NOTHING


_top = msgspec.json.Decoder(_Wrapped)
_payload = msgspec.json.Decoder(_Envelope)
_key = msgspec.json.Decoder(_Key)
_NO_SOURCE = Source()


@dataclass(frozen=True)
class Event:
    """A record as lakesink reads it."""

    kind: Kind
    op: str | None = None
    source: Source = _NO_SOURCE
    row: bytes | msgspec.Raw | None = None  # the row's JSON (`after`; a delete's `before`), None: absent or null
    schema: bytes | msgspec.Raw | None = None  # the value's Connect schema (JSON), with the wrapper


def where(topic: str | None, partition: int | None, offset: int | None, index: int) -> str:
    """How an error names a record."""
    if topic is None and offset is None:
        return f"record {index} of the input"
    return f"the record at topic {topic!r}, partition {partition}, offset {offset}"


def _raw(value: msgspec.Raw) -> msgspec.Raw | None:
    """A raw JSON value, None when absent or null (kept as msgspec's view: no copy)."""
    n = len(value)
    return None if n == 0 or (n == 4 and bytes(value) == NULL) else value


# JsonConverter writes a topic's values as `{"schema":<the same schema>,"payload":<the change>}`:
# that prefix, learnt per topic, is compared (a memcmp) instead of parsed, which was most of a
# record's cost (a table's schema is often 2-3 KB, its change a few hundred bytes).
_MAX_TOPICS = 4096
_PREFIXES: Memo[str | None, list[tuple[bytes, bytes]]] = Memo(_MAX_TOPICS)  # topic -> [(prefix, the schema in it)]
_KEY_PREFIXES: Memo[str | None, tuple[bytes, bytes]] = Memo(_MAX_TOPICS)  # topic -> its keys' (prefix, schema)
_PER_TOPIC = 8  # schemas a topic keeps (a topic several tables share, a table's new version)


def known_prefixes(topic: str | None) -> list[tuple[bytes, bytes]]:
    """The wrapper prefixes (and schemas) seen on `topic`'s values, newest first."""
    return _PREFIXES.known(topic) or []


def key_prefix(topic: str | None) -> tuple[bytes, bytes] | None:
    """The wrapper prefix (and schema) of `topic`'s keys, once one was read."""
    return _KEY_PREFIXES.known(topic)


def read_value(value: bytes | str | None, topic: str | None, what: str) -> Event:
    """Classify one record's value (JSON text or bytes)."""
    if value is None:
        return Event(Kind.TOMBSTONE)
    if isinstance(value, bytes) and value.endswith(b"}"):
        for prefix, known in _PREFIXES.known(topic) or ():
            if value.startswith(prefix):
                try:
                    payload = _payload.decode(memoryview(value)[len(prefix) : -1])
                except (msgspec.DecodeError, msgspec.ValidationError):
                    break  # not what it looked like: read whole below
                return _classify(payload, known, value, topic, what)
    try:
        top = _top.decode(value)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise DebeziumInputError(f"{what} is not a Debezium change event: its value is not a JSON object ({exc})") from None
    envelope: _Envelope = top
    raw_schema = _raw(top.schema)
    # bytes: a table's records are grouped by schema (a msgspec view cannot be a dict key).
    schema = bytes(raw_schema) if raw_schema is not None else None
    if top.payload is not None:
        envelope = top.payload
        if schema is not None and isinstance(value, bytes):
            _learn(topic, value, schema)
    elif schema is not None:
        return Event(Kind.TOMBSTONE)  # JsonConverter's wrapper around a null value
    return _classify(envelope, schema, value, topic, what)


def _prefix(value: bytes) -> tuple[bytes, bytes] | None:
    """The wrapper's prefix of `value` (everything before its payload, the payload last) and
    the schema in it; None when the value is not laid out so."""
    parts = _key.decode(value)
    payload, schema = bytes(parts.payload), bytes(parts.schema)
    if not payload or not schema or not value.endswith(b"}"):
        return None
    at = value.rfind(payload)
    if at <= 0 or value[at + len(payload) :].strip() != b"}" or not value[:at].rstrip().endswith(b":"):
        return None
    return value[:at], schema


def _learn(topic: str | None, value: bytes, schema: bytes) -> None:
    found = _prefix(value)
    if found is None or found[1] != schema:
        return
    prefix = found[0]
    known = [(p, s) for p, s in _PREFIXES.known(topic) or () if p != prefix]
    _PREFIXES[topic] = [(prefix, schema), *known][:_PER_TOPIC]


def _classify(envelope: _Envelope, schema: bytes | None, value: bytes | str, topic: str | None, what: str) -> Event:
    op = envelope.op
    if op is not None:
        if op in WRITE_OPS or op == DELETE_OP:
            if envelope.source is None:
                raise DebeziumInputError(f"{what} is not a Debezium change event: op {op!r} without 'source'. Nothing was written")
            if envelope.source.table is None:
                refuse_mongodb(envelope.source, what)
            row = _raw(envelope.after) if op != DELETE_OP else _raw(envelope.before)
            return Event(Kind.CHANGE, op, envelope.source, row, schema)
        if op == TRUNCATE_OP:
            if envelope.source is None:
                raise DebeziumInputError(f"{what} is not a Debezium change event: op 't' without 'source'. Nothing was written")
            if envelope.source.table is None:
                refuse_mongodb(envelope.source, what)
            return Event(Kind.TRUNCATE, op, envelope.source, schema=schema)
        if op == MESSAGE_OP:
            return Event(Kind.MESSAGE)
        raise DebeziumInputError(
            f"{what} has op {op!r}: Debezium's ops are c, r, u (write the row), d (delete the key), t (truncate), "
            "m (a logical message). Nothing was written"
        )
    # Told apart by their whole shape, never by one field: a row without an envelope (Debezium's
    # ExtractNewRecordState) may well have a `status` of 'BEGIN' or a `ddl` column.
    fields = _fields(value) if envelope.status is not None or envelope.ddl is not None or envelope.source is not None else None
    if fields is not None and envelope.status in ("BEGIN", "END") and _TRANSACTION_MARKER <= fields <= _TRANSACTION_FIELDS:
        return Event(Kind.TRANSACTION)
    if fields is not None and _SCHEMA_CHANGE <= fields <= _SCHEMA_CHANGE_FIELDS:
        return Event(Kind.SCHEMA_CHANGE)
    if (topic or "").startswith("__debezium-heartbeat") or _is_heartbeat(value):
        return Event(Kind.HEARTBEAT)
    raise DebeziumInputError(
        f"{what} is not a Debezium change event: it has no 'op' and is no tombstone, heartbeat, transaction marker or "
        "schema change (is the topic one of Debezium's, read as JSON? A row without Debezium's envelope, as "
        "ExtractNewRecordState writes it, is written with table_column and op_column instead). Nothing was written"
    )


# Debezium's transaction metadata value (its `<topic.prefix>.transaction` topic) and schema
# change value (SchemaFactory's TransactionMetadataValue and SchemaChangeValue): the fields
# every version writes (JsonConverter writes a null field too), and every field.
_TRANSACTION_MARKER = frozenset({"status", "id", "event_count", "data_collections"})
_TRANSACTION_FIELDS = _TRANSACTION_MARKER | {"ts_ms"}
_SCHEMA_CHANGE = frozenset({"source", "databaseName", "ddl"})
_SCHEMA_CHANGE_FIELDS = _SCHEMA_CHANGE | {"ts_ms", "schemaName", "tableChanges"}


def _fields(value: bytes | str) -> frozenset[str] | None:
    """The field names of a value's payload (in JsonConverter's wrapper, or bare)."""
    try:
        fields = msgspec.json.decode(value)
    except msgspec.DecodeError:
        return None
    if isinstance(fields, dict) and "payload" in fields and "schema" in fields:
        fields = fields["payload"]
    return frozenset(fields) if isinstance(fields, dict) else None


def _is_heartbeat(value: bytes | str) -> bool:
    """A heartbeat's value holds `ts_ms` only (in JsonConverter's wrapper, or bare)."""
    fields = _fields(value)
    return fields is not None and fields <= {"ts_ms", "ts_us", "ts_ns"} and bool(fields)


def refuse_mongodb(source: Source, what: str) -> None:
    """MongoDB's events (no `source.table`: a `collection`) are refused by name, before they
    would be refused as events without a table."""
    if str(source.connector or "").lower() == "mongodb" or source.collection is not None:
        raise DebeziumInputError(
            f"{what} is an event of Debezium's MongoDB connector (source.connector {source.connector!r}, a collection, no "
            "table): cdc_format=debezium replicates relational tables (PostgreSQL, MySQL, MariaDB, SQL Server, Oracle). "
            "Write MongoDB's documents flattened by Debezium's ExtractNewDocumentState (add.fields=op,collection) with "
            "table_column, op_column, operation=cdc and a sequence_column of your own. Nothing was written"
        )


def read_key(key: bytes | str | None, what: str, topic: str | None = None) -> tuple[bytes | msgspec.Raw | None, bytes | None]:
    """A record key's fields (JSON object) and its Connect schema (with the wrapper)."""
    if key is None:
        return None, None
    try:
        top = _key.decode(key)
    except (msgspec.DecodeError, msgspec.ValidationError):
        raise DebeziumInputError(
            f"{what} has a key that is not a JSON object: Debezium's message key holds the row's primary key fields. "
            "Nothing was written"
        ) from None
    payload = _raw(top.payload)
    schema = _raw(top.schema)
    if payload is not None and schema is not None:
        known = bytes(schema)
        held = _KEY_PREFIXES.known(topic)
        if isinstance(key, bytes) and (held is None or not key.startswith(held[0])):
            found = _prefix(key)
            if found is not None and found[1] == known:
                _KEY_PREFIXES[topic] = found
        return payload, known
    if bytes(top.payload) == NULL and _raw(top.schema) is not None:
        return None, None  # a wrapped null key
    data = key.encode() if isinstance(key, str) else bytes(key)
    return (None if data.strip() == NULL else data), None
