"""`foreachBatch(batch_sink(...))`: the Arrow-keeping stream sink (PySpark 4.0's fast path),
exactly once by the micro-batch id."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from lakesink_testing import duckdb_rows, expected_rows, load, pyiceberg_rows

from lakesink_datasource import batch_sink


def test_a_stream_through_batch_sink_lands_each_micro_batch_once(spark, warehouse: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    source = tmp_path / "source"
    source.mkdir()
    everything = []
    for b in range(3):
        part = [{"id": b * 10 + i, "name": f"b{b}-{i}"} for i in range(10)]
        pq.write_table(pa.Table.from_pylist(part), source / f"{b:03d}.parquet")
        everything += part
    sink = batch_sink("db.events", "events-ingest", warehouse=warehouse)
    query = (spark.readStream.schema("id long, name string").option("maxFilesPerTrigger", 1).parquet(str(source))
             .writeStream.foreachBatch(sink).option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
    query.awaitTermination()
    # Spark running a micro-batch again (after a crash) calls the function with the same id.
    sink(spark.createDataFrame(everything[:10], "id long, name string"), 0)
    sink(spark.createDataFrame(everything[10:20], "id long, name string"), 1)
    table = load(warehouse, "db.events")
    expected = expected_rows(everything, ["id", "name"])
    assert pyiceberg_rows(table, ["id", "name"]) == expected
    assert duckdb_rows(table.metadata_location, ["id", "name"]) == expected
    assert len(table.metadata.snapshots) == 3


def test_an_upsert_through_batch_sink(spark, warehouse: str) -> None:  # type: ignore[no-untyped-def]
    sink = batch_sink("db.users", "users", warehouse=warehouse, operation="upsert", primary_key="id", index_dir=f"{warehouse}/idx")
    sink(spark.createDataFrame([(1, "a"), (2, "b")], "id long, name string"), 0)
    sink(spark.createDataFrame([(2, "B"), (3, "c")], "id long, name string"), 1)
    sink(spark.createDataFrame([(2, "B"), (3, "c")], "id long, name string"), 1)  # a replay
    table = load(warehouse, "db.users")
    assert pyiceberg_rows(table, ["id", "name"]) == expected_rows(
        [{"id": 1, "name": "a"}, {"id": 2, "name": "B"}, {"id": 3, "name": "c"}], ["id", "name"]
    )
