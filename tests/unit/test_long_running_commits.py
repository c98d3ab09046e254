"""Commits that stay cheap however long a table lives: table properties, a bounded metadata
log, manifest merging, snapshot expiry and replay detection that survives it.

Driven through the production path without Spark (plan_write -> write_task -> commit_write).
What expiry deleted is checked against pyiceberg's own manifest reader (shares no code with
lakesink): afterwards the files on disk are exactly those the retained snapshots reference.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from lakesink_testing import assert_readers_see, expected_rows, load, table_exists
from pyiceberg.table import Table
from pyspark.sql import types as T

from lakesink_datasource.check import check_table
from lakesink_datasource.commit.committer import CommitOutcome, commit_write
from lakesink_datasource.iceberg.compat import v3_metadata_writes
from lakesink_datasource.iceberg.manifest_list import read_manifest_list
from lakesink_datasource.iceberg.summary_keys import EPOCH_ID
from lakesink_datasource.messages import decode_messages
from lakesink_datasource.options import OptionError, parse_options
from lakesink_datasource.table.setup import plan_write
from lakesink_datasource.write.task import TaskIdentity, write_task

IDENT = "db.t"
SCHEMA = T.StructType([T.StructField("id", T.LongType()), T.StructField("v", T.StringType())])
ARROW = pa.schema([("id", pa.int64()), ("v", pa.string())])
COLUMNS = ["id", "v"]


def _rows(ids: Iterable[int], tag: str = "") -> list[dict]:
    return [{"id": i, "v": f"{tag}{i}"} for i in ids]


def _write(
    warehouse: str, ids: Iterable[int], *, tag: str = "", query: str | None = None, batch: int | None = None, **options: str
) -> CommitOutcome:
    raw = {"table": IDENT, "warehouse": warehouse, **options}
    # Commits alone, no maintenance: no compaction carried by the task either.
    plan = msgspec.structs.replace(plan_write(parse_options(raw), SCHEMA, overwrite=False), compaction=None)
    rows = _rows(ids, tag)
    message = write_task(plan, iter([pa.RecordBatch.from_pylist(rows, schema=ARROW)]), TaskIdentity(batch_id=batch, query_id=query))
    return commit_write(plan, decode_messages([message]), batch)


def _local(path: str) -> str:
    return path.removeprefix("file://")


def _files_on_disk(table: Table) -> set[str]:
    """Data, delete, manifest and manifest-list files under the table's location."""
    root = Path(_local(table.metadata.location))
    return {str(p) for p in root.rglob("*") if p.is_file() and p.suffix in (".parquet", ".puffin", ".avro")}


def _referenced_by_pyiceberg(table: Table) -> set[str]:
    """Everything the table's snapshots reference, read with pyiceberg's own manifest reader."""
    out: set[str] = set()
    for snapshot in table.metadata.snapshots:
        out.add(_local(snapshot.manifest_list))
        for manifest in snapshot.manifests(table.io):
            out.add(_local(manifest.manifest_path))
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
                out.add(_local(entry.data_file.file_path))
    return out


# --- table properties --------------------------------------------------------------------------


def test_created_tables_delete_old_metadata_and_take_property_options(warehouse: str) -> None:
    _write(warehouse, range(5), **{"property.write.parquet.compression-codec": "snappy", "property.commit.retry.num-retries": "7"})
    table = load(warehouse, IDENT)
    assert table.metadata.properties["write.metadata.delete-after-commit.enabled"] == "true"
    assert table.metadata.properties["commit.retry.num-retries"] == "7"
    assert table.metadata.properties["write.parquet.compression-codec"] == "snappy"
    [task] = table.scan().plan_files()
    parquet = pq.ParquetFile(_local(task.file.file_path))
    assert parquet.metadata.row_group(0).column(0).compression == "SNAPPY"


def test_a_property_option_reaches_an_existing_table_with_the_next_commit(warehouse: str) -> None:
    _write(warehouse, range(5))
    before = load(warehouse, IDENT)
    assert "write.target-file-size-bytes" not in before.metadata.properties
    outcome = _write(warehouse, range(5, 10), **{"property.write.target-file-size-bytes": "4096"})
    after = load(warehouse, IDENT)
    # Set by the very commit that wrote the batch: no metadata version in between.
    assert after.metadata.properties["write.target-file-size-bytes"] == "4096"
    assert after.metadata.current_snapshot().snapshot_id == outcome.snapshot_id  # type: ignore[union-attr]
    assert [e.metadata_file for e in after.metadata.metadata_log][-1] == before.metadata_location
    # And the batch was written with it: the same target as the option target_file_size_bytes.
    big = _write(warehouse, range(10_000, 30_000), tag="x" * 40)
    files = [f for f in load(warehouse, IDENT).scan().plan_files() if f.file.record_count > 5]
    assert big.snapshot_id is not None and len(files) > 10
    assert all(f.file.file_size_in_bytes < 3 * 4096 for f in files)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"property.commit.retry.num-retries": "many"}, "option 'property.commit.retry.num-retries'"),
        ({"property.write.parquet.compression-codec": "lzo"}, "must be one of zstd, snappy"),
        ({"property.commit.manifest-merge.enabled": "yes"}, "must be true or false"),
        ({"maintenance": "sometimes"}, "option 'maintenance' must be one of auto, background, off"),
        ({"property.": "x"}, "needs a table property name"),
    ],
)
def test_bad_properties_and_maintenance_values_are_refused_before_anything_is_written(
    warehouse: str, options: dict[str, str], message: str
) -> None:
    with pytest.raises(OptionError, match=message):
        _write(warehouse, range(3), **options)
    assert not table_exists(warehouse, IDENT)


def test_a_bad_property_already_on_the_table_is_named_before_writing(warehouse: str) -> None:
    _write(warehouse, range(3), **{"property.write.parquet.compression-level": "3"})
    table = load(warehouse, IDENT)
    with v3_metadata_writes(), table.transaction() as tx:  # another engine sets a value lakesink cannot use
        tx.set_properties({"write.parquet.compression-level": "high"})
    before = load(warehouse, IDENT).metadata.current_snapshot()
    with pytest.raises(OptionError, match=r"'write.parquet.compression-level'.*property.write.parquet.compression-level="):
        _write(warehouse, range(3, 6))
    assert load(warehouse, IDENT).metadata.current_snapshot() == before


# --- metadata log and manifests ----------------------------------------------------------------


def test_metadata_log_is_bounded_and_dropped_metadata_files_are_deleted(warehouse: str) -> None:
    for i in range(12):
        _write(warehouse, range(i * 10, i * 10 + 3), **{"property.write.metadata.previous-versions-max": "3"})
    table = load(warehouse, IDENT)
    assert len(table.metadata.metadata_log) == 3
    on_disk = sorted(Path(_local(table.metadata.location), "metadata").glob("*.metadata.json"))
    expected = {_local(e.metadata_file) for e in table.metadata.metadata_log} | {_local(table.metadata_location)}
    assert {str(p) for p in on_disk} == expected
    assert_readers_see(warehouse, IDENT, expected_rows([r for i in range(12) for r in _rows(range(i * 10, i * 10 + 3))], COLUMNS), COLUMNS)


def test_manifests_are_merged_once_enough_accumulate(warehouse: str) -> None:
    every: list[dict] = []
    counts = []
    for i in range(14):
        _write(warehouse, range(i * 10, i * 10 + 4), **{"property.commit.manifest.min-count-to-merge": "4"})
        every += _rows(range(i * 10, i * 10 + 4))
        table = load(warehouse, IDENT)
        counts.append(len(read_manifest_list(table.io, table.metadata.current_snapshot().manifest_list)))  # type: ignore[union-attr]
    # Java's rule: the bin holding the new manifest merges once it has min-count manifests.
    assert max(counts) <= 4 and counts[:4] == [1, 2, 3, 1]
    table = load(warehouse, IDENT)
    assert_readers_see(warehouse, IDENT, expected_rows(every, COLUMNS), COLUMNS)
    assert check_table(table) == []


def test_manifest_merging_can_be_switched_off(warehouse: str) -> None:
    for i in range(6):
        _write(warehouse, range(i, i + 1), **{"property.commit.manifest-merge.enabled": "false", "property.commit.manifest.min-count-to-merge": "2"})
    table = load(warehouse, IDENT)
    assert len(read_manifest_list(table.io, table.metadata.current_snapshot().manifest_list)) == 6  # type: ignore[union-attr]


# --- snapshot expiry -----------------------------------------------------------------------------


def test_expiry_keeps_rows_and_deletes_exactly_the_files_only_expired_snapshots_referenced(warehouse: str) -> None:
    keep_all = {"property.history.expire.min-snapshots-to-keep": "1"}
    every: list[dict] = []
    for i in range(6):
        _write(warehouse, range(i * 10, i * 10 + 5), **keep_all)
        every += _rows(range(i * 10, i * 10 + 5))
    # An overwrite-style history: a keyed rewrite would remove files; here an upsert does.
    for i in range(3):
        _write(warehouse, range(0, 5), tag=f"u{i}-", operation="upsert", primary_key="id", index_dir=f"{warehouse}/idx")
    live = {r["id"]: r for r in every}
    live.update({r["id"]: r for r in _rows(range(0, 5), "u2-")})
    before = load(warehouse, IDENT)
    assert _files_on_disk(before) == _referenced_by_pyiceberg(before)  # nothing stray so far
    snapshots_before = len(before.metadata.snapshots)

    # The next commit expires everything but itself (age 0, keep 1).
    _write(warehouse, range(100, 102), operation="upsert", primary_key="id", index_dir=f"{warehouse}/idx",
           **{"property.history.expire.max-snapshot-age-ms": "0"})
    live.update({r["id"]: r for r in _rows(range(100, 102))})
    after = load(warehouse, IDENT)
    assert len(after.metadata.snapshots) == 1 and snapshots_before == 9
    assert _files_on_disk(after) == _referenced_by_pyiceberg(after)
    assert_readers_see(warehouse, IDENT, expected_rows(list(live.values()), COLUMNS), COLUMNS)
    assert check_table(after) == []


def test_maintenance_off_expires_nothing(warehouse: str) -> None:
    for i in range(4):
        _write(warehouse, range(i, i + 1), maintenance="off", **{"property.history.expire.max-snapshot-age-ms": "0"})
    assert len(load(warehouse, IDENT).metadata.snapshots) == 4


def test_a_replayed_batch_is_recognised_after_its_snapshot_expired(warehouse: str) -> None:
    _write(warehouse, range(0, 3), query="q", batch=0)
    _write(warehouse, range(3, 6), query="q", batch=1)
    # Another writer commits and expires the stream's snapshots (keep 1, age 0).
    _write(warehouse, range(6, 9), **{"property.history.expire.max-snapshot-age-ms": "0"})
    table = load(warehouse, IDENT)
    assert [s.summary.get(EPOCH_ID) for s in table.metadata.snapshots] == [None]  # type: ignore[union-attr]
    # Spark replays batch 1 (its commit landed, its checkpoint did not record it).
    outcome = _write(warehouse, range(3, 6), query="q", batch=1)
    assert outcome.skipped_reason == "already committed"
    outcome = _write(warehouse, range(9, 12), query="q", batch=2)
    assert outcome.snapshot_id is not None
    assert_readers_see(warehouse, IDENT, expected_rows(_rows(range(12)), COLUMNS), COLUMNS)


def test_expiry_of_the_index_state_does_not_rebuild_the_key_index(warehouse: str, caplog: pytest.LogCaptureFixture) -> None:
    keyed = {"operation": "upsert", "primary_key": "id", "index_dir": f"{warehouse}/idx", "property.history.expire.max-snapshot-age-ms": "0"}
    _write(warehouse, range(0, 50), **keyed)
    caplog.set_level("INFO", logger="lakesink")
    caplog.clear()
    for i in range(4):  # each commit expires its parent, the snapshot the index last saw
        _write(warehouse, range(i, i + 10), tag=f"b{i}-", **keyed)
    assert not [r for r in caplog.records if "rebuilt key index" in r.getMessage()]
    live = {r["id"]: r for r in _rows(range(0, 50))}
    for i in range(4):
        live.update({r["id"]: r for r in _rows(range(i, i + 10), f"b{i}-")})
    assert_readers_see(warehouse, IDENT, expected_rows(list(live.values()), COLUMNS), COLUMNS)


def test_metadata_json_stays_small_with_short_retention(warehouse: str) -> None:
    props = {"property.history.expire.max-snapshot-age-ms": "0", "property.write.metadata.previous-versions-max": "5"}
    sizes = []
    for i in range(40):
        _write(warehouse, range(i, i + 1), query="q", batch=i, **props)
        sizes.append(os.path.getsize(_local(load(warehouse, IDENT).metadata_location)))
    assert max(sizes[20:]) <= max(sizes[:5]) + 1024  # flat: one property per query, one snapshot
    meta = json.loads(Path(_local(load(warehouse, IDENT).metadata_location)).read_text())
    assert len(meta["snapshots"]) == 1 and len(meta["metadata-log"]) == 5
