"""Debezium change events captured from real connectors by other projects (Apache Flink,
Apache Paimon, Apache SeaTunnel, RisingWave, debezium-server-iceberg), written through Spark with
`cdc_format=debezium`, and compared with the final table each project's own test expects.

Every other Debezium test here lands events written by us (tests/debezium_events.py), which
share our reading of Debezium's documentation; these do not. Each data set lives in
tests/data/debezium_captured/<name>/: the captured file(s) byte for byte, SOURCE.md (where
they come from, and where in the source project's test the expected rows are) and
expected.json (those rows, transcribed by hand, in the types docs/usage.md says lakesink
stores). A data set lands in one batch, and again in three batches or record by record
(separate writes, so separate batch ids); a data set that a limit in docs/limits.md refuses
must fail with that limit's error and create no table.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import re
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import msgspec
import pytest
from lakesink_testing import current_snapshot_id, duckdb_rows, embedded_catalog, expected_rows, load, pyiceberg_rows, table_exists

CORPUS = Path(__file__).resolve().parent.parent / "data" / "debezium_captured"
KAFKA = "key binary, value binary, topic string, partition int, offset long"
NAMESPACE = "replica"
# Record by record costs one Spark write per event: only for the small data sets.
RECORD_BY_RECORD_BELOW = 15
TOMBSTONES = "__lakesink_tombstones"  # a keyed table's companion table of deletes (docs/maintenance.md)


class Refusal(msgspec.Struct, frozen=True):
    error_contains: list[str]
    absent_tables: list[str]


class RefusedAfter(msgspec.Struct, frozen=True):
    """A file the source project's test expects to fail once the others have landed."""

    file: str
    error_contains: list[str]


class ExpectedTable(msgspec.Struct, frozen=True):
    columns: list[str]
    rows: list[list[Any]]
    types: dict[str, str | None] = {}  # None: no such column


class DataSet(msgspec.Struct, frozen=True):
    topic: str
    key: list[str] | None  # the primary key the source project's test declares; None: no key
    files: list[str]  # events one a line, values only
    tables: dict[str, ExpectedTable]
    # Events captured as a whole file each, key and value: [key file or None, value file].
    pairs: list[tuple[str | None, str]] = []
    refused: Refusal | None = None
    refused_after: RefusedAfter | None = None


Record = tuple[bytes | None, bytes, str, int, int]


def data_set(name: str) -> DataSet:
    return msgspec.json.decode((CORPUS / name / "expected.json").read_bytes(), type=DataSet)


def captured_values(name: str, file: str) -> list[bytes]:
    """The file's events, one a line, each line's bytes as captured. Paimon's files open with
    a licence comment and RisingWave's end with an empty line: only lines holding a JSON
    object are events (as each project's own loader reads them)."""
    return [line for line in (CORPUS / name / file).read_bytes().split(b"\n") if line.lstrip().startswith(b"{")]


def _envelope(value: dict) -> tuple[dict, dict | None]:
    """The envelope and, with JsonConverter's schemas, its schema (RisingWave's own capture
    wraps the envelope in `payload` without a schema)."""
    if "payload" in value:
        return value["payload"], value.get("schema")
    return value, None


def message_key(value_bytes: bytes, fields: list[str] | None, topic: str) -> bytes | None:
    """The Kafka key Debezium writes beside this value: a struct of the table's primary key
    columns, in the value's converter (with the value's field schemas when it has schemas).
    The captured files hold values only (their projects' tests declare the key instead), so
    the key is built from that declaration, as Debezium's documentation describes it."""
    if fields is None:
        return None
    envelope, schema = _envelope(json.loads(value_bytes))
    row = envelope.get("after") or envelope.get("before")
    if not isinstance(row, dict):
        return None
    payload = {f: row[f] for f in fields}
    if schema is None:
        return json.dumps(payload, separators=(",", ":")).encode()
    row_schema = next(f for f in schema["fields"] if f["field"] in ("after", "before"))
    by_name = {f["field"]: f for f in row_schema["fields"]}
    key_schema = {"type": "struct", "fields": [by_name[f] for f in fields], "optional": False, "name": f"{topic}.Key"}
    return json.dumps({"schema": key_schema, "payload": payload}, separators=(",", ":")).encode()


def kafka_records(name: str, data: DataSet, files: list[str] | None = None, first_offset: int = 0) -> list[Record]:
    """Spark's Kafka rows of the data set's events (or of these files' only): partition 0,
    offsets in file order."""
    values = [v for file in (data.files if files is None else files) for v in captured_values(name, file)]
    pairs = [(message_key(v, data.key, data.topic), v) for v in values]
    if files is None:
        folder = CORPUS / name
        pairs += [((folder / k).read_bytes() if k else None, (folder / v).read_bytes()) for k, v in data.pairs]
    return [(key, value, data.topic, 0, first_offset + i) for i, (key, value) in enumerate(pairs)]


def batches(records: list[Record], plan: str) -> list[list[Record]]:
    if plan == "one_batch":
        return [records]
    if plan == "record_by_record":
        return [[r] for r in records]
    third = -(-len(records) // 3)
    return [records[i : i + third] for i in range(0, len(records), third)]


def write(spark, warehouse: str, records: list[Record]) -> None:  # type: ignore[no-untyped-def]
    df = spark.createDataFrame(records, KAFKA).coalesce(1)
    (df.write.format("lakesink").mode("append").option("cdc_format", "debezium").option("namespace", NAMESPACE)
     .option("warehouse", warehouse).option("maintenance", "off").save())


def _typed(value: Any) -> Any:
    """expected.json's tagged values ({"$decimal": "1.10"}, ...) as the Python values the
    readers give; a plain object is a struct, a list a list."""
    if isinstance(value, list):
        return [_typed(v) for v in value]
    if not isinstance(value, dict):
        return value
    if len(value) == 1 and next(iter(value)).startswith("$"):
        tag, text = next(iter(value.items()))
        converters: dict[str, Callable[[str], Any]] = {
            "$decimal": Decimal, "$date": dt.date.fromisoformat, "$time": dt.time.fromisoformat,
            "$timestamp": dt.datetime.fromisoformat, "$timestamptz": dt.datetime.fromisoformat,
            "$base64": base64.b64decode, "$hex": bytes.fromhex, "$text": str.encode,
        }
        return converters[tag](text)
    return {k: _typed(v) for k, v in value.items()}


def _table_names(warehouse: str) -> dict[str, str]:
    """The replica tables that exist, by lower-case name (a source's table name may be upper
    case, as Oracle's are), less the companion tables of deletes docs/maintenance.md describes."""
    names = [ident[-1] for ident in embedded_catalog(warehouse).list_tables(NAMESPACE) if not ident[-1].endswith(TOMBSTONES)]
    return {n.lower(): n for n in names}


def assert_tables(warehouse: str, data: DataSet) -> None:
    names = _table_names(warehouse)
    assert sorted(names) == sorted(t.lower() for t in data.tables), f"replica tables {sorted(names)}"
    for table_name, table in data.tables.items():
        identifier = f"{NAMESPACE}.{names[table_name.lower()]}"
        loaded = load(warehouse, identifier)
        stored = {f.name: str(f.field_type) for f in loaded.schema().fields}
        types = {c: stored.get(c) for c in table.types}
        assert types == table.types, f"{identifier}: column types differ"
        expected = expected_rows([dict(zip(table.columns, _typed(row))) for row in table.rows], table.columns)
        assert pyiceberg_rows(loaded, table.columns) == expected, f"{identifier}: pyiceberg disagrees with the expected rows"
        assert duckdb_rows(loaded.metadata_location, table.columns) == expected, f"{identifier}: DuckDB disagrees with the expected rows"


def _cases() -> list[Any]:
    cases = []
    for folder in sorted(p for p in CORPUS.iterdir() if (p / "expected.json").exists()):
        data = data_set(folder.name)
        n = len(kafka_records(folder.name, data))
        plans = ["one_batch"]
        if data.refused is None and n > 1:  # a single event has no other batching
            plans.append("record_by_record" if n < RECORD_BY_RECORD_BELOW else "three_batches")
        cases += [pytest.param(folder.name, plan, id=f"{folder.name}-{plan}") for plan in plans]
    return cases


@pytest.mark.parametrize(("name", "plan"), _cases())
def test_captured_events_land_as_their_project_expects(spark, warehouse: str, name: str, plan: str) -> None:  # type: ignore[no-untyped-def]
    data = data_set(name)
    records = kafka_records(name, data)
    if data.refused is not None:
        with pytest.raises(Exception, match=f"(?i){re.escape(data.refused.error_contains[0])}") as raised:
            write(spark, warehouse, records)
        for word in data.refused.error_contains:
            assert word.lower() in str(raised.value).lower(), f"the error does not say {word!r}"
        for table in data.refused.absent_tables:
            assert not table_exists(warehouse, f"{NAMESPACE}.{table}")
        return
    for batch in batches(records, plan):
        write(spark, warehouse, batch)
    assert_tables(warehouse, data)
    if data.refused_after is not None:
        assert_refused_after(spark, warehouse, name, data, first_offset=len(records))


def assert_refused_after(spark, warehouse: str, name: str, data: DataSet, first_offset: int) -> None:  # type: ignore[no-untyped-def]
    """The source project expects this file to fail: lakesink refuses it, naming the column,
    and every table stays as it was."""
    assert data.refused_after is not None
    names = _table_names(warehouse)
    before = {n: current_snapshot_id(warehouse, f"{NAMESPACE}.{n}") for n in names.values()}
    tail = kafka_records(name, data, [data.refused_after.file], first_offset)
    with pytest.raises(Exception, match=re.escape(data.refused_after.error_contains[0])) as raised:
        write(spark, warehouse, tail)
    for word in data.refused_after.error_contains:
        assert word in str(raised.value), f"the error does not say {word!r}"
    assert {n: current_snapshot_id(warehouse, f"{NAMESPACE}.{n}") for n in names.values()} == before
    assert_tables(warehouse, data)
