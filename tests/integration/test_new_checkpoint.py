"""A named streaming query started again from a new checkpoint (a pipeline's --full-refresh):
its source sends every row again, and lakesink must not land them twice. Refused by
default, the table unchanged; new_checkpoint=replace recomputes the table (append and keyed
sinks); new_checkpoint=append adds to it, as asked."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from lakesink_testing import assert_readers_see, current_snapshot_id, expected_rows, load
from pyspark.errors import StreamingQueryException

from lakesink_datasource.check import check_table
from lakesink_datasource.table.new_checkpoint import NEW_CHECKPOINT_SUMMARY, stream_property

COLUMNS = ["id", "v"]


def write_source(folder: Path, index: int, rows: list[tuple[int, str]]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    table = pa.table({"id": pa.array([r[0] for r in rows], pa.int64()), "v": [r[1] for r in rows]})
    path = folder / f"part-{index:03d}.parquet"
    pq.write_table(table, path)
    os.utime(path, (1_700_000_000 + index, 1_700_000_000 + index))  # Spark reads files by age: batch order = index


def run(spark, source: Path, checkpoint: Path, query_name: str = "events", **options: str) -> None:  # type: ignore[no-untyped-def]
    """One availableNow run of the named query, one source file per micro-batch."""
    query = (
        spark.readStream.schema("id long, v string").option("maxFilesPerTrigger", 1).parquet(str(source))
        .writeStream.format("lakesink").queryName(query_name).option("checkpointLocation", str(checkpoint))
        .options(**options).trigger(availableNow=True).start()
    )
    query.awaitTermination()


def test_a_new_checkpoint_is_refused_by_default_and_changes_nothing(spark, tmp_path: Path, warehouse: str) -> None:
    source = tmp_path / "source"
    write_source(source, 0, [(i, "a") for i in range(5)])
    options = {"table": "db.events", "warehouse": warehouse}
    run(spark, source, tmp_path / "ck1", **options)
    before = current_snapshot_id(warehouse, "db.events")
    assert load(warehouse, "db.events").metadata.properties[stream_property("events")]

    with pytest.raises(StreamingQueryException, match=r"Set option new_checkpoint to 'replace'.*or to 'append'"):
        run(spark, source, tmp_path / "ck2", **options)
    assert current_snapshot_id(warehouse, "db.events") == before  # nothing written
    assert_readers_see(warehouse, "db.events", expected_rows([{"id": i, "v": "a"} for i in range(5)], COLUMNS), COLUMNS)

    # Asked for: the new checkpoint's rows are added to the table's, every row twice here.
    run(spark, source, tmp_path / "ck2", **options, new_checkpoint="append")
    assert_readers_see(warehouse, "db.events", expected_rows([{"id": i, "v": "a"} for i in range(5)] * 2, COLUMNS), COLUMNS)


@pytest.mark.parametrize("operation", ["append", "upsert"])
def test_replace_recomputes_the_table_from_the_new_checkpoint(spark, tmp_path: Path, warehouse: str, operation: str) -> None:
    options = {"table": "db.events", "warehouse": warehouse, "new_checkpoint": "replace"}
    if operation == "upsert":
        options |= {"operation": "upsert", "primary_key": "id"}
    # The first checkpoint's source: ids 0-9, then an update of 5-14 (for the keyed sink).
    first = tmp_path / "first"
    write_source(first, 0, [(i, "a") for i in range(10)])
    write_source(first, 1, [(i, "b") for i in range(5, 15)])
    run(spark, first, tmp_path / "ck1", **options)

    # The upstream data corrected (ids 10-14 withdrawn), then recomputed from a new checkpoint:
    # the table holds exactly what the new run writes, whatever the old one wrote.
    second = tmp_path / "second"
    write_source(second, 0, [(i, "a") for i in range(10)])
    write_source(second, 1, [(i, "c") for i in range(3)])
    run(spark, second, tmp_path / "ck2", **options)
    if operation == "append":
        expected = [{"id": i, "v": "a"} for i in range(10)] + [{"id": i, "v": "c"} for i in range(3)]
    else:
        expected = [{"id": i, "v": "c" if i < 3 else "a"} for i in range(10)]
    assert_readers_see(warehouse, "db.events", expected_rows(expected, COLUMNS), COLUMNS)
    table = load(warehouse, "db.events")
    emptied = [s for s in table.metadata.snapshots if s.summary is not None and NEW_CHECKPOINT_SUMMARY in s.summary.additional_properties]
    assert len(emptied) == 1

    # The new checkpoint goes on as any stream: run again with nothing new, then a new batch
    # (keyed: an update of existing keys, found through the index started on the empty table).
    run(spark, second, tmp_path / "ck2", **options)
    write_source(second, 2, [(i, "d") for i in (0, 9)])
    run(spark, second, tmp_path / "ck2", **options)
    if operation == "append":
        expected += [{"id": 0, "v": "d"}, {"id": 9, "v": "d"}]
    else:
        expected = [{"id": i, "v": "d" if i in (0, 9) else "c" if i < 3 else "a"} for i in range(10)]
    assert_readers_see(warehouse, "db.events", expected_rows(expected, COLUMNS), COLUMNS)
    assert len([s for s in load(warehouse, "db.events").metadata.snapshots
                if s.summary is not None and NEW_CHECKPOINT_SUMMARY in s.summary.additional_properties]) == 1
    assert check_table(load(warehouse, "db.events")) == []


def test_replace_is_refused_when_another_query_writes_the_table_and_changes_nothing(spark, tmp_path: Path, warehouse: str) -> None:
    options = {"table": "db.shared", "warehouse": warehouse, "new_checkpoint": "replace"}
    events, audit = tmp_path / "events", tmp_path / "audit"
    write_source(events, 0, [(i, "e") for i in range(4)])
    write_source(audit, 0, [(i, "a") for i in range(10, 13)])
    run(spark, events, tmp_path / "ck-events", **options)
    run(spark, audit, tmp_path / "ck-audit", query_name="audit", **options)
    before = current_snapshot_id(warehouse, "db.shared")

    # Emptying the table for 'events' would take 'audit''s rows with it: refused, naming it.
    with pytest.raises(StreamingQueryException, match=r"new_checkpoint=replace would empty table db\.shared .*'audit' write it too"):
        run(spark, events, tmp_path / "ck-events-2", **options)
    assert current_snapshot_id(warehouse, "db.shared") == before
    rows = [{"id": i, "v": "e"} for i in range(4)] + [{"id": i, "v": "a"} for i in range(10, 13)]
    assert_readers_see(warehouse, "db.shared", expected_rows(rows, COLUMNS), COLUMNS)
