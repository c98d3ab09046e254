"""Nothing lost when the world around a table goes wrong (issue 26), through Spark: what
the user's write meets, and the table read back by DuckDB and pyiceberg."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import date
from pathlib import Path

import pytest
from lakesink_testing import assert_readers_see, duckdb_rows, embedded_catalog, expected_rows, load, pyiceberg_rows
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import NoSuchTableError
from pyspark.errors import StreamingQueryException

from lakesink_datasource.check import check_table
from lakesink_datasource.maintain import main as maintain_main
from lakesink_datasource.maintenance.compaction import compact
from lakesink_datasource.maintenance.orphans import LocationShared, remove_orphans


def test_an_optional_struct_with_a_required_field_can_be_left_out(spark, warehouse: str) -> None:
    """Spark makes `named_struct('x', cast(id as int))`'s field `x` required. A later
    merge_schema upsert that omits `s` used to fail in the task ("Column 'x' is declared
    non-nullable but contains nulls") and stall the stream; a null optional struct with
    required fields is valid Iceberg, written as such."""
    options = {"warehouse": warehouse, "table": "db.s", "operation": "upsert", "primary_key": "id"}
    spark.range(4).selectExpr("id", "named_struct('x', cast(id as int)) as s", "'a' as v") \
        .write.format("lakesink").options(**options).mode("append").save()
    spark.createDataFrame([(2, "b"), (9, "b")], "id long, v string") \
        .write.format("lakesink").options(**options, merge_schema="true").mode("append").save()
    expected = [{"id": i, "s": {"x": i}, "v": "a"} for i in (0, 1, 3)] + [{"id": i, "s": None, "v": "b"} for i in (2, 9)]
    assert_readers_see(warehouse, "db.s", expected_rows(expected, ["id", "s", "v"]), ["id", "s", "v"])
    table = load(warehouse, "db.s")
    assert check_table(table) == []
    # The struct stays optional with its required field: the table's schema is unchanged.
    field = table.schema().find_field("s")
    assert not field.required and field.field_type.fields[0].required


@pytest.mark.parametrize("operation", ["append", "upsert"])
def test_a_struct_omitted_from_a_stream_survives_compaction(spark, warehouse: str, operation: str) -> None:
    """Files holding null structs with required fields are rewritten by the compaction
    (which reads them back through the same alignment) without error."""
    keyed = {"operation": "upsert", "primary_key": "id"} if operation == "upsert" else {}
    options = {"warehouse": warehouse, "table": "db.c", "maintenance": "off", **keyed}
    spark.range(3).selectExpr("id", "named_struct('x', cast(id as int)) as s") \
        .write.format("lakesink").options(**options).mode("append").save()
    for i in range(3, 6):
        spark.createDataFrame([(i,)], "id long").write.format("lakesink").options(**options, merge_schema="true").mode("append").save()
    result = compact(load(warehouse, "db.c"), budget_bytes=1 << 40, tiered=False, batch_id=None)
    assert result.snapshot_id is not None and result.files_rewritten >= 4, result.describe()
    expected = [{"id": i, "s": {"x": i} if i < 3 else None} for i in range(6)]
    assert_readers_see(warehouse, "db.c", expected_rows(expected, ["id", "s"]), ["id", "s"])


# ----------------------------------------------------------------- a catalog that lost its tables


def _stream(spark, source: Path, checkpoint: Path, options: dict[str, str]) -> None:  # type: ignore[no-untyped-def]
    writer = spark.readStream.schema("id long, name string").option("maxFilesPerTrigger", 1).parquet(str(source)).writeStream
    writer = writer.format("lakesink").option("checkpointLocation", str(checkpoint))
    for key, value in options.items():
        writer = writer.option(key, value)
    writer.trigger(availableNow=True).start().awaitTermination()


def _add_input(spark, source: Path, rows: list[tuple[int, str]]) -> None:  # type: ignore[no-untyped-def]
    spark.createDataFrame(rows, "id long, name string").coalesce(1).write.mode("append").parquet(str(source))


def test_a_vanished_embedded_catalog_is_not_replaced_by_an_empty_one(spark, tmp_path: Path, warehouse: str) -> None:
    """catalog.db moved away (a volume that came back empty): a stream restarted from its
    checkpoint used to get a fresh catalog, create a new db.t over the old one's files and
    mark its first batches done in a table that no longer had them."""
    source, checkpoint = tmp_path / "source", tmp_path / "checkpoint"
    options = {"warehouse": warehouse, "table": "db.t"}
    first = [(i, "first") for i in range(10)]
    _add_input(spark, source, first)
    _stream(spark, source, checkpoint, options)
    catalog_db = Path(warehouse) / "catalog.db"
    catalog_db.rename(tmp_path / "catalog.db.moved")

    second = [(i, "second") for i in range(10, 15)]
    _add_input(spark, source, second)
    with pytest.raises(StreamingQueryException, match=r"embedded catalog .*catalog\.db is missing, but warehouse .* holds Iceberg tables \(db/t\)"):
        _stream(spark, source, checkpoint, options)
    assert not catalog_db.exists(), "an empty catalog was started over the warehouse"
    # Back in place, the same query goes on exactly once.
    (tmp_path / "catalog.db.moved").rename(catalog_db)
    _stream(spark, source, checkpoint, options)
    assert_readers_see(warehouse, "db.t", expected_rows([{"id": i, "name": n} for i, n in first + second], ["id", "name"]), ["id", "name"])


@pytest.fixture
def sql_catalog(request, tmp_path: Path) -> dict[str, str]:  # type: ignore[no-untyped-def]
    """Write options of an explicit SQL catalog: SQLite, or the PostgreSQL server."""
    warehouse = f"file://{tmp_path / 'wh'}"
    uri = f"sqlite:///{tmp_path / 'lite.db'}" if request.param == "sqlite" else request.getfixturevalue("postgres_uri")
    return {"catalog": "c", "catalog.type": "sql", "catalog.uri": uri, "catalog.warehouse": warehouse}


@pytest.mark.parametrize("sql_catalog", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True)
def test_a_table_the_catalog_lost_is_not_created_again_over_its_files(spark, tmp_path: Path, sql_catalog: dict[str, str]) -> None:
    """The catalog forgot db.t (restored from an old backup, dropped without purge): neither
    the stream that wrote it nor a batch write creates a new db.t at the same location;
    registering it back restores every row."""
    namespace = f"n{uuid.uuid4().hex[:8]}"  # PostgreSQL outlives the test
    table = f"{namespace}.t"
    options = {**sql_catalog, "table": table}
    source, checkpoint = tmp_path / "source", tmp_path / "checkpoint"
    first = [(i, "first") for i in range(8)]
    _add_input(spark, source, first)
    _stream(spark, source, checkpoint, options)
    catalog = SqlCatalog("c", uri=sql_catalog["catalog.uri"], warehouse=sql_catalog["catalog.warehouse"])
    location = catalog.load_table(table).metadata.location
    catalog.drop_table(table)  # the catalog entry only: the files stay

    _add_input(spark, source, [(100, "second")])
    with pytest.raises(StreamingQueryException, match=r"checkpoint .* has committed batches \(up to 0\)"):
        _stream(spark, source, checkpoint, options)
    with pytest.raises(Exception, match=r"its location .* holds the metadata of a table .*maintain register"):
        spark.createDataFrame([(200, "batch")], "id long, name string").write.format("lakesink").options(**options).mode("append").save()
    with pytest.raises(NoSuchTableError):
        catalog.load_table(table)
    assert len(list(Path(location.removeprefix("file://"), "metadata").glob("*.metadata.json"))) >= 2

    code = maintain_main(["register", table, "--catalog", "c", "--catalog-prop", "type=sql",
                          "--catalog-prop", f"uri={sql_catalog['catalog.uri']}", "--catalog-prop", f"warehouse={sql_catalog['catalog.warehouse']}"])
    assert code == 0
    _stream(spark, source, checkpoint, options)  # the query goes on where it stopped
    restored = catalog.load_table(table)
    expected = expected_rows([{"id": i, "name": n} for i, n in [*first, (100, "second")]], ["id", "name"])
    assert pyiceberg_rows(restored, ["id", "name"]) == expected
    assert duckdb_rows(restored.metadata_location, ["id", "name"]) == expected


def test_orphan_removal_refuses_a_location_another_table_owns(spark, tmp_path: Path, warehouse: str) -> None:
    """A table created (by another tool) where a lost table's files still are must not
    treat that table's files as its own orphans."""
    spark.createDataFrame([(1, "a"), (2, "b")], "id long, name string").write.format("lakesink") \
        .options(warehouse=warehouse, table="db.t", maintenance="off").mode("append").save()
    catalog = embedded_catalog(warehouse)
    old = catalog.load_table("db.t")
    old_files = sorted(p for p in Path(warehouse, "db", "t").rglob("*") if p.is_file())
    catalog.drop_table("db.t")
    catalog.create_table("db.t", schema=old.schema(), location=old.metadata.location)  # not through lakesink
    with pytest.raises(LocationShared, match=r"holds the metadata of another table \(uuid .*nothing was removed"):
        remove_orphans(catalog.load_table("db.t"), min_age_ms=0)
    code = maintain_main(["remove-orphans", "db.t", "--warehouse", warehouse, "--orphan-min-age-hours", "0"])
    assert code == 2
    assert all(p.exists() for p in old_files)


# ----------------------------------------------------------------- a catalog that is briefly away

HOLD_LOCK = str(Path(__file__).with_name("hold_sqlite_lock.py"))


def _hold_lock_command(db: Path, seconds: float, ready: Path) -> list[str]:
    return [sys.executable, HOLD_LOCK, "--start", str(db), str(seconds), str(ready)]


def _data_files(warehouse: str) -> set[str]:
    return {str(p) for p in Path(warehouse).rglob("*.parquet")}


def test_a_locked_embedded_catalog_is_waited_for_while_planning_and_committing(spark, tmp_path: Path, warehouse: str, arm_fault) -> None:  # type: ignore[no-untyped-def]
    """Another process holds catalog.db exclusively for 7 s, longer than SQLite's own busy
    wait (5 s): the write used to die with a raw "database is locked" (planning) or fail its
    commit and orphan its files; it now waits with the commit.retry.* budget."""
    options = {"warehouse": warehouse, "table": "db.t"}
    spark.createDataFrame([(0, "a")], "id long, name string").write.format("lakesink").options(**options).mode("append").save()
    catalog_db = Path(warehouse) / "catalog.db"

    subprocess.run(_hold_lock_command(catalog_db, 7, tmp_path / "planning.ready"), check=True)
    spark.createDataFrame([(1, "b")], "id long, name string").write.format("lakesink").options(**options).mode("append").save()

    arm_fault({"point": "before_commit", "action": "run", "once": True, "command": _hold_lock_command(catalog_db, 7, tmp_path / "commit.ready")})
    spark.createDataFrame([(2, "c")], "id long, name string").write.format("lakesink").options(**options).mode("append").save()
    assert (tmp_path / "commit.ready").exists(), "the lock was never taken during the commit"

    assert_readers_see(warehouse, "db.t", expected_rows([{"id": 0, "name": "a"}, {"id": 1, "name": "b"}, {"id": 2, "name": "c"}], ["id", "name"]), ["id", "name"])
    assert len(load(warehouse, "db.t").metadata.snapshots) == 3


def test_a_catalog_locked_past_the_budget_fails_the_write_naming_it_and_the_abort_cleans_up(spark, tmp_path: Path, warehouse: str, arm_fault) -> None:  # type: ignore[no-untyped-def]
    """With a budget of one retry 5 s apart, a lock held 20 s outlasts the commit (~15 s)
    but not the abort that follows it (its second try comes at ~25 s): the error names the
    catalog and the way out, nothing is committed and the batch's files are deleted."""
    options = {"warehouse": warehouse, "table": "db.t"}
    spark.createDataFrame([(0, "a")], "id long, name string").write.format("lakesink").options(**options).mode("append").save()
    before = _data_files(warehouse)
    catalog_db = Path(warehouse) / "catalog.db"
    arm_fault({"point": "before_commit", "action": "run", "once": True, "command": _hold_lock_command(catalog_db, 20, tmp_path / "commit.ready")})
    budget = {"property.commit.retry.num-retries": "1", "property.commit.retry.min-wait-ms": "5000"}
    with pytest.raises(Exception, match=r"could not commit to db\.t: catalog 'lakesink' at sqlite:.* kept failing .*database is locked.*commit\.retry\.num-retries") as failed:
        spark.createDataFrame([(1, "b")], "id long, name string").write.format("lakesink").options(**options, **budget).mode("append").save()
    assert "Restarting the query is safe" in str(failed.value)
    assert _data_files(warehouse) == before, "the aborted batch's files were left behind"
    assert_readers_see(warehouse, "db.t", expected_rows([{"id": 0, "name": "a"}], ["id", "name"]), ["id", "name"])


TERMINATE = """
import sqlalchemy as sa, sys
with sa.create_engine(sys.argv[1]).connect() as con:
    con.execute(sa.text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"))
"""


def test_a_postgres_catalog_restart_during_the_commit_is_ridden_out(spark, tmp_path: Path, postgres_uri: str, arm_fault) -> None:  # type: ignore[no-untyped-def]
    """Every connection to the catalog database is terminated right before the commit (a
    failover, a restart): the pooled connection the commit uses is dead; it reconnects."""
    warehouse = f"file://{tmp_path / 'wh'}"
    table = f"n{uuid.uuid4().hex[:8]}.t"
    options = {"catalog": "pg", "catalog.type": "sql", "catalog.uri": postgres_uri, "catalog.warehouse": warehouse, "table": table}
    spark.createDataFrame([(0, "a")], "id long, name string").write.format("lakesink").options(**options).mode("append").save()
    arm_fault({"point": "before_commit", "action": "run", "once": True, "command": [sys.executable, "-c", TERMINATE, postgres_uri]})
    spark.createDataFrame([(1, "b")], "id long, name string").write.format("lakesink").options(**options).mode("append").save()
    loaded = SqlCatalog("pg", uri=postgres_uri, warehouse=warehouse).load_table(table)
    expected = expected_rows([{"id": 0, "name": "a"}, {"id": 1, "name": "b"}], ["id", "name"])
    assert pyiceberg_rows(loaded, ["id", "name"]) == expected
    assert duckdb_rows(loaded.metadata_location, ["id", "name"]) == expected
    assert len(loaded.metadata.snapshots) == 2


# ----------------------------------------------------------------- a damaged tombstone table

CDC_COLUMNS = ["id", "v", "seq"]


def _cdc(spark, warehouse: str, index_dir: Path, rows: list[tuple[int, str, str, int]], **extra: str) -> None:  # type: ignore[no-untyped-def]
    options = {"warehouse": warehouse, "table": "db.k", "operation": "cdc", "primary_key": "id", "op_column": "op",
               "sequence_column": "seq", "index_dir": str(index_dir), **extra}
    spark.createDataFrame(rows, "id long, v string, op string, seq long").write.format("lakesink").options(**options).mode("append").save()


def _cdc_model(batches: list[list[tuple[int, str, str, int]]]) -> list[dict]:
    live: dict[int, dict] = {}
    latest: dict[int, int] = {}
    for batch in batches:
        for key, v, op, seq in sorted(batch, key=lambda r: r[3]):
            if latest.get(key, -1) > seq:
                continue
            latest[key] = seq
            if op == "d":
                live.pop(key, None)
            else:
                live[key] = {"id": key, "v": v, "seq": seq}
    return list(live.values())


INSERTS = [(k, f"v{k}", "c", 1) for k in range(10)]
DELETES = [(k, "", "d", 5) for k in range(5)]
LATE = [(0, "late", "c", 3)]  # older than key 0's delete: must never bring it back


def test_a_companion_whose_metadata_is_damaged_stops_sequenced_batches_until_repaired(spark, tmp_path: Path, warehouse: str) -> None:
    index_dir = tmp_path / "index"
    _cdc(spark, warehouse, index_dir, INSERTS)
    _cdc(spark, warehouse, index_dir, DELETES)
    companion = embedded_catalog(warehouse).load_table("db.k__lakesink_tombstones")
    Path(companion.metadata_location.removeprefix("file://")).write_text("{not json")  # damaged on disk
    before = load(warehouse, "db.k").metadata.current_snapshot().snapshot_id

    update = [(9, "v9-b", "u", 6)]
    with pytest.raises(Exception, match=r"cannot be stored in its tombstone table db\.k__lakesink_tombstones .*maintain repair-tombstones db\.k"):
        _cdc(spark, warehouse, index_dir, update)
    assert load(warehouse, "db.k").metadata.current_snapshot().snapshot_id == before

    assert maintain_main(["repair-tombstones", "db.k", "--warehouse", warehouse]) == 0  # nothing lost: older metadata + snapshots
    _cdc(spark, warehouse, index_dir, update)
    shutil.rmtree(index_dir)  # the next batch rebuilds the index, with the repaired tombstones
    _cdc(spark, warehouse, index_dir, LATE)
    expected = _cdc_model([INSERTS, DELETES, update, LATE])
    assert_readers_see(warehouse, "db.k", expected_rows(expected, CDC_COLUMNS), CDC_COLUMNS)


def test_a_rebuild_that_cannot_read_the_tombstones_refuses_late_changes_it_cannot_decide(spark, tmp_path: Path, warehouse: str) -> None:
    """The issue's data loss: the companion's rows unreadable, the snapshots that named the
    tombstone files expired, the key index deleted: late older changes used to bring all
    deleted keys back. The rebuilt index now refuses changes to keys it does not hold at
    or below the highest delete's sequence, and takes everything else."""
    index_dir = tmp_path / "index"
    expire = {"property.history.expire.max-snapshot-age-ms": "1"}
    _cdc(spark, warehouse, index_dir, INSERTS, **expire)
    _cdc(spark, warehouse, index_dir, DELETES, **expire)
    _cdc(spark, warehouse, index_dir, [(8, "v8-b", "u", 6)], **expire)
    table = load(warehouse, "db.k")
    assert not any(s.summary and s.summary.additional_properties.get("lakesink.tombstones") for s in table.metadata.snapshots), \
        "the snapshots naming the tombstone files should have expired (their tombstones were stored)"
    companion = embedded_catalog(warehouse).load_table("db.k__lakesink_tombstones")
    for entry in companion.inspect.files().to_pylist():
        Path(entry["file_path"].removeprefix("file://")).unlink()  # the companion's rows are lost
    shutil.rmtree(index_dir)

    newer = [(9, "v9-b", "u", 7), (20, "v20", "c", 9)]  # a live key, and a new key above every delete
    _cdc(spark, warehouse, index_dir, newer)
    before = load(warehouse, "db.k").metadata.current_snapshot().snapshot_id
    with pytest.raises(Exception, match=r"1 change\(s\) of this batch are for keys the key index does not hold.*repair-tombstones db\.k"):
        _cdc(spark, warehouse, index_dir, LATE)
    assert load(warehouse, "db.k").metadata.current_snapshot().snapshot_id == before
    expected = _cdc_model([INSERTS, DELETES, [(8, "v8-b", "u", 6)], newer])
    assert_readers_see(warehouse, "db.k", expected_rows(expected, CDC_COLUMNS), CDC_COLUMNS)
    # The repair says what is lost and waits to be told.
    assert maintain_main(["repair-tombstones", "db.k", "--warehouse", warehouse]) == 1
    assert maintain_main(["repair-tombstones", "db.k", "--warehouse", warehouse, "--accept-loss"]) == 0


# ----------------------------------------------------------------- Spark's session settings


def _deleted_records(warehouse: str, identifier: str) -> int:
    summary = load(warehouse, identifier).metadata.current_snapshot().summary
    return int(summary.additional_properties.get("deleted-records", 0))


def test_the_session_partition_overwrite_mode_is_honoured(spark, warehouse: str) -> None:
    """`spark.sql.sources.partitionOverwriteMode=dynamic` in the session used to be ignored:
    overwriting one partition of a 3-partition table replaced the whole table (30 rows -> 1)."""
    options = {"warehouse": warehouse, "table": "db.p", "partition_by": "p"}
    rows = [(i, f"p{i % 3}") for i in range(30)]
    spark.createDataFrame(rows, "id long, p string").write.format("lakesink").options(**options).mode("append").save()
    spark.conf.set("spark.sql.sources.partitionOverwriteMode", "dynamic")
    try:
        spark.createDataFrame([(100, "p1")], "id long, p string").write.format("lakesink").options(**options).mode("overwrite").save()
        expected = [{"id": i, "p": p} for i, p in rows if p != "p1"] + [{"id": 100, "p": "p1"}]
        assert_readers_see(warehouse, "db.p", expected_rows(expected, ["id", "p"]), ["id", "p"])
        assert _deleted_records(warehouse, "db.p") == 10
        # The write's own option still wins over the session.
        spark.createDataFrame([(200, "p0")], "id long, p string").write.format("lakesink").options(**options, overwrite_mode="static") \
            .mode("overwrite").save()
    finally:
        spark.conf.unset("spark.sql.sources.partitionOverwriteMode")
    assert_readers_see(warehouse, "db.p", expected_rows([{"id": 200, "p": "p0"}], ["id", "p"]), ["id", "p"])
    assert _deleted_records(warehouse, "db.p") == 21


# ----------------------------------------------------------------- smaller ones


def test_replace_where_takes_spark_sql_literals_and_points_at_the_part_it_cannot_read(spark, warehouse: str) -> None:
    options = {"warehouse": warehouse, "table": "db.r"}
    rows = [(i, date(2026, 11, 1 + i % 3)) for i in range(9)]
    spark.createDataFrame(rows, "id long, d date").write.format("lakesink").options(**options).mode("append").save()
    new = [(100, date(2026, 11, 1))]
    spark.createDataFrame(new, "id long, d date").write.format("lakesink").options(**options, replace_where="d = DATE '2026-11-01' AND id >= 0L") \
        .mode("overwrite").save()
    expected = [{"id": i, "d": d} for i, d in rows if d != date(2026, 11, 1)] + [{"id": 100, "d": date(2026, 11, 1)}]
    assert_readers_see(warehouse, "db.r", expected_rows(expected, ["id", "d"]), ["id", "d"])
    with pytest.raises(Exception, match=r"cannot parse .* as a filter: 'id >> 3' \(at character 27\)"):
        spark.createDataFrame(new, "id long, d date").write.format("lakesink").options(**options, replace_where="d = DATE '2026-11-01' AND id >> 3") \
            .mode("overwrite").save()


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 512 KiB file system (tmpfs), so a write fills it."""
    mount = tmp_path / "tiny"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        if os.environ.get("CI"):
            pytest.fail(f"cannot mount a tmpfs in CI: {done.stderr.decode()}")
        pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def test_a_full_disk_names_the_file_it_was_writing_and_leaves_nothing(spark, warehouse: str, tiny_disk: Path) -> None:
    options = {"warehouse": warehouse, "table": "db.f", "property.write.data.path": str(tiny_disk / "data")}
    spark.createDataFrame([(0, "a")], "id long, v string").write.format("lakesink").options(**options).mode("append").save()
    before = load(warehouse, "db.f").metadata.current_snapshot().snapshot_id
    big = spark.range(20_000).selectExpr("id", "sha2(cast(id as string), 512) as v")  # ~2.5 MB that does not compress
    with pytest.raises(Exception, match=rf"No space left on device \(writing data file {tiny_disk}/data/.*\.parquet; the file system of the table's data location is full"):
        big.coalesce(1).write.format("lakesink").options(**options).mode("append").save()
    assert load(warehouse, "db.f").metadata.current_snapshot().snapshot_id == before
    assert len(list((tiny_disk / "data").glob("*.parquet"))) == 1  # the failed write's files are gone
