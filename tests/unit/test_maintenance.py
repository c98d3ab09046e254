"""Maintenance: compaction (row lineage kept, index moved not rebuilt, races dropped),
orphan-file removal, the `maintain` tool, and a long stream whose table stays bounded.

Driven through the production path without Spark (plan_write -> write_task -> commit_write,
then the after-commit maintenance a Spark commit runs). Rows are read back with DuckDB and
pyiceberg; `_row_id` / `_last_updated_sequence_number` with DuckDB's own lineage columns.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterable
from pathlib import Path

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from keyed_model import IDENT as KEYED_IDENT
from keyed_model import Change, Config, Harness, Model, label_batches
from lakesink_testing import assert_readers_see, duckdb_connection, expected_rows, load
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat, ManifestContent, ManifestEntryStatus
from pyiceberg.table import Table
from pyiceberg.typedef import Record
from pyspark.sql import types as T

from lakesink_datasource.check import check_table
from lakesink_datasource.commit.committer import CommitOutcome, commit_write
from lakesink_datasource.commit.snapshot_producer import RowDelta, SnapshotProducer
from lakesink_datasource.commit.swap import PreparedCommit, swap_in
from lakesink_datasource.compaction.rewrite import COMPACTED_PREFIX
from lakesink_datasource.iceberg.live_files import data_entries_changed_by, live_data_files, live_entries, live_position_deletes
from lakesink_datasource.iceberg.manifest_list import read_manifest_list
from lakesink_datasource.iceberg.manifests import content_offset, deleted_data_file
from lakesink_datasource.iceberg.summary_keys import MOVED_DELETES
from lakesink_datasource.index import follow_compaction as fold_module
from lakesink_datasource.index.for_write import index_location
from lakesink_datasource.index.sharded_index import open_sharded
from lakesink_datasource.maintain import main as maintain_main
from lakesink_datasource.maintain import maintain_table
from lakesink_datasource.maintenance.after_batch import land_compaction, maintain_after_commit
from lakesink_datasource.maintenance.compaction import compact
from lakesink_datasource.maintenance.orphans import remove_orphans
from lakesink_datasource.messages import decode_messages
from lakesink_datasource.options import parse_options
from lakesink_datasource.schema.arrow_align import table_arrow_schema
from lakesink_datasource.table.plan import WritePlan
from lakesink_datasource.table.setup import plan_write
from lakesink_datasource.table.tombstone_table import companion_identifier, read_stored
from lakesink_datasource.write.task import TaskIdentity, write_task

IDENT = "db.t"
SCHEMA = T.StructType([T.StructField("id", T.LongType()), T.StructField("v", T.StringType())])
ARROW = pa.schema([("id", pa.int64()), ("v", pa.string())])
COLUMNS = ["id", "v"]
UNLIMITED = 1 << 40


def _rows(ids: Iterable[int], tag: str = "") -> list[dict]:
    return [{"id": i, "v": f"{tag}{i}"} for i in ids]


def _write(warehouse: str, ids: Iterable[int], *, tag: str = "", batch: int | None = None, maintain: bool = False,
           **options: str) -> CommitOutcome:
    raw = {"table": IDENT, "warehouse": warehouse, **options}
    plan = plan_write(parse_options(raw), SCHEMA, overwrite=False)
    if not maintain:
        plan = msgspec.structs.replace(plan, compaction=None)  # no compaction carried by the task either
    message = write_task(plan, iter([pa.RecordBatch.from_pylist(_rows(ids, tag), schema=ARROW)]),
                         TaskIdentity(batch_id=batch, query_id="q" if batch is not None else None))
    if maintain:
        land_compaction(plan, decode_messages([message]), batch)  # as a Spark commit: the tasks' compaction first
    outcome = commit_write(plan, decode_messages([message]), batch)
    if maintain and outcome.snapshot_id is not None:
        maintain_after_commit(plan, outcome.stats.bytes_written, batch, batch_files=outcome.data_files)  # what a Spark commit runs next
    return outcome


def _keyed(warehouse: str, **extra: str) -> dict[str, str]:
    return {"operation": "upsert", "primary_key": "id", "index_dir": f"{warehouse}/idx", "partition_by": "bucket(2, id)", **extra}


def _lineage(table: Table) -> dict[int, tuple[str, int, int]]:
    """id -> (v, _row_id, _last_updated_sequence_number) as DuckDB reads them."""
    got = duckdb_connection().execute(
        f"SELECT id, v, _row_id, _last_updated_sequence_number FROM iceberg_scan('{table.metadata_location}')"
    ).fetchall()
    out = {r[0]: (r[1], r[2], r[3]) for r in got}
    assert len(out) == len(got), "duplicate ids"
    return out


def _local(path: str) -> str:
    return path.removeprefix("file://")


def _files_under(table: Table) -> set[str]:
    return {str(p) for p in Path(_local(table.metadata.location)).rglob("*") if p.is_file()}


def _upsert_history(warehouse: str, batches: int = 6) -> dict[int, dict]:
    """Overlapping upserts: every batch replaces some keys (DVs) and adds new ones."""
    live: dict[int, dict] = {}
    for b in range(batches):
        ids = range(b * 3, b * 3 + 10)
        _write(warehouse, ids, tag=f"b{b}-", batch=b, **_keyed(warehouse))
        live.update({r["id"]: r for r in _rows(ids, f"b{b}-")})
    return live


# --- compaction ----------------------------------------------------------------------------------


def test_compaction_keeps_rows_and_their_lineage_and_removes_the_dvs(warehouse: str) -> None:
    live = _upsert_history(warehouse)
    before = load(warehouse, IDENT)
    lineage = _lineage(before)
    files_before = len(live_data_files(before.io, before.current_snapshot()))
    assert live_position_deletes(before.io, before.current_snapshot())  # the history left DVs

    result = compact(before, budget_bytes=UNLIMITED, tiered=False)

    after = load(warehouse, IDENT)
    assert result.snapshot_id == after.metadata.current_snapshot().snapshot_id  # type: ignore[union-attr]
    assert after.metadata.current_snapshot().summary.operation.value == "replace"  # type: ignore[union-attr]
    files_after = live_data_files(after.io, after.current_snapshot())
    assert len(files_after) == 2 < files_before  # one per bucket
    assert live_position_deletes(after.io, after.current_snapshot()) == {}
    assert _lineage(after) == lineage  # every row keeps its id and last-updated sequence
    assert_readers_see(warehouse, IDENT, expected_rows(live.values(), COLUMNS), COLUMNS)
    assert check_table(after) == []


def test_keyed_writes_after_a_compaction_move_keys_without_rebuilding_the_index(
    warehouse: str, caplog: pytest.LogCaptureFixture
) -> None:
    live = _upsert_history(warehouse)
    compact(load(warehouse, IDENT), budget_bytes=UNLIMITED, tiered=False)
    caplog.set_level("INFO", logger="lakesink")
    caplog.clear()
    lineage = _lineage(load(warehouse, IDENT))
    _write(warehouse, range(0, 30, 2), tag="late-", batch=10, **_keyed(warehouse))
    live.update({r["id"]: r for r in _rows(range(0, 30, 2), "late-")})

    assert not [r for r in caplog.records if "rebuilt key index" in r.getMessage()]
    table = load(warehouse, IDENT)
    assert_readers_see(warehouse, IDENT, expected_rows(live.values(), COLUMNS), COLUMNS)
    after = _lineage(table)
    untouched = [i for i in lineage if i % 2 == 1]
    assert untouched and all(after[i] == lineage[i] for i in untouched)
    # The index forgot the files the compaction removed: it knows exactly the live ones.
    index = open_sharded(index_location(f"{warehouse}/idx", table.metadata, writer="q"))
    assert index.file_count() == len(live_data_files(table.io, table.current_snapshot()))
    # It followed the compaction through row lineage (no key re-read): the untouched keys
    # still reach their rows through the compaction's move maps.
    assert index.moved_rows() > 0
    assert check_table(table) == []


def test_a_compaction_output_compacted_again_adds_no_map_of_its_own(warehouse: str) -> None:
    """No key points at a compaction's output directly (only maps lead there), so when it
    is rewritten in turn, the maps leading into it are re-aimed and it gets none itself:
    the maps grow with the rows batches wrote, not with every rewrite of them."""
    live = _upsert_history(warehouse)
    compact(load(warehouse, IDENT), budget_bytes=UNLIMITED, tiered=False)
    _write(warehouse, range(0, 30, 2), tag="late-", batch=10, **_keyed(warehouse))
    live.update({r["id"]: r for r in _rows(range(0, 30, 2), "late-")})
    table = load(warehouse, IDENT)
    index = open_sharded(index_location(f"{warehouse}/idx", table.metadata, writer="q"))
    moved_once = index.moved_rows()
    assert moved_once > 0

    compact(table, budget_bytes=UNLIMITED, tiered=False)
    removed = data_entries_changed_by(table.io, load(warehouse, IDENT).current_snapshot(), ManifestEntryStatus.DELETED)
    outputs = [e for e in removed if os.path.basename(e.data_file.file_path).startswith(COMPACTED_PREFIX)]
    assert outputs, "the second compaction rewrote the first one's outputs"
    _write(warehouse, range(1, 30, 2), tag="later-", batch=11, **_keyed(warehouse))
    live.update({r["id"]: r for r in _rows(range(1, 30, 2), "later-")})

    written_by_batches = sum(e.data_file.record_count for e in removed if e not in outputs)
    assert 0 < index.moved_rows() <= moved_once + written_by_batches
    assert_readers_see(warehouse, IDENT, expected_rows(live.values(), COLUMNS), COLUMNS)
    assert check_table(load(warehouse, IDENT)) == []


@pytest.mark.parametrize(("trigger", "per_sync"), [("positions", None), ("positions", 1), ("maps", None)],
                         ids=["all-at-once", "one-file-per-sync", "too-many-maps"])
def test_move_maps_are_folded_into_the_keys_once_they_outgrow_the_index(
    warehouse: str, trigger: str, per_sync: int | None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Folding (re-pointing the moved keys at their places, retiring the map entries) is
    what keeps the maps bounded; with a threshold at zero (the positions the maps hold, or
    how many maps there are) every sync folds, all at once or one target file per sync, and
    every later update of moved and unmoved keys still hides the right row until the maps
    are gone."""
    if trigger == "positions":
        monkeypatch.setattr(fold_module, "FOLD_MIN_ROWS", 0)
        monkeypatch.setattr(fold_module, "FOLD_RATIO", 0)
    else:
        monkeypatch.setattr(fold_module, "FOLD_MAX_MAPS", 0)
    if per_sync is not None:
        monkeypatch.setattr(fold_module, "FOLD_BATCH_ROWS", per_sync)
    live = _upsert_history(warehouse)
    compact(load(warehouse, IDENT), budget_bytes=UNLIMITED, tiered=False)  # one file per bucket
    caplog.set_level("INFO", logger="lakesink")
    moved = []
    for b, start in enumerate(range(3)):
        caplog.clear()
        _write(warehouse, range(start, 30, 3), tag=f"late{b}-", batch=10 + b, **_keyed(warehouse))
        live.update({r["id"]: r for r in _rows(range(start, 30, 3), f"late{b}-")})
        assert not [r for r in caplog.records if "rebuilt key index" in r.getMessage()]
        assert_readers_see(warehouse, IDENT, expected_rows(live.values(), COLUMNS), COLUMNS)
        table = load(warehouse, IDENT)
        moved.append(open_sharded(index_location(f"{warehouse}/idx", table.metadata, writer="q")).moved_rows())
    assert check_table(table) == []
    # All at once: gone after the first batch. One file per sync: two target files (one per
    # bucket), so the maps last one batch longer.
    assert moved == ([0, 0, 0] if per_sync is None else [moved[0], 0, 0]) and (per_sync is None or moved[0] > 0), moved


def test_a_compaction_that_loses_the_race_commits_nothing_and_deletes_its_files(warehouse: str) -> None:
    live = _upsert_history(warehouse)
    stale = load(warehouse, IDENT)  # what the compaction reads ...
    _write(warehouse, [1000], batch=20, **_keyed(warehouse))  # ... before another writer commits
    live[1000] = _rows([1000])[0]
    files = _files_under(load(warehouse, IDENT))

    result = compact(stale, budget_bytes=UNLIMITED, tiered=False)

    assert result.snapshot_id is None and result.skipped_reason is not None
    assert _files_under(load(warehouse, IDENT)) == files  # its outputs and manifests are gone
    assert_readers_see(warehouse, IDENT, expected_rows(live.values(), COLUMNS), COLUMNS)


def _compact_in_a_child_killed_at(point: str, warehouse: str, tmp_path: Path) -> None:
    """Compact in a separate process that is SIGKILLed at fault point `point`."""
    faults = tmp_path / "faults.json"
    faults.write_text(json.dumps([{"point": point, "action": "kill"}]))
    script = (
        "import sys; sys.path.insert(0, 'tests'); from lakesink_testing import load; "
        "from lakesink_datasource.maintenance.compaction import compact; "
        f"compact(load({warehouse!r}, {IDENT!r}), budget_bytes=1 << 40, tiered=False)"
    )
    child = subprocess.run([sys.executable, "-c", script], env={**os.environ, "LAKESINK_FAULTS": str(faults)},
                           start_new_session=True, check=False)
    assert child.returncode == -signal.SIGKILL


@pytest.mark.child
def test_a_kill_during_the_rewrite_changes_nothing_and_remove_orphans_collects_the_leftovers(
    warehouse: str, tmp_path: Path
) -> None:
    live = _upsert_history(warehouse)
    files = _files_under(load(warehouse, IDENT))
    _compact_in_a_child_killed_at("compaction_files_written", warehouse, tmp_path)
    table = load(warehouse, IDENT)
    leftovers = _files_under(table) - files
    assert leftovers and all("compacted-" in p for p in leftovers)  # the killed rewrite's files
    assert_readers_see(warehouse, IDENT, expected_rows(live.values(), COLUMNS), COLUMNS)

    young = remove_orphans(table, min_age_ms=3600_000)
    assert young.orphans == [] and young.too_young == len(leftovers)  # in-flight writes are safe
    scan = remove_orphans(table, min_age_ms=0)
    assert set(scan.orphans) == leftovers
    assert _files_under(load(warehouse, IDENT)) == files
    assert_readers_see(warehouse, IDENT, expected_rows(live.values(), COLUMNS), COLUMNS)
    assert check_table(load(warehouse, IDENT)) == []


@pytest.mark.child
def test_a_kill_right_after_the_compaction_commit_loses_nothing(warehouse: str, tmp_path: Path) -> None:
    live = _upsert_history(warehouse)
    _compact_in_a_child_killed_at("after_compaction_commit", warehouse, tmp_path)
    table = load(warehouse, IDENT)
    assert table.metadata.current_snapshot().summary.operation.value == "replace"  # type: ignore[union-attr]
    assert_readers_see(warehouse, IDENT, expected_rows(live.values(), COLUMNS), COLUMNS)
    _write(warehouse, [3], tag="next-", batch=30, **_keyed(warehouse))
    live[3] = _rows([3], "next-")[0]
    assert_readers_see(warehouse, IDENT, expected_rows(live.values(), COLUMNS), COLUMNS)
    assert check_table(load(warehouse, IDENT)) == []
    # Killed before deleting the metadata file that left the log: remove-orphans collects it.
    assert all(p.endswith(".metadata.json") for p in remove_orphans(load(warehouse, IDENT), min_age_ms=0).orphans)


def test_fully_deleted_files_are_dropped_and_dry_run_changes_nothing(warehouse: str) -> None:
    _write(warehouse, range(10), tag="a", **_keyed(warehouse))
    _write(warehouse, range(10), tag="b", **_keyed(warehouse))  # hides every row of the first files
    table = load(warehouse, IDENT)
    dry = compact(table, budget_bytes=UNLIMITED, tiered=False, dry_run=True)
    assert dry.files_dropped == 2 and dry.snapshot_id is None
    assert load(warehouse, IDENT).metadata_location == table.metadata_location
    result = compact(table, budget_bytes=UNLIMITED, tiered=False)
    assert result.files_dropped == 2 and result.files_written == 0
    assert_readers_see(warehouse, IDENT, expected_rows(_rows(range(10), "b"), COLUMNS), COLUMNS)


# --- a compaction while a keyed batch is in flight -------------------------------------------------


def _plan_and_write(warehouse: str, ids: Iterable[int], *, tag: str, batch: int, **options: str) -> tuple[WritePlan, bytes]:
    """The tasks' half of a batch: planned and written, not committed yet."""
    plan = plan_write(parse_options({"table": IDENT, "warehouse": warehouse, **options}), SCHEMA, overwrite=False)
    message = write_task(plan, iter([pa.RecordBatch.from_pylist(_rows(ids, tag), schema=ARROW)]),
                         TaskIdentity(batch_id=batch, query_id="q"))
    return plan, message


def _compact_in_another_process(warehouse: str) -> None:
    script = (
        "import sys; sys.path.insert(0, 'tests'); from lakesink_testing import load; "
        "from lakesink_datasource.maintenance.compaction import compact; "
        f"r = compact(load({warehouse!r}, {IDENT!r}), budget_bytes=1 << 40, tiered=False); "
        "assert r.snapshot_id is not None, r"
    )
    subprocess.run([sys.executable, "-c", script], check=True)


def _rewrite_without_lineage(warehouse: str) -> None:
    """A compaction as an engine that drops row lineage would write it: every live row in
    one new file, in another order, without `_row_id` (new ids are assigned)."""
    table = load(warehouse, IDENT)
    snapshot = table.current_snapshot()
    rows = table.scan().to_arrow().select(COLUMNS).sort_by([("id", "descending")])
    path = f"{table.metadata.location}/data/foreign-rewrite-{uuid.uuid4().hex}.parquet"
    pq.write_table(rows.cast(table_arrow_schema(table.schema())), _local(path))
    added = DataFile.from_args(
        _table_format_version=3, content=DataFileContent.DATA, file_path=path, file_format=FileFormat.PARQUET,
        partition=Record(), record_count=rows.num_rows, file_size_in_bytes=os.path.getsize(_local(path)),
        first_row_id=None, referenced_data_file=None, content_offset=None, content_size_in_bytes=None,
    )
    added.spec_id = 0
    dvs = live_position_deletes(table.io, snapshot)
    rewritten = {
        e.data_file.file_path: (dvs[e.data_file.file_path].data_file.file_path, content_offset(dvs[e.data_file.file_path].data_file))
        if e.data_file.file_path in dvs else None
        for e in live_data_files(table.io, snapshot)
    }
    producer = SnapshotProducer(table.io, table.metadata, RowDelta(added_data_files=[added], rewritten=rewritten))
    swap_in(table, PreparedCommit(table.metadata, producer.produce(table.metadata, 0, {})))
    producer.cleanup(committed_attempt=0)


def test_a_compaction_during_a_keyed_batch_gets_the_batch_deletes_moved_by_row_id(
    warehouse: str, caplog: pytest.LogCaptureFixture
) -> None:
    live = _upsert_history(warehouse)
    lineage = _lineage(load(warehouse, IDENT))
    ids = list(range(0, 30, 2))  # 13 keys the table has, 2 new ones
    plan, message = _plan_and_write(warehouse, ids, tag="late-", batch=10, **_keyed(warehouse))
    _compact_in_another_process(warehouse)  # commits a replace while the batch is in flight
    assert load(warehouse, IDENT).metadata.current_snapshot().summary.operation.value == "replace"  # type: ignore[union-attr]

    outcome = commit_write(plan, decode_messages([message]), 10)

    assert outcome.snapshot_id is not None
    live.update({r["id"]: r for r in _rows(ids, "late-")})
    assert_readers_see(warehouse, IDENT, expected_rows(live.values(), COLUMNS), COLUMNS)
    table = load(warehouse, IDENT)
    replaced = [i for i in ids if i in lineage]
    assert table.metadata.current_snapshot().summary.additional_properties[MOVED_DELETES] == f"{len(replaced)},0,0"  # type: ignore[union-attr]
    after = _lineage(table)
    assert all(after[i] == lineage[i] for i in lineage if i not in ids)  # untouched rows keep their ids
    assert check_table(table) == []
    # The next batch catches the index up from the compaction's files alone.
    caplog.set_level("INFO", logger="lakesink")
    caplog.clear()
    _write(warehouse, range(1, 30, 2), tag="next-", batch=11, **_keyed(warehouse))
    live.update({r["id"]: r for r in _rows(range(1, 30, 2), "next-")})
    assert not [r for r in caplog.records if "rebuilt key index" in r.getMessage()]
    assert_readers_see(warehouse, IDENT, expected_rows(live.values(), COLUMNS), COLUMNS)
    assert check_table(load(warehouse, IDENT)) == []


def test_a_rewrite_without_row_lineage_during_a_keyed_batch_gets_the_deletes_moved_by_key(
    warehouse: str, caplog: pytest.LogCaptureFixture
) -> None:
    keyed = {"operation": "upsert", "primary_key": "id", "index_dir": f"{warehouse}/idx"}
    live: dict[int, dict] = {}
    for b in range(4):
        ids = range(b * 3, b * 3 + 10)
        _write(warehouse, ids, tag=f"b{b}-", batch=b, **keyed)
        live.update({r["id"]: r for r in _rows(ids, f"b{b}-")})
    ids = [0, 5, 11, 12, 20]  # 19 is the highest key: 20 is new
    plan, message = _plan_and_write(warehouse, ids, tag="late-", batch=10, **keyed)
    _rewrite_without_lineage(warehouse)

    commit_write(plan, decode_messages([message]), 10)

    live.update({r["id"]: r for r in _rows(ids, "late-")})
    assert_readers_see(warehouse, IDENT, expected_rows(live.values(), COLUMNS), COLUMNS)
    table = load(warehouse, IDENT)
    assert table.metadata.current_snapshot().summary.additional_properties[MOVED_DELETES] == "0,4,0"  # type: ignore[union-attr]
    assert check_table(table) == []
    caplog.set_level("INFO", logger="lakesink")
    caplog.clear()
    _write(warehouse, [1, 5, 21], tag="next-", batch=11, **keyed)
    live.update({r["id"]: r for r in _rows([1, 5, 21], "next-")})
    assert not [r for r in caplog.records if "rebuilt key index" in r.getMessage()]
    assert_readers_see(warehouse, IDENT, expected_rows(live.values(), COLUMNS), COLUMNS)


def test_format_version_2_keyed_writes_keep_one_position_delete_file_per_data_file_and_compact(warehouse: str) -> None:
    """v2 has no DVs: rows are hidden by file-scoped position-delete files (Parquet), merged
    and replaced like DVs; a compaction in flight moves the batch's deletes by key (v2 has
    no row lineage); compaction leaves no delete file behind."""
    keyed = _keyed(warehouse, format_version="2")
    live = {}
    for b in range(5):
        ids = range(b * 2, b * 2 + 10)  # each batch hides rows of the last two batches' files
        _write(warehouse, ids, tag=f"b{b}-", batch=b, **keyed)
        live.update({r["id"]: r for r in _rows(ids, f"b{b}-")})
    table = load(warehouse, IDENT)
    assert table.metadata.format_version == 2
    deletes = [e.data_file for e in live_entries(table.io, table.current_snapshot(), ManifestContent.DELETES)]
    assert deletes and all(f.file_format == FileFormat.PARQUET for f in deletes)
    targets = [deleted_data_file(f) for f in deletes]
    assert None not in targets and len(set(targets)) == len(targets)  # file-scoped, one per data file
    assert_readers_see(warehouse, IDENT, expected_rows(live.values(), COLUMNS), COLUMNS)
    assert check_table(table) == []

    ids = [0, 3, 9, 13, 20]
    plan, message = _plan_and_write(warehouse, ids, tag="late-", batch=10, **keyed)
    _compact_in_another_process(warehouse)
    commit_write(plan, decode_messages([message]), 10)
    live.update({r["id"]: r for r in _rows(ids, "late-")})
    table = load(warehouse, IDENT)
    assert table.metadata.current_snapshot().summary.additional_properties[MOVED_DELETES] == "0,4,0"  # type: ignore[union-attr]
    assert_readers_see(warehouse, IDENT, expected_rows(live.values(), COLUMNS), COLUMNS)

    compact(table, budget_bytes=UNLIMITED, tiered=False)
    table = load(warehouse, IDENT)
    assert live_entries(table.io, table.current_snapshot(), ManifestContent.DELETES) == []
    assert_readers_see(warehouse, IDENT, expected_rows(live.values(), COLUMNS), COLUMNS)
    assert check_table(table) == []


# --- orphans and the maintain tool --------------------------------------------------------------


def test_remove_orphans_never_touches_a_referenced_file(warehouse: str) -> None:
    live = _upsert_history(warehouse)
    table = load(warehouse, IDENT)
    before = _files_under(table)
    stray = Path(_local(table.metadata.location)) / "data" / "stray.parquet"
    stray.write_bytes(b"not a table file")
    dry = remove_orphans(table, min_age_ms=0, dry_run=True)
    assert dry.orphans == [str(stray)] and stray.exists()
    assert remove_orphans(table, min_age_ms=0).orphans == [str(stray)]
    assert _files_under(load(warehouse, IDENT)) == before
    assert_readers_see(warehouse, IDENT, expected_rows(live.values(), COLUMNS), COLUMNS)


def test_maintain_all_compacts_expires_and_reports(warehouse: str, capsys: pytest.CaptureFixture[str]) -> None:
    live = _upsert_history(warehouse)
    snapshots = len(load(warehouse, IDENT).metadata.snapshots)
    assert maintain_main(["all", IDENT, "--warehouse", warehouse, "--older-than-hours", "0.000001", "--dry-run"]) == 0
    assert len(load(warehouse, IDENT).metadata.snapshots) == snapshots
    assert maintain_main(["all", IDENT, "--warehouse", warehouse, "--older-than-hours", "0.000001"]) == 0
    out = capsys.readouterr().out
    assert "compaction: rewrote" in out and "expiry: expired" in out and "orphans: removed 0" in out
    table = load(warehouse, IDENT)
    assert len(table.metadata.snapshots) == 1
    assert len(live_data_files(table.io, table.current_snapshot())) == 2
    assert_readers_see(warehouse, IDENT, expected_rows(live.values(), COLUMNS), COLUMNS)
    assert check_table(table) == []


def test_maintain_takes_zero_ages_with_a_note_and_a_dry_run_says_what_it_would_do(warehouse: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Zero ages used to be refused ("must be positive"); a dry run printed "would rewrite:
    rewrote 16 files into 0 (0 bytes)"."""
    live = _upsert_history(warehouse)
    snapshots = len(load(warehouse, IDENT).metadata.snapshots)
    assert maintain_main(["all", IDENT, "--warehouse", warehouse, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "compaction: would rewrite " in out and "rewrote" not in out and "into 0 (0 bytes)" not in out
    assert maintain_main(["expire", IDENT, "--warehouse", warehouse, "--older-than-hours", "0"]) == 0
    assert "expires every snapshot but the newest" in capsys.readouterr().err
    assert len(load(warehouse, IDENT).metadata.snapshots) == 1 < snapshots
    assert maintain_main(["remove-orphans", IDENT, "--warehouse", warehouse, "--orphan-min-age-hours", "0"]) == 0
    assert "also removes the files of writes still in flight" in capsys.readouterr().err
    assert_readers_see(warehouse, IDENT, expected_rows(live.values(), COLUMNS), COLUMNS)
    with pytest.raises(SystemExit):
        maintain_main(["expire", IDENT, "--warehouse", warehouse, "--older-than-hours", "-1"])


def test_maintain_names_a_missing_table_and_a_bad_action(warehouse: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert maintain_main(["compact", "db.nope", "--warehouse", warehouse]) == 2
    assert "cannot load table db.nope" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        maintain_main(["sometimes", IDENT, "--warehouse", warehouse])
    _write(warehouse, range(3))
    with pytest.raises(ValueError, match="unknown action"):
        maintain_table(load(warehouse, IDENT), "sometimes")


# --- a long stream ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_long_upsert_stream_keeps_its_table_bounded(warehouse: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """300 micro-batches of upserts over 400 repeating keys, maintenance as a stream runs it,
    retention shortened to zero: metadata, manifests, data files and the key index (its
    compactions' move maps included, folded at a bound lowered to this table's size) stay flat."""
    monkeypatch.setattr(fold_module, "FOLD_MIN_ROWS", 1000)
    keyed = _keyed(
        warehouse,
        **{"property.history.expire.max-snapshot-age-ms": "0", "property.write.metadata.previous-versions-max": "10",
           "property.lakesink.maintenance.compaction-fan-in": "4"},  # the tightest tiers: the bounds below are theirs
    )
    live: dict[int, dict] = {}
    metadata_sizes, live_files, moved = [], [], []
    for b in range(300):
        ids = [(b * 7 + k * 13) % 400 for k in range(20)]
        _write(warehouse, ids, tag=f"b{b}-", batch=b, maintain=True, **keyed)
        live.update({r["id"]: r for r in _rows(ids, f"b{b}-")})
        if b % 50 == 49:
            table = load(warehouse, IDENT)
            metadata_sizes.append(os.path.getsize(_local(table.metadata_location)))
            live_files.append(len(live_data_files(table.io, table.current_snapshot())))
            moved.append(open_sharded(index_location(f"{warehouse}/idx", table.metadata, writer="q")).moved_rows())
    # The index follows the last batch's snapshot (and the compaction landed before it) at its
    # next sync: a batch of no rows, carrying no compaction, brings it there.
    _write(warehouse, [], batch=300, **keyed)
    table = load(warehouse, IDENT)
    metadata_dir = Path(_local(table.metadata.location)) / "metadata"
    manifests = read_manifest_list(table.io, table.current_snapshot().manifest_list)  # type: ignore[union-attr]
    assert max(metadata_sizes) < 16 * 1024 and metadata_sizes[-1] <= metadata_sizes[0] + 2048
    assert len(list(metadata_dir.iterdir())) <= 40  # 10 metadata files + one snapshot's lists and manifests
    assert len(manifests) <= 8
    assert max(live_files) <= 2 * 12 and live_files[-1] <= live_files[0] + 4  # 2 buckets, a few per size class
    assert max(moved) <= 1000, moved
    index = open_sharded(index_location(f"{warehouse}/idx", table.metadata, writer="q"))
    assert index.count() == 400 and index.file_count() == len(live_data_files(table.io, table.current_snapshot()))
    assert_readers_see(warehouse, IDENT, expected_rows(live.values(), COLUMNS), COLUMNS)
    assert check_table(table) == []
    assert remove_orphans(table, min_age_ms=0, dry_run=True).orphans == []  # nothing leaked on the way


# --- tombstones outlive any engine's maintenance ---------------------------------------------------


def _foreign_maintenance(harness: Harness) -> None:
    """What another engine's expire_snapshots (keep the last) and remove_orphan_files do to
    lakesink's tombstones: the snapshots naming them go, without any carrying, and so do
    the files (no snapshot's manifests reference them)."""
    table = harness.table()
    current = table.metadata.current_snapshot()
    assert current is not None
    expired = [s.snapshot_id for s in table.metadata.snapshots if s.snapshot_id != current.snapshot_id]
    swap_in(table, PreparedCommit(table.metadata, None, expired=expired))
    shutil.rmtree(Path(_local(table.metadata.location), "data", "lakesink-tombstones"), ignore_errors=True)


@pytest.mark.parametrize("maintenance", ["lakesink-expiry", "foreign-expiry-and-orphans"])
def test_sequenced_deletes_survive_expiry_orphan_removal_and_an_index_rebuild(maintenance: str) -> None:
    """Deleted keys remember their delete's sequence although every snapshot that recorded
    the delete expired (and, with another engine's maintenance, their files are gone too):
    with the index deleted and rebuilt from the tables, a late change older than the delete
    is still refused, because the deletes are rows of the companion table."""
    config = Config("cdc", "bucket(2, id)", True)
    created = [[[Change(k, "c", seq=10) for k in range(30)]]]
    removed = [[[[Change(k, "d", seq=20)]]] for k in range(20)]  # one batch per delete
    late = [[[Change(k, "u", seq=15) for k in range(30)]]]  # older than every delete
    labelled = label_batches(config, [created, *removed, late])
    with Harness(config) as harness:
        if maintenance == "lakesink-expiry":
            harness.options = msgspec.structs.replace(harness.options, table_properties={"history.expire.max-snapshot-age-ms": "0"})
        model = Model(config)
        for batch_id, batch in enumerate(labelled[:-1]):
            harness.run_batch(batch, batch_id)
            model.apply_batch(batch)
        if maintenance != "lakesink-expiry":
            _foreign_maintenance(harness)
        table = harness.table()
        assert len(table.metadata.snapshots) == 1  # every delete's snapshot expired
        stored = read_stored(table.catalog, KEYED_IDENT)
        assert stored is not None and sorted(stored.column("id").to_pylist()) == list(range(20))
        harness.drop_index()
        harness.run_batch(labelled[-1], len(labelled) - 1)
        model.apply_batch(labelled[-1])
        harness.assert_matches(model.expected(), "after the late batch")
        assert sorted(model.live) == list(range(20, 30))  # the 20 deleted keys stay deleted
        companion = load(harness.warehouse, companion_identifier(KEYED_IDENT))
        assert len(companion.metadata.snapshots) <= 11 and len(live_data_files(companion.io, companion.current_snapshot())) < 8


def test_maintain_expire_stores_the_deletes_of_the_snapshots_it_expires() -> None:
    """Deletes written without the companion (an older lakesink) are stored by `maintain
    expire` before their snapshots go; then another engine's orphan removal cannot hurt."""
    config = Config("cdc", None, True)
    created = [[[Change(k, "c", seq=10) for k in range(5)]]]
    removed = [[[Change(k, "d", seq=20) for k in range(5)]]]
    other = [[[Change(100, "c", seq=30)]]]
    late = [[[Change(k, "u", seq=15) for k in range(5)]]]
    labelled = label_batches(config, [created, removed, other, late])
    with Harness(config) as harness:
        model = Model(config)
        for batch_id, batch in enumerate(labelled[:3]):
            plan = harness.plan()
            messages = [harness.write(plan, task, batch_id, partition_id=i) for i, task in enumerate(batch)]
            commit_write(plan, decode_messages(messages), batch_id)  # no storing: an older writer
            model.apply_batch(batch)
        assert read_stored(harness.table().catalog, KEYED_IDENT) is None
        report = maintain_table(harness.table(), "expire", older_than_ms=1)
        assert report.expiry is not None and report.expiry.expired_snapshots == 2  # the current one stays
        assert any(line.startswith("tombstones: stored 5") for line in report.lines)
        shutil.rmtree(Path(_local(harness.table().metadata.location), "data", "lakesink-tombstones"))
        harness.drop_index()
        harness.run_batch(labelled[3], 3)
        model.apply_batch(labelled[3])
        harness.assert_matches(model.expected(), "after the late batch")
        assert sorted(model.live) == [100]  # every late change was older than its delete
