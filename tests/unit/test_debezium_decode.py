"""Reading Debezium's records (debezium/): what each record is, and Kafka Connect's and
Debezium's logical types as the Iceberg types they stand for. Plain Arrow, no Spark.

Expected values are written out by hand from the types' definitions (Kafka's Decimal:
big-endian two's complement of the unscaled value, base64 in JSON; io.debezium.time.*:
integers since the epoch or midnight in their unit; ZonedTimestamp: ISO-8601 with an offset).
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis_profiles import examples

from lakesink_datasource.debezium.connect_schema import (
    TIME_AS_TIME,
    ConnectSchema,
    DebeziumSchemaError,
    arrow_type,
    binary_from_base64,
    convert,
    read_type,
)
from lakesink_datasource.debezium.decode import decode
from lakesink_datasource.debezium.envelope import DebeziumInputError, Kind, Source, read_key, read_value
from lakesink_datasource.debezium.options import DebeziumOptions
from lakesink_datasource.debezium.positions import positions


def _field(type_: str, name: str | None = None, **extra: object) -> ConnectSchema:
    return ConnectSchema(type=type_, name=name, field="f", **extra)  # type: ignore[arg-type]


def _convert(schema: ConnectSchema, json_values: list[object]) -> list[object]:
    import io

    import pyarrow.json as pj

    lines = "\n".join(json.dumps({"f": v}) for v in json_values).encode()
    parsed = pj.read_json(io.BytesIO(lines), parse_options=pj.ParseOptions(explicit_schema=pa.schema([("f", read_type(schema))])))
    out = convert(parsed.column("f").combine_chunks(), schema)
    assert out.type == arrow_type(schema)
    return out.to_pylist()


def _b64(unscaled: int) -> str:
    return base64.b64encode(unscaled.to_bytes(max(1, (unscaled.bit_length() + 8) // 8), "big", signed=True)).decode()


def test_kafka_decimals_become_decimals_of_their_scale() -> None:
    schema = _field("bytes", "org.apache.kafka.connect.data.Decimal", parameters={"scale": "2", "connect.decimal.precision": "10"})
    got = _convert(schema, [_b64(1234), _b64(-1), _b64(0), None, _b64(-99999999), "BE0="])
    assert got == [decimal.Decimal("12.34"), decimal.Decimal("-0.01"), decimal.Decimal("0.00"), None, decimal.Decimal("-999999.99"),
                   decimal.Decimal("11.01")]  # "BE0=" is 0x044D = 1101
    assert arrow_type(schema) == pa.decimal128(10, 2)


@settings(max_examples=examples(200))
@given(st.lists(st.one_of(st.none(), st.integers(-(10**37), 10**37)), min_size=1, max_size=20), st.integers(0, 10))
def test_any_unscaled_decimal_round_trips(values: list[int | None], scale: int) -> None:
    schema = _field("bytes", "org.apache.kafka.connect.data.Decimal", parameters={"scale": str(scale)})
    got = _convert(schema, [None if v is None else _b64(v) for v in values])
    assert got == [None if v is None else decimal.Decimal(v).scaleb(-scale, decimal.Context(prec=80)) for v in values]


def test_a_decimal_written_as_a_number_is_read_too() -> None:
    schema = _field("bytes", "org.apache.kafka.connect.data.Decimal", parameters={"scale": "2"})
    import io

    import pyarrow.json as pj

    parsed = pj.read_json(io.BytesIO(b'{"f": 12.5}'), parse_options=pj.ParseOptions(explicit_schema=pa.schema([("f", read_type(schema, True))])))
    assert convert(parsed.column("f").combine_chunks(), schema).to_pylist() == [decimal.Decimal("12.50")]


def test_variable_scale_decimals_become_their_exact_text() -> None:
    schema = _field("struct", "io.debezium.data.VariableScaleDecimal", fields=[
        ConnectSchema(type="int32", field="scale"), ConnectSchema(type="bytes", field="value")])
    got = _convert(schema, [{"scale": 3, "value": _b64(-1500)}, {"scale": 0, "value": _b64(42)}, None, {"scale": 5, "value": _b64(7)}])
    assert got == ["-1.500", "42", None, "0.00007"]
    assert arrow_type(schema) == pa.string()


def test_dates_times_and_timestamps() -> None:
    assert _convert(_field("int32", "io.debezium.time.Date"), [0, 19723, -1]) == [dt.date(1970, 1, 1), dt.date(2024, 1, 1), dt.date(1969, 12, 31)]
    micro = _field("int64", "io.debezium.time.MicroTimestamp")
    assert _convert(micro, [1_704_067_200_000_001]) == [dt.datetime(2024, 1, 1, 0, 0, 0, 1)]
    millis = _field("int64", "io.debezium.time.Timestamp")
    assert _convert(millis, [1_704_067_200_123]) == [dt.datetime(2024, 1, 1, 0, 0, 0, 123000)]
    nanos = _field("int64", "io.debezium.time.NanoTimestamp")
    assert _convert(nanos, [1_704_067_200_000_001_999, -1]) == [dt.datetime(2024, 1, 1, 0, 0, 0, 1), dt.datetime(1969, 12, 31, 23, 59, 59, 999999)]
    zoned = _field("string", "io.debezium.time.ZonedTimestamp")
    got = _convert(zoned, ["2024-01-01T10:00:00.5+02:00", "2024-01-01T08:00:00Z", None])
    assert got[:2] == [dt.datetime(2024, 1, 1, 8, 0, 0, 500000, tzinfo=dt.timezone.utc), dt.datetime(2024, 1, 1, 8, tzinfo=dt.timezone.utc)]
    assert got[2] is None
    micro_time = _field("int64", "io.debezium.time.MicroTime")
    expected_time = dt.time(13, 37, 3, 250) if TIME_AS_TIME else ((13 * 60 + 37) * 60 + 3) * 1_000_000 + 250
    assert _convert(micro_time, [((13 * 60 + 37) * 60 + 3) * 1_000_000 + 250]) == [expected_time]
    milli_time = _field("int32", "io.debezium.time.Time")
    assert _convert(milli_time, [1000]) == [dt.time(0, 0, 1) if TIME_AS_TIME else 1_000_000]


def test_bytes_strings_json_uuid_nested_structs_and_arrays() -> None:
    assert _convert(_field("bytes"), [base64.b64encode(b"\x00\xffab").decode(), None]) == [b"\x00\xffab", None]
    assert _convert(_field("string", "io.debezium.data.Json"), ['{"a": 1}']) == ['{"a": 1}']
    assert _convert(_field("string", "io.debezium.data.Uuid"), ["9a6d0e3e-6c1d-4f47-8c1b-5c2c6c1d2f00"]) == ["9a6d0e3e-6c1d-4f47-8c1b-5c2c6c1d2f00"]
    nested = _field("struct", fields=[
        ConnectSchema(type="int32", field="n"),
        ConnectSchema(type="array", field="days", items=ConnectSchema(type="int32", name="io.debezium.time.Date")),
        ConnectSchema(type="bytes", field="amount", name="org.apache.kafka.connect.data.Decimal", parameters={"scale": "1"}),
    ])
    got = _convert(nested, [{"n": 1, "days": [0, 1], "amount": _b64(15)}, None, {"n": 2, "days": None, "amount": None}])
    assert got == [{"n": 1, "days": [dt.date(1970, 1, 1), dt.date(1970, 1, 2)], "amount": decimal.Decimal("1.5")}, None,
                   {"n": 2, "days": None, "amount": None}]


def test_a_map_column_is_refused_with_the_setting_to_change() -> None:
    schema = ConnectSchema(type="struct", fields=[ConnectSchema(type="map", field="tags", keys=ConnectSchema(type="string"), values=ConnectSchema(type="string"))])
    value = json.dumps({"schema": {"type": "struct", "fields": [
        {"type": "struct", "field": "after", "fields": [{"type": "map", "field": "tags", "keys": {"type": "string"}, "values": {"type": "string"}}]}]},
        "payload": {"op": "c", "after": {"tags": {"a": "b"}}, "source": {"connector": "postgresql", "table": "t", "lsn": 1}}}).encode()
    assert schema.fields is not None
    records = pa.table({"key": pa.array([None], pa.binary()), "value": pa.array([value], pa.binary())})
    with pytest.raises(DebeziumSchemaError, match=r"hstore\.handling\.mode=json"):
        decode(records, DebeziumOptions(namespace="r", topic_column=None, partition_column=None, offset_column=None), lambda _: None)


@pytest.mark.parametrize(("value", "kind"), [
    (None, Kind.TOMBSTONE),
    (b'{"schema": {"type": "struct"}, "payload": null}', Kind.TOMBSTONE),
    (b'{"ts_ms": 1700000000000}', Kind.HEARTBEAT),
    (b'{"status": "BEGIN", "id": "571", "event_count": null, "data_collections": null}', Kind.TRANSACTION),
    (b'{"source": {"connector": "mysql"}, "databaseName": "inventory", "ddl": "ALTER TABLE t ADD c INT", "tableChanges": []}', Kind.SCHEMA_CHANGE),
    (b'{"op": "m", "source": {"connector": "postgresql"}, "message": {"prefix": "p", "content": "eA=="}}', Kind.MESSAGE),
    (b'{"op": "t", "source": {"connector": "postgresql", "table": "t", "lsn": 5}}', Kind.TRUNCATE),
    (b'{"before": null, "after": {"id": 1}, "source": {"connector": "postgresql", "table": "t", "lsn": 5}, "op": "c"}', Kind.CHANGE),
])
def test_every_kind_of_record_is_told_apart(value: bytes | None, kind: Kind) -> None:
    assert read_value(value, "topic", "the record").kind is kind


def test_a_wrapped_and_a_bare_key_give_the_same_fields() -> None:
    wrapped = b'{"schema": {"type": "struct", "fields": [{"type": "int32", "field": "id"}]}, "payload": {"id": 7}}'
    fields, schema = read_key(wrapped, "k")
    assert fields is not None and json.loads(bytes(fields)) == {"id": 7} and schema is not None
    fields, schema = read_key(b'{"id": 7}', "k")
    assert fields is not None and json.loads(bytes(fields)) == {"id": 7} and schema is None
    assert read_key(None, "k") == (None, None)
    with pytest.raises(DebeziumInputError, match="key that is not a JSON object"):
        read_key(b"7", "the record at topic 't'")


def test_positions_order_each_connector_as_its_log_does() -> None:
    from lakesink_datasource.debezium.decode import encode_position

    def order(connector: str, sources: list[dict], offsets: list[int]) -> list[int]:
        encoded = encode_position(positions(connector, [Source(**s) for s in sources], offsets))
        return sorted(range(len(sources)), key=lambda i: encoded[i])

    mysql = [{"file": "mysql-bin.000003", "pos": 9000, "row": 0}, {"file": "mysql-bin.000004", "pos": 4, "row": 0},
             {"file": "mysql-bin.000003", "pos": 9000, "row": 1}]
    assert order("mysql", mysql, [0, 1, 2]) == [0, 2, 1]
    pg = [{"lsn": 200, "sequence": '["150","200"]'}, {"lsn": 100, "sequence": '["50","100"]'}, {"lsn": 200, "sequence": '["150","200"]'}]
    assert order("postgresql", pg, [5, 1, 9]) == [1, 0, 2]  # a re-sent event (same lsn) comes after by its offset
    mssql = [{"change_lsn": "00000027:00000758:0003", "commit_lsn": "x", "event_serial_no": 2},
             {"change_lsn": None, "commit_lsn": "00000027:00000700:0001", "event_serial_no": None},
             {"change_lsn": "00000027:00000758:0003", "commit_lsn": "x", "event_serial_no": 1}]
    assert order("sqlserver", mssql, [0, 0, 0]) == [1, 2, 0]  # the snapshot row first
    oracle = [{"scn": "100000000000000000001"}, {"scn": "99"}]
    assert order("oracle", oracle, [0, 0]) == [1, 0]  # numbers, not text
    with pytest.raises(DebeziumSchemaError, match=r"source\.connector .mongodb."):
        positions("mongodb", [Source()], None)


def test_the_bulk_read_gives_what_reading_record_by_record_gives() -> None:
    """Records are read in bulk once a topic's wrapper prefix is known (its first record,
    read whole, teaches it), else one by one: both ways must give the same rows, keys and
    positions."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parents[1]))
    from debezium_events import PLACEHOLDER, Column, Connector, SourceDatabase, SourceTable, to_arrow

    from lakesink_datasource.debezium import envelope

    people = SourceTable("d", "public", "people", (
        Column("id", "int32", optional=False), Column("name", "string"), Column("bal", "decimal"), Column("born", "date"),
        Column("at", "zoned_timestamp"), Column("n", "variable_decimal"), Column("raw", "bytes")), ("id",))
    log = SourceTable("d", "public", "log", (Column("msg", "string"),), ())
    pg = SourceDatabase(Connector("postgresql", "pg", partitions=2), [people, log], toasted=["name"])
    for i in range(30):
        pg.insert("people", {"id": i, "name": f"p{i}", "bal": f"{i}.25", "born": dt.date(2000, 1, 1 + i % 28),
                             "at": dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc), "n": f"-{i}.5", "raw": bytes([i, 0, 255])})
        pg.insert("log", {"msg": f"m{i}"})
    for i in range(0, 30, 3):
        pg.update("people", (i,), {"bal": "9.99"})  # name unchanged: the placeholder
        pg.delete("people", (i + 1,))
    pg.truncate("log")
    records = to_arrow(pg.records)
    options = DebeziumOptions(namespace="r")
    envelope._PREFIXES.clear()
    envelope._KEY_PREFIXES.clear()
    one_by_one = decode(records, options, lambda _: None, bulk=False)
    envelope._PREFIXES.clear()
    envelope._KEY_PREFIXES.clear()
    in_bulk = decode(records, options, lambda _: None)  # a topic's first record teaches its prefix, the rest go in bulk
    assert envelope.known_prefixes("pg.public.people") and envelope.key_prefix("pg.public.people")
    assert [t.identifier for t in in_bulk.tables] == [t.identifier for t in one_by_one.tables] == ["r.log", "r.people"]
    for a, b in zip(one_by_one.tables, in_bulk.tables):
        assert a.rows.equals(b.rows), a.identifier
        assert (a.key, a.keyed, a.truncated_at) == (b.key, b.keyed, b.truncated_at)
    assert in_bulk.skipped == one_by_one.skipped == {"tombstones": 10}
    people_rows = in_bulk.tables[1].rows
    assert PLACEHOLDER in people_rows.column("name").to_pylist()  # left for the keyed write to fill


@settings(max_examples=examples(200))
@given(values=st.lists(st.one_of(st.none(), st.binary(max_size=24)), max_size=40), start=st.integers(0, 3))
def test_a_base64_column_decodes_as_pythons_base64_does(values: list[bytes | None], start: int) -> None:
    """The column-at-once decoding (decimals, bytes) against Python's base64, on slices too."""
    texts = pa.array([None if v is None else base64.b64encode(v).decode() for v in values], pa.string()).slice(start)
    assert binary_from_base64(texts, "f").to_pylist() == values[start:]


@pytest.mark.parametrize("text", ["AB=C", "A", "QUJD\n", "QU*D"])
def test_text_that_is_not_base64_is_refused_naming_the_field(text: str) -> None:
    with pytest.raises(DebeziumSchemaError, match="field 'blob': a bytes value is not base64 text"):
        binary_from_base64(pa.array(["QUJD", text]), "blob")
