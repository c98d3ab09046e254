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
