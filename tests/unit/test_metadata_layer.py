"""Spec conformance of lakesink's metadata layer, on real files, without Spark or mocks.

Every write goes through the production path (plan_write -> write_task -> commit_write,
or SnapshotProducer for hand-built deletion vectors). The files it leaves are then read
three ways that share no code with lakesink's writers:

* a minimal Avro decoder below, driven only by the schema embedded in each file (so a
  field written under the wrong name, id or value shows up as written);
* pyiceberg's scan (and StaticTable), which applies DVs with its own reader;
* DuckDB's iceberg extension, whose `_row_id` / `_last_updated_sequence_number`
  columns expose the row-lineage values a reader derives from the metadata.

The facts asserted are the ones readers depend on (docs/format.md, after the Iceberg and
Puffin specs); `check_table` is run after each scenario as the last line of defence.
"""

from __future__ import annotations

import json
import os
import struct
import sys
import zlib
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from lakesink_testing import assert_readers_see, duckdb_connection, embedded_catalog, expected_rows, load
from pyiceberg.table import StaticTable, Table
from pyiceberg.table.snapshots import Snapshot
from pyiceberg.table.update import AddSnapshotUpdate, AssertRefSnapshotId, SetSnapshotRefUpdate
from pyroaring import BitMap64
from pyspark.sql import types as T

from lakesink_datasource.check import check_table
from lakesink_datasource.commit.committer import CommitOutcome, abort_write, commit_write
from lakesink_datasource.commit.data_files import data_file
from lakesink_datasource.commit.deletion_vectors import PendingDeletes
from lakesink_datasource.commit.snapshot_producer import RowDelta, SnapshotProducer
from lakesink_datasource.iceberg.compat import v3_metadata_writes
from lakesink_datasource.iceberg.partition_key import decode_partition
from lakesink_datasource.iceberg.summary_keys import EPOCH_ID, QUERY_ID
from lakesink_datasource.messages import (
    DataFileMessage,
    LakeSinkCommitMessage,
    TaskResult,
    decode_messages,
)
from lakesink_datasource.options import parse_options
from lakesink_datasource.table import metadata_cache
from lakesink_datasource.table.plan import WritePlan
from lakesink_datasource.table.setup import plan_write
from lakesink_datasource.write.task import TaskIdentity, write_task

IDENT = "db.t"
COLUMNS = ["id", "v"]
SPARK_SCHEMA = T.StructType([T.StructField("id", T.LongType()), T.StructField("v", T.StringType())])
ARROW_SCHEMA = pa.schema([("id", pa.int64()), ("v", pa.string())])


# --- an independent Avro reader ------------------------------------------------------------
# Deliberately naive: it decodes whatever the file's own writer schema says (Avro spec
# 1.11 binary encoding, null/deflate codecs), so nothing of lakesink's or pyiceberg's
# read-side schema resolution can hide a field that was written wrongly.


class _Cursor:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def take(self, n: int) -> bytes:
        out = self.data[self.pos : self.pos + n]
        assert len(out) == n, "truncated Avro data"
        self.pos += n
        return out

    def long(self) -> int:  # zig-zag varint
        shift = acc = 0
        while True:
            byte = self.data[self.pos]
            self.pos += 1
            acc |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                return (acc >> 1) ^ -(acc & 1)


def _decode(schema: Any, cur: _Cursor, named: dict[str, Any]) -> Any:
    if isinstance(schema, list):  # union: branch index, then the value
        return _decode(schema[cur.long()], cur, named)
    if isinstance(schema, str):
        if schema in named:
            return _decode(named[schema], cur, named)
        schema = {"type": schema}
    kind = schema["type"]
    if isinstance(kind, (list, dict)):
        return _decode(kind, cur, named)
    if kind == "null":
        return None
    if kind == "boolean":
        return cur.take(1) != b"\0"
    if kind in ("int", "long"):
        return cur.long()
    if kind == "float":
        return struct.unpack("<f", cur.take(4))[0]
    if kind == "double":
        return struct.unpack("<d", cur.take(8))[0]
    if kind == "bytes":
        return cur.take(cur.long())
    if kind == "string":
        return cur.take(cur.long()).decode()
    if kind == "fixed":
        named[schema["name"]] = schema
        return cur.take(schema["size"])
    if kind == "enum":
        named[schema["name"]] = schema
        return schema["symbols"][cur.long()]
    if kind == "record":
        named[schema["name"]] = schema
        return {f["name"]: _decode(f["type"], cur, named) for f in schema["fields"]}
    if kind in ("array", "map"):
        out: Any = [] if kind == "array" else {}
        while (count := cur.long()) != 0:
            if count < 0:  # negative block count is followed by the block's byte size
                count = -count
                cur.long()
            for _ in range(count):
                if kind == "array":
                    out.append(_decode(schema["items"], cur, named))
                else:
                    key = cur.take(cur.long()).decode()
                    out[key] = _decode(schema["values"], cur, named)
        return out
    raise AssertionError(f"unexpected Avro type {kind!r}")


class AvroContents(msgspec.Struct):
    meta: dict[str, str]  # the file's key-value metadata (avro.schema excluded)
    schema: dict[str, Any]  # the writer schema
    records: list[dict[str, Any]]


def read_avro(location: str) -> AvroContents:
    cur = _Cursor(Path(_local(location)).read_bytes())
    assert cur.take(4) == b"Obj\x01", "not an Avro object container file"
    raw_meta = _decode({"type": "map", "values": "bytes"}, cur, {})
    sync = cur.take(16)
    schema = json.loads(raw_meta.pop("avro.schema"))
    codec = raw_meta.get("avro.codec", b"null").decode()
    records = []
    while cur.pos < len(cur.data):
        count, size = cur.long(), cur.long()
        block = cur.take(size)
        if codec == "deflate":
            block = zlib.decompress(block, -15)  # Avro's deflate is raw RFC 1951
        else:
            assert codec == "null", codec
        inner = _Cursor(block)
        records.extend(_decode(schema, inner, {}) for _ in range(count))
        assert cur.take(16) == sync, "bad Avro sync marker"
    return AvroContents({k: v.decode() for k, v in raw_meta.items()}, schema, records)


def field_ids(schema: dict[str, Any], record: str | None = None) -> dict[str, int]:
    """name -> field-id of the top-level record's fields, or of the nested record `record`."""
    if record is not None:
        for f in schema["fields"]:
            branches = f["type"] if isinstance(f["type"], list) else [f["type"]]
            for b in branches:
                if isinstance(b, dict) and b.get("type") == "record" and b["name"] == record:
                    return field_ids(b)
        raise AssertionError(f"no nested record {record}")
    return {f["name"]: f["field-id"] for f in schema["fields"]}


# --- driving writes ------------------------------------------------------------------------


def _local(uri: str) -> str:
    return uri.removeprefix("file://")


def _records(ids: range) -> list[dict[str, Any]]:
    return [{"id": i, "v": f"v{i}"} for i in ids]


def _batch(ids: range) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(_records(ids), schema=ARROW_SCHEMA)


def _plan(wh: str, *, fv: int = 3, overwrite: bool = False) -> WritePlan:
    opts = parse_options({"table": IDENT, "warehouse": wh, "partition_by": "bucket(4, id)", "format_version": str(fv)})
    return plan_write(opts, SPARK_SCHEMA, overwrite=overwrite)


def _task(plan: WritePlan, ids: range, query_id: str | None = None, batch_id: int | None = None, partition_id: int = 0) -> list[TaskResult]:
    msg = write_task(plan, iter([_batch(ids)]), who=TaskIdentity(partition_id=partition_id, batch_id=batch_id, query_id=query_id))
    return decode_messages([msg])


def _write(
    wh: str, ids: range, *, fv: int = 3, overwrite: bool = False, query_id: str | None = None, batch_id: int | None = None
) -> tuple[WritePlan, list[TaskResult], CommitOutcome]:
    plan = _plan(wh, fv=fv, overwrite=overwrite)
    results = _task(plan, ids, query_id, batch_id)
    outcome = commit_write(plan, results, batch_id)
    return plan, results, outcome


def _metadata_json(table: Table) -> dict[str, Any]:
    return json.loads(Path(_local(table.metadata_location)).read_text())


def _data_files(table: Table) -> set[str]:
    root = Path(_local(table.metadata.location)) / "data"
    return {str(p) for p in root.rglob("*.parquet")}


def _inherited_row_ids(manifest_record: dict[str, Any]) -> dict[str, int]:
    """file path -> first row id, derived from raw Avro as a reader must (spec "Row
    Lineage"): explicit values win, null ones get the manifest's first_row_id plus the
    record counts of the earlier null ones; DELETED entries are skipped (Java)."""
    out, next_id = {}, manifest_record["first_row_id"]
    for e in read_avro(manifest_record["manifest_path"]).records:
        f = e["data_file"]
        if e["status"] == 2:
            continue
        if f["first_row_id"] is not None:
            out[f["file_path"]] = f["first_row_id"]
        elif next_id is not None:
            out[f["file_path"]] = next_id
            next_id += f["record_count"]
    return out


def _duckdb_lineage(table: Table) -> list[tuple[str, int, int, int, int]]:
    """(filename, file_row_number, _row_id, _last_updated_sequence_number, id) per row, by DuckDB."""
    con = duckdb_connection()
    return con.execute(
        "SELECT filename, file_row_number, _row_id, _last_updated_sequence_number, id "
        f"FROM iceberg_scan('{table.metadata_location}')"
    ).fetchall()


def _commit_delta(
    wh: str, delta: RowDelta, extra: dict[str, str] | None = None, producer_class: type[SnapshotProducer] = SnapshotProducer
) -> Snapshot:
    """Commit a hand-built RowDelta the way commit_write does (CAS on main), single attempt."""
    table = load(wh, IDENT)
    producer = producer_class(table.io, table.metadata, delta)
    snapshot = producer.produce(table.metadata, 0, extra or {})
    parent = table.metadata.current_snapshot()
    with v3_metadata_writes():  # pyiceberg writes v3 metadata only inside lakesink's scope
        table.catalog.commit_table(
            table,
            requirements=(AssertRefSnapshotId(ref="main", snapshot_id=parent.snapshot_id if parent else None),),
            updates=(
                AddSnapshotUpdate(snapshot=snapshot),
                SetSnapshotRefUpdate(ref_name="main", type="branch", snapshot_id=snapshot.snapshot_id),
            ),
        )
    return snapshot


# --- v3 appends: row lineage and the fields readers need ---------------------------------------


def test_v3_appends_carry_row_lineage_and_spec_metadata(warehouse: str) -> None:
    sizes = [5, 7, 11]
    starts = [0, 100, 200]
    written: list[dict[str, Any]] = []
    for epoch, (start, n) in enumerate(zip(starts, sizes)):
        _write(warehouse, range(start, start + n), query_id="q-lineage", batch_id=epoch)
        written += _records(range(start, start + n))
    table = load(warehouse, IDENT)
    meta = _metadata_json(table)

    # Table metadata JSON: next-row-id is every row ever added; each snapshot's range
    # starts where the previous one ended and spans exactly its added rows.
    assert meta["format-version"] == 3
    assert meta["next-row-id"] == sum(sizes)
    snaps = meta["snapshots"]
    assert [(s["first-row-id"], s["added-rows"]) for s in snaps] == [(0, 5), (5, 7), (12, 11)]
    assert [s["sequence-number"] for s in snaps] == [1, 2, 3]

    for i, snap in enumerate(snaps):
        mlist = read_avro(snap["manifest-list"])
        # Java V3 manifest-list key-value metadata, all strings.
        assert mlist.meta["format-version"] == "3"
        assert mlist.meta["snapshot-id"] == str(snap["snapshot-id"])
        assert mlist.meta["parent-snapshot-id"] == (str(snaps[i - 1]["snapshot-id"]) if i else "null")
        assert mlist.meta["sequence-number"] == str(snap["sequence-number"])
        assert mlist.meta["first-row-id"] == str(snap["first-row-id"])
        assert field_ids(mlist.schema)["first_row_id"] == 520
        assert field_ids(mlist.schema)["content"] == 517
        # Manifests of this and all earlier commits; the one this commit added gets the
        # snapshot's first-row-id, older ones keep the id they were given back then.
        by_snapshot = {m["added_snapshot_id"]: m for m in mlist.records}
        assert len(by_snapshot) == i + 1
        for j in range(i + 1):
            m = by_snapshot[snaps[j]["snapshot-id"]]
            assert m["content"] == 0
            assert m["first_row_id"] == snaps[j]["first-row-id"]
            assert m["sequence_number"] == m["min_sequence_number"] == snaps[j]["sequence-number"]
            assert m["added_rows_count"] == sizes[j] and m["existing_rows_count"] == 0

    current = read_avro(snaps[-1]["manifest-list"]).records
    for m in current:
        manifest = read_avro(m["manifest_path"])
        assert manifest.meta["content"] == "data"
        assert manifest.meta["format-version"] == "3"
        assert manifest.meta["partition-spec-id"] == "0"
        assert json.loads(manifest.meta["partition-spec"]) == [
            {"source-id": 1, "field-id": 1000, "transform": "bucket[4]", "name": "id_bucket"}
        ]
        schema = json.loads(manifest.meta["schema"])
        assert [(f["id"], f["name"], f["type"]) for f in schema["fields"]] == [(1, "id", "long"), (2, "v", "string")]
        ids = field_ids(manifest.schema, "r2")
        assert {k: ids[k] for k in ("content", "first_row_id", "referenced_data_file", "content_offset", "content_size_in_bytes")} == {
            "content": 134, "first_row_id": 142, "referenced_data_file": 143, "content_offset": 144, "content_size_in_bytes": 145,
        }
        assert field_ids(manifest.schema)["sequence_number"] == 3
        for e in manifest.records:
            # New entries inherit sequence numbers and row ids from the manifest list.
            assert e["status"] == 1
            assert e["snapshot_id"] == m["added_snapshot_id"]
            assert e["sequence_number"] is None and e["file_sequence_number"] is None
            assert e["data_file"]["first_row_id"] is None
            assert e["data_file"]["file_format"] == "PARQUET" and e["data_file"]["content"] == 0
        assert sum(e["data_file"]["record_count"] for e in manifest.records) == m["added_rows_count"]

    # DuckDB derives every row's _row_id from the same metadata: ids are exactly
    # 0..total-1, each equal to (inherited file first_row_id + position in file), and
    # each batch's rows fall into its snapshot's range.
    first_ids: dict[str, int] = {}
    seq_of_file: dict[str, int] = {}
    for m in current:
        first_ids.update(_inherited_row_ids(m))
        for e in read_avro(m["manifest_path"]).records:
            seq_of_file[e["data_file"]["file_path"]] = m["sequence_number"]
    lineage = _duckdb_lineage(table)
    assert sorted(r[2] for r in lineage) == list(range(sum(sizes)))
    for filename, pos, row_id, last_seq, key in lineage:
        assert row_id == first_ids[filename] + pos
        assert last_seq == seq_of_file[filename]
        batch = next(k for k, start in enumerate(starts) if start <= key < start + sizes[k])
        assert snaps[batch]["first-row-id"] <= row_id < snaps[batch]["first-row-id"] + sizes[batch]

    static = StaticTable.from_metadata(table.metadata_location)
    assert Counter(tuple(r[c] for c in COLUMNS) for r in static.scan().to_arrow().to_pylist()) == expected_rows(written, COLUMNS)
    assert_readers_see(warehouse, IDENT, expected_rows(written, COLUMNS), COLUMNS)
    assert check_table(table) == []


def test_v2_table_written_by_the_same_path_has_no_row_lineage(warehouse: str) -> None:
    _write(warehouse, range(0, 6), fv=2)
    _write(warehouse, range(10, 13), fv=2)
    table = load(warehouse, IDENT)
    meta = _metadata_json(table)
    assert meta["format-version"] == 2
    assert "next-row-id" not in meta
    for snap in meta["snapshots"]:
        assert "first-row-id" not in snap and "added-rows" not in snap
        mlist = read_avro(snap["manifest-list"])
        assert mlist.meta["format-version"] == "2"
        assert "first-row-id" not in mlist.meta
        # The v2 file schema has no field 520 at all (not merely a null value).
        assert "first_row_id" not in field_ids(mlist.schema)
        for m in mlist.records:
            manifest = read_avro(m["manifest_path"])
            assert manifest.meta["format-version"] == "2" and manifest.meta["content"] == "data"
            assert not {"first_row_id", "referenced_data_file", "content_offset"} & set(field_ids(manifest.schema, "r2"))
    assert_readers_see(warehouse, IDENT, expected_rows(_records(range(0, 6)) + _records(range(10, 13)), COLUMNS), COLUMNS)
    assert check_table(table) == []


# --- overwrite -------------------------------------------------------------------------------


@pytest.mark.parametrize("fv", [3, 2])
def test_overwrite_marks_previous_files_deleted_with_explicit_metadata(warehouse: str, fv: int) -> None:
    _write(warehouse, range(0, 10), fv=fv)
    _write(warehouse, range(10, 16), fv=fv)
    before = load(warehouse, IDENT)
    old_lists = {s.snapshot_id: read_avro(s.manifest_list).records for s in before.metadata.snapshots}
    # What a reader of the old snapshot saw for each file: data seq and (v3) row id.
    old_seq: dict[str, int] = {}
    old_row_id: dict[str, int] = {}
    for m in old_lists[before.metadata.current_snapshot().snapshot_id]:  # type: ignore[union-attr]
        for e in read_avro(m["manifest_path"]).records:
            old_seq[e["data_file"]["file_path"]] = m["sequence_number"]
        if fv == 3:
            old_row_id.update(_inherited_row_ids(m))
    old_summary = before.metadata.current_snapshot().summary  # type: ignore[union-attr]
    old_files = int(old_summary["total-data-files"])  # type: ignore[index]

    _, results, outcome = _write(warehouse, range(100, 104), fv=fv, overwrite=True)
    table = load(warehouse, IDENT)
    snap = table.metadata.current_snapshot()
    assert snap is not None and snap.snapshot_id == outcome.snapshot_id
    summary = snap.summary
    assert summary is not None and summary.operation.value == "overwrite"
    new_files = len(results[0].data_files)
    assert summary["deleted-data-files"] == str(old_files)
    assert summary["deleted-records"] == "16"
    assert summary["added-records"] == "4"
    assert summary["total-records"] == "4"
    assert summary["total-data-files"] == str(new_files)
    assert summary["removed-files-size"] == old_summary["total-files-size"]  # type: ignore[index]

    deleted = [
        (m, e)
        for m in read_avro(snap.manifest_list).records
        for e in read_avro(m["manifest_path"]).records
        if e["status"] == 2
    ]
    assert {e["data_file"]["file_path"] for _, e in deleted} == set(old_seq)
    for m, e in deleted:
        path = e["data_file"]["file_path"]
        # DELETED entries are written in the new snapshot but keep their original data
        # sequence numbers explicitly (spec: "must be explicit for EXISTING/DELETED").
        assert e["snapshot_id"] == snap.snapshot_id
        assert e["sequence_number"] == e["file_sequence_number"] == old_seq[path]
        assert m["content"] == 0 and m["added_snapshot_id"] == snap.snapshot_id
        assert m["deleted_files_count"] == len([x for x in deleted if x[0] is m])
        if fv == 3:
            assert e["data_file"]["first_row_id"] == old_row_id[path]
            assert m["first_row_id"] is not None  # every v3 data manifest gets one

    if fv == 3:
        # The rewritten manifests hold no live rows, so only the new rows are reserved.
        assert snap.first_row_id == 16 and snap.added_rows == 4
        assert table.metadata.next_row_id == 20  # type: ignore[attr-defined]
        assert sorted(r[2] for r in _duckdb_lineage(table)) == [16, 17, 18, 19]
    assert_readers_see(warehouse, IDENT, expected_rows(_records(range(100, 104)), COLUMNS), COLUMNS)
    assert check_table(table) == []


# --- idempotency -----------------------------------------------------------------------------


def test_same_epoch_committed_twice_appends_once(warehouse: str) -> None:
    plan, results, first = _write(warehouse, range(0, 8), query_id="q-idem", batch_id=0)
    assert first.snapshot_id is not None
    # Spark may call commit again for the same epoch after a driver restart.
    second = commit_write(plan, results, 0)
    assert second.snapshot_id is None and second.skipped_reason == "already committed"
    # An older epoch of the same query is also known to be in the table.
    _write(warehouse, range(8, 10), query_id="q-idem", batch_id=1)
    assert commit_write(plan, results, 0).skipped_reason == "already committed"
    table = load(warehouse, IDENT)
    assert len(table.metadata.snapshots) == 2
    assert_readers_see(warehouse, IDENT, expected_rows(_records(range(0, 10)), COLUMNS), COLUMNS)


def test_replayed_epoch_is_skipped_by_tasks_and_commit_despite_an_intervening_writer(warehouse: str) -> None:
    _, stale_results, _ = _write(warehouse, range(0, 8), query_id="q-replay", batch_id=0)
    _write(warehouse, range(50, 53))  # another writer (a batch write) lands in between
    files_before = _data_files(load(warehouse, IDENT))

    # The replayed task is planned on metadata where epoch 0 is an ancestor, not the head.
    plan = _plan(warehouse)
    replay = _task(plan, range(0, 8), "q-replay", 0)
    assert replay[0].skipped and replay[0].data_files == []
    assert _data_files(load(warehouse, IDENT)) == files_before  # the task wrote nothing
    assert commit_write(plan, replay, 0).skipped_reason == "already committed"
    # A commit of the original (pre-replay) task results is skipped as well.
    assert commit_write(plan, stale_results, 0).skipped_reason == "already committed"
    # The next epoch is not mistaken for a replay.
    nxt = _task(plan, range(8, 10), "q-replay", 1)
    assert not nxt[0].skipped and commit_write(plan, nxt, 1).snapshot_id is not None

    table = load(warehouse, IDENT)
    assert [s.summary.get(EPOCH_ID) for s in table.metadata.snapshots] == ["0", None, "1"]  # type: ignore[union-attr]
    assert_readers_see(warehouse, IDENT, expected_rows(_records(range(0, 10)) + _records(range(50, 53)), COLUMNS), COLUMNS)
    assert check_table(table) == []


# --- concurrency ---------------------------------------------------------------------------


def test_pyiceberg_append_between_plan_and_commit_v2(warehouse: str) -> None:
    _write(warehouse, range(0, 4), fv=2)
    plan = _plan(warehouse, fv=2)
    results = _task(plan, range(10, 15))
    # A different engine commits after lakesink planned and its tasks wrote files.
    other = embedded_catalog(warehouse).load_table(IDENT)
    other.append(pa.Table.from_pylist(_records(range(20, 23)), schema=ARROW_SCHEMA))
    theirs = load(warehouse, IDENT).metadata.current_snapshot()
    assert theirs is not None

    outcome = commit_write(plan, results, None)
    table = load(warehouse, IDENT)
    ours = table.metadata.current_snapshot()
    assert ours is not None and ours.snapshot_id == outcome.snapshot_id
    assert ours.parent_snapshot_id == theirs.snapshot_id  # built on top, nothing lost
    assert ours.summary["total-records"] == "12"  # type: ignore[index]
    assert int(ours.summary["total-data-files"]) == int(theirs.summary["total-data-files"]) + len(results[0].data_files)  # type: ignore[index]
    expected = _records(range(0, 4)) + _records(range(10, 15)) + _records(range(20, 23))
    assert_readers_see(warehouse, IDENT, expected_rows(expected, COLUMNS), COLUMNS)
    assert check_table(table) == []


_COMMIT_IN_CHILD = """
import sys, msgspec
from lakesink_datasource.commit.committer import commit_write
from lakesink_datasource.table.plan import WritePlan
from lakesink_datasource.messages import LakeSinkCommitMessage
plan = msgspec.json.decode(open(sys.argv[1], 'rb').read(), type=WritePlan)
results = [LakeSinkCommitMessage(open(sys.argv[2], 'rb').read()).result()]
assert commit_write(plan, results, None).snapshot_id is not None
"""


def test_two_lakesink_writers_planned_together_v3_both_commit_without_row_id_overlap(
    warehouse: str, tmp_path: Path, arm_fault: Callable[..., None]
) -> None:
    _write(warehouse, range(0, 4))
    plan_a, plan_b = _plan(warehouse), _plan(warehouse)
    assert plan_a.metadata_location == plan_b.metadata_location
    results_a = _task(plan_a, range(10, 17))
    results_b = _task(plan_b, range(20, 23), "q-b", 7)
    # Writer A commits from another process exactly while B is between reading the table
    # and its compare-and-swap (the commit's own fault point), so B must lose the race,
    # rebuild its snapshot on A's and retry.
    (tmp_path / "plan_a.json").write_bytes(msgspec.json.encode(plan_a))
    (tmp_path / "result_a.bin").write_bytes(LakeSinkCommitMessage.of(results_a[0]).payload)
    (tmp_path / "child.py").write_text(_COMMIT_IN_CHILD)
    arm_fault({
        "point": "before_commit", "batch": 7, "action": "run", "once": True,
        "command": [sys.executable, str(tmp_path / "child.py"), str(tmp_path / "plan_a.json"), str(tmp_path / "result_a.bin")],
    })
    outcome_b = commit_write(plan_b, results_b, 7)
    assert outcome_b.attempts == 2

    table = load(warehouse, IDENT)
    base, snap_a, snap_b = table.metadata.snapshots
    assert table.metadata.current_snapshot_id == snap_b.snapshot_id == outcome_b.snapshot_id
    assert snap_a.parent_snapshot_id == base.snapshot_id and snap_b.parent_snapshot_id == snap_a.snapshot_id
    assert snap_a.first_row_id == 4 and snap_a.added_rows == 7
    assert snap_b.first_row_id == 11 and snap_b.added_rows == 3
    assert table.metadata.next_row_id == 14  # type: ignore[attr-defined]
    assert snap_b.summary["total-records"] == "14"  # type: ignore[index]
    assert sorted(r[2] for r in _duckdb_lineage(table)) == list(range(14))
    # The lost attempt's manifest list was removed: every list on disk belongs to a snapshot.
    listed = {_local(s.manifest_list) for s in table.metadata.snapshots}
    on_disk = {str(p) for p in Path(_local(table.metadata.location), "metadata").glob("snap-*.avro")}
    assert on_disk == listed
    expected = _records(range(0, 4)) + _records(range(10, 17)) + _records(range(20, 23))
    assert_readers_see(warehouse, IDENT, expected_rows(expected, COLUMNS), COLUMNS)
    assert check_table(table) == []


# --- abort -----------------------------------------------------------------------------------


def test_abort_deletes_files_of_an_uncommitted_write(warehouse: str) -> None:
    plan = _plan(warehouse)
    results = _task(plan, range(0, 9), "q-abort", 0)
    paths = {_local(f.path) for f in results[0].data_files}
    assert paths and all(os.path.exists(p) for p in paths)
    deleted = abort_write(plan, results, 0)
    assert {_local(p) for p in deleted} == paths
    assert not any(os.path.exists(p) for p in paths)
    assert load(warehouse, IDENT).metadata.current_snapshot() is None


@pytest.mark.parametrize("streaming", [True, False])
def test_abort_after_commit_deletes_nothing(warehouse: str, streaming: bool) -> None:
    # Spark can call abort after a commit that actually landed (e.g. the driver died
    # before recording it); deleting then would corrupt the table. A batch write is
    # recognised by its write id, a streaming one also by (query id, epoch).
    query_id, batch_id = ("q-late-abort", 0) if streaming else (None, None)
    plan, results, outcome = _write(warehouse, range(0, 9), query_id=query_id, batch_id=batch_id)
    assert outcome.snapshot_id is not None
    _write(warehouse, range(50, 52))  # the commit is no longer the head
    assert abort_write(plan, results, batch_id) == []
    assert all(os.path.exists(_local(f.path)) for f in results[0].data_files)
    assert_readers_see(warehouse, IDENT, expected_rows(_records(range(0, 9)) + _records(range(50, 52)), COLUMNS), COLUMNS)


# --- metadata cache --------------------------------------------------------------------------


def test_metadata_cache_parses_each_location_once_per_process(warehouse: str) -> None:
    _write(warehouse, range(0, 3))
    plan = _plan(warehouse)
    before = metadata_cache.loads
    first = metadata_cache.load(plan.metadata_location, plan.io_properties)
    # Several tasks of the same batch in this (worker) process reuse the parsed metadata.
    _task(plan, range(10, 12), partition_id=0)
    _task(plan, range(12, 14), partition_id=1)
    assert metadata_cache.load(plan.metadata_location, plan.io_properties) is first
    assert metadata_cache.loads == before + 1


# --- summary keys ----------------------------------------------------------------------------


def test_summary_counters_totals_and_streaming_keys(warehouse: str) -> None:
    _, stream_results, _ = _write(warehouse, range(0, 12), query_id="q-sum", batch_id=3)
    _, batch_results, _ = _write(warehouse, range(20, 25))
    table = load(warehouse, IDENT)
    s1, s2 = (s.summary for s in table.metadata.snapshots)
    assert s1 is not None and s2 is not None

    def on_disk(results: list[TaskResult]) -> int:
        return sum(os.path.getsize(_local(f.path)) for f in results[0].data_files)

    for summary, results, rows in ((s1, stream_results, 12), (s2, batch_results, 5)):
        assert summary.operation.value == "append"
        assert summary["added-data-files"] == str(len(results[0].data_files))
        assert summary["added-records"] == str(rows)
        assert summary["added-files-size"] == str(on_disk(results))
        # Java writes counters only when non-zero.
        assert "deleted-data-files" not in summary.additional_properties
        assert "added-dvs" not in summary.additional_properties
    assert s1[QUERY_ID] == "q-sum" and s1[EPOCH_ID] == "3"
    assert QUERY_ID not in s2.additional_properties and EPOCH_ID not in s2.additional_properties
    assert s2["total-records"] == "17"
    assert s2["total-data-files"] == str(len(stream_results[0].data_files) + len(batch_results[0].data_files))
    assert s2["total-files-size"] == str(on_disk(stream_results) + on_disk(batch_results))
    for key in ("total-delete-files", "total-position-deletes", "total-equality-deletes"):
        assert s2[key] == "0"
    assert check_table(table) == []


# --- deletion vectors ------------------------------------------------------------------------


def _largest_file(results: list[TaskResult]) -> DataFileMessage:
    return max(results[0].data_files, key=lambda f: f.record_count)


def _hide(
    warehouse: str, target: DataFileMessage, positions: list[int], producer_class: type[SnapshotProducer] = SnapshotProducer
) -> Snapshot:
    """Commit a RowDelta hiding `positions` of `target`, as a keyed batch's commit does."""
    table = load(warehouse, IDENT)
    spec = table.metadata.specs()[target.spec_id]
    partition = decode_partition(spec, table.schema(), target.partition)
    pending = {target.path: PendingDeletes(target.spec_id, partition, BitMap64(positions))}
    return _commit_delta(warehouse, RowDelta(position_deletes=pending), producer_class=producer_class)


def _puffin_blobs(path: str) -> tuple[int, list[dict[str, Any]]]:
    """(file size, blob metadata of the footer), parsed here from the Puffin layout itself."""
    data = Path(_local(path)).read_bytes()
    assert data[:4] == data[-4:] == b"PFA1"
    (size,) = struct.unpack("<i", data[-12:-8])
    return len(data), json.loads(data[-12 - size : -12])["blobs"]


def _ids_at(target: DataFileMessage, positions: list[int]) -> set[int]:
    ids = pq.read_table(_local(target.path))["id"].to_pylist()
    return {ids[p] for p in positions}


def _delete_manifests(snapshot: Snapshot) -> list[dict[str, Any]]:
    return [m for m in read_avro(snapshot.manifest_list).records if m["content"] == 1]


def test_deletion_vector_commit_and_replacement(warehouse: str) -> None:
    _, results, _ = _write(warehouse, range(0, 40))
    target = _largest_file(results)
    assert target.record_count >= 4
    table = load(warehouse, IDENT)
    data_manifests = [m["manifest_path"] for m in read_avro(table.metadata.current_snapshot().manifest_list).records]  # type: ignore[union-attr]
    target_entry = next(
        e for e in read_avro(data_manifests[0]).records if e["data_file"]["file_path"] == target.path
    )

    # --- first DV: positions 0 and 2 ---
    snap1 = _hide(warehouse, target, [0, 2])
    table = load(warehouse, IDENT)
    (dm1,) = _delete_manifests(snap1)
    (entry,) = read_avro(dm1["manifest_path"]).records
    f = entry["data_file"]
    puffin_size, (blob1,) = _puffin_blobs(f["file_path"])
    s = snap1.summary
    assert s is not None and s.operation.value == "delete"
    assert (s["added-dvs"], s["added-delete-files"], s["added-position-deletes"]) == ("1", "1", "2")
    assert (s["total-delete-files"], s["total-position-deletes"], s["total-records"]) == ("1", "2", "40")
    assert s["added-files-size"] == str(blob1["length"])  # Java counts a DV by its blob size
    assert "added-records" not in s.additional_properties
    # Row lineage: a DV-only commit reuses the data manifests and adds no row ids.
    assert snap1.first_row_id == 40 and snap1.added_rows == 0
    assert table.metadata.next_row_id == 40  # type: ignore[attr-defined]

    mlist = read_avro(snap1.manifest_list).records
    assert sorted(m["manifest_path"] for m in mlist if m["content"] == 0) == sorted(data_manifests)
    assert dm1["first_row_id"] is None  # row ids are for data manifests only
    assert dm1["added_files_count"] == 1 and dm1["added_rows_count"] == 2  # DV cardinality
    assert dm1["sequence_number"] == snap1.sequence_number
    manifest = read_avro(dm1["manifest_path"])
    assert manifest.meta["content"] == "deletes" and manifest.meta["format-version"] == "3"
    assert entry["status"] == 1 and entry["sequence_number"] is None and entry["file_sequence_number"] is None
    assert f["content"] == 1 and f["file_format"] == "PUFFIN"
    assert f["referenced_data_file"] == target.path
    # The manifest entry and the Puffin footer agree (readers trust one or the other).
    assert (f["content_offset"], f["content_size_in_bytes"]) == (blob1["offset"], blob1["length"])
    assert blob1["properties"] == {"referenced-data-file": target.path, "cardinality": "2"}
    assert f["record_count"] == 2 and f["file_size_in_bytes"] == puffin_size
    assert f["first_row_id"] is None and f["lower_bounds"] is None and f["sort_order_id"] is None
    assert f["partition"] == target_entry["data_file"]["partition"]  # the data file's partition tuple

    gone = _ids_at(target, [0, 2])
    alive = [r for r in _records(range(0, 40)) if r["id"] not in gone]
    assert_readers_see(warehouse, IDENT, expected_rows(alive, COLUMNS), COLUMNS)
    # Deleting rows does not renumber the survivors.
    assert len({r[2] for r in _duckdb_lineage(table)}) == 38
    assert check_table(table) == []

    # --- second DV for the same file: old positions merged with a new one ---
    last = target.record_count - 1
    snap2 = _hide(warehouse, target, [last])  # merged with the live DV: {0, 2, last}
    table = load(warehouse, IDENT)
    s = snap2.summary
    assert s is not None and s.operation.value == "delete"
    assert (s["added-dvs"], s["removed-dvs"], s["added-delete-files"], s["removed-delete-files"]) == ("1", "1", "1", "1")
    assert (s["added-position-deletes"], s["removed-position-deletes"]) == ("3", "2")
    assert (s["total-delete-files"], s["total-position-deletes"]) == ("1", "3")

    entries = [(m, e) for m in _delete_manifests(snap2) for e in read_avro(m["manifest_path"]).records]
    added = [e for _, e in entries if e["status"] == 1]
    removed = [(m, e) for m, e in entries if e["status"] == 2]
    (new,) = added
    assert new["data_file"]["file_path"] != f["file_path"] and new["data_file"]["record_count"] == 3
    ((rm, old),) = removed
    # The replaced DV is written DELETED by the new snapshot with its original sequence
    # numbers explicit and every DV field copied, so readers and cleanup still find it.
    assert old["snapshot_id"] == snap2.snapshot_id
    assert old["sequence_number"] == old["file_sequence_number"] == snap1.sequence_number
    assert old["data_file"]["file_path"] == f["file_path"] and old["data_file"]["file_format"] == "PUFFIN"
    assert (old["data_file"]["referenced_data_file"], old["data_file"]["content_offset"], old["data_file"]["content_size_in_bytes"]) == (
        target.path, blob1["offset"], blob1["length"],
    )
    assert old["data_file"]["record_count"] == 2
    assert rm["first_row_id"] is None and rm["deleted_files_count"] == 1 and rm["added_snapshot_id"] == snap2.snapshot_id

    gone |= _ids_at(target, [last])
    alive = [r for r in _records(range(0, 40)) if r["id"] not in gone]
    assert_readers_see(warehouse, IDENT, expected_rows(alive, COLUMNS), COLUMNS)
    assert check_table(table) == []

    # --- an overwrite removes the live DV together with the data files it applies to ---
    _, _, outcome = _write(warehouse, range(100, 103), overwrite=True)
    table = load(warehouse, IDENT)
    snap3 = table.metadata.current_snapshot()
    assert snap3 is not None and snap3.snapshot_id == outcome.snapshot_id and snap3.summary is not None
    assert (snap3.summary["removed-dvs"], snap3.summary["removed-position-deletes"]) == ("1", "3")
    assert (snap3.summary["total-delete-files"], snap3.summary["total-position-deletes"]) == ("0", "0")
    (dm3,) = _delete_manifests(snap3)
    (dv_entry,) = read_avro(dm3["manifest_path"]).records
    assert dv_entry["status"] == 2 and dv_entry["sequence_number"] == snap2.sequence_number
    assert dv_entry["data_file"]["referenced_data_file"] == target.path
    assert_readers_see(warehouse, IDENT, expected_rows(_records(range(100, 103)), COLUMNS), COLUMNS)
    assert check_table(table) == []


class _NoReplaceProducer(SnapshotProducer):
    """A broken writer: adds a DV without removing the file's live one."""

    def _replaced_dv_targets(self, added_dvs: list) -> set[str]:  # type: ignore[override]
        return set()


def test_check_table_reports_two_live_dvs_for_one_data_file(warehouse: str) -> None:
    _, results, _ = _write(warehouse, range(0, 40))
    target = _largest_file(results)
    load(warehouse, IDENT)
    _hide(warehouse, target, [0])
    _hide(warehouse, target, [1], producer_class=_NoReplaceProducer)
    violations = check_table(load(warehouse, IDENT))
    assert len(violations) == 1, violations
    assert f"data file {target.path} has 2 live DVs" in violations[0]


def test_check_table_reports_summary_totals_that_disagree_with_the_manifests(warehouse: str) -> None:
    _write(warehouse, range(0, 5))
    plan = _plan(warehouse)
    results = _task(plan, range(5, 8))
    table = load(warehouse, IDENT)
    delta = RowDelta(added_data_files=[data_file(m, table.metadata) for m in results[0].data_files])
    snap = _commit_delta(warehouse, delta, extra={"total-records": "999"})
    assert check_table(load(warehouse, IDENT)) == [
        f"snapshot {snap.snapshot_id}: summary total-records=999, live manifests say 8"
    ]


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda m: m.update({"next-row-id": 11}), "table: next-row-id 11 != sum of snapshots' added-rows 12"),
        (lambda m: m["snapshots"][1].update({"first-row-id": 3}), "row-id range [3, 10) overlaps or precedes the range [0, 5)"),
        (lambda m: m["snapshots"][0].pop("first-row-id"), "v3 snapshot lacks first-row-id"),
    ],
    ids=["next-row-id", "overlap", "missing"],
)
def test_check_table_reports_broken_snapshot_row_lineage(
    warehouse: str, tmp_path: Path, mutate: Callable[[dict[str, Any]], None], expected: str
) -> None:
    # Metadata JSON edited the way a buggy writer would have produced it, read back as a
    # StaticTable: proves the lineage checks are not vacuous on otherwise sound files.
    _write(warehouse, range(0, 5))
    _write(warehouse, range(5, 12))
    meta = _metadata_json(load(warehouse, IDENT))
    mutate(meta)
    location = tmp_path / "00009-mutated.metadata.json"
    location.write_text(json.dumps(meta))
    violations = check_table(StaticTable.from_metadata(str(location)))
    assert len(violations) == 1 and expected in violations[0], violations


def test_manifest_merging_leaves_no_file_under_metadata_unreferenced(warehouse: str) -> None:
    """A batch whose commit merges manifests folds its own added manifest into a merged one:
    that added manifest is then named by no manifest list and is deleted with the commit
    (found by issue 44's long run: one leftover per merge, left to orphan removal)."""
    from lakesink_datasource.maintenance.orphans import remove_orphans

    opts = {"table": IDENT, "warehouse": warehouse, "progress": "false", "maintenance": "off",
            "property.commit.manifest.min-count-to-merge": "3"}
    for b in range(12):
        plan = plan_write(parse_options(opts), SPARK_SCHEMA, overwrite=False)
        commit_write(plan, _task(plan, range(b * 10, b * 10 + 10)), None)
    table = load(warehouse, IDENT)
    assert len(table.metadata.snapshots) == 12
    scan = remove_orphans(table, min_age_ms=0, dry_run=True)
    assert scan.orphans == [], scan.orphans
    assert_readers_see(warehouse, IDENT, expected_rows(_records(range(120)), ["id", "v"]), ["id", "v"])
