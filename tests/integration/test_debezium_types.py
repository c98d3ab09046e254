"""Every type as Kafka's JsonConverter and Debezium write it (issue 59), through Spark: one
`cdc_format=debezium` batch write of a PostgreSQL, a SQL Server and a MySQL connector's
change events, read back with pyiceberg, DuckDB and Spark; then a refused write.

Each event is written out here as the connector puts it in Kafka, and each expected value by
hand from the documentation:
- JsonConverter's schema type names (Kafka's org.apache.kafka.connect.json.JsonSchema):
  `int8`, `int16`, `int32`, `int64`, `float` (FLOAT32), `double` (FLOAT64), `boolean`,
  `string`, `bytes`, `struct`.
- Debezium's PostgreSQL connector ("TIMESTAMP type", AbstractRecordsProducerTest's time
  table): MicroTime of 13:51:30 is 49,890,000,000 and of 24:00:00 one day, 86,400,000,000;
  `'infinity'::TIMESTAMP` is MicroTimestamp 9223372036825200000, `'-infinity'`
  -9223372036832400000; `'infinity'::TIMESTAMPTZ` is the ZonedTimestamp text `infinity`;
  a streamed `'infinity'::DATE` is the epoch day of -5877611-06-21 (PostgresValueConverter's
  POSITIVE_INFINITY_LOCAL_DATE): -2,147,472,692, `'-infinity'` the day after.
- ZonedTimestamp (Java's ISO_OFFSET_DATE_TIME, or Debezium's fixed fraction width): SQL
  Server's datetimeoffset(7) `2024-03-01T10:15:30.1234567+02:00`, Oracle's TIMESTAMP(9) WITH
  TIME ZONE with nine digits; Iceberg keeps microseconds, the digits after them cut.
- MySQL ("shared MariaDB/MySQL" data types): BIT(1) is a BOOLEAN; BIT(n>1) is
  `io.debezium.data.Bits` with `length` n, the bytes little-endian, ceil(n/8) of them, so
  b'11111000111' (0x07C7) is sent `c7 07` and the database's order is `07 c7`; TINYINT is
  int8; DECIMAL(65,0) is a Decimal of precision 65; TIME is MicroTime and may be negative
  or past 24 hours (-838:59:59 .. 838:59:59).

lakesink's decisions (docs/usage.md, "From Debezium"): ±infinity and TIME values outside a
day are null (counted in the progress line: tests/unit/test_debezium_decode.py checks the
count), 24:00:00 is 23:59:59.999999; Iceberg `time` where PySpark has a time type (4.1+),
microseconds since midnight (a long) on 4.0; a decimal past 38 digits refuses the batch,
naming the column, before anything is written.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
from collections import Counter
from typing import Any

import pytest
from lakesink_testing import PYSPARK_MINOR, duckdb_rows, load, pyiceberg_rows

KAFKA = "key binary, value binary, topic string, partition int, offset long"
TIME_IS_TIME = PYSPARK_MINOR >= (4, 1)  # PySpark 4.0 has no time type: a long of microseconds
UTC = dt.timezone.utc
DAY = 86_400_000_000


def _field(name: str, type_: str, logical: str | None = None, **parameters: str) -> dict[str, Any]:
    out: dict[str, Any] = {"type": type_, "optional": name != "id", "field": name}
    if logical is not None:
        out.update(name=logical, version=1)
    if parameters:
        out["parameters"] = parameters
    return out


def _source(connector: str, db: str, schema: str | None, table: str, n: int) -> dict[str, Any]:
    common = {"version": "2.7.3.Final", "connector": connector, "name": "srv", "ts_ms": 1_700_000_000_000, "snapshot": "false",
              "db": db, "table": table}
    if connector == "postgresql":
        return {**common, "schema": schema, "sequence": json.dumps(["900", str(1000 + n)]), "txId": 500 + n, "lsn": 1000 + n}
    if connector == "sqlserver":
        lsn = f"{40 + n:08x}:00000010:0002"
        return {**common, "schema": schema, "change_lsn": lsn, "commit_lsn": f"{40 + n:08x}:00000010:0005", "event_serial_no": 1}
    return {**common, "server_id": 1, "file": "mysql-bin.000003", "pos": 400 + 100 * n, "row": 0}


def _records(connector: str, db: str, schema: str | None, table: str, fields: list[dict[str, Any]], rows: list[dict[str, Any]],
             start: int = 0) -> list[dict[str, Any]]:
    """The connector's Kafka records (JsonConverter with schemas) of one insert per row."""
    topic = f"srv.{schema or db}.{table}"
    row_schema = {"type": "struct", "fields": fields, "optional": True, "name": f"{topic}.Value"}
    envelope = {"type": "struct", "optional": False, "name": f"{topic}.Envelope", "fields": [
        {**row_schema, "field": "before"}, {**row_schema, "field": "after"},
        {"type": "struct", "optional": False, "field": "source", "name": f"io.debezium.connector.{connector}.Source",
         "fields": [{"type": "string", "optional": False, "field": "connector"}]},
        {"type": "string", "optional": False, "field": "op"}, {"type": "int64", "optional": True, "field": "ts_ms"}]}
    key_schema = {"type": "struct", "optional": False, "name": f"{topic}.Key", "fields": [fields[0]]}
    out = []
    for i, row in enumerate(rows, start):
        payload = {"before": None, "after": row, "source": _source(connector, db, schema, table, i), "op": "c", "ts_ms": 1_700_000_000_100}
        out.append({
            "key": json.dumps({"schema": key_schema, "payload": {"id": row["id"]}}).encode(),
            "value": json.dumps({"schema": envelope, "payload": payload}).encode(),
            "topic": topic, "partition": 0, "offset": i,
        })
    return out


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def _unscaled(value: int) -> str:
    return _b64(value.to_bytes(max(1, (value.bit_length() + 8) // 8), "big", signed=True))


def _time(hours: int, minutes: int, seconds: int, micros: int = 0) -> int:
    return ((hours * 60 + minutes) * 60 + seconds) * 1_000_000 + micros


def _as_stored(micros: int | None) -> dt.time | int | None:
    """A time of day as Iceberg `time` (4.1+) or as the long 4.0 keeps."""
    if micros is None or not TIME_IS_TIME:
        return micros
    seconds, micro = divmod(micros, 1_000_000)
    return dt.time(seconds // 3600, seconds // 60 % 60, seconds % 60, micro)


PG_FIELDS = [
    _field("id", "int32"), _field("weight", "double"), _field("ratio", "float"), _field("small", "int16"), _field("big", "int64"),
    _field("flag", "boolean"), _field("at_time", "int64", "io.debezium.time.MicroTime"),
    _field("ts", "int64", "io.debezium.time.MicroTimestamp"), _field("tz", "string", "io.debezium.time.ZonedTimestamp"),
    _field("day", "int32", "io.debezium.time.Date"),
]
PG_ROWS: list[dict[str, Any]] = [
    {"id": 1, "weight": 2.5, "ratio": 0.25, "small": -32768, "big": 9_007_199_254_740_993, "flag": True, "at_time": 49_890_000_000,
     "ts": 1_478_267_490_123_456, "tz": "2016-11-04T11:51:30.123456Z", "day": 17_109},
    {"id": 2, "weight": -0.5, "ratio": 1.5, "small": 7, "big": -1, "flag": False, "at_time": DAY,
     "ts": 9_223_372_036_825_200_000, "tz": "infinity", "day": -2_147_472_692},
    {"id": 3, "weight": None, "ratio": None, "small": None, "big": None, "flag": None, "at_time": None,
     "ts": -9_223_372_036_832_400_000, "tz": "-infinity", "day": -2_147_472_691},
]
PG_COLUMNS = ["id", "weight", "ratio", "small", "big", "flag", "at_time", "ts", "tz", "day"]
PG_EXPECTED = Counter([
    (1, 2.5, 0.25, -32768, 9_007_199_254_740_993, True, _as_stored(_time(13, 51, 30)), dt.datetime(2016, 11, 4, 13, 51, 30, 123456),
     dt.datetime(2016, 11, 4, 11, 51, 30, 123456), dt.date(2016, 11, 4)),
    # 24:00:00 is the day's last microsecond; infinity has no timestamp or date: null.
    (2, -0.5, 1.5, 7, -1, False, _as_stored(DAY - 1) if TIME_IS_TIME else DAY, None, None, None),
    (3, None, None, None, None, None, None, None, None, None),
])

MS_FIELDS = [_field("id", "int32"), _field("at", "string", "io.debezium.time.ZonedTimestamp")]
MS_ROWS: list[dict[str, Any]] = [
    {"id": 1, "at": "2024-03-01T10:15:30.1234567+02:00"},  # SQL Server datetimeoffset(7), its default
    {"id": 2, "at": "2024-03-01T10:15:30.0000000Z"},
    {"id": 3, "at": "2024-03-01T10:15:30.123456789-05:00"},  # nine digits (Oracle's TIMESTAMP(9) WITH TIME ZONE)
    {"id": 4, "at": "2024-03-01T10:15:30Z"},
    {"id": 5, "at": "2024-03-01T10:15:30.5+05:30"},
]
MS_EXPECTED = Counter([
    (1, dt.datetime(2024, 3, 1, 8, 15, 30, 123456)), (2, dt.datetime(2024, 3, 1, 10, 15, 30)),
    (3, dt.datetime(2024, 3, 1, 15, 15, 30, 123456)), (4, dt.datetime(2024, 3, 1, 10, 15, 30)),
    (5, dt.datetime(2024, 3, 1, 4, 45, 30, 500000)),
])

MY_FIELDS = [
    _field("id", "int32"), _field("flags", "bytes", "io.debezium.data.Bits", length="11"),
    _field("wide", "bytes", "io.debezium.data.Bits", length="64"), _field("on_off", "boolean"), _field("tiny", "int8"),
    _field("price", "bytes", "org.apache.kafka.connect.data.Decimal", scale="0", **{"connect.decimal.precision": "65"}),
    _field("took", "int64", "io.debezium.time.MicroTime"),
]
THIRTY_EIGHT_NINES = 10**38 - 1
MY_ROWS: list[dict[str, Any]] = [
    {"id": 1, "flags": _b64(bytes([0xC7, 0x07])), "wide": _b64(bytes([0xC7, 0x07, 0, 0, 0, 0, 0, 0])), "on_off": True, "tiny": -128,
     "price": _unscaled(THIRTY_EIGHT_NINES), "took": _time(12, 0, 0)},
    {"id": 2, "flags": _b64(bytes([0x01, 0x04])), "wide": _b64(bytes([0, 0, 0, 0, 0, 0, 0, 0x80])), "on_off": False, "tiny": 127,
     "price": _unscaled(-THIRTY_EIGHT_NINES), "took": -_time(838, 59, 59)},
    {"id": 3, "flags": None, "wide": None, "on_off": None, "tiny": None, "price": _unscaled(42), "took": _time(838, 59, 59)},
]
MY_COLUMNS = ["id", "flags", "wide", "on_off", "tiny", "price", "took"]
MY_EXPECTED = Counter([
    (1, b"\x07\xc7", b"\x00\x00\x00\x00\x00\x00\x07\xc7", True, -128, decimal.Decimal(THIRTY_EIGHT_NINES), _as_stored(_time(12, 0, 0))),
    # b'10000000001' (0x0401) is sent 01 04; BIT(64) with its top bit set, 80 first.
    (2, b"\x04\x01", b"\x80\x00\x00\x00\x00\x00\x00\x00", False, 127, decimal.Decimal(-THIRTY_EIGHT_NINES),
     None if TIME_IS_TIME else -_time(838, 59, 59)),
    (3, None, None, None, None, decimal.Decimal(42), None if TIME_IS_TIME else _time(838, 59, 59)),
])


def _write(spark: Any, records: list[dict[str, Any]], warehouse: str) -> None:
    df = spark.createDataFrame([tuple(r[c] for c in ("key", "value", "topic", "partition", "offset")) for r in records], KAFKA)
    options = {"warehouse": warehouse, "cdc_format": "debezium", "namespace": "replica", "maintenance": "off"}
    df.coalesce(1).write.format("lakesink").options(**options).mode("append").save()


def _spark_rows(spark: Any, warehouse: str, table: str, columns: list[str], micros: tuple[str, ...] = ()) -> Counter:
    """Rows as Spark reads the table through lakesink; timestamps as UTC (Spark's own are
    the session's local time)."""
    df = spark.read.format("lakesink").option("warehouse", warehouse).load(table)
    selected = df.selectExpr(*[f"unix_micros(CAST({c} AS TIMESTAMP)) AS {c}" if c in micros else c for c in columns])
    out: Counter = Counter()
    for row in selected.collect():
        values = []
        for c in columns:
            v = row[c]
            if c in micros and v is not None:
                v = dt.datetime(1970, 1, 1) + dt.timedelta(microseconds=v)
            values.append(bytes(v) if isinstance(v, bytearray) else v)
        out[tuple(values)] += 1
    return out


def _assert_readers(spark: Any, warehouse: str, table: str, columns: list[str], expected: Counter, micros: tuple[str, ...] = ()) -> None:
    loaded = load(warehouse, table)
    assert pyiceberg_rows(loaded, columns) == expected, f"{table}: pyiceberg"
    assert duckdb_rows(loaded.metadata_location, columns) == expected, f"{table}: DuckDB"
    assert _spark_rows(spark, warehouse, table, columns, micros) == expected, f"{table}: Spark"


def test_every_type_as_json_converter_and_debezium_write_it(spark, warehouse: str) -> None:  # type: ignore[no-untyped-def]
    records = (
        _records("postgresql", "shop", "public", "kinds", PG_FIELDS, PG_ROWS)
        + _records("sqlserver", "testDB", "dbo", "events", MS_FIELDS, MS_ROWS)
        + _records("mysql", "inventory", None, "parts", MY_FIELDS, MY_ROWS)
    )
    _write(spark, records, warehouse)

    kinds = load(warehouse, "replica.kinds").schema()
    types = {f.name: str(f.field_type) for f in kinds.fields}
    assert {k: types[k] for k in ("weight", "ratio", "small", "at_time", "ts", "tz", "day")} == {
        "weight": "double", "ratio": "float", "small": "int", "at_time": "time" if TIME_IS_TIME else "long", "ts": "timestamp",
        "tz": "timestamptz", "day": "date",
    }
    assert str(load(warehouse, "replica.parts").schema().find_field("price").field_type) == "decimal(38, 0)"
    _assert_readers(spark, warehouse, "replica.kinds", PG_COLUMNS, PG_EXPECTED, micros=("ts", "tz"))
    _assert_readers(spark, warehouse, "replica.events", ["id", "at"], MS_EXPECTED, micros=("at",))
    _assert_readers(spark, warehouse, "replica.parts", MY_COLUMNS, MY_EXPECTED)

    # A DECIMAL(65,0) value of 39 digits: refused naming the column and what to set, before
    # anything is written (the batch's other rows with it).
    before = load(warehouse, "replica.parts").metadata.current_snapshot()
    too_wide = dict(MY_ROWS[2], id=4, price=_unscaled(10**38))
    refused = _records("mysql", "inventory", None, "parts", MY_FIELDS, [dict(MY_ROWS[0], id=5), too_wide], start=10)
    with pytest.raises(Exception, match=r"column 'price': a decimal value has more than 38 digits.*decimal\.handling\.mode=string"):
        _write(spark, refused, warehouse)
    after = load(warehouse, "replica.parts")
    assert after.metadata.current_snapshot() == before
    assert pyiceberg_rows(after, MY_COLUMNS) == MY_EXPECTED
