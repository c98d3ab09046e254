"""Streaming appends, batch by batch, read back by DuckDB and pyiceberg."""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from lakesink_testing import assert_readers_see, expected_rows, load

from lakesink_datasource.check import check_table
from lakesink_datasource.iceberg.summary_keys import EPOCH_ID, QUERY_ID
from lakesink_datasource.maintenance.background import wait_for_table

COLUMNS = ["id", "name", "amount", "ts"]


def make_rows(start: int, n: int) -> list[dict]:
    base = datetime(2026, 1, 1, tzinfo=timezone.utc)
    return [
        {
            "id": i,
            "name": None if i % 11 == 0 else f"name-{i % 13}",
            "amount": float(i) / 3 if i % 17 else float("nan"),
            "ts": base + timedelta(hours=7 * i),  # spreads rows over many days
        }
        for i in range(start, start + n)
    ]


def write_source_file(folder: Path, index: int, records: list[dict]) -> None:
    schema = pa.schema([("id", pa.int64()), ("name", pa.string()), ("amount", pa.float64()), ("ts", pa.timestamp("us", tz="UTC"))])
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(records, schema=schema), folder / f"part-{index:04d}.parquet")


def run_available_now(spark, source: Path, checkpoint: Path, **options: str) -> None:  # type: ignore[no-untyped-def]
    stream = spark.readStream.schema("id long, name string, amount double, ts timestamp").option("maxFilesPerTrigger", 1).parquet(str(source))
    writer = stream.writeStream.format("lakesink").option("checkpointLocation", str(checkpoint))
    for key, value in options.items():
        writer = writer.option(key, value)
    query = writer.trigger(availableNow=True).start()
    query.awaitTermination()
    assert query.exception() is None


@pytest.mark.parametrize("format_version", ["3", "2"])
def test_each_micro_batch_is_one_snapshot_visible_to_other_readers(spark, tmp_path: Path, warehouse: str, format_version: str) -> None:
    source, checkpoint = tmp_path / "source", tmp_path / "checkpoint"
    options = {"table": "db.events", "warehouse": warehouse, "partition_by": "days(ts), bucket(4, id)", "format_version": format_version}
    written: list[dict] = []
    for batch in range(3):
        records = make_rows(batch * 40, 40)
        write_source_file(source, batch, records)
        written += records
        run_available_now(spark, source, checkpoint, **options)
        # NaN != NaN, so compare amounts through a NaN-free projection as well as raw ids.
        assert_readers_see(warehouse, "db.events", expected_rows(written, ["id", "name", "ts"]), ["id", "name", "ts"])

    table = load(warehouse, "db.events")
    assert table.metadata.format_version == int(format_version)
    snapshots = table.metadata.snapshots
    assert [s.summary[EPOCH_ID] for s in snapshots] == ["0", "1", "2"]
    assert len({s.summary[QUERY_ID] for s in snapshots}) == 1
    last = snapshots[-1].summary
    assert last["added-records"] == "40" and last["total-records"] == "120"
    assert int(last["total-data-files"]) == sum(int(s.summary["added-data-files"]) for s in snapshots)
    assert [f.name for f in table.spec().fields] == ["ts_day", "id_bucket"]
    # amount survives with its NaNs (count them: NaN breaks equality)
    amounts = table.scan().to_arrow()["amount"].to_pylist()
    assert sum(a != a for a in amounts) == sum(r["amount"] != r["amount"] for r in written)
    assert Counter(a for a in amounts if a == a) == Counter(r["amount"] for r in written if r["amount"] == r["amount"])


# Size classes of four files (the default merges eight): a few micro-batches make a compaction.
FAN_IN_4 = {"property.lakesink.maintenance.compaction-fan-in": "4"}


def test_a_stream_compacts_its_small_files_between_batches(spark, tmp_path: Path, warehouse: str) -> None:
    """Six small micro-batches into one partition: after the fourth small file (fan-in 4) the
    next batch's tasks merge them (a `replace` snapshot); rows stay exact for every reader, every
    batch keeps its own snapshot and row lineage, and `maintenance=off` leaves all files."""
    source, written = tmp_path / "source", []
    for batch in range(6):
        records = make_rows(batch * 20, 20)
        write_source_file(source, batch, records)
        written += records
    for mode, name in (("auto", "db.auto"), ("off", "db.off")):
        run_available_now(spark, source, tmp_path / f"checkpoint-{mode}", table=name, warehouse=warehouse, maintenance=mode,
                          **FAN_IN_4)
        assert_readers_see(warehouse, name, expected_rows(written, ["id", "name", "ts"]), ["id", "name", "ts"])
    auto, off = load(warehouse, "db.auto"), load(warehouse, "db.off")
    assert [s.summary[EPOCH_ID] for s in auto.metadata.snapshots if EPOCH_ID in s.summary.additional_properties] == [str(b) for b in range(6)]
    replaces = [s for s in auto.metadata.snapshots if s.summary.operation.value == "replace"]
    assert replaces and all(s.summary["lakesink.compaction"] == "true" for s in replaces)
    assert len(list(off.scan().plan_files())) == 6
    assert len(list(auto.scan().plan_files())) < 4
    assert check_table(auto) == []


def test_background_maintenance_compacts_beside_the_next_batch_and_auto_lands_what_the_tasks_compacted_before_its_batch(
    spark, tmp_path: Path, warehouse: str
) -> None:
    """maintenance=background: a batch's compaction runs in the driver while Spark runs the
    next batch, and lands after its batch, before the next one (the last batch's finishes
    after the query: waited for here). maintenance=auto: the next batch's tasks rewrite it
    and it lands right before that batch. Same rows, far fewer files than batches."""
    source, written = tmp_path / "source", []
    for batch in range(7):
        records = make_rows(batch * 20, 20)
        write_source_file(source, batch, records)
        written += records
    for mode in ("auto", "background"):
        options = {"table": f"db.{mode}", "warehouse": warehouse, "maintenance": mode, **FAN_IN_4}
        run_available_now(spark, source, tmp_path / f"checkpoint-{mode}", **options)
        wait_for_table(options)
        assert_readers_see(warehouse, f"db.{mode}", expected_rows(written, ["id", "name", "ts"]), ["id", "name", "ts"])
    auto, background = load(warehouse, "db.auto"), load(warehouse, "db.background")

    def history(table) -> list[str]:  # type: ignore[no-untyped-def]
        return [s.summary.get(EPOCH_ID) or s.summary.operation.value for s in table.metadata.snapshots]

    batches = [str(b) for b in range(7)]
    for table in (auto, background):
        assert [h for h in history(table) if h != "replace"] == batches
        assert len(list(table.scan().plan_files())) < 5 and check_table(table) == []
    assert history(background).count("replace") >= 2 and history(background)[-1] == "replace"  # the last one waited for
    # auto: each compaction right before the batch whose tasks rewrote it, never after the last batch.
    replaced = [i for i, h in enumerate(history(auto)) if h == "replace"]
    assert replaced and all(history(auto)[i + 1] in batches for i in replaced)


def test_foreach_batch_writing_every_batch_twice_leaves_each_row_once(spark, tmp_path: Path, warehouse: str) -> None:
    """What a retried foreachBatch does: the batch function runs again for the same batch id.
    With txn_app_id + txn_version (the batch id) the second write is skipped."""
    source, checkpoint = tmp_path / "source", tmp_path / "checkpoint"
    written: list[dict] = []
    for batch in range(3):
        records = make_rows(batch * 30, 30)
        write_source_file(source, batch, records)
        written += records

    def twice(df, batch_id: int) -> None:  # type: ignore[no-untyped-def]
        for _ in range(2):
            (df.write.format("lakesink").option("table", "db.fb").option("warehouse", warehouse)
             .option("txn_app_id", "orders-etl").option("txn_version", str(batch_id)).mode("append").save())

    stream = spark.readStream.schema("id long, name string, amount double, ts timestamp").option("maxFilesPerTrigger", 1).parquet(str(source))
    query = stream.writeStream.foreachBatch(twice).option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start()
    query.awaitTermination()
    assert query.exception() is None
    assert_readers_see(warehouse, "db.fb", expected_rows(written, ["id", "name", "ts"]), ["id", "name", "ts"])
    assert len(load(warehouse, "db.fb").metadata.snapshots) == 3  # one per batch, none for the repeats


def test_txn_options_on_a_streaming_write_are_refused_before_a_table_is_created(spark, tmp_path: Path, warehouse: str) -> None:
    write_source_file(tmp_path / "source", 0, make_rows(0, 3))
    stream = spark.readStream.schema("id long, name string, amount double, ts timestamp").parquet(str(tmp_path / "source"))
    with pytest.raises(Exception, match="apply to batch writes"):
        query = (stream.writeStream.format("lakesink").option("table", "db.s").option("warehouse", warehouse)
                 .option("txn_app_id", "x").option("txn_version", "1")
                 .option("checkpointLocation", str(tmp_path / "cp")).trigger(availableNow=True).start())
        query.awaitTermination()
    assert not Path(warehouse, "db", "s").exists()


def test_a_stream_restarted_with_a_wider_source_schema_evolves_the_table(spark, tmp_path: Path, warehouse: str) -> None:
    source, checkpoint = tmp_path / "source", tmp_path / "checkpoint"
    source.mkdir()
    narrow = pa.schema([("id", pa.int64()), ("n", pa.int32())])
    wide = pa.schema([("id", pa.int64()), ("n", pa.int64()), ("extra", pa.string())])

    def run(ddl: str) -> None:
        query = (spark.readStream.schema(ddl).option("maxFilesPerTrigger", 1).parquet(str(source)).writeStream.format("lakesink")
                 .option("checkpointLocation", str(checkpoint)).option("table", "db.evolving").option("warehouse", warehouse)
                 .option("merge_schema", "true").trigger(availableNow=True).start())
        query.awaitTermination()
        assert query.exception() is None

    pq.write_table(pa.Table.from_pylist([{"id": 1, "n": 10}, {"id": 2, "n": 20}], schema=narrow), source / "part-0000.parquet")
    run("id long, n int")
    # Upstream added a column and widened n: the restarted query goes on from its checkpoint.
    pq.write_table(pa.Table.from_pylist([{"id": 3, "n": 2**40, "extra": "x"}], schema=wide), source / "part-0001.parquet")
    run("id long, n long, extra string")

    table = load(warehouse, "db.evolving")
    assert {f.name: str(f.field_type) for f in table.schema().fields} == {"id": "long", "n": "long", "extra": "string"}
    expected = [{"id": 1, "n": 10, "extra": None}, {"id": 2, "n": 20, "extra": None}, {"id": 3, "n": 2**40, "extra": "x"}]
    assert_readers_see(warehouse, "db.evolving", expected_rows(expected, ["id", "n", "extra"]), ["id", "n", "extra"])
    assert [s.summary[EPOCH_ID] for s in table.metadata.snapshots] == ["0", "1"]
    assert check_table(table) == []
