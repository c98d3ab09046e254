"""History tables through Spark (issue 59, item 5): cases where a version's bounds were wrong.

Each batch is a `df.write.format("lakesink")` append, each key's changes in one task (as a
Kafka partition keeps them). Expected versions are written by hand from the SCD type 2 rules
(docs/usage.md, "History as well as the present"; tests/scd2_model.py states them from the
Databricks and Spark declarative pipelines documentation), read back by DuckDB and pyiceberg,
and every table passes `check`.
"""

from __future__ import annotations

import decimal
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
from debezium_events import KAFKA_ARROW, Column, Connector, SourceDatabase, SourceTable
from lakesink_testing import duckdb_rows, load, pyiceberg_rows

from lakesink_datasource.check import check_table

BOUNDS = ["__start_at", "__end_at"]


def _write(spark, rows: list[tuple], schema: str, table: str, **options: str) -> None:  # type: ignore[no-untyped-def]
    # One task: a key's changes reach one task of a batch (docs/limits.md).
    spark.createDataFrame(rows, schema).coalesce(1).write.format("lakesink").options(**options).mode("append").save(table)


def _both(warehouse: str, identifier: str, columns: list[str]) -> Counter:
    """The table's rows as pyiceberg reads them, after DuckDB agreed and `check` passed."""
    table = load(warehouse, identifier)
    rows = pyiceberg_rows(table, columns)
    assert duckdb_rows(table.metadata_location, columns) == rows
    assert check_table(table) == []
    return rows


def test_every_change_counts_in_order_and_bounds_hold_the_whole_position(spark, warehouse: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    common = {"warehouse": warehouse, "operation": "cdc", "primary_key": "id", "op_column": "op", "history": "true",
              "maintenance": "off", "progress": "false", "index_dir": str(tmp_path / "idx")}
    # db.cases (sequence_column=seq):
    # - key 1: a delete and a later write in one batch: the version from 4490 ends at the
    #   delete, none holds between 4600 and 4660;
    # - key 2: an update to equal values at 30 is the key's newest: a late delete at 20 ends
    #   the version there, and the values are current again from 30;
    # - key 3: the same with a late update at 20 to other values: they hold from 20 to 30.
    cases = [
        [(1, "a", "u", 4490), (2, "a", "c", 10), (3, "a", "c", 10)],
        [(1, "a", "d", 4600), (1, "b", "u", 4660), (2, "a", "u", 30), (3, "a", "u", 30)],
        [(2, "a", "d", 20), (3, "b", "u", 20)],
    ]
    # db.positions (sequence_column=file,pos, as a MySQL binlog position): bounds are the
    # whole position, a struct of both parts. Key 1: a late change at (f1, 7) splits the first
    # version; key 2: a delete and a later write in one batch, in one binlog file, leave the
    # deleted period between them.
    positions = [
        [(1, "a", "c", "f1", 5), (2, "a", "c", "f1", 10)],
        [(1, "b", "u", "f1", 9), (1, "c", "u", "f2", 1), (2, "a", "d", "f2", 3), (2, "b", "c", "f2", 8)],
        [(1, "x", "u", "f1", 7)],
    ]
    for batch, more in zip(cases, positions):
        _write(spark, batch, "id long, v string, op string, seq long", "db.cases", sequence_column="seq", **common)
        _write(spark, more, "id long, v string, op string, file string, pos long", "db.positions", sequence_column="file,pos", **common)
    assert _both(warehouse, "db.cases", ["id", "v", *BOUNDS]) == Counter({
        (1, "a", 4490, 4600): 1, (1, "b", 4660, None): 1,
        (2, "a", 10, 20): 1, (2, "a", 30, None): 1,
        (3, "a", 10, 20): 1, (3, "b", 20, 30): 1, (3, "a", 30, None): 1,
    })

    def at(file: str, pos: int) -> tuple:
        return (("file", file), ("pos", pos))  # a struct as the readers give it

    assert _both(warehouse, "db.positions", ["id", "v", *BOUNDS]) == Counter({
        (1, "a", at("f1", 5), at("f1", 7)): 1, (1, "x", at("f1", 7), at("f1", 9)): 1,
        (1, "b", at("f1", 9), at("f2", 1)): 1, (1, "c", at("f2", 1), None): 1,
        (2, "a", at("f1", 10), at("f2", 3)): 1, (2, "b", at("f2", 8), None): 1,
    })
    bound = load(warehouse, "db.positions").schema().find_field("__start_at").field_type
    assert [(f.name, str(f.field_type)) for f in bound.fields] == [("file", "string"), ("pos", "long")]  # type: ignore[attr-defined]
    # The present, and the table as of a position, in Spark SQL (a struct compares by its parts in turn).
    spark.read.format("lakesink").option("warehouse", warehouse).load("db.positions").createOrReplaceTempView("positions")
    as_of = spark.sql(
        "SELECT v FROM positions WHERE __start_at <= named_struct('file', 'f1', 'pos', 8L) "
        "AND (__end_at IS NULL OR __end_at > named_struct('file', 'f1', 'pos', 8L))"
    ).collect()
    assert [r["v"] for r in as_of] == ["x"]


ORDERS = SourceTable("shop", "public", "orders", (Column("order_id", "int64", optional=False), Column("total", "decimal", scale=3, precision=12)), ("order_id",))


def test_a_truncate_ends_every_current_version_and_keeps_the_past(spark, warehouse: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A PostgreSQL truncate in a Debezium stream into a history table: the versions current
    at the truncate end at its position, the ended ones stay, later inserts start anew; the
    next batch's change of a key whose version the truncate ended starts a version of its own."""
    pg = SourceDatabase(Connector("postgresql", "pg", partitions=1), [ORDERS])
    options = {"cdc_format": "debezium", "namespace": "replica", "history": "true", "warehouse": warehouse, "progress": "false",
               "maintenance": "off", "index_dir": str(tmp_path / "idx")}
    done = 0

    def flush() -> None:
        nonlocal done
        records = pa.Table.from_pylist(pg.records[done:], schema=KAFKA_ARROW).to_pylist()
        done = len(pg.records)
        spark.createDataFrame(records, "key binary, value binary, topic string, partition int, offset long").coalesce(1) \
            .write.format("lakesink").options(**options).mode("append").save()

    pg.insert("orders", {"order_id": 1, "total": "1.000"})
    pg.insert("orders", {"order_id": 2, "total": "2.000"})
    flush()
    pg.update("orders", (1,), {"total": "1.500"})
    flush()
    pg.truncate("orders")
    pg.insert("orders", {"order_id": 3, "total": "3.000"})
    flush()
    pg.insert("orders", {"order_id": 1, "total": "9.000"})
    flush()
    # Each event's LSN: insert 1, insert 2, update 1, the truncate, insert 3, insert 1 again.
    lsn = [e.position[0] for e in pg.events]
    rows = _both(warehouse, "replica.orders", ["order_id", "total", *BOUNDS])
    got = Counter({(k, t, _lsn(s), _lsn(e)): n for (k, t, s, e), n in rows.items()})
    d = decimal.Decimal
    assert got == Counter({
        (1, d("1.000"), lsn[0], lsn[2]): 1, (1, d("1.500"), lsn[2], lsn[3]): 1, (1, d("9.000"), lsn[5], None): 1,
        (2, d("2.000"), lsn[1], lsn[3]): 1,
        (3, d("3.000"), lsn[4], None): 1,
    })


def _lsn(bound: Any) -> int | None:
    return None if bound is None else dict(bound)["lsn"]  # a struct as (field, value) pairs
