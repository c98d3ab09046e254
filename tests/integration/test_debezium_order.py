"""Each Debezium connector's own order, through Spark: Kafka-shaped records (key, value,
topic, partition, offset) of a PostgreSQL, an Oracle, a SQL Server and two MySQL (Flink CDC;
a failover with GTIDs) sources written with `cdc_format=debezium` in two batch writes: the snapshots,
then the streams and a connector restart's copy of them (same positions, new offsets).

The events and the tables they must leave are written by hand in tests/debezium_events.py
(`ORDER_CASES`): a transaction in flight during the snapshot wins over the snapshot's read
(PostgreSQL, Oracle), the transaction committed last wins though its change sits lower in the
log, a re-snapshot replaces older streamed rows (SQL Server), snapshot rows without a binlog
file are taken and sort first (MySQL through Flink CDC), a new primary's changes win though
its binlog numbers are lower (MySQL failover).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from debezium_events import ORDER_CASES, resent
from lakesink_testing import duckdb_rows, load, pyiceberg_rows

KAFKA = "key binary, value binary, topic string, partition int, offset long"


def _rows(records: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [(r["key"], r["value"], r["topic"], r["partition"], r["offset"]) for r in records]


def test_four_connectors_land_in_their_own_commit_order_and_a_restarts_copy_changes_nothing(spark, warehouse: str) -> None:  # type: ignore[no-untyped-def]
    snapshots: list[dict[str, Any]] = []
    streams: list[dict[str, Any]] = []
    for case in ORDER_CASES:
        steps = case.records(f"src_{case.connector}")
        snapshots += [r for step in steps[: case.cut] for r in step]
        stream = [r for step in steps[case.cut :] for r in step]
        streams += stream + resent(stream, first_offset=len(steps) + 1)
    options = {"warehouse": warehouse, "cdc_format": "debezium", "namespace": "replica", "maintenance": "off"}
    for records in (snapshots, streams):
        # One task: each topic's events in one write task, as one Kafka partition's would be.
        df = spark.createDataFrame(_rows(records), KAFKA).coalesce(1)
        df.write.format("lakesink").options(**options).mode("append").save()
    for case in ORDER_CASES:
        table = load(warehouse, f"replica.{case.table.table}")
        expected = Counter(case.expected.items())
        assert pyiceberg_rows(table, ["id", "v"]) == expected, case.connector
        assert duckdb_rows(table.metadata_location, ["id", "v"]) == expected, case.connector
