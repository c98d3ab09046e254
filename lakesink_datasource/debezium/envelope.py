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


class _Envelope(msgspec.Struct):
    op: str | None = None
    before: msgspec.Raw = NOTHING
    after: msgspec.Raw = NOTHING
    source: dict[str, Any] | None = None
    # transaction boundaries: {"status": "BEGIN" | "END", "id": ...}
    status: Any = None
    # schema changes (MySQL's, SQL Server's schema change topic)
    ddl: Any = None
    tableChanges: msgspec.Raw = NOTHING
    databaseName: Any = None


class _Wrapped(_Envelope):
    schema: msgspec.Raw = NOTHING
    payload: msgspec.Raw = NOTHING


class _Key(msgspec.Struct):
    schema: msgspec.Raw = NOTHING
    payload: msgspec.Raw = NOTHING


_top = msgspec.json.Decoder(_Wrapped)
_envelope = msgspec.json.Decoder(_Envelope)
_key = msgspec.json.Decoder(_Key)


@dataclass(frozen=True)
class Event:
    """A record as lakesink reads it."""

    kind: Kind
    op: str | None = None
    source: dict[str, Any] | None = None
    row: bytes | None = None  # the row's JSON (`after`; a delete's `before`), None: absent or null
    before: bytes | None = None
    schema: bytes | None = None  # the value's Connect schema (JSON), with the wrapper


def where(topic: str | None, partition: int | None, offset: int | None, index: int) -> str:
    """How an error names a record."""
    if topic is None and offset is None:
        return f"record {index} of the input"
    return f"the record at topic {topic!r}, partition {partition}, offset {offset}"


def _raw(value: msgspec.Raw) -> bytes | None:
    data = bytes(value)
    return None if not data or data == NULL else data


def read_value(value: bytes | str | None, topic: str | None, what: str) -> Event:
    """Classify one record's value (JSON text or bytes)."""
    if value is None:
        return Event(Kind.TOMBSTONE)
    try:
        top = _top.decode(value)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise DebeziumInputError(f"{what} is not a Debezium change event: its value is not a JSON object ({exc})") from None
    envelope: _Envelope = top
    schema = None
    payload = _raw(top.payload)
    if payload is not None or (bytes(top.payload) == NULL and _raw(top.schema) is not None):
        if payload is None:
            return Event(Kind.TOMBSTONE)  # JsonConverter's wrapper around a null value
        schema = _raw(top.schema)
        try:
            envelope = _envelope.decode(payload)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise DebeziumInputError(f"{what} is not a Debezium change event: its payload is not an envelope ({exc})") from None
    op = envelope.op
    if op is not None:
        if not isinstance(op, str) or op not in (*WRITE_OPS, DELETE_OP, TRUNCATE_OP, MESSAGE_OP):
            raise DebeziumInputError(
                f"{what} has op {op!r}: Debezium's ops are c, r, u (write the row), d (delete the key), t (truncate), "
                "m (a logical message). Nothing was written"
            )
        if op == MESSAGE_OP:
            return Event(Kind.MESSAGE)
        if envelope.source is None:
            raise DebeziumInputError(f"{what} is not a Debezium change event: op {op!r} without 'source'. Nothing was written")
        after, before = _raw(envelope.after), _raw(envelope.before)
        if op == TRUNCATE_OP:
            return Event(Kind.TRUNCATE, op, envelope.source, schema=schema)
        return Event(Kind.CHANGE, op, envelope.source, after if op != DELETE_OP else before, before, schema)
    if envelope.status in ("BEGIN", "END"):
        return Event(Kind.TRANSACTION)
    if envelope.ddl is not None or _raw(envelope.tableChanges) is not None or envelope.databaseName is not None:
        return Event(Kind.SCHEMA_CHANGE)
    if (topic or "").startswith("__debezium-heartbeat") or _is_heartbeat(value if payload is None else payload):
        return Event(Kind.HEARTBEAT)
    raise DebeziumInputError(
        f"{what} is not a Debezium change event: it has no 'op' and is no tombstone, heartbeat, transaction marker or "
        "schema change (is the topic one of Debezium's, read as JSON?). Nothing was written"
    )


def _is_heartbeat(value: bytes | str) -> bool:
    """A heartbeat's value holds `ts_ms` only."""
    try:
        fields = msgspec.json.decode(value)
    except msgspec.DecodeError:
        return False
    return isinstance(fields, dict) and set(fields) <= {"ts_ms", "ts_us", "ts_ns"} and bool(fields)


def read_key(key: bytes | str | None, what: str) -> tuple[bytes | None, bytes | None]:
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
    if payload is not None and _raw(top.schema) is not None:
        return payload, _raw(top.schema)
    if bytes(top.payload) == NULL and _raw(top.schema) is not None:
        return None, None  # a wrapped null key
    data = key.encode() if isinstance(key, str) else bytes(key)
    return (None if data.strip() == NULL else data), None
