"""Keyed writes through Spark: streaming cdc, batch upsert and dedupe, bad keyed input."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from lakesink_testing import assert_readers_see, current_snapshot_id, expected_rows, load

from lakesink_datasource.check import check_table
from lakesink_datasource.iceberg.summary_keys import COMPACTION

COLUMNS = ["id", "name", "seq"]
SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("seq", pa.int64()), ("op", pa.string())])


def cdc_model(batches: list[list[dict]]) -> dict[int, dict]:
    """Key -> live row, highest seq wins across batches (deletes remember their seq)."""
    live: dict[int, dict] = {}
    latest: dict[int, int] = {}
    for batch in batches:
        for row in sorted(batch, key=lambda r: r["seq"]):  # within a batch: highest seq wins
            if latest.get(row["id"], -1) > row["seq"]:
                continue
            latest[row["id"]] = row["seq"]
            if row["op"] == "d":
                live.pop(row["id"], None)
            else:
                live[row["id"]] = {"id": row["id"], "name": row["name"], "seq": row["seq"]}
    return live


def test_streaming_cdc_with_sequence_hides_old_rows_with_deletion_vectors(spark, tmp_path: Path, warehouse: str) -> None:
    source = tmp_path / "source"
    source.mkdir()
    batches = [
        [{"id": i, "name": f"v0-{i}", "seq": 10, "op": "c"} for i in range(12)],
        # updates, a delete, a delete of an absent key, a key updated twice in one batch
        [{"id": 1, "name": "v1-1", "seq": 20, "op": "u"}, {"id": 2, "name": None, "seq": 20, "op": "d"},
         {"id": 99, "name": None, "seq": 20, "op": "d"}, {"id": 3, "name": "v1-3a", "seq": 21, "op": "u"},
         {"id": 3, "name": "v1-3b", "seq": 22, "op": "u"}, {"id": 20, "name": "new", "seq": 20, "op": "c"}],
        # late, older changes: ignored (2 stays deleted, 1 keeps v1-1); 4 updated
        [{"id": 2, "name": "zombie", "seq": 15, "op": "u"}, {"id": 1, "name": "stale", "seq": 12, "op": "u"},
         {"id": 4, "name": "v2-4", "seq": 30, "op": "u"}, {"id": 3, "name": None, "seq": 31, "op": "d"}],
    ]
    checkpoint = tmp_path / "checkpoint"
    for n, batch in enumerate(batches):
        path = source / f"{n}.parquet"
        pq.write_table(pa.Table.from_pylist(batch, schema=SCHEMA), path)
        query = (
            spark.readStream.schema("id long, name string, seq long, op string").parquet(str(source))
            .writeStream.format("lakesink").option("checkpointLocation", str(checkpoint))
            .option("table", "db.cdc").option("warehouse", warehouse).option("partition_by", "bucket(4, id)")
            .option("operation", "cdc").option("op_column", "op").option("primary_key", "id")
            .option("sequence_column", "seq").option("index_dir", str(tmp_path / "index"))
            .trigger(availableNow=True).start()
        )
        query.awaitTermination()
        model = cdc_model(batches[: n + 1])
        assert_readers_see(warehouse, "db.cdc", expected_rows(list(model.values()), COLUMNS), COLUMNS)
        assert check_table(load(warehouse, "db.cdc")) == []

    table = load(warehouse, "db.cdc")
    assert [f.name for f in table.schema().fields] == ["id", "name", "seq"]  # op is not stored
    assert table.schema().identifier_field_ids == [table.schema().find_field("id").field_id]
    # One snapshot per batch; the compactions that ran after batches sit between them.
    batch_snapshots = [s for s in table.metadata.snapshots if s.summary and COMPACTION not in s.summary.additional_properties]
    assert [s.summary.operation.value for s in batch_snapshots] == ["append", "overwrite", "overwrite"]
    compactions = [s for s in table.metadata.snapshots if s not in batch_snapshots]
    assert all(s.summary.operation.value == "replace" for s in compactions)
    second = batch_snapshots[1].summary
    assert second["added-dvs"] == second["added-delete-files"]
    assert int(second["added-position-deletes"]) == 3  # the old rows of keys 1, 2 and 3 (20 is new)
    assert second["lakesink.rows-deleted"] == "1"


def upsert(spark, rows: list[tuple], warehouse: str, operation: str = "upsert", **options: str) -> None:  # type: ignore[no-untyped-def]
    # One task: without a sequence column only a task's input order ranks a key's rows.
    writer = (
        spark.createDataFrame(rows, "id long, name string").coalesce(1).write.format("lakesink")
        .option("warehouse", warehouse).option("operation", operation).option("index_dir", os.path.join(warehouse, "index"))
    )
    for key, value in options.items():
        writer = writer.option(key, value)
    writer.mode("append").save("db.keyed")


def test_batch_upsert_and_dedupe(spark, warehouse: str) -> None:
    upsert(spark, [(1, "a"), (2, "b"), (3, "c")], warehouse, primary_key="id", partition_by="bucket(2, id)")
    upsert(spark, [(2, "B"), (4, "d"), (2, "BB")], warehouse)  # primary key from the table's identifier fields
    upsert(spark, [(1, "ignored"), (5, "e")], warehouse, operation="dedupe")
    expected = [{"id": 1, "name": "a"}, {"id": 2, "name": "BB"}, {"id": 3, "name": "c"}, {"id": 4, "name": "d"}, {"id": 5, "name": "e"}]
    assert_readers_see(warehouse, "db.keyed", expected_rows(expected, ["id", "name"]), ["id", "name"])
    assert check_table(load(warehouse, "db.keyed")) == []


@pytest.mark.parametrize(
    "rows, options, message",
    [
        ([(None, "x")], {"primary_key": "id"}, "primary key column 'id' has 1 null value"),
        ([(1, "x")], {"primary_key": "nope"}, "primary key column 'nope' is missing"),
        ([(1, "x")], {"primary_key": "name"}, r"primary_key' \(name\) does not match the table's identifier fields \(id\)"),
        ([(1, "x")], {"operation": "cdc", "primary_key": "id"}, "operation 'cdc' needs option 'op_column'"),
        ([(1, "x")], {"operation": "cdc", "primary_key": "id", "op_column": "name"}, r"op column 'name' has unknown value\(s\) \['x'\]"),
        ([(1, "x")], {"operation": "upsert", "primary_key": "id", "op_column": "name"}, "only applies to operation 'cdc'"),
    ],
)
def test_bad_keyed_input_names_the_problem_and_commits_nothing(spark, warehouse: str, rows, options: dict, message: str) -> None:  # type: ignore[no-untyped-def]
    upsert(spark, [(1, "a")], warehouse, primary_key="id")
    before = current_snapshot_id(warehouse, "db.keyed")
    files = sorted(Path(warehouse).rglob("*.parquet"))
    options = {"operation": "upsert", **options}
    operation = options.pop("operation")
    with pytest.raises(Exception, match=message):
        upsert(spark, rows, warehouse, operation=operation, **options)
    assert current_snapshot_id(warehouse, "db.keyed") == before
    assert sorted(Path(warehouse).rglob("*.parquet")) == files
    assert_readers_see(warehouse, "db.keyed", expected_rows([{"id": 1, "name": "a"}], ["id", "name"]), ["id", "name"])
