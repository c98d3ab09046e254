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
import re
from collections import Counter

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
    nulls_counted,
    read_type,
)
from lakesink_datasource.debezium.decode import decode
from lakesink_datasource.debezium.envelope import DebeziumInputError, Kind, Source, read_key, read_value
from lakesink_datasource.debezium.memo import Memo
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

    def order(connector: str, sources: list[dict], ops: list[str]) -> list[int]:
        encoded = encode_position(positions(connector, [Source(**s) for s in sources], ops))
        return sorted(range(len(sources)), key=lambda i: encoded[i])

    mysql = [{"file": "mysql-bin.000003", "pos": 9000, "row": 0}, {"file": "mysql-bin.000004", "pos": 4, "row": 0},
             {"file": "mysql-bin.000003", "pos": 9000, "row": 1}, {"file": "", "pos": 0, "row": 0, "snapshot": "false"}]
    assert order("mysql", mysql, ["u", "u", "u", "r"]) == [3, 0, 2, 1]  # Flink CDC's snapshot row (no file) first
    # PostgreSQL: the last commit LSN first; a snapshot read before the first transaction streamed after it.
    pg = [{"lsn": 200, "sequence": '["150","200"]'}, {"lsn": 100, "sequence": '["50","100"]'}, {"lsn": 90, "sequence": '["50","90"]'},
          {"lsn": 100, "sequence": '["50","100"]', "snapshot": "last"}]
    assert order("postgresql", pg, ["u", "u", "u", "r"]) == [3, 2, 1, 0]
    # An incremental snapshot's read carries the streaming position it was sent at: ordered as streamed.
    incremental = [{"lsn": 250, "sequence": '["240","250"]', "snapshot": "incremental"}, {"lsn": 245, "sequence": '["240","245"]'}]
    assert order("postgresql", incremental, ["r", "u"]) == [1, 0]
    # SQL Server: commit_lsn, then change_lsn (none for a snapshot row), then event_serial_no.
    mssql: list[dict] = [{"change_lsn": "00000027:00000758:0003", "commit_lsn": "00000027:00000760:0001", "event_serial_no": 2},
             {"change_lsn": None, "commit_lsn": "00000028:00000700:0001", "event_serial_no": None},
             {"change_lsn": "00000027:00000758:0003", "commit_lsn": "00000027:00000760:0001", "event_serial_no": 1}]
    assert order("sqlserver", mssql, ["u", "r", "u"]) == [2, 0, 1]
    # Oracle: commit SCN (a snapshot row's: its scn) as numbers, not text, then scn.
    oracle: list[dict] = [{"scn": "100000000000000000001", "commit_scn": "100000000000000000002"}, {"scn": "99", "commit_scn": "120"},
              {"scn": "100", "commit_scn": None, "snapshot": "true"}]
    assert order("oracle", oracle, ["u", "u", "r"]) == [2, 1, 0]
    with pytest.raises(DebeziumSchemaError, match=r"source\.connector .mongodb."):
        positions("mongodb", [Source()], ["c"])


def test_the_bulk_read_gives_what_reading_record_by_record_gives(monkeypatch: pytest.MonkeyPatch) -> None:
    """Records are read in bulk once a topic's wrapper prefix is known (its first record,
    read whole, teaches it), else one by one: both ways must give the same rows, keys and
    positions, and the bulk read must really be taken (a fallback to one by one would pass
    the comparison)."""
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
    Memo.forget_all()  # as a fresh process reads them
    one_by_one = decode(records, options, lambda _: None, bulk=False)
    Memo.forget_all()  # as a fresh process reads them
    from lakesink_datasource.debezium import decode as decode_module

    taken: list[tuple[str, int, bool]] = []
    read_in_bulk = decode_module.read_in_bulk

    def spied(task, topic, prefix, schema, members, *rest):  # type: ignore[no-untyped-def]
        result = read_in_bulk(task, topic, prefix, schema, members, *rest)
        taken.append((str(topic), len(members), result))
        return result

    monkeypatch.setattr(decode_module, "read_in_bulk", spied)
    in_bulk = decode(records, options, lambda _: None)  # a topic's first record teaches its prefix, the rest go in bulk
    # Every record that has a value (all but the tombstones) went in bulk, in one read per topic.
    with_value = Counter(str(r["topic"]) for r in pg.records if r["value"] is not None)
    assert sorted(taken) == sorted((topic, n, True) for topic, n in with_value.items())
    assert envelope.known_prefixes("pg.public.people") and envelope.key_prefix("pg.public.people")
    assert [t.identifier for t in in_bulk.tables] == [t.identifier for t in one_by_one.tables] == ["r.log", "r.people"]
    for a, b in zip(one_by_one.tables, in_bulk.tables):
        assert a.rows.equals(b.rows), a.identifier
        assert (a.key, a.keyed, a.truncated_at) == (b.key, b.keyed, b.truncated_at)
    assert in_bulk.skipped == one_by_one.skipped == {"tombstones": 10}
    people_rows = in_bulk.tables[1].rows
    assert PLACEHOLDER in people_rows.column("name").to_pylist()  # left for the keyed write to fill


def test_a_bad_key_read_in_bulk_is_named_by_topic_partition_and_offset() -> None:
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parents[1]))
    from debezium_events import Column, Connector, SourceDatabase, SourceTable, to_arrow


    people = SourceTable("d", "public", "people", (Column("id", "int32", optional=False), Column("name", "string")), ("id",))
    pg = SourceDatabase(Connector("postgresql", "pg"), [people])
    for i in range(5):
        pg.insert("people", {"id": i, "name": f"p{i}"})
    records = [dict(r) for r in pg.records]
    records[3]["key"] = b"7"  # after the first record, which is read whole: this one goes in bulk
    Memo.forget_all()  # as a fresh process reads them
    where = f"the record at topic 'pg.public.people', partition {records[3]['partition']}, offset {records[3]['offset']}"
    with pytest.raises(DebeziumInputError, match=f"^{re.escape(where)} has a key that is not a JSON object"):
        decode(to_arrow(records), DebeziumOptions(namespace="r"), lambda _: None)


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


# -- every type as JsonConverter and Debezium write it (issue 59) -------------------------------


def _counted(schema: ConnectSchema, json_values: list[object]) -> tuple[list[object], dict[str, int]]:
    with nulls_counted() as counts:
        got = _convert(schema, json_values)
    return got, counts


@pytest.mark.parametrize(("name", "arrow"), [("float", pa.float32()), ("double", pa.float64()), ("float32", pa.float32()),
                                             ("float64", pa.float64()), ("int8", pa.int32()), ("int16", pa.int32())])
def test_json_converters_own_type_names_are_read(name: str, arrow: pa.DataType) -> None:
    """Kafka's JsonConverter writes FLOAT32/FLOAT64 as "float"/"double" (its JsonSchema type
    names); Connect's own names are read too."""
    assert arrow_type(_field(name)) == arrow
    assert _convert(_field(name), [1.5 if "float" in name or name == "double" else -7, None])[1] is None


def test_zoned_timestamps_take_zero_to_nine_fractional_digits_cut_to_microseconds() -> None:
    zoned = _field("string", "io.debezium.time.ZonedTimestamp")
    utc = dt.timezone.utc
    got = _convert(zoned, [
        "2024-03-01T10:15:30.1234567+02:00",  # SQL Server datetimeoffset(7)
        "2024-03-01T10:15:30.0000000Z",
        "2024-03-01T10:15:30.999999999-05:00",  # Oracle TIMESTAMP(9) WITH TIME ZONE: cut, not rounded
        "2024-03-01T10:15:30Z", "2024-03-01T10:15:30.1Z", None,
        "1900-01-01T00:00:00+00:09:21",  # a local mean time offset: Java writes its seconds
    ])
    assert got == [
        dt.datetime(2024, 3, 1, 8, 15, 30, 123456, tzinfo=utc), dt.datetime(2024, 3, 1, 10, 15, 30, tzinfo=utc),
        dt.datetime(2024, 3, 1, 15, 15, 30, 999999, tzinfo=utc), dt.datetime(2024, 3, 1, 10, 15, 30, tzinfo=utc),
        dt.datetime(2024, 3, 1, 10, 15, 30, 100000, tzinfo=utc), None, dt.datetime(1899, 12, 31, 23, 50, 39, tzinfo=utc),
    ]


def test_a_column_of_seven_digit_zoned_timestamps_reads_as_one_of_mixed_forms_does() -> None:
    """SQL Server's datetimeoffset(7) column (every value one layout, some null) is cut to
    microseconds by position; the same values among other forms are taken apart one by one."""
    zoned = _field("string", "io.debezium.time.ZonedTimestamp")
    texts = [None, "2024-03-01T10:15:30.1234567+02:00", "1999-12-31T23:59:59.9999999-08:00", "2024-03-01T10:15:30.0000000Z"]
    utc = dt.timezone.utc
    expected = [None, dt.datetime(2024, 3, 1, 8, 15, 30, 123456, tzinfo=utc), dt.datetime(2000, 1, 1, 7, 59, 59, 999999, tzinfo=utc),
                dt.datetime(2024, 3, 1, 10, 15, 30, tzinfo=utc)]
    assert _convert(zoned, texts) == expected
    assert _convert(zoned, [*texts, "2024-03-01T10:15:30.12345678Z"])[:4] == expected


def test_zoned_timestamps_past_year_9999_keep_their_instant() -> None:
    """Debezium's PostgreSQL tests: '21016-11-04T13:51:30.123456+07:00'::TIMESTAMPTZ is
    `+21016-11-04T06:51:30.123456Z`; 4714-12-31T23:59:59.999999Z BC is `-4713-12-31T...`."""
    import io

    import pyarrow.json as pj

    zoned = _field("string", "io.debezium.time.ZonedTimestamp")
    lines = b'{"f": "+21016-11-04T06:51:30.123456Z"}\n{"f": "-4713-12-31T23:59:59.999999Z"}'
    parsed = pj.read_json(io.BytesIO(lines), parse_options=pj.ParseOptions(explicit_schema=pa.schema([("f", read_type(zoned))])))
    micros = convert(parsed.column("f").combine_chunks(), zoned).cast(pa.int64()).to_pylist()
    # The Gregorian calendar repeats every 400 years (146,097 days): 21016 is 9016 and 30 cycles,
    # -4713 is 87 less 12 cycles.
    cycle = 146_097
    days_21016 = (dt.date(9016, 11, 4) - dt.date(1970, 1, 1)).days + 30 * cycle
    assert micros[0] == (((days_21016 * 24 + 6) * 60 + 51) * 60 + 30) * 1_000_000 + 123456
    days_before = (dt.date(87, 12, 31) - dt.date(1970, 1, 1)).days - 12 * cycle
    assert micros[1] == (((days_before * 24 + 23) * 60 + 59) * 60 + 59) * 1_000_000 + 999999


def test_a_zoned_timestamp_that_is_no_iso_text_is_refused_naming_the_field() -> None:
    with pytest.raises(DebeziumSchemaError, match=r"field 'f': ZonedTimestamp '2024-03-01 10:15' is not ISO-8601 text"):
        _convert(_field("string", "io.debezium.time.ZonedTimestamp"), ["2024-03-01T10:15:30.1234567Z", "2024-03-01 10:15"])


def test_postgresql_infinity_is_null_and_counted() -> None:
    """Debezium's sentinels (PostgreSQL connector, "TIMESTAMP type"; PostgresValueConverter):
    MicroTimestamp 9223372036825200000 / -9223372036832400000, NanoTimestamp Long.MAX/MIN,
    ZonedTimestamp `infinity`/`-infinity`, a streamed Date the epoch days of -5877611-06-21/22
    and a snapshotted one that count wrapped to 32 bits (here -622191233, of 292278994-08-17)."""
    micro = _field("int64", "io.debezium.time.MicroTimestamp")
    got, counts = _counted(micro, [9_223_372_036_825_200_000, 1_478_267_490_123_456, -9_223_372_036_832_400_000, None])
    assert got == [None, dt.datetime(2016, 11, 4, 13, 51, 30, 123456), None, None]
    assert counts == {"PostgreSQL infinity/-infinity values of column 'f' (stored as null)": 2}
    nano, counts = _counted(_field("int64", "io.debezium.time.NanoTimestamp"), [(1 << 63) - 1, -(1 << 63), 1_000])
    assert nano == [None, None, dt.datetime(1970, 1, 1, 0, 0, 0, 1)] and sum(counts.values()) == 2
    # time.precision.mode=connect: milliseconds, infinity's microseconds a thousandth of them or the count itself.
    millis, counts = _counted(_field("int64", "org.apache.kafka.connect.data.Timestamp"), [9_223_372_036_825_200, 9_223_372_036_825_200_000, 1])
    assert millis == [None, None, dt.datetime(1970, 1, 1, 0, 0, 0, 1000)] and sum(counts.values()) == 2
    zoned, counts = _counted(_field("string", "io.debezium.time.ZonedTimestamp"), ["infinity", "-infinity", "2016-11-04T11:51:30.123456Z"])
    assert zoned == [None, None, dt.datetime(2016, 11, 4, 11, 51, 30, 123456, tzinfo=dt.timezone.utc)] and sum(counts.values()) == 2
    dates, counts = _counted(_field("int32", "io.debezium.time.Date"), [-2_147_472_692, -2_147_472_691, -622_191_233, 17_109, -719_162])
    assert dates == [None, None, None, dt.date(2016, 11, 4), dt.date(1, 1, 1)] and sum(counts.values()) == 3


def test_times_outside_a_day() -> None:
    """PostgreSQL's 24:00:00 (Debezium: MicroTime of one day) is the day's last microsecond;
    MySQL's TIME durations (-838:59:59 .. 838:59:59) have no time of day: null, counted.
    PySpark 4.0 keeps every value as its microseconds."""
    micro_time = _field("int64", "io.debezium.time.MicroTime")
    hours_838 = ((838 * 60 + 59) * 60 + 59) * 1_000_000
    got, counts = _counted(micro_time, [86_400_000_000, -hours_838, hours_838, 0, None])
    if TIME_AS_TIME:
        assert got == [dt.time(23, 59, 59, 999999), None, None, dt.time(0), None]
        assert counts == {"TIME values of column 'f' outside 00:00:00-24:00:00 (stored as null)": 2}
    else:
        assert got == [86_400_000_000, -hours_838, hours_838, 0, None] and counts == {}
    nano_time = _field("int64", "io.debezium.time.NanoTime")
    assert _convert(nano_time, [86_400_000_000_000]) == [dt.time(23, 59, 59, 999999) if TIME_AS_TIME else 86_400_000_000]


@pytest.mark.parametrize(("length", "wire", "database"), [
    (11, [0xC7, 0x07], b"\x07\xc7"),  # MySQL b'11111000111'
    (64, [0xC7, 0x07, 0, 0, 0, 0, 0, 0], b"\x00\x00\x00\x00\x00\x00\x07\xc7"),
    # Debezium's PostgreSQL tests (AbstractRecordsProducerTest, bitbin_table): the values it expects on the wire.
    (24, [1, 2, 3], b"\x03\x02\x01"),  # '000000110000001000000001'::bit(24)
    (7, [64], b"\x40"),  # '1'::bit(7), '1000000'
    (64, [0, 0, 0, 0, 0, 0, 0, 0x80], b"\x80" + b"\x00" * 7),  # '1' and 63 zeros, ::bit(64)
    (2, [], b"\x00"),  # '00'::bit(2): sent without bytes
    ((1 << 31) - 1, [1, 2, 35, 0xDA, 1], b"\x01\xda\x23\x02\x01"),  # bit varying without a length: its own bytes
])
def test_bits_are_stored_in_the_databases_byte_order(length: int, wire: list[int], database: bytes) -> None:
    bits = _field("bytes", "io.debezium.data.Bits", parameters={"length": str(length)})
    assert _convert(bits, [base64.b64encode(bytes(wire)).decode(), None]) == [database, None]


def test_decimals_past_38_digits_are_refused_naming_the_column() -> None:
    wide = _field("bytes", "org.apache.kafka.connect.data.Decimal", parameters={"scale": "0", "connect.decimal.precision": "65"})
    assert _convert(wide, [_b64(10**38 - 1), _b64(-(10**38 - 1))]) == [decimal.Decimal(10**38 - 1), decimal.Decimal(-(10**38 - 1))]
    for value in (10**38, -(10**38), 2**127 - 1, -(2**127), 10**60):
        with pytest.raises(DebeziumSchemaError, match=r"column 'f': a decimal value has more than 38 digits.*decimal\.handling\.mode=string"):
            _convert(wide, [_b64(1), _b64(value)])
    # JsonConverter's decimal.format=NUMERIC: the same values as JSON numbers.
    import io

    import pyarrow.json as pj

    numbers = b'{"f": 99999999999999999999999999999999999999}\n{"f": 100000000000000000000000000000000000000}'
    parsed = pj.read_json(io.BytesIO(numbers), parse_options=pj.ParseOptions(explicit_schema=pa.schema([("f", read_type(wide, True))])))
    with pytest.raises(DebeziumSchemaError, match=r"column 'f': a decimal value has more than 38 digits.*decimal\.handling\.mode=string"):
        convert(parsed.column("f").combine_chunks(), wide)
    assert convert(parsed.column("f").combine_chunks().slice(0, 1), wide).to_pylist() == [decimal.Decimal(10**38 - 1)]
    scaled = _field("bytes", "org.apache.kafka.connect.data.Decimal", parameters={"scale": "40", "connect.decimal.precision": "65"})
    with pytest.raises(DebeziumSchemaError, match=r"column 'f' is a decimal of scale 40.*decimal\.handling\.mode=string"):
        arrow_type(scaled)


def test_the_values_stored_as_null_are_counted_with_the_skipped_records() -> None:
    """The count reaches the batch's progress line through `Decoded.skipped`, read in bulk or
    one by one alike."""

    fields = [{"type": "int32", "optional": False, "field": "id"}, {"type": "string", "optional": True, "field": "until",
                                                                    "name": "io.debezium.time.ZonedTimestamp"}]
    row = {"type": "struct", "optional": True, "fields": fields}
    schema = {"type": "struct", "fields": [{**row, "field": "before"}, {**row, "field": "after"},
                                           {"type": "struct", "field": "source", "fields": []}, {"type": "string", "field": "op"}]}
    key_schema = {"type": "struct", "fields": fields[:1]}

    def record(i: int, until: str) -> tuple[bytes, bytes]:
        source = {"connector": "postgresql", "db": "d", "schema": "public", "table": "t", "lsn": 100 + i, "sequence": f'["90","{100 + i}"]'}
        value = {"schema": schema, "payload": {"op": "c", "before": None, "after": {"id": i, "until": until}, "source": source}}
        return json.dumps({"schema": key_schema, "payload": {"id": i}}).encode(), json.dumps(value).encode()

    made = [record(i, until) for i, until in enumerate(["infinity", "2024-01-01T00:00:00Z", "-infinity", "infinity"])]
    records = pa.table({"key": [k for k, _ in made], "value": [v for _, v in made], "topic": ["t"] * 4,
                        "partition": pa.array([0] * 4, pa.int32()), "offset": pa.array(range(4), pa.int64())})
    for bulk in (False, True):
        Memo.forget_all()  # as a fresh process reads them
        decoded = decode(records, DebeziumOptions(namespace="r"), lambda _: None, bulk=bulk)
        assert decoded.skipped == {"PostgreSQL infinity/-infinity values of column 'until' (stored as null)": 3}, bulk
        assert decoded.tables[0].rows.column("until").null_count == 3


def _kafka(values: list[dict], keys: list[dict], topic: str) -> pa.Table:
    """Spark's Kafka rows of these values and keys (JSON), partition 0, offsets in order."""
    n = len(values)
    return pa.table({"key": [json.dumps(k).encode() for k in keys], "value": [json.dumps(v).encode() for v in values],
                     "topic": [topic] * n, "partition": pa.array([0] * n, pa.int32()), "offset": pa.array(range(n), pa.int64())})


def _decoded_both_ways(records: pa.Table, existing: pa.Schema | None = None) -> list[pa.Table]:
    """The one table's rows read in bulk (once a topic's first record taught its prefix) and
    record by record."""

    out = []
    for bulk in (True, False):
        Memo.forget_all()  # as a fresh process reads them
        decoded = decode(records, DebeziumOptions(namespace="r"), lambda _: existing, bulk=bulk)
        assert len(decoded.tables) == 1
        out.append(decoded.tables[0].rows)
    return out


def _pg_source(i: int) -> dict:
    return {"connector": "postgresql", "db": "d", "schema": "public", "table": "t", "lsn": 100 + i, "sequence": f'["90","{100 + i}"]'}


def test_text_without_schemas_stays_text_and_fields_no_value_types_are_no_columns() -> None:
    """Without schemas a string is a string (Arrow's reader would make timestamps of ISO
    dates), and a field null or empty in every event has no type: no column, unless the table
    has it already (then it is read in the table's type)."""
    rows = [
        {"id": 1, "ship": "1992-06-22", "at": "2024-01-01T00:00:00", "tags": [], "gone": None,
         "geo": {"wkb": "AQ==", "srid": None}, "days": ["2020-01-01"]},
        {"id": 2, "ship": "1993-11-07", "at": "2024-01-02T10:00:00", "tags": [], "gone": None,
         "geo": {"wkb": "Ag==", "srid": None}, "days": []},
    ]
    values = [{"op": "r", "before": None, "after": r, "source": _pg_source(i)} for i, r in enumerate(rows)]
    records = _kafka(values, [{"id": r["id"], "ship": r["ship"]} for r in rows], "t")
    for got in _decoded_both_ways(records):
        assert got.schema.field("ship").type == pa.string() and got.schema.field("at").type == pa.string()
        assert got.column("ship").to_pylist() == ["1992-06-22", "1993-11-07"]
        assert got.column("at").to_pylist() == ["2024-01-01T00:00:00", "2024-01-02T10:00:00"]
        assert "tags" not in got.column_names and "gone" not in got.column_names
        assert got.schema.field("geo").type == pa.struct([("wkb", pa.string())])
        assert got.column("days").to_pylist() == [["2020-01-01"], []]
    # The table has the columns already: its types read them (an empty list, a null).
    table = pa.schema([("id", pa.int64()), ("tags", pa.list_(pa.int64())), ("gone", pa.float64())])
    for got in _decoded_both_ways(records, table):
        assert got.schema.field("tags").type == pa.list_(pa.int64()) and got.column("tags").to_pylist() == [[], []]
        assert got.schema.field("gone").type == pa.float64() and got.column("gone").to_pylist() == [None, None]
        assert got.column("ship").to_pylist() == ["1992-06-22", "1993-11-07"]


def test_json_converters_nan_and_infinity_texts_are_floats() -> None:
    """JsonConverter (Jackson) writes a double's NaN and infinities as the texts "NaN",
    "Infinity", "-Infinity": a float or double column reads them as those floats, in bulk and
    record by record; a string column keeps the same text as text."""
    import math

    fields = [
        {"type": "int32", "optional": False, "field": "id"}, {"type": "double", "optional": True, "field": "d"},
        {"type": "float", "optional": True, "field": "f"}, {"type": "string", "optional": True, "field": "s"},
        {"type": "array", "items": {"type": "double", "optional": True}, "optional": True, "field": "l"},
    ]
    row = {"type": "struct", "optional": True, "fields": fields}
    schema = {"type": "struct", "fields": [{**row, "field": "before"}, {**row, "field": "after"},
                                           {"type": "struct", "field": "source", "fields": []}, {"type": "string", "field": "op"}]}
    key_schema = {"type": "struct", "fields": fields[:1]}
    after = [
        {"id": 0, "d": 1.5, "f": "NaN", "s": "NaN", "l": [1.0]},
        {"id": 1, "d": "NaN", "f": 2.5, "s": "Infinity", "l": ["Infinity", 2.0]},
        {"id": 2, "d": "Infinity", "f": "-Infinity", "s": "x", "l": []},
        {"id": 3, "d": "-Infinity", "f": "Infinity", "s": "-Infinity", "l": ["-Infinity", "NaN"]},
    ]
    values = [{"schema": schema, "payload": {"op": "c", "before": None, "after": a, "source": _pg_source(i)}} for i, a in enumerate(after)]
    keys = [{"schema": key_schema, "payload": {"id": a["id"]}} for a in after]
    inf = math.inf
    for got in _decoded_both_ways(_kafka(values, keys, "t")):
        d, f, lists = got.column("d").to_pylist(), got.column("f").to_pylist(), got.column("l").to_pylist()
        assert d[0] == 1.5 and math.isnan(d[1]) and d[2:] == [inf, -inf]
        assert math.isnan(f[0]) and f[1:] == [2.5, -inf, inf]
        assert got.column("s").to_pylist() == ["NaN", "Infinity", "x", "-Infinity"]
        assert lists[:3] == [[1.0], [inf, 2.0], []] and lists[3][0] == -inf and math.isnan(lists[3][1])
        assert got.schema.field("d").type == pa.float64() and got.schema.field("f").type == pa.float32()
    # Without schemas: a field whose other values are numbers, or that the table has as a
    # double, is a double; a field of texts only is text.
    plain = [{"op": "c", "before": None, "after": {"id": a["id"], "d": a["d"], "s": a["s"], "e": "NaN"}, "source": _pg_source(i)}
             for i, a in enumerate(after)]
    plain_keys = [{"id": a["id"]} for a in after]
    for got in _decoded_both_ways(_kafka(plain, plain_keys, "u")):
        d = got.column("d").to_pylist()
        assert got.schema.field("d").type == pa.float64() and d[0] == 1.5 and math.isnan(d[1]) and d[2:] == [inf, -inf]
        assert got.column("s").to_pylist() == ["NaN", "Infinity", "x", "-Infinity"]
        assert got.column("e").to_pylist() == ["NaN"] * 4
    for got in _decoded_both_ways(_kafka(plain, plain_keys, "u"), pa.schema([("id", pa.int64()), ("e", pa.float64())])):
        assert got.schema.field("e").type == pa.float64() and all(math.isnan(v) for v in got.column("e").to_pylist())


def test_the_tasks_views_of_a_partition_merge_into_the_newest_failover_and_every_server() -> None:
    """Two tasks of one batch saw parts of one partition (cluster_by_key): the one that saw the
    failover decides the count and the new server's top; every server's transactions are kept."""
    from lakesink_datasource.debezium.failovers import Binlog, merged

    before = Binlog(failovers=0, top=(120, 1400), newest={"a": 58}, eras={"a": [(0, 1)]})
    after = Binlog(failovers=1, top=(3, 200), newest={"a": 57, "b": 1}, eras={"a": [(0, 3)], "b": [(1, 1)]})
    for order in ([before, after], [after, before]):
        out = merged([{"t/0": b} for b in order])["t/0"]
        assert (out.failovers, out.top, out.newest) == (1, (3, 200), {"a": 58, "b": 1})
        assert out.eras == {"a": [(0, 1)], "b": [(1, 1)]}
