"""Bad input fails before anything is written, names the culprit, and leaves the table as it was."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from lakesink_testing import current_snapshot_id, load, table_exists


def data_files_on_disk(warehouse: str) -> list[str]:
    return sorted(str(p) for p in Path(warehouse).rglob("*.parquet"))


@pytest.fixture
def existing_table(spark, warehouse: str) -> str:
    spark.createDataFrame([(1, "a")], "id long, name string").write.format("lakesink").option("warehouse", warehouse).mode("append").save("db.t")
    return "db.t"


@pytest.mark.parametrize(
    "options, message",
    [
        ({"tabel": "db.t"}, "unknown option 'tabel'"),
        ({"partition_by": "days(id"}, "partition_by"),
        ({"partition_by": "bucket(x, id)"}, "partition_by"),
        ({"partition_by": "days(nope)"}, "column 'nope'"),
        ({"format_version": "7"}, "format_version"),
        ({"target_file_size_bytes": "big"}, "target_file_size_bytes"),
        ({"operation": "merge"}, "operation"),
        ({"progress": "loud"}, "option 'progress' must be true or false"),
    ],
)
def test_bad_options_are_named_and_change_nothing(spark, warehouse: str, existing_table: str, options: dict, message: str) -> None:
    before, files = current_snapshot_id(warehouse, existing_table), data_files_on_disk(warehouse)
    writer = spark.createDataFrame([(2, "b")], "id long, name string").write.format("lakesink").option("warehouse", warehouse).option("table", existing_table)
    for key, value in options.items():
        writer = writer.option(key, value)
    with pytest.raises(Exception, match=message) as raised:
        writer.mode("append").save()
    # The message the user acts on, not lakesink's frames: only the entry point's is left.
    assert [line for line in str(raised.value).splitlines() if line.strip().startswith("File ")] == [
        line for line in str(raised.value).splitlines() if "lakesink_datasource/errors.py" in line]
    assert current_snapshot_id(warehouse, existing_table) == before
    assert data_files_on_disk(warehouse) == files


def test_missing_table_option_is_named(spark, warehouse: str) -> None:
    with pytest.raises(Exception, match="option 'table' is required"):
        spark.createDataFrame([(1,)], "id long").write.format("lakesink").option("warehouse", warehouse).mode("append").save()
    assert not os.path.exists(os.path.join(warehouse, "db"))


def test_save_as_table_says_to_use_save(spark, warehouse: str) -> None:  # type: ignore[no-untyped-def]
    df = spark.createDataFrame([(1,)], "id long")
    with pytest.raises(Exception, match=r"saveAsTable, toTable and writeTo go through Spark's catalog.*use save\(\)/start\(\) instead"):
        df.write.format("lakesink").option("warehouse", warehouse).mode("append").saveAsTable("lakesink_events")
    assert not os.path.exists(os.path.join(warehouse, "db"))
    spark.sql("DROP TABLE IF EXISTS lakesink_events")  # Spark's session catalog may keep the name


@pytest.mark.parametrize("operation", ["upsert", "dedupe"])
def test_a_keyed_write_without_primary_key_does_not_create_the_table(spark, warehouse: str, operation: str) -> None:
    """It used to create db.new with no snapshot and no identifier fields, then fail."""
    with pytest.raises(Exception, match=r"operation '(upsert|dedupe)' needs option 'primary_key' \(table db\.new does not exist yet"):
        spark.createDataFrame([(1, "a")], "id long, v string").write.format("lakesink").option("warehouse", warehouse) \
            .option("operation", operation).mode("append").save("db.new")
    assert not table_exists(warehouse, "db.new")
    assert data_files_on_disk(warehouse) == []


def test_bad_partition_spec_does_not_create_the_table(spark, warehouse: str) -> None:
    with pytest.raises(Exception, match="partition_by"):
        spark.createDataFrame([(1,)], "id long").write.format("lakesink").option("warehouse", warehouse).option("partition_by", "hours(id)").mode("append").save("db.new")
    assert not table_exists(warehouse, "db.new")


@pytest.mark.parametrize(
    "ddl, message",
    [
        ("id string, name string", "column 'id': table type long cannot become string"),
        ("id long, name string, extra int", r"added extra \(int\) would be needed; option merge_schema=true evolves the table"),
        ("name string", None),  # a missing optional column is fine: written as null
    ],
)
def test_schema_mismatch_is_named_and_changes_nothing(spark, warehouse: str, existing_table: str, ddl: str, message) -> None:  # type: ignore[no-untyped-def]
    before, files = current_snapshot_id(warehouse, existing_table), data_files_on_disk(warehouse)
    df = spark.createDataFrame([tuple("x" if "string" in c else 1 for c in ddl.split(", "))], ddl)
    write = lambda: df.write.format("lakesink").option("warehouse", warehouse).mode("append").save(existing_table)  # noqa: E731
    if message is None:
        write()
        rows = load(warehouse, existing_table).scan().to_arrow().to_pylist()
        assert {"id": None, "name": "x"} in rows
        return
    with pytest.raises(Exception, match=message):
        write()
    assert current_snapshot_id(warehouse, existing_table) == before
    assert data_files_on_disk(warehouse) == files


def test_type_we_cannot_store_is_named(spark, warehouse: str, existing_table: str) -> None:
    before = current_snapshot_id(warehouse, existing_table)
    df = spark.sql("SELECT 3L AS id, 'c' AS name, INTERVAL '1' DAY AS wait")
    with pytest.raises(Exception, match="column 'wait' has type interval day"):
        df.write.format("lakesink").option("warehouse", warehouse).mode("append").save("db.other")
    assert not table_exists(warehouse, "db.other")
    assert current_snapshot_id(warehouse, existing_table) == before


def test_nulls_in_a_required_column_are_named_with_the_way_out(spark, warehouse: str) -> None:
    keyed = {"warehouse": warehouse, "operation": "upsert", "primary_key": "id"}
    spark.createDataFrame([(1, "a")], "id long, name string").write.format("lakesink").options(**keyed).mode("append").save("db.req")
    before = current_snapshot_id(warehouse, "db.req")
    with_null = spark.createDataFrame([(2, "b"), (None, "c")], "id long, name string")
    with pytest.raises(Exception, match=r"column 'id' is required \(NOT NULL\) in the table, but 1 row\(s\) of this batch hold null") as caught:
        with_null.write.format("lakesink").option("warehouse", warehouse).mode("append").save("db.req")
    assert "df.na.drop(subset=['id'])" in str(caught.value)
    assert current_snapshot_id(warehouse, "db.req") == before
