"""A commit that loses the race to another writer is rebuilt on the new state, not lost."""

from __future__ import annotations

import sys
from pathlib import Path

from lakesink_testing import assert_readers_see, expected_rows, load

from lakesink_datasource.iceberg.summary_keys import EPOCH_ID

PYICEBERG_APPEND = """
import sys
import pyarrow as pa
from pyiceberg.catalog.sql import SqlCatalog
warehouse = sys.argv[1]
catalog = SqlCatalog("lakesink", uri=f"sqlite:///{warehouse}/catalog.db", warehouse=f"file://{warehouse}")
table = catalog.load_table("db.race")
table.append(pa.table({"id": pa.array([-1, -2], pa.int64()), "name": ["pyiceberg", "pyiceberg"]}))
"""


def test_pyiceberg_append_during_a_streaming_batch_is_kept(spark, tmp_path: Path, warehouse: str, arm_fault) -> None:  # type: ignore[no-untyped-def]
    # pyiceberg 0.12 cannot write v3 manifests, so the race runs on a v2 table.
    first = [{"id": i, "name": "lakesink"} for i in range(5)]
    spark.createDataFrame(first, "id long, name string").write.format("lakesink").option("warehouse", warehouse).option("format_version", "2").mode("append").save("db.race")
    script = tmp_path / "append.py"
    script.write_text(PYICEBERG_APPEND)
    # Right before the batch's compare-and-swap, another process appends through pyiceberg.
    arm_fault({"point": "before_commit", "batch": 0, "action": "run", "once": True, "command": [sys.executable, str(script), warehouse]})

    source = tmp_path / "source"
    source.mkdir()
    batch = [{"id": i, "name": "stream"} for i in range(100, 110)]
    spark.createDataFrame(batch, "id long, name string").coalesce(1).write.parquet(str(source / "f"))
    query = (
        spark.readStream.schema("id long, name string").parquet(str(source / "f"))
        .writeStream.format("lakesink").option("checkpointLocation", str(tmp_path / "ck"))
        .option("warehouse", warehouse).option("table", "db.race").trigger(availableNow=True).start()
    )
    query.awaitTermination()

    theirs = [{"id": -1, "name": "pyiceberg"}, {"id": -2, "name": "pyiceberg"}]
    assert_readers_see(warehouse, "db.race", expected_rows(first + theirs + batch, ["id", "name"]), ["id", "name"])
    table = load(warehouse, "db.race")
    # Ours is the batch's snapshot (a compaction of the small files may sit on top of it).
    [ours] = [s for s in table.metadata.snapshots if s.summary and s.summary.get(EPOCH_ID) is not None]
    parent = table.metadata.snapshot_by_id(ours.parent_snapshot_id)
    assert ours.summary[EPOCH_ID] == "0"
    assert table.metadata.current_snapshot().summary.operation.value in ("append", "replace")
    assert parent.summary["added-records"] == "2"  # pyiceberg's snapshot sits under ours
    assert ours.summary["total-records"] == str(len(first) + len(theirs) + len(batch))


EVOLVING_WRITE = """
import sys
import pyarrow as pa
from pyspark.sql import types as T
from lakesink_datasource.commit.committer import commit_write
from lakesink_datasource.messages import decode_messages
from lakesink_datasource.options import parse_options
from lakesink_datasource.table.setup import plan_write
from lakesink_datasource.write.task import write_task
warehouse = sys.argv[1]
schema = T.StructType([T.StructField("id", T.LongType()), T.StructField("name", T.StringType()), T.StructField("b", T.StringType())])
options = parse_options({"table": "db.evolvers", "warehouse": warehouse, "merge_schema": "true", "progress": "false"})
plan = plan_write(options, schema, overwrite=False)
rows = pa.RecordBatch.from_pylist([{"id": -1, "name": "other", "b": "bee"}], schema=pa.schema([("id", pa.int64()), ("name", pa.string()), ("b", pa.string())]))
commit_write(plan, decode_messages([write_task(plan, iter([rows]))]), None)
"""


def test_two_writers_evolving_the_schema_at_once_both_land(spark, tmp_path: Path, warehouse: str, arm_fault) -> None:  # type: ignore[no-untyped-def]
    first = [{"id": i, "name": "first"} for i in range(3)]
    spark.createDataFrame(first, "id long, name string").write.format("lakesink").option("warehouse", warehouse).mode("append").save("db.evolvers")
    script = tmp_path / "evolve.py"
    script.write_text(EVOLVING_WRITE)
    # The stream adds column `a`; right before its compare-and-swap another lakesink writer
    # adds column `b` (and commits its row): the batch must re-merge on the new schema.
    arm_fault({"point": "before_commit", "batch": 0, "action": "run", "once": True, "command": [sys.executable, str(script), warehouse]})
    source = tmp_path / "source"
    batch = [{"id": i, "name": "stream", "a": i * 10} for i in range(100, 105)]
    spark.createDataFrame(batch, "id long, name string, a long").coalesce(1).write.parquet(str(source))
    query = (
        spark.readStream.schema("id long, name string, a long").parquet(str(source))
        .writeStream.format("lakesink").option("checkpointLocation", str(tmp_path / "ck")).option("merge_schema", "true")
        .option("warehouse", warehouse).option("table", "db.evolvers").trigger(availableNow=True).start()
    )
    query.awaitTermination()

    table = load(warehouse, "db.evolvers")
    fields = table.schema().fields
    assert [f.name for f in fields] == ["id", "name", "b", "a"]
    assert len({f.field_id for f in fields}) == 4
    columns = ["id", "name", "a", "b"]
    expected = ([{**r, "a": None, "b": None} for r in first] + [{"id": -1, "name": "other", "a": None, "b": "bee"}]
                + [{**r, "b": None} for r in batch])
    assert_readers_see(warehouse, "db.evolvers", expected_rows(expected, columns), columns)
