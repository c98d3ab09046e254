"""Unchanged TOASTed values of every column type Debezium's PostgreSQL connector sends a
placeholder for (issue 59), through Spark: Kafka-shaped records (tests/debezium_toast.py)
written with `cdc_format=debezium` in two batch writes, read back with DuckDB and pyiceberg.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from debezium_toast import COLUMNS, expected, stream
from lakesink_testing import duckdb_rows, load, pyiceberg_rows

KAFKA = "key binary, value binary, topic string, partition int, offset long"


def _plain(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def test_every_placeholder_form_keeps_the_value_the_table_holds(spark, warehouse: str) -> None:  # type: ignore[no-untyped-def]
    """The first write stores rows 1 and 2. The second sends row 1 with every TOASTed column
    as its placeholder (text, bytea, jsonb, hstore as JSON, integer[], bigint[], date[], text[],
    bytea[], uuid[], jsonb[]): the table's values stay; row 2 with values that only look like
    placeholders: written as sent; row 3 inserted, then sent with every placeholder: its
    insert's values stay."""
    options = {"warehouse": warehouse, "cdc_format": "debezium", "namespace": "replica", "maintenance": "off"}
    for records in stream():
        rows = [(r["key"], r["value"], r["topic"], r["partition"], r["offset"]) for r in records]
        spark.createDataFrame(rows, KAFKA).coalesce(1).write.format("lakesink").options(**options).mode("append").save()
    want = Counter(tuple(i if c == "id" else _plain(row[c]) for c in COLUMNS) for i, row in expected().items())
    table = load(warehouse, "replica.docs")
    assert pyiceberg_rows(table, COLUMNS) == want
    assert duckdb_rows(table.metadata_location, COLUMNS) == want
