"""Reading a history table in Spark (issue 55): the present, the table as of a sequence,
and the change feed saying what each commit did to the versions."""

from __future__ import annotations

from pathlib import Path


def test_a_history_tables_present_past_and_changes_in_spark(spark, warehouse: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    options = {"warehouse": warehouse, "operation": "cdc", "primary_key": "id", "op_column": "op", "sequence_column": "seq",
               "history": "true", "maintenance": "off", "progress": "false", "index_dir": str(tmp_path / "idx")}
    batches = [
        [(1, "a", "c", 10), (2, "x", "c", 11)],
        [(1, "b", "u", 20)],
        [(2, "x", "d", 30), (1, "c", "u", 40)],
    ]
    for rows in batches:
        df = spark.createDataFrame(rows, "id long, v string, op string, seq long")
        df.write.format("lakesink").options(**options).mode("append").save("db.hist")
    table = spark.read.format("lakesink").option("warehouse", warehouse).load("db.hist")
    table.createOrReplaceTempView("hist")
    present = {tuple(r) for r in spark.sql("SELECT id, v FROM hist WHERE __end_at IS NULL").collect()}
    assert present == {(1, "c")}
    as_of = {tuple(r) for r in spark.sql("SELECT id, v FROM hist WHERE __start_at <= 25 AND (__end_at IS NULL OR __end_at > 25)").collect()}
    assert as_of == {(1, "b"), (2, "x")}
    changes = (spark.read.format("lakesink").option("warehouse", warehouse).option("read_changes", "true")
               .option("starting_snapshot_id", _snapshot(spark, warehouse, 1)).load("db.hist"))
    second = {(r["_change_type"], r["v"], r["__start_at"], r["__end_at"]) for r in changes.where("_change_ordinal = 2").collect()}
    # Batch 1 ended version a (its open row out, its ended copy in) and started version b.
    assert second == {("update_before", "a", 10, None), ("update_after", "a", 10, 20), ("update_after", "b", 20, None)}


def _snapshot(spark, warehouse: str, n: int) -> int:  # type: ignore[no-untyped-def]
    snapshots = spark.read.format("lakesink").option("warehouse", warehouse).load("db.hist.snapshots").orderBy("committed_at").collect()
    return int(snapshots[n]["snapshot_id"])
