"""A PostgreSQL table with a column of every type Debezium sends an unchanged TOASTed value
of as a placeholder, its change events (JsonConverter with schemas) and the placeholder of
each column, written out by hand.

The placeholder forms are those of Debezium's PostgreSQL connector
(`UnchangedToastedPlaceholder`, `UnchangedToastedReplicationMessageColumn`,
`PostgresValueConverter.handleUnknownData`; debezium/debezium, connector-postgres): text,
json, jsonb and uuid columns hold the text; bytea its UTF-8 bytes (base64 in JSON); hstore with
`hstore.handling.mode=json` a one-entry JSON object (Jackson, no spaces); text[], varchar[],
json[] and jsonb[] a list of the text; bytea[] a list of the bytes; integer[], bigint[] and
date[] the bytes as numbers; uuid[] a list of `UUID.nameUUIDFromBytes` of the bytes. The
numbers and the UUID are copied from Debezium's own test expectations
(connector-postgres/src/test/.../DecoderDifferences.java: TOASTED_VALUE_NUMBER_STRING,
TOASTED_VALUE_UUID_STRING).
"""

from __future__ import annotations

import base64
import datetime as dt
import json
from typing import Any

PLACEHOLDER = "__debezium_unavailable_value"
PLACEHOLDER_NUMBERS = [95, 95, 100, 101, 98, 101, 122, 105, 117, 109, 95, 117, 110, 97, 118, 97, 105, 108, 97, 98, 108, 101, 95, 118, 97, 108, 117, 101]
PLACEHOLDER_UUID = "b68a35a7-17ad-35b3-af2a-ae46edb4545a"
TOPIC = "pg.public.docs"

_DATE = {"name": "io.debezium.time.Date", "version": 1}
_JSON = {"name": "io.debezium.data.Json", "version": 1}
_UUID = {"name": "io.debezium.data.Uuid", "version": 1}
# column -> its Connect schema (as Debezium gives the PostgreSQL type in the comment)
FIELDS: dict[str, dict[str, Any]] = {
    "id": {"type": "int32", "optional": False},  # integer, the primary key
    "note": {"type": "string", "optional": True},  # text, changed by every update
    "body": {"type": "string", "optional": True},  # text
    "raw": {"type": "bytes", "optional": True},  # bytea
    "doc": {"type": "string", "optional": True, **_JSON},  # jsonb
    "attrs": {"type": "string", "optional": True, **_JSON},  # hstore, hstore.handling.mode=json
    "ints": {"type": "array", "optional": True, "items": {"type": "int32", "optional": True}},  # integer[]
    "bigs": {"type": "array", "optional": True, "items": {"type": "int64", "optional": True}},  # bigint[]
    "days": {"type": "array", "optional": True, "items": {"type": "int32", "optional": True, **_DATE}},  # date[]
    "words": {"type": "array", "optional": True, "items": {"type": "string", "optional": True}},  # text[]
    "blobs": {"type": "array", "optional": True, "items": {"type": "bytes", "optional": True}},  # bytea[]
    "ids": {"type": "array", "optional": True, "items": {"type": "string", "optional": True, **_UUID}},  # uuid[]
    "docs": {"type": "array", "optional": True, "items": {"type": "string", "optional": True, **_JSON}},  # jsonb[]
}
COLUMNS = list(FIELDS)
TOASTED = COLUMNS[2:]

# Every TOASTed column's placeholder as the JSON payload holds it.
PLACEHOLDERS: dict[str, Any] = {
    "body": PLACEHOLDER,
    "raw": base64.b64encode(PLACEHOLDER.encode()).decode(),
    "doc": PLACEHOLDER,
    "attrs": '{"__debezium_unavailable_value":"__debezium_unavailable_value"}',
    "ints": PLACEHOLDER_NUMBERS,
    "bigs": PLACEHOLDER_NUMBERS,
    "days": PLACEHOLDER_NUMBERS,
    "words": [PLACEHOLDER],
    "blobs": [base64.b64encode(PLACEHOLDER.encode()).decode()],
    "ids": [PLACEHOLDER_UUID],
    "docs": [PLACEHOLDER],
}


def values(n: int) -> dict[str, Any]:
    """Row `n`'s TOASTed columns as a reader sees them (Python values)."""
    return {
        "body": f"a long body {n}", "raw": bytes([n, 0, 255]), "doc": json.dumps({"n": n}), "attrs": json.dumps({"k": str(n)}),
        "ints": [n, -n], "bigs": [n * 10**12], "days": [dt.date(2024, 1, n)], "words": [f"w{n}", "x"], "blobs": [bytes([n])],
        "ids": [f"00000000-0000-0000-0000-00000000000{n}"], "docs": [json.dumps([n])],
    }


def _json_value(column: str, value: Any) -> Any:
    """A reader's value as the connector writes it in JSON."""
    if column == "raw":
        return base64.b64encode(value).decode()
    if column == "blobs":
        return [base64.b64encode(v).decode() for v in value]
    if column == "days":
        return [(d - dt.date(1970, 1, 1)).days for d in value]
    return value


def record(op: str, row: dict[str, Any], lsn: int, offset: int, *, schema: str = "public", topic: str = TOPIC) -> dict[str, Any]:
    """A change of table docs (`row`: each column's JSON value) as Spark's Kafka source gives it."""
    fields = [{**FIELDS[c], "field": c} for c in COLUMNS]
    image = {"type": "struct", "optional": True, "name": f"pg.{schema}.docs.Value", "fields": fields}
    envelope = {"type": "struct", "optional": False, "name": f"pg.{schema}.docs.Envelope", "fields": [
        {**image, "field": "before"}, {**image, "field": "after"},
        {"type": "struct", "optional": False, "name": "io.debezium.connector.postgresql.Source", "field": "source", "fields": [
            {"type": "string", "optional": False, "field": "connector"}, {"type": "string", "optional": False, "field": "table"}]},
        {"type": "string", "optional": False, "field": "op"},
    ]}
    source = {"version": "2.7.3.Final", "connector": "postgresql", "name": "pg", "db": "shop", "schema": schema, "table": "docs",
              "lsn": lsn, "sequence": json.dumps([str(lsn - 1), str(lsn)])}
    payload = {"before": None, "after": row, "source": source, "op": op, "ts_ms": 1_700_000_000_000}
    key = {"schema": {"type": "struct", "optional": False, "name": f"pg.{schema}.docs.Key", "fields": [{"type": "int32", "optional": False, "field": "id"}]},
           "payload": {"id": row["id"]}}
    return {"key": json.dumps(key).encode(), "value": json.dumps({"schema": envelope, "payload": payload}).encode(), "topic": topic,
            "partition": 0, "offset": offset}


def full(n: int, note: str) -> dict[str, Any]:
    """Row `n` with every value sent."""
    return {"id": n, "note": note, **{c: _json_value(c, v) for c, v in values(n).items()}}


def unchanged(n: int, note: str) -> dict[str, Any]:
    """An update of row `n` that changed `note` only: every TOASTed column is the placeholder."""
    return {"id": n, "note": note, **PLACEHOLDERS}


def stream() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Two batches: rows 1 and 2 written; then row 1 updated with every placeholder (kept from
    the table), row 2 updated with new values that look like placeholders but are not, row 3
    inserted and updated with every placeholder in the same batch (kept from its insert)."""
    first = [record("c", full(1, "one"), 100, 0), record("c", full(2, "two"), 110, 1)]
    lookalike = {**full(2, "two again"), "ints": PLACEHOLDER_NUMBERS[:2], "words": [PLACEHOLDER, "x"], "body": PLACEHOLDER + " "}
    second = [
        record("u", unchanged(1, "one again"), 200, 2), record("u", lookalike, 210, 3),
        record("c", full(3, "three"), 220, 4), record("u", unchanged(3, "three again"), 230, 5),
    ]
    return first, second


def expected() -> dict[int, dict[str, Any]]:
    """What a reader sees once both batches are in, by id."""
    two = {**values(2), "ints": [95, 95], "words": [PLACEHOLDER, "x"], "body": PLACEHOLDER + " "}
    return {1: {"note": "one again", **values(1)}, 2: {"note": "two again", **two}, 3: {"note": "three again", **values(3)}}
