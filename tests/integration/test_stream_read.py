"""Streaming reads: `spark.readStream.format("lakesink")` emits each appended snapshot once
across restarts, honours a file limit per micro-batch, refuses snapshots that delete rows
unless it reads a change feed, and the change feed replays every later state of a CDC
table (checked against pyiceberg's read of each snapshot)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from lakesink_testing import PYSPARK_MINOR, expected_rows, load
from pyspark.errors import StreamingQueryException

COLUMNS = ["id", "v"]


def _write(spark: Any, warehouse: str, table: str, records: list[dict], **options: str) -> None:
    writer = spark.createDataFrame(records, "id long, v string").coalesce(1).write.format("lakesink").option("warehouse", warehouse)
    for k, v in options.items():
        writer = writer.option(k, v)
    writer.mode("append").save(table)


def _stream(spark: Any, warehouse: str, table: str, checkpoint: Path, sink: Path, **options: str) -> Any:
    """Run the stream to the end of what is there now into a Parquet directory (Spark's file
    sink, exactly once across restarts with its own log)."""
    reader = spark.readStream.format("lakesink").option("warehouse", warehouse)
    for k, v in options.items():
        reader = reader.option(k, v)
    query = (reader.load(table).writeStream.format("parquet").option("path", str(sink))
             .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    query.awaitTermination()
    return query


def _sink(spark: Any, sink: Path, columns: list[str]) -> Counter:
    return Counter(tuple(r[c] for c in columns) for r in spark.read.parquet(str(sink)).collect())


def _batch(start: int, n: int, tag: str) -> list[dict]:
    return [{"id": i, "v": f"{tag}{i}"} for i in range(start, start + n)]


def test_appended_snapshots_are_emitted_once_across_a_restart(spark, warehouse: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    first, second, third = _batch(0, 5, "a"), _batch(5, 5, "b"), _batch(10, 5, "c")
    _write(spark, warehouse, "db.src", first)
    _write(spark, warehouse, "db.src", second)
    checkpoint, sink = tmp_path / "ck", tmp_path / "out"
    _stream(spark, warehouse, "db.src", checkpoint, sink)
    assert _sink(spark, sink, COLUMNS) == expected_rows(first + second, COLUMNS)
    _write(spark, warehouse, "db.src", third)
    _stream(spark, warehouse, "db.src", checkpoint, sink)
    assert _sink(spark, sink, COLUMNS) == expected_rows(first + second + third, COLUMNS)


def test_a_file_limit_spreads_snapshots_over_micro_batches(spark, warehouse: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    batches = [_batch(10 * i, 3, f"x{i}-") for i in range(4)]
    for b in batches:
        _write(spark, warehouse, "db.limited", b, maintenance="off")  # one file per snapshot
    sink = tmp_path / "out"
    if PYSPARK_MINOR < (4, 2):  # PySpark 4.0 and 4.1: refused, naming the minor that has it
        with pytest.raises(Exception, match=r"option 'max_files_per_trigger' needs PySpark 4\.2 or newer"):
            _stream(spark, warehouse, "db.limited", tmp_path / "ck", sink, max_files_per_trigger="2")
        return
    query = _stream(spark, warehouse, "db.limited", tmp_path / "ck", sink, max_files_per_trigger="2")
    assert _sink(spark, sink, COLUMNS) == expected_rows([r for b in batches for r in b], COLUMNS)
    rows_per_batch = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    # The first micro-batch reads the oldest snapshot whole (1 file) plus the next; then two more.
    assert rows_per_batch == [6, 6]


def test_a_snapshot_that_deletes_rows_fails_a_plain_stream_naming_it(spark, warehouse: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    keyed = {"operation": "upsert", "primary_key": "id", "index_dir": f"{warehouse}/idx"}
    _write(spark, warehouse, "db.keyedsrc", _batch(0, 4, "a"), **keyed)
    _write(spark, warehouse, "db.keyedsrc", _batch(2, 4, "b"), **keyed)
    upsert = load(warehouse, "db.keyedsrc").metadata.current_snapshot()
    with pytest.raises(StreamingQueryException, match=rf"snapshot {upsert.snapshot_id} \(overwrite\) deletes or replaces rows.*read_changes=true"):
        _stream(spark, warehouse, "db.keyedsrc", tmp_path / "ck", tmp_path / "out")


def test_a_plain_stream_told_to_skip_overwrites_emits_the_appends_only(spark, warehouse: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    keyed = {"operation": "upsert", "primary_key": "id", "index_dir": f"{warehouse}/idx"}
    _write(spark, warehouse, "db.skipping", _batch(0, 4, "a"), **keyed)
    _write(spark, warehouse, "db.skipping", _batch(2, 4, "b"), **keyed)  # an overwrite: hides 2, 3
    _write(spark, warehouse, "db.skipping", _batch(10, 2, "c"))  # a plain append
    sink = tmp_path / "out"
    _stream(spark, warehouse, "db.skipping", tmp_path / "ck", sink, **{"streaming-skip-overwrite-snapshots": "true"})
    assert _sink(spark, sink, COLUMNS) == expected_rows(_batch(0, 4, "a") + _batch(10, 2, "c"), COLUMNS)


def test_the_change_feed_of_a_cdc_table_replays_every_later_snapshot(spark, warehouse: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    cdc = {"operation": "cdc", "op_column": "op", "primary_key": "id", "index_dir": f"{warehouse}/idx", "maintenance": "off"}
    steps = [
        [(1, "a", "c"), (2, "b", "c"), (3, "c", "c")],
        [(2, "b2", "u"), (3, None, "d"), (4, "d", "c")],
        [(1, None, "d"), (4, "d2", "u"), (5, "e", "c")],
        [(5, "e", "u"), (2, "b3", "u")],  # 5 rewritten unchanged: a carry-over, not an update
    ]
    for step in steps:
        (spark.createDataFrame(step, "id long, v string, op string").coalesce(1).write.format("lakesink")
         .option("warehouse", warehouse).options(**cdc).mode("append").save("db.cdc"))
    table = load(warehouse, "db.cdc")
    snapshots = [s.snapshot_id for s in table.metadata.snapshots]
    sink = tmp_path / "out"
    _stream(spark, warehouse, "db.cdc", tmp_path / "ck", sink, read_changes="true")
    feed = spark.read.parquet(str(sink)).collect()
    by_snapshot: dict[int, list[Any]] = {}
    for r in feed:
        by_snapshot.setdefault(r["_commit_snapshot_id"], []).append(r)
    assert sorted(by_snapshot) == sorted(snapshots)
    state: dict[int, str | None] = {}
    for snapshot_id in snapshots:
        for r in by_snapshot[snapshot_id]:
            if r["_change_type"] in ("delete", "update_before"):
                assert state.pop(r["id"]) == r["v"]
        for r in by_snapshot[snapshot_id]:
            if r["_change_type"] in ("insert", "update_after"):
                assert r["id"] not in state
                state[r["id"]] = r["v"]
        then = Counter((r["id"], r["v"]) for r in table.scan(snapshot_id=snapshot_id).to_arrow().to_pylist())
        assert Counter(state.items()) == then
    second = {(r["id"], r["_change_type"]) for r in by_snapshot[snapshots[1]]}
    assert second == {(2, "update_before"), (2, "update_after"), (3, "delete"), (4, "insert")}
    assert {(r["id"], r["_change_type"]) for r in by_snapshot[snapshots[3]]} == {(2, "update_before"), (2, "update_after")}


def test_a_stream_over_expired_history_starts_with_the_oldest_retained_snapshot(spark, warehouse: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    keep_two = {"property.history.expire.max-snapshot-age-ms": "1", "property.history.expire.min-snapshots-to-keep": "2"}
    batches = [_batch(10 * i, 3, f"e{i}-") for i in range(4)]
    for b in batches[:3]:
        _write(spark, warehouse, "db.expiring", b, **keep_two)
    table = load(warehouse, "db.expiring")
    oldest = min(table.metadata.snapshots, key=lambda s: s.sequence_number)
    assert len(table.metadata.snapshots) == 2 and table.metadata.snapshot_by_id(oldest.parent_snapshot_id) is None
    checkpoint, sink = tmp_path / "ck", tmp_path / "out"
    _stream(spark, warehouse, "db.expiring", checkpoint, sink)
    assert _sink(spark, sink, COLUMNS) == expected_rows([r for b in batches[:3] for r in b], COLUMNS)
    _write(spark, warehouse, "db.expiring", batches[3], **keep_two)  # expires the stream's start's parent again
    _stream(spark, warehouse, "db.expiring", checkpoint, sink)
    assert _sink(spark, sink, COLUMNS) == expected_rows([r for b in batches for r in b], COLUMNS)


def test_the_change_feed_replayed_in_ordinal_order_rebuilds_the_table_across_compaction_and_expiry(
    spark, warehouse: str, tmp_path: Path  # type: ignore[no-untyped-def]
) -> None:
    """A consumer that knows nothing but `_change_ordinal` (commit order) and `_change_type`
    rebuilds the table: compactions (maintenance=auto) and expired snapshots in between."""
    cdc = {"operation": "cdc", "op_column": "op", "primary_key": "id", "index_dir": f"{warehouse}/idx",
           "property.history.expire.max-snapshot-age-ms": "1", "property.history.expire.min-snapshots-to-keep": "6"}

    def step(i: int) -> list[tuple[int, str | None, str]]:
        return [(i, f"v{i}", "c"), ((i * 7) % 10, f"u{i}", "u"), ((i * 3) % 10, None, "d")]

    checkpoint, sink = tmp_path / "ck", tmp_path / "out"
    for part in (range(0, 8), range(8, 10), range(10, 12), range(12, 14)):  # read often enough: the offset stays retained
        for i in part:
            (spark.createDataFrame(step(i), "id long, v string, op string").coalesce(1).write.format("lakesink")
             .option("warehouse", warehouse).options(**cdc).mode("append").save("db.feed"))
        _stream(spark, warehouse, "db.feed", checkpoint, sink, read_changes="true")
    table = load(warehouse, "db.feed")
    operations = {s.summary.operation.value for s in table.metadata.snapshots}
    assert "replace" in operations, "a compaction ran between the batches"
    assert min(s.sequence_number for s in table.metadata.snapshots) > 1, "early snapshots expired"
    feed = spark.read.parquet(str(sink)).collect()
    order = {"delete": 0, "update_before": 0, "insert": 1, "update_after": 1}  # within one commit: removals first
    state: dict[int, str | None] = {}
    for r in sorted(feed, key=lambda r: (r["_change_ordinal"], order[r["_change_type"]])):
        if order[r["_change_type"]] == 0:
            assert state.pop(r["id"]) == r["v"]
        else:
            state[r["id"]] = r["v"]
    assert Counter(state.items()) == Counter((r["id"], r["v"]) for r in table.scan().to_arrow().to_pylist())
    committed = {s.snapshot_id: s.timestamp_ms for s in table.metadata.snapshots}
    for r in feed:
        if r["_commit_snapshot_id"] in committed:
            assert int(r["_commit_timestamp"].timestamp() * 1000) == committed[r["_commit_snapshot_id"]]


def _replay(state: dict[int, str | None], changes: list[Any]) -> dict[int, str | None]:
    """Apply a change feed in commit order (removals before inserts within a commit)."""
    order = {"delete": 0, "update_before": 0, "insert": 1, "update_after": 1}
    state = dict(state)
    for r in sorted(changes, key=lambda r: (r["_change_ordinal"], order[r["_change_type"]])):
        if order[r["_change_type"]] == 0:
            assert state.pop(r["id"]) == r["v"]
        else:
            state[r["id"]] = r["v"]
    return state


def test_a_batch_read_of_a_range_replays_what_those_snapshots_changed(spark, warehouse: str) -> None:  # type: ignore[no-untyped-def]
    """spark.read with read_changes and starting_/ending_ bounds (snapshot ids or times): the
    changes of exactly those snapshots, which turn the table as of the one before the range
    into the table as of the range's end (both read by pyiceberg)."""
    cdc = {"operation": "cdc", "op_column": "op", "primary_key": "id", "index_dir": f"{warehouse}/idx", "maintenance": "off"}
    snapshots = []  # one per write (no compaction in between)
    for i in range(6):
        rows = [(10 + i, f"v{i}", "c"), ((i * 7) % 5, f"u{i}", "u"), ((i * 3 + 1) % 5, None, "d")]
        (spark.createDataFrame(rows, "id long, v string, op string").coalesce(1).write.format("lakesink")
         .option("warehouse", warehouse).options(**cdc).mode("append").save("db.range"))
        snapshots.append(load(warehouse, "db.range").metadata.current_snapshot_id)
    table = load(warehouse, "db.range")

    def state_at(snapshot_id: int) -> dict[int, str | None]:
        return {r["id"]: r["v"] for r in table.scan(snapshot_id=snapshot_id).to_arrow().to_pylist()}

    def changes(**bounds: str) -> list[Any]:
        return (spark.read.format("lakesink").option("warehouse", warehouse).option("read_changes", "true")
                .options(**bounds).load("db.range").collect())

    by_id = changes(starting_snapshot_id=str(snapshots[2]), ending_snapshot_id=str(snapshots[4]))
    assert {r["_commit_snapshot_id"] for r in by_id} == set(snapshots[2:5])
    assert _replay(state_at(snapshots[1]), by_id) == state_at(snapshots[4])

    times = {s.snapshot_id: s.timestamp_ms for s in table.metadata.snapshots}
    by_time = changes(startingTimestamp=str(times[snapshots[1]]), endingTimestamp=str(times[snapshots[3]]))  # Delta's names
    assert {r["_commit_snapshot_id"] for r in by_time} == set(snapshots[1:4])
    assert _replay(state_at(snapshots[0]), by_time) == state_at(snapshots[3])

    everything = changes()  # no bounds: the whole table as of the first snapshot, then every change
    assert _replay({}, everything) == state_at(snapshots[-1])
    assert changes(starting_timestamp=str(times[snapshots[-1]] + 60_000)) == []  # a range after the last commit is empty


def test_a_batch_read_of_a_range_without_changes_reads_its_appended_rows(spark, warehouse: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    parts = [_batch(0, 3, "a"), _batch(3, 3, "b"), _batch(6, 3, "c")]
    snapshots = []
    for part in parts:
        _write(spark, warehouse, "db.appends", part)
        snapshots.append(load(warehouse, "db.appends").metadata.current_snapshot_id)
    middle = (spark.read.format("lakesink").option("warehouse", warehouse).option("starting_snapshot_id", str(snapshots[1]))
              .option("end-snapshot-id", str(snapshots[1])).load("db.appends").collect())  # Iceberg's spelling of the end
    assert Counter((r["id"], r["v"]) for r in middle) == expected_rows(parts[1], COLUMNS)
    with pytest.raises(Exception, match="'ending_snapshot_id' and 'ending_timestamp' bound a batch read"):
        _stream(spark, warehouse, "db.appends", tmp_path / "ck", tmp_path / "out", ending_snapshot_id=str(snapshots[1]))
