"""Batch reads through Spark: `spark.read.format("lakesink")` and temporary views, compared
with DuckDB and pyiceberg (which share no code with the read path's planning) and with
expected rows kept by hand; filter pushdown, time travel, and the errors a user meets."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from lakesink_testing import PYSPARK_MINOR, duckdb_rows, expected_rows, load, pyiceberg_rows
from pyspark.errors import AnalysisException, PythonException
from pyspark.sql import DataFrame
from pyspark.sql.utils import CapturedException

COLUMNS = ["id", "v", "g"]
PUSHDOWN = "spark.sql.python.filterPushdown.enabled"


def _spark_rows(df: DataFrame, columns: list[str]) -> Counter:
    return Counter(tuple(r[c] for c in columns) for r in df.collect())


def _read(spark: Any, warehouse: str, table: str, **options: str) -> DataFrame:
    reader = spark.read.format("lakesink").option("warehouse", warehouse)
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load(table)


def _write(spark: Any, warehouse: str, table: str, records: list[dict], **options: str) -> None:
    # One task: each write makes one file per partition, so file counts below are known.
    writer = spark.createDataFrame(records, "id long, v string, g int").coalesce(1).write.format("lakesink").option("warehouse", warehouse)
    for k, v in options.items():
        writer = writer.option(k, v)
    writer.mode("append").save(table)


def _keyed(warehouse: str, **extra: str) -> dict[str, str]:
    return {"operation": "upsert", "primary_key": "id", "index_dir": f"{warehouse}/idx", **extra}


def _assert_same_as_other_readers(spark: Any, warehouse: str, table: str, columns: list[str], expected: Counter) -> None:
    got = _spark_rows(_read(spark, warehouse, table), columns)
    assert got == expected
    loaded = load(warehouse, table)
    assert pyiceberg_rows(loaded, columns) == expected and duckdb_rows(loaded.metadata_location, columns) == expected


@contextmanager
def _pushdown(spark: Any) -> Iterator[None]:
    spark.conf.set(PUSHDOWN, "true")
    try:
        yield
    finally:
        spark.conf.unset(PUSHDOWN)


@pytest.mark.parametrize("format_version", ["3", "2"])
def test_a_keyed_table_reads_like_duckdb_and_pyiceberg_with_its_deletes_applied(spark, warehouse: str, format_version: str) -> None:  # type: ignore[no-untyped-def]
    live = {i: {"id": i, "v": f"a{i}", "g": i % 3} for i in range(60)}
    _write(spark, warehouse, "db.keyed", list(live.values()), partition_by="g", format_version=format_version, **_keyed(warehouse))
    for round_, step in enumerate((4, 7)):
        changes = [{"id": i, "v": f"r{round_}-{i}", "g": i % 3} for i in range(0, 80, step)]
        _write(spark, warehouse, "db.keyed", changes, **_keyed(warehouse))
        live.update({r["id"]: r for r in changes})
    _assert_same_as_other_readers(spark, warehouse, "db.keyed", COLUMNS, expected_rows(live.values(), COLUMNS))
    with _pushdown(spark):  # with a pushed filter the deletes take pyiceberg's path, not the full-scan one
        filtered = _read(spark, warehouse, "db.keyed").filter("g = 1 AND id < 50")
        assert _spark_rows(filtered, COLUMNS) == expected_rows([r for r in live.values() if r["g"] == 1 and r["id"] < 50], COLUMNS)


def test_an_evolved_table_reads_old_files_with_nulls_and_widened_values(spark, warehouse: str) -> None:  # type: ignore[no-untyped-def]
    spark.createDataFrame([(1, 7)], "id long, n int").write.format("lakesink").option("warehouse", warehouse).mode("append").save("db.ev")
    (spark.createDataFrame([(2, 2**40, "x")], "id long, n long, extra string").write.format("lakesink")
     .option("warehouse", warehouse).option("merge_schema", "true").mode("append").save("db.ev"))
    df = _read(spark, warehouse, "db.ev")
    assert [(f.name, f.dataType.simpleString()) for f in df.schema.fields] == [("id", "bigint"), ("n", "bigint"), ("extra", "string")]
    _assert_same_as_other_readers(spark, warehouse, "db.ev", ["id", "n", "extra"], Counter({(1, 7, None): 1, (2, 2**40, "x"): 1}))


def test_pushed_filters_give_the_same_rows_and_read_fewer_files(spark, warehouse: str) -> None:  # type: ignore[no-untyped-def]
    records = [{"id": i, "v": f"v{i:03d}", "g": i % 5} for i in range(200)]
    for part in range(4):  # several files per partition, with disjoint id ranges
        _write(spark, warehouse, "db.pruned", records[part * 50 : (part + 1) * 50], partition_by="g", maintenance="off")
    queries = ["g = 2", "id >= 150", "g IN (1, 3) AND id < 20", "v LIKE 'v19%'", "v IS NULL", "id > 40 AND v <> 'v041'"]
    plain = {q: _spark_rows(_read(spark, warehouse, "db.pruned").filter(q), COLUMNS) for q in queries}
    whole = _read(spark, warehouse, "db.pruned", split_size_bytes="1").rdd.getNumPartitions()  # one file per partition
    assert whole == 20
    with _pushdown(spark):
        for q in queries:
            pushed = _read(spark, warehouse, "db.pruned").filter(q)
            assert _spark_rows(pushed, COLUMNS) == plain[q], q
        assert plain["g = 2"] == expected_rows([r for r in records if r["g"] == 2], COLUMNS)
        assert plain["id > 40 AND v <> 'v041'"] == expected_rows([r for r in records if r["id"] > 41], COLUMNS)
        # Partition pruning: 4 of 20 files; bounds pruning: the one write holding ids >= 150.
        # PySpark 4.0 hands a Python source no filters (Spark filters after the read): all 20.
        pruned = (4, 5) if PYSPARK_MINOR >= (4, 1) else (20, 20)
        assert _read(spark, warehouse, "db.pruned", split_size_bytes="1").filter("g = 2").rdd.getNumPartitions() == pruned[0]
        assert _read(spark, warehouse, "db.pruned", split_size_bytes="1").filter("id >= 150").rdd.getNumPartitions() == pruned[1]
        # A filter lakesink leaves to Spark (NOT) still gives the right rows, and stays in Spark's plan.
        not_equal = _read(spark, warehouse, "db.pruned").filter("v <> 'v001'")
        assert "Filter" in not_equal._jdf.queryExecution().executedPlan().toString()
        assert not_equal.count() == 199


def test_time_travel_to_every_snapshot_of_a_keyed_table_equals_the_model_then(spark, warehouse: str) -> None:  # type: ignore[no-untyped-def]
    live: dict[int, dict] = {}
    history: list[tuple[int, int, Counter]] = []  # (snapshot id, commit time ms, rows then)
    batches = [[{"id": i, "v": f"a{i}", "g": 0} for i in range(10)],
               [{"id": i, "v": f"b{i}", "g": 1} for i in range(5, 15)],
               [{"id": i, "v": f"c{i}", "g": 2} for i in (0, 14, 20)]]
    for batch in batches:
        _write(spark, warehouse, "db.tt", batch, **_keyed(warehouse, maintenance="off"))
        live.update({r["id"]: r for r in batch})
        snapshot = load(warehouse, "db.tt").metadata.current_snapshot()
        history.append((snapshot.snapshot_id, snapshot.timestamp_ms, expected_rows(live.values(), COLUMNS)))
    for snapshot_id, timestamp_ms, then in history:
        assert _spark_rows(_read(spark, warehouse, "db.tt", snapshot_id=str(snapshot_id)), COLUMNS) == then
        assert _spark_rows(_read(spark, warehouse, "db.tt", as_of_timestamp=str(timestamp_ms)), COLUMNS) == then
    with pytest.raises((AnalysisException, PythonException, CapturedException), match="has no such snapshot") as bad:
        _read(spark, warehouse, "db.tt", snapshot_id="12345").collect()
    assert "CREATE TABLE" not in str(bad.value)  # that hint is for a missing table only
    with pytest.raises((AnalysisException, PythonException, CapturedException), match="no snapshot current at that time"):
        _read(spark, warehouse, "db.tt", as_of_timestamp="2001-01-01T00:00:00Z").collect()


def test_sql_reads_go_through_a_temporary_view_and_a_catalog_table_says_so(spark, warehouse: str) -> None:  # type: ignore[no-untyped-def]
    _write(spark, warehouse, "db.sqlread", [{"id": i, "v": f"s{i}", "g": i % 2} for i in range(10)])
    spark.sql(f"CREATE OR REPLACE TEMPORARY VIEW sqlread USING lakesink OPTIONS (table 'db.sqlread', warehouse '{warehouse}')")
    assert spark.sql("SELECT count(*) AS n, sum(id) AS s FROM sqlread WHERE g = 1").collect()[0].asDict() == {"n": 5, "s": 25}
    spark.sql("CREATE TABLE IF NOT EXISTS sqlread_catalog (id BIGINT, v STRING, g INT) USING lakesink")
    try:
        with pytest.raises((AnalysisException, PythonException, CapturedException), match="CREATE TEMPORARY VIEW"):
            spark.sql("SELECT * FROM sqlread_catalog").collect()
    finally:
        spark.sql("DROP TABLE IF EXISTS sqlread_catalog")


def test_a_large_file_is_read_by_several_tasks_cut_at_row_groups(spark, warehouse: str) -> None:  # type: ignore[no-untyped-def]
    live = {i: {"id": i, "v": f"a{i}", "g": i % 4} for i in range(20_000)}
    # One file of many small row groups, then an upsert that hides rows all over it.
    _write(spark, warehouse, "db.big", list(live.values()), **_keyed(warehouse, maintenance="off"),
           **{"property.write.parquet.row-group-size-bytes": "16384"})
    changes = [{"id": i, "v": f"b{i}", "g": i % 4} for i in range(0, 20_000, 9)]
    _write(spark, warehouse, "db.big", changes, **_keyed(warehouse, maintenance="off"))
    live.update({r["id"]: r for r in changes})
    split = _read(spark, warehouse, "db.big", split_size_bytes="16384")
    assert split.rdd.getNumPartitions() >= 6  # the 98 KiB file of 26 row groups is cut into several
    assert _spark_rows(split, COLUMNS) == expected_rows(live.values(), COLUMNS)
    with _pushdown(spark):
        filtered = _read(spark, warehouse, "db.big", split_size_bytes="16384").filter("g = 2 AND id >= 15000")
        wanted = [r for r in live.values() if r["g"] == 2 and r["id"] >= 15000]
        assert _spark_rows(filtered, COLUMNS) == expected_rows(wanted, COLUMNS)
