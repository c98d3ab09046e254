"""`gc.enabled=false` (issue 45, part 1): a table whose files another table shares loses none.

Table `db.b` is made to share table `db.a`'s data files (as Iceberg's `snapshot` procedure
or `add_files` make tables: a snapshot of `db.b` references files under `db.a`'s location),
with gc.enabled=false and maintenance as aggressive as it gets (snapshots expire after a
millisecond, compaction merges every two files, orphans older than a millisecond are
removed at every batch). A long stream of batches with maintenance on follows. Driven
through the production path without Spark (plan_write -> write_task -> the compaction the
task carried -> commit_write -> maintenance after the commit), read back with DuckDB and
pyiceberg.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable
from pathlib import Path

import pyarrow as pa
import pytest
from lakesink_testing import assert_readers_see, expected_rows, load
from pyspark.sql import types as T

from lakesink_datasource.check import check_table
from lakesink_datasource.commit.committer import CommitOutcome, commit_write
from lakesink_datasource.commit.snapshot_producer import RowDelta, SnapshotProducer
from lakesink_datasource.commit.swap import PreparedCommit, swap_in
from lakesink_datasource.iceberg.gc import GC_OFF_NOTE, GcDisabled
from lakesink_datasource.iceberg.live_files import live_data_files
from lakesink_datasource.maintain import main as maintain_main
from lakesink_datasource.maintenance.after_batch import land_compaction, maintain_after_commit
from lakesink_datasource.maintenance.expire import expire_snapshots
from lakesink_datasource.maintenance.orphans import remove_orphans
from lakesink_datasource.messages import decode_messages
from lakesink_datasource.options import parse_options
from lakesink_datasource.read.metadata_tables import lakesink_history
from lakesink_datasource.table.setup import plan_write
from lakesink_datasource.write.task import TaskIdentity, write_task

SCHEMA = T.StructType([T.StructField("id", T.LongType()), T.StructField("v", T.StringType())])
ARROW = pa.schema([("id", pa.int64()), ("v", pa.string())])
COLUMNS = ["id", "v"]
AGGRESSIVE = {
    "property.history.expire.max-snapshot-age-ms": "1",
    "property.lakesink.maintenance.compaction-fan-in": "2",
    "property.lakesink.maintenance.orphan-min-age-ms": "1",
    "property.lakesink.maintenance.orphan-interval-ms": "1",
}


def _rows(ids: Iterable[int], tag: str) -> list[dict]:
    return [{"id": i, "v": f"{tag}{i}"} for i in ids]


def _batch(warehouse: str, table: str, ids: Iterable[int], tag: str, batch: int, **options: str) -> CommitOutcome:
    """One micro-batch as a Spark commit runs it, maintenance included."""
    plan = plan_write(parse_options({"table": table, "warehouse": warehouse, "progress": "false", **options}), SCHEMA, False)
    message = write_task(plan, iter([pa.RecordBatch.from_pylist(_rows(ids, tag), schema=ARROW)]),
                         TaskIdentity(batch_id=batch, query_id="q"))
    land_compaction(plan, decode_messages([message]), batch)
    outcome = commit_write(plan, decode_messages([message]), batch)
    assert outcome.snapshot_id is not None
    maintain_after_commit(plan, outcome.stats.bytes_written, batch, batch_files=outcome.data_files)
    for thread in threading.enumerate():  # the orphan scan runs beside the stream
        if thread.name == "lakesink-orphans":
            thread.join()
    return outcome


def _share_files(warehouse: str, source: str, target: str) -> list[str]:
    """Commit `source`'s live data files into `target` as an append (what `add_files` does)."""
    a, b = load(warehouse, source), load(warehouse, target)
    files = [e.data_file for e in live_data_files(a.io, a.metadata.current_snapshot())]
    head = b.metadata.current_snapshot()
    delta = RowDelta(added_data_files=files, planned_snapshot_id=head.snapshot_id if head else None)
    producer = SnapshotProducer(b.io, b.metadata, delta)
    swap_in(b, PreparedCommit(b.metadata, producer.produce(b.metadata, 0, {"added-by": "test"})))
    return [f.file_path for f in files]


def _exists(path: str) -> bool:
    return os.path.exists(path.removeprefix("file://"))


@pytest.fixture
def shared(warehouse: str) -> tuple[list[str], list[dict], list[dict]]:
    """db.a (3 batches) and db.b (gc.enabled=false, one batch plus db.a's files)."""
    a_rows: list[dict] = []
    for b in range(3):
        _batch(warehouse, "db.a", range(b * 10, b * 10 + 10), "a", b, format_version="2", maintenance="off")
        a_rows += _rows(range(b * 10, b * 10 + 10), "a")
    _batch(warehouse, "db.b", range(1000, 1005), "b", 0, format_version="2", maintenance="off",
           **{"property.gc.enabled": "false"})
    paths = _share_files(warehouse, "db.a", "db.b")
    return paths, a_rows, a_rows + _rows(range(1000, 1005), "b")


def test_a_long_stream_with_maintenance_deletes_no_file_of_a_table_with_gc_disabled(
    warehouse: str, shared: tuple[list[str], list[dict], list[dict]]
) -> None:
    shared_paths, a_rows, b_rows = shared
    planted = Path(warehouse) / "db" / "b" / "data" / "planted-by-another-engine.parquet"
    planted.parent.mkdir(parents=True, exist_ok=True)
    planted.write_bytes(b"not lakesink's")
    ten_days_ago = time.time() - 10 * 24 * 3600
    os.utime(planted, (ten_days_ago, ten_days_ago))

    notes = []
    for b in range(1, 25):
        outcome = _batch(warehouse, "db.b", range(2000 + b * 3, 2003 + b * 3), "s", b, **AGGRESSIVE)
        notes.append(outcome.note)
        b_rows += _rows(range(2000 + b * 3, 2003 + b * 3), "s")

    table_b = load(warehouse, "db.b")
    assert [n for n in notes if n is not None] == [GC_OFF_NOTE] and notes[0] == GC_OFF_NOTE  # said once
    live = {e.data_file.file_path for e in live_data_files(table_b.io, table_b.metadata.current_snapshot())}
    assert not live & set(shared_paths), "compaction never replaced the shared files: the test proves nothing"
    # Every shared file, every file the compactions replaced and the planted file are still there.
    assert all(_exists(p) for p in shared_paths)
    assert planted.exists()
    # The metadata stays bounded all the same: expired snapshots leave it, their files stay.
    assert len(table_b.metadata.snapshots) <= 3
    assert_readers_see(warehouse, "db.a", expected_rows(a_rows, COLUMNS), COLUMNS)
    assert_readers_see(warehouse, "db.b", expected_rows(b_rows, COLUMNS), COLUMNS)
    assert check_table(load(warehouse, "db.a")) == [] and check_table(table_b) == []
    history = lakesink_history(table_b).to_pylist()
    assert {r["maintenance_note"] for r in history} <= {None, GC_OFF_NOTE}


def test_without_gc_disabled_the_same_stream_would_delete_the_shared_files(
    warehouse: str, shared: tuple[list[str], list[dict], list[dict]]
) -> None:
    """The control: the same table with gc.enabled=true loses the files it shares, which is
    why the property matters (db.a then reads files that are gone)."""
    shared_paths, _, _ = shared
    for b in range(1, 25):
        _batch(warehouse, "db.b", range(2000 + b * 3, 2003 + b * 3), "s", b, **AGGRESSIVE, **{"property.gc.enabled": "true"})
    assert not all(_exists(p) for p in shared_paths)


@pytest.mark.parametrize("action", ["expire", "remove-orphans", "all"])
def test_maintain_refuses_to_delete_and_names_the_property(
    warehouse: str, shared: tuple[list[str], list[dict], list[dict]], action: str, capsys: pytest.CaptureFixture[str]
) -> None:
    before = load(warehouse, "db.b").metadata_location
    assert maintain_main([action, "db.b", "--warehouse", warehouse, "--older-than-hours", "0", "--orphan-min-age-hours", "0"]) == 2
    err = capsys.readouterr().err
    assert "gc.enabled=false" in err and "nothing was deleted" in err
    assert load(warehouse, "db.b").metadata_location == before  # nothing changed
    table = load(warehouse, "db.b")
    with pytest.raises(GcDisabled, match=r"gc\.enabled"):
        expire_snapshots(table, max_age_ms=0)
    with pytest.raises(GcDisabled, match=r"gc\.enabled"):
        remove_orphans(table, min_age_ms=0)
