"""Batch writes (append, overwrite), the SQL path and complete-mode streaming."""

from __future__ import annotations

from datetime import date, datetime, timezone
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from lakesink_testing import assert_readers_see, duckdb_rows, expected_rows, load, pyiceberg_rows, rows
from pyspark.sql import Row
from pyspark.sql import types as T


def test_batch_append_then_overwrite_replaces_contents_in_one_snapshot(spark, warehouse: str) -> None:
    first = [{"id": i, "name": f"a{i}"} for i in range(50)]
    second = [{"id": i, "name": f"b{i}"} for i in range(100, 130)]
    writer = lambda data, mode: (  # noqa: E731
        spark.createDataFrame(data, "id long, name string").write.format("lakesink")
        .option("warehouse", warehouse).option("partition_by", "bucket(4, id)").mode(mode).save("db.batch")
    )
    writer(first, "append")
    writer(first, "append")
    assert_readers_see(warehouse, "db.batch", expected_rows(first + first, ["id", "name"]), ["id", "name"])

    writer(second, "overwrite")
    assert_readers_see(warehouse, "db.batch", expected_rows(second, ["id", "name"]), ["id", "name"])
    table = load(warehouse, "db.batch")
    snap = table.metadata.current_snapshot()
    assert snap.summary.operation.value == "overwrite"
    assert snap.summary["deleted-records"] == "100" and snap.summary["added-records"] == "30"
    assert snap.summary["total-records"] == "30"
    assert "spark.sql.streaming.queryId" not in snap.summary.additional_properties


def test_every_supported_type_round_trips(spark, warehouse: str) -> None:
    schema = T.StructType(
        [
            T.StructField("b", T.BooleanType()),
            T.StructField("i", T.IntegerType()),
            T.StructField("s16", T.ShortType()),
            T.StructField("l", T.LongType()),
            T.StructField("f", T.FloatType()),
            T.StructField("d", T.DoubleType()),
            T.StructField("dec", T.DecimalType(10, 2)),
            T.StructField("dec38", T.DecimalType(38, 10)),
            T.StructField("str", T.StringType()),
            T.StructField("bin", T.BinaryType()),
            T.StructField("dt", T.DateType()),
            T.StructField("ts", T.TimestampType()),
            T.StructField("ntz", T.TimestampNTZType()),
            T.StructField("arr", T.ArrayType(T.IntegerType())),
            T.StructField("m", T.MapType(T.StringType(), T.LongType())),
            T.StructField("st", T.StructType([T.StructField("x", T.IntegerType()), T.StructField("y", T.StringType())])),
        ]
    )
    data = [
        (True, 1, 2, 3, 1.5, 2.25, Decimal("12.34"), Decimal("1234567890.0123456789"), "héllo", b"\x00\xff",
         date(2024, 2, 29), datetime(2024, 1, 1, 12, 0, tzinfo=timezone.utc), datetime(2024, 1, 1, 12, 0),
         [1, None, 3], {"k": 7}, Row(x=1, y="y")),
        (None,) * 16,
    ]
    spark.createDataFrame(data, schema).write.format("lakesink").option("warehouse", warehouse).mode("append").save("db.types")

    table = load(warehouse, "db.types")
    iceberg_types = {f.name: str(f.field_type) for f in table.schema().fields}
    assert iceberg_types["s16"] == "int" and iceberg_types["ts"] == "timestamptz" and iceberg_types["ntz"] == "timestamp"
    assert iceberg_types["dec38"] == "decimal(38, 10)"
    got = table.scan().to_arrow().to_pylist()
    assert len(got) == 2
    full = next(r for r in got if r["b"] is not None)
    assert full["dec38"] == Decimal("1234567890.0123456789") and full["bin"] == b"\x00\xff"
    assert full["arr"] == [1, None, 3] and dict(full["m"]) == {"k": 7} and full["st"] == {"x": 1, "y": "y"}
    assert full["ts"] == datetime(2024, 1, 1, 12, 0, tzinfo=timezone.utc) and full["ntz"] == datetime(2024, 1, 1, 12, 0)
    scalar = ["b", "i", "s16", "l", "f", "d", "dec", "dec38", "str", "bin", "dt", "ts", "ntz"]
    assert duckdb_rows(table.metadata_location, scalar) == pyiceberg_rows(table, scalar)
    nested = next(iter(duckdb_rows(table.metadata_location, ["arr", "st"]).keys() - {(None, None)}))
    assert nested == ((1, None, 3), (("x", 1), ("y", "y")))


def test_sql_create_insert_and_insert_overwrite(spark, warehouse: str) -> None:
    spark.sql("DROP TABLE IF EXISTS sql_events")
    spark.sql(f"CREATE TABLE sql_events (id BIGINT, name STRING) USING lakesink OPTIONS (table 'db.sql_events', warehouse '{warehouse}')")
    with_options = f"WITH ('table' = 'db.sql_events', 'warehouse' = '{warehouse}')"
    spark.sql(f"INSERT INTO sql_events {with_options} VALUES (1, 'a'), (2, 'b')")
    spark.sql(f"INSERT INTO sql_events {with_options} SELECT id, concat('r', id) FROM range(10, 13)")
    expected = [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}] + [{"id": i, "name": f"r{i}"} for i in range(10, 13)]
    assert_readers_see(warehouse, "db.sql_events", expected_rows(expected, ["id", "name"]), ["id", "name"])

    spark.sql(f"INSERT OVERWRITE sql_events {with_options} VALUES (9, 'z')")
    assert_readers_see(warehouse, "db.sql_events", expected_rows([{"id": 9, "name": "z"}], ["id", "name"]), ["id", "name"])


def test_sql_insert_without_options_explains_the_workaround(spark) -> None:
    spark.sql("DROP TABLE IF EXISTS sql_plain")
    spark.sql("CREATE TABLE sql_plain (id BIGINT) USING lakesink OPTIONS (table 'db.sql_plain')")
    with pytest.raises(Exception, match=r"INSERT INTO t WITH \('table'"):
        spark.sql("INSERT INTO sql_plain VALUES (1)")


def test_complete_mode_replaces_the_table_every_batch(spark, tmp_path: Path, warehouse: str) -> None:
    source = tmp_path / "source"
    source.mkdir()
    checkpoint = tmp_path / "checkpoint"
    all_rows: list[dict] = []
    for batch in range(2):
        data = [{"cat": i % 3, "v": batch * 100 + i} for i in range(10)]
        all_rows += data
        pq.write_table(pa.Table.from_pylist(data, schema=pa.schema([("cat", pa.int64()), ("v", pa.int64())])), source / f"{batch}.parquet")
        query = (
            spark.readStream.schema("cat long, v long").option("maxFilesPerTrigger", 1).parquet(str(source))
            .groupBy("cat").count()
            .writeStream.format("lakesink").outputMode("complete")
            .option("checkpointLocation", str(checkpoint)).option("warehouse", warehouse).option("table", "db.counts")
            .trigger(availableNow=True).start()
        )
        query.awaitTermination()
        counts: dict[int, int] = {}
        for r in all_rows:
            counts[r["cat"]] = counts.get(r["cat"], 0) + 1
        expected = expected_rows([{"cat": k, "count": v} for k, v in counts.items()], ["cat", "count"])
        assert_readers_see(warehouse, "db.counts", expected, ["cat", "count"])


def test_spark_rejects_errorifexists_and_ignore_before_lakesink_runs(spark, warehouse: str) -> None:
    df = spark.createDataFrame([(1,)], "id long")
    df.write.format("lakesink").option("warehouse", warehouse).mode("append").save("db.modes")
    before = load(warehouse, "db.modes").metadata.current_snapshot().snapshot_id
    for mode in ("error", "errorifexists", "ignore"):
        with pytest.raises(Exception, match="UNSUPPORTED_DATA_SOURCE_SAVE_MODE"):
            df.write.format("lakesink").option("warehouse", warehouse).mode(mode).save("db.modes")
    assert load(warehouse, "db.modes").metadata.current_snapshot().snapshot_id == before
    assert rows(load(warehouse, "db.modes").scan().to_arrow(), ["id"]) == expected_rows([{"id": 1}], ["id"])


def test_cluster_by_partition_writes_one_file_per_partition(spark, warehouse: str) -> None:
    from lakesink_datasource import cluster_by_partition
    from lakesink_datasource.iceberg.live_files import live_data_files

    rows = [(i, f"v{i}") for i in range(400)]
    options = {"warehouse": warehouse, "partition_by": "bucket(4, id)", "maintenance": "off"}  # no compaction after the write

    def files_of(table: str) -> int:
        t = load(warehouse, table)
        return len(live_data_files(t.io, t.current_snapshot()))

    spread = spark.createDataFrame(rows, "id long, v string").repartition(4)  # every task meets every bucket
    spread.write.format("lakesink").options(**options).mode("append").save("db.plain")
    clustered = cluster_by_partition(spread, "db.clustered", **options)  # the table does not exist yet
    clustered.write.format("lakesink").options(**options).mode("append").save("db.clustered")

    assert files_of("db.plain") == 16
    assert files_of("db.clustered") == 4
    for table in ("db.plain", "db.clustered"):
        assert_readers_see(warehouse, table, expected_rows([{"id": i, "v": v} for i, v in rows], ["id", "v"]), ["id", "v"])
    # On an existing table the spec comes from the table.
    again = cluster_by_partition(spark.createDataFrame(rows[:40], "id long, v string").repartition(4), "db.clustered", warehouse=warehouse)
    again.write.format("lakesink").option("warehouse", warehouse).option("maintenance", "off").mode("append").save("db.clustered")
    assert files_of("db.clustered") == 8


def test_partial_overwrites_and_a_branch_through_df_write(spark, warehouse: str) -> None:
    def write(data: list[tuple], mode: str, **options: str) -> None:
        writer = spark.createDataFrame(data, "id long, region string").write.format("lakesink").option("warehouse", warehouse)
        for key, value in options.items():
            writer = writer.option(key, value)
        writer.mode(mode).save("db.partial")

    write([(1, "eu"), (2, "eu"), (3, "us"), (4, "ap")], "append", partition_by="region")
    write([(10, "eu")], "overwrite", partitionOverwriteMode="dynamic")  # Iceberg/Spark's option name
    assert_readers_see(warehouse, "db.partial", expected_rows(
        [{"id": 10, "region": "eu"}, {"id": 3, "region": "us"}, {"id": 4, "region": "ap"}], ["id", "region"]), ["id", "region"])

    write([(30, "us")], "overwrite", replaceWhere="region = 'us' OR id = 4")  # Delta's option name
    assert_readers_see(warehouse, "db.partial", expected_rows(
        [{"id": 10, "region": "eu"}, {"id": 30, "region": "us"}], ["id", "region"]), ["id", "region"])

    main = load(warehouse, "db.partial").metadata.current_snapshot()
    write([(99, "jp")], "append", branch="audit")
    table = load(warehouse, "db.partial")
    assert table.metadata.current_snapshot() == main
    branch_rows = rows(table.scan(snapshot_id=table.metadata.refs["audit"].snapshot_id).to_arrow(), ["id"])
    assert branch_rows == expected_rows([{"id": 10}, {"id": 30}, {"id": 99}], ["id"])
