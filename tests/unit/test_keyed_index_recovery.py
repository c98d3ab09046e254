"""The key index is a cache of the table: losing it, another writer rewriting files,
batches that never commit and retried task attempts must not change what readers see.

Every scenario runs through the production path (plan_write -> write_task per task ->
commit_write, no Spark) against a fresh warehouse + index directory per example, and is
compared after every batch with the reference model of `tests/keyed_model.py` (DuckDB and
pyiceberg see exactly the model's rows; `check_table` reports nothing).
"""

from __future__ import annotations

import glob
import json
import multiprocessing
import os
import shutil
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from typing import NamedTuple

import lmdb
import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context
from hypothesis_profiles import examples
from keyed_model import Change, Config, Harness, Model, in_order_sequences, label_batches, micro_batches, remote_write
from pyiceberg.manifest import ManifestContent
from pyiceberg.schema import Schema
from pyiceberg.table.snapshots import Operation, Snapshot, Summary
from pyiceberg.table.update import AddSnapshotUpdate, AssertRefSnapshotId, SetSnapshotRefUpdate
from pyiceberg.types import LongType, NestedField

from lakesink_datasource.commit.committer import CommitError
from lakesink_datasource.commit.data_files import data_file
from lakesink_datasource.commit.snapshot_producer import new_snapshot_id
from lakesink_datasource.faults import InjectedFault
from lakesink_datasource.iceberg.compat import v3_metadata_writes
from lakesink_datasource.iceberg.live_files import live_data_files, live_position_deletes, read_hidden_positions
from lakesink_datasource.iceberg.manifest_list import ManifestListWriter, read_manifest_list
from lakesink_datasource.iceberg.manifests import data_file_first_row_id, read_entries, referenced_data_file, write_manifest
from lakesink_datasource.iceberg.partition_key import encode_partition
from lakesink_datasource.iceberg.row_lineage import FIELD_ID_KEY, ROW_ID, ROW_ID_FIELD_ID, row_ids
from lakesink_datasource.iceberg.summary import ChangeCounts, build_summary
from lakesink_datasource.index import environment
from lakesink_datasource.index.sharded_index import open_sharded
from lakesink_datasource.io.rolling_writer import PartitionedParquetWriter
from lakesink_datasource.messages import DataFileMessage
from lakesink_datasource.schema.arrow_align import table_arrow_schema

SETTINGS = settings(
    max_examples=examples(8),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
PARTITIONS = st.sampled_from([None, "bucket(4, id)", "days(ts)"])


# Configurations whose results must not depend on the index's history: no sequence, or
# sequences in arrival order (so no tombstone is ever needed to reject a late change).
MUST_PASS = [("upsert", False), ("cdc", False), ("cdc", True), ("dedupe", False)]
MUST_PASS_IDS = [f"{op}-{'inorder-seq' if s else 'noseq'}" for op, s in MUST_PASS]


def _draw_batches(data: st.DataObject, operation: str, sequence: bool, **kwargs: int) -> list:
    batches = data.draw(micro_batches(operation, sequence, **kwargs), label="batches")
    return in_order_sequences(batches) if sequence else batches


# ----------------------------------------------------------------- index deleted


def _run(config: Config, labelled: list, *, drops: list[bool] | None = None) -> list:
    """Run all batches and check each against the model; return what the readers saw
    after each batch. drops: per batch, delete the index directory first (True: as a new
    worker process would see it, False: this process keeps its open LMDB handle)."""
    seen = []
    mode = "kept" if drops is None else "dropped"
    with Harness(config) as harness:
        model = Model(config)
        for batch_id, batch in enumerate(labelled):
            if drops is not None:
                harness.drop_index(new_process=drops[batch_id])
            outcome = harness.run_batch(batch, batch_id)
            model.apply_batch(batch)
            note(f"{mode} index, batch {batch_id}: {outcome.skipped_reason or 'committed'}")
            harness.assert_matches(model.expected(), f"{mode} index, after batch {batch_id}")
            seen.append(harness.readers())
    return seen


@pytest.mark.parametrize(("operation", "sequence"), MUST_PASS, ids=MUST_PASS_IDS)
@SETTINGS
@given(data=st.data())
def test_deleting_the_index_before_every_batch_changes_nothing(operation: str, sequence: bool, data: st.DataObject) -> None:
    """The same batches run twice: once keeping the index, once deleting the index
    directory before every batch (either closing this process's LMDB handle too, like a
    fresh worker process, or keeping it open, like a long-lived worker)."""
    config = Config(operation, data.draw(PARTITIONS, label="partition_by"), sequence)
    labelled = label_batches(config, _draw_batches(data, operation, sequence))
    drops = data.draw(st.lists(st.booleans(), min_size=len(labelled), max_size=len(labelled)), label="new_process")
    kept = _run(config, labelled)
    dropped = _run(config, labelled, drops=drops)
    assert dropped == kept


@SETTINGS
@given(data=st.data())
def test_index_rebuilt_before_every_batch_with_out_of_order_sequences(data: st.DataObject) -> None:
    """Out-of-order sequences, deletes and ties with the index rebuilt from the table
    before every batch: a delete's sequence must survive the rebuild (lakesink persists
    tombstones in Parquet files named in the snapshot summary), so the full model holds."""
    config = Config("cdc", data.draw(PARTITIONS, label="partition_by"), True)
    labelled = label_batches(config, data.draw(micro_batches("cdc", True), label="batches"))
    _run(config, labelled, drops=[True] * len(labelled))


def _late_insert_after_delete(drop_index: bool) -> None:
    config = Config("cdc", None, True)
    batches = [
        [[[Change(1, "c", seq=1), Change(2, "c", seq=1)]]],
        [[[Change(1, "d", seq=5, bare=True)]]],  # hides a live row: this batch commits
        [[[Change(1, "c", seq=3)]]],  # late and older than the delete: must be ignored
    ]
    labelled = label_batches(config, batches)
    with Harness(config) as harness:
        model = Model(config)
        for batch_id, batch in enumerate(labelled):
            if drop_index and batch_id == 2:
                harness.drop_index()
            harness.run_batch(batch, batch_id)
            model.apply_batch(batch)
            harness.assert_matches(model.expected(), f"after batch {batch_id}")
        assert 1 not in model.live


def test_late_change_after_a_delete_is_ignored_while_the_index_lives() -> None:
    _late_insert_after_delete(drop_index=False)


def test_late_change_after_a_delete_is_ignored_after_the_index_is_rebuilt() -> None:
    """The out-of-order-after-delete case across an index rebuild. (It used to resurrect
    the key, when tombstones lived only in the index; they are now persisted.)"""
    _late_insert_after_delete(drop_index=True)


def test_tombstone_of_a_batch_that_commits_nothing_still_rejects_older_changes() -> None:
    config = Config("cdc", None, True)
    batches = [
        [[[Change(5, "d", seq=9, bare=True)]]],  # key 5 absent: no DV, no data file, nothing to commit
        [[[Change(5, "c", seq=3)]]],  # older than the delete: must be ignored
    ]
    labelled = label_batches(config, batches)
    with Harness(config) as harness:
        model = Model(config)
        for batch_id, batch in enumerate(labelled):
            harness.run_batch(batch, batch_id)
            model.apply_batch(batch)
            harness.assert_matches(model.expected(), f"after batch {batch_id}")


def test_tombstone_of_an_absent_key_in_a_batch_that_commits() -> None:
    """Control for the test above: the same delete of an absent key, in a batch that also
    changes another key (so it commits), keeps rejecting the older insert."""
    config = Config("cdc", None, True)
    batches = [
        [[[Change(5, "d", seq=9, bare=True), Change(6, "c", seq=1)]]],
        [[[Change(5, "c", seq=3)]]],
    ]
    labelled = label_batches(config, batches)
    with Harness(config) as harness:
        model = Model(config)
        for batch_id, batch in enumerate(labelled):
            harness.run_batch(batch, batch_id)
            model.apply_batch(batch)
            harness.assert_matches(model.expected(), f"after batch {batch_id}")


# ----------------------------------------------------------------- another writer compacts


def _without_row_id_metrics(message: DataFileMessage) -> DataFileMessage:
    """Readers know `_row_id` by its reserved id; metrics are kept for table columns only."""
    fields = ("column_sizes", "value_counts", "null_value_counts", "nan_value_counts", "lower_bounds", "upper_bounds")
    return msgspec.structs.replace(message, **{f: {k: v for k, v in getattr(message, f).items() if k != ROW_ID_FIELD_ID} for f in fields})


class Rewrite(NamedTuple):
    files: int  # data files the compaction removed
    rows: int  # live rows it wrote into new files (0: every chosen row was hidden)


def compact(harness: Harness, choose: Callable[[int], bool], *, lineage: bool = False) -> Rewrite:
    """A `replace` snapshot by another writer: the chosen live data files (grouped per
    partition) are rewritten into one new file per partition holding only their live rows
    (DV applied, order reversed so no position stays valid), and the old files and their
    DVs become DELETED entries. `lineage`: the rows keep their `_row_id` (as a v3 writer
    must; the index then follows the moves through row ids), else they get new ones (as
    a writer unaware of lineage does; the index re-reads the new files). Returns how many
    data files were rewritten and how many live rows moved."""
    table = harness.table()
    metadata, io = table.metadata, table.io
    parent = metadata.current_snapshot()
    if parent is None:
        return Rewrite(0, 0)
    entries = live_data_files(io, parent)
    chosen = [e for i, e in enumerate(entries) if choose(i)]
    if not chosen:
        return Rewrite(0, 0)
    dvs = live_position_deletes(io, parent)
    schema = metadata.schema()
    arrow_schema = table_arrow_schema(schema)
    write_schema = schema
    if lineage:
        arrow_schema = arrow_schema.append(pa.field(ROW_ID, pa.int64(), metadata={FIELD_ID_KEY: str(ROW_ID_FIELD_ID).encode()}))
        write_schema = Schema(*schema.fields, NestedField(ROW_ID_FIELD_ID, ROW_ID, LongType(), required=False), schema_id=schema.schema_id)
    snapshot_id = new_snapshot_id()
    data_dir = f"{metadata.location.rstrip('/')}/data"
    tag = uuid.uuid4().hex[:8]
    by_partition: dict[tuple, list] = defaultdict(list)
    for e in chosen:
        spec = metadata.specs()[e.data_file.spec_id]
        by_partition[(e.data_file.spec_id, encode_partition(spec, schema, e.data_file.partition))].append(e)

    counts = ChangeCounts()
    added = []
    for (spec_id, key), group in by_partition.items():
        spec = metadata.specs()[spec_id]
        parts = []
        for e in group:
            with io.new_input(e.data_file.file_path).open() as stream:
                rows = pq.read_table(stream)
            ids = row_ids(rows, np.arange(rows.num_rows), data_file_first_row_id(e.data_file))
            dv = dvs.get(e.data_file.file_path)
            if dv is not None:
                deleted = np.fromiter(read_hidden_positions(io, dv.data_file), dtype=np.int64)
                keep = ~np.isin(np.arange(rows.num_rows), deleted)
                rows, ids = rows.filter(pa.array(keep)), ids[keep]
            if lineage:
                rows = rows.drop_columns([c for c in rows.column_names if c == ROW_ID]).append_column(ROW_ID, pa.array(ids))
            parts.append(rows.select(arrow_schema.names).cast(arrow_schema))
        rows = pa.concat_tables(parts)
        rows = rows.take(pa.array(np.arange(rows.num_rows)[::-1]))
        if rows.num_rows:
            writer = PartitionedParquetWriter(
                io=io, iceberg_schema=write_schema, arrow_schema=arrow_schema, spec_id=spec_id,
                table_properties=metadata.properties,
                path_for=lambda k, n, spec=spec: f"{data_dir}/compacted-{tag}-{len(added)}-{n}.parquet",
            )
            writer.write(key, rows)
            for msg in writer.close():
                f = data_file(_without_row_id_metrics(msg), metadata)
                added.append(f)
                counts.add(f, spec.partition_to_path(f.partition, schema))
        for e in group:
            counts.remove(e.data_file, spec.partition_to_path(e.data_file.partition, schema))

    removed_paths = {e.data_file.file_path for e in chosen}
    metadata_dir = f"{metadata.location.rstrip('/')}/metadata"
    manifests = []
    if added:
        manifests.append(
            write_manifest(
                io, f"{metadata_dir}/compact-{tag}-added.avro", spec=metadata.spec(), schema=schema,
                snapshot_id=snapshot_id, format_version=metadata.format_version, content=ManifestContent.DATA, added=added,
            )
        )
    for n, manifest in enumerate(read_manifest_list(io, parent.manifest_list)):
        live = read_entries(io, manifest)
        if manifest.content == ManifestContent.DATA:
            gone = [e for e in live if e.data_file.file_path in removed_paths]
        else:
            gone = [e for e in live if referenced_data_file(e.data_file) in removed_paths]
        if not gone:
            manifests.append(manifest)
            continue
        if manifest.content == ManifestContent.DELETES:
            for e in gone:
                spec = metadata.specs()[manifest.partition_spec_id]
                counts.remove(e.data_file, spec.partition_to_path(e.data_file.partition, schema))
        manifests.append(
            write_manifest(
                io, f"{metadata_dir}/compact-{tag}-r{n}.avro", spec=metadata.specs()[manifest.partition_spec_id],
                schema=schema, snapshot_id=snapshot_id, format_version=metadata.format_version, content=manifest.content,
                existing=[e for e in live if all(e is not g for g in gone)], deleted=gone,
            )
        )
    sequence_number = metadata.last_sequence_number + 1
    first_row_id = metadata.next_row_id or 0
    list_writer = ManifestListWriter(
        io, f"{metadata_dir}/snap-{snapshot_id}-compact-{tag}.avro", format_version=metadata.format_version,
        snapshot_id=snapshot_id, parent_snapshot_id=parent.snapshot_id, sequence_number=sequence_number,
        first_row_id=first_row_id,
    )
    list_writer.write(manifests)
    previous = parent.summary.additional_properties if parent.summary else None
    snapshot = Snapshot(
        snapshot_id=snapshot_id,
        parent_snapshot_id=parent.snapshot_id,
        sequence_number=sequence_number,
        timestamp_ms=parent.timestamp_ms + 1,
        manifest_list=list_writer.location,
        summary=Summary(Operation.REPLACE, **build_summary(counts, previous, {"engine-name": "compaction-test"})),
        schema_id=metadata.current_schema_id,
        first_row_id=first_row_id,
        added_rows=list_writer.added_rows,
    )
    with v3_metadata_writes():
        table.catalog.commit_table(
            table,
            requirements=(AssertRefSnapshotId(ref="main", snapshot_id=parent.snapshot_id),),
            updates=(
                AddSnapshotUpdate(snapshot=snapshot),
                SetSnapshotRefUpdate(ref_name="main", type="branch", snapshot_id=snapshot.snapshot_id),
            ),
        )
    return Rewrite(len(chosen), sum(f.record_count for f in added))


@pytest.mark.parametrize(("operation", "sequence", "lineage"), [("cdc", True, False), ("upsert", False, False), ("cdc", True, True)],
                         ids=["cdc-seq", "upsert-noseq", "cdc-seq-lineage"])
@SETTINGS
@given(data=st.data())
def test_compaction_by_another_writer_between_batches(operation: str, sequence: bool, lineage: bool, data: st.DataObject) -> None:
    """Before every batch but the first, another writer may rewrite some live data files
    (a `replace` snapshot): the next task's index sync moves the keys of the rewritten files
    (through row lineage when the writer kept it, else by re-reading the new files), and
    later updates and deletes of those keys must hide the rows at their new positions."""
    _compactions_between_batches(Config(operation, data.draw(PARTITIONS, label="partition_by"), sequence), data, lineage)


def _compactions_between_batches(config: Config, data: st.DataObject | None, lineage: bool, batches: list | None = None,
                                 picks: list[list[bool]] | None = None) -> int:
    """The scenario of the test above, drawn from `data` or given (`batches`, `picks`: before
    each batch but the first, which live files, by their manifest order, to rewrite). Returns
    the row positions the index's move maps hold at the end."""
    if batches is None:
        assert data is not None
        batches = data.draw(micro_batches(config.operation, config.sequence, 3, 5), label="batches")
    labelled = label_batches(config, batches)
    if picks is None:
        assert data is not None
        picks = data.draw(st.lists(st.lists(st.booleans(), min_size=1, max_size=6), min_size=len(labelled), max_size=len(labelled)), label="picks")
    with Harness(config) as harness:
        model = Model(config)
        for batch_id, batch in enumerate(labelled):
            rewrite = Rewrite(0, 0)
            if batch_id:
                pick = picks[batch_id]
                rewrite = compact(harness, lambda i, pick=pick: pick[i % len(pick)], lineage=lineage)
                if currently_in_test_context():
                    event("a compaction rewrote data files" if rewrite.files else "nothing to compact")
                    note(f"before batch {batch_id}: rewrote {rewrite.files} data file(s), {rewrite.rows} live row(s)")
                harness.assert_matches(model.expected(), f"after the compaction before batch {batch_id}")
            planned = harness.table().metadata.current_snapshot() if batch_id else None
            outcome = harness.run_batch(batch, batch_id)
            index = open_sharded(harness.index_path())
            # Every task syncs the index to the planned snapshot first, even one that
            # receives no rows.
            state = index.get_state()
            assert state is not None and state.snapshot_id == (planned and planned.snapshot_id)
            moved = index.moved_rows()
            if lineage and rewrite.rows:
                # The index followed the rewrite through row ids (move maps), no key re-read.
                # (A rewrite of rows that were all hidden moves none: its maps, with no live
                # entry, are dropped, which is what the draw of issue 32 hit.)
                assert moved > 0, f"{rewrite}: no move map"
            model.apply_batch(batch)
            harness.assert_matches(model.expected(), f"after batch {batch_id}: {outcome.skipped_reason or 'committed'}")
    return moved


def test_a_compaction_of_hidden_rows_only_leaves_no_move_map() -> None:
    """The regression of a falsifying example (issue 32): cdc with sequences, then a batch
    whose three tasks receive no rows after another writer compacted a file whose only
    row a delete had hidden. The tasks still sync the index; no live row moved, so no map
    is kept (the earlier assertion `moved_rows() > 0` was wrong for this draw)."""
    batches = [
        [[[Change(1, "c", seq=1)]]],
        [[[Change(1, "d", seq=5)]]],  # hides the only row of the first file
        [[[]], [[]], [[]]],
    ]
    assert _compactions_between_batches(Config("cdc", None, True), None, lineage=True, batches=batches, picks=[[True]] * 3) == 0


def test_compaction_then_updates_and_deletes_of_rewritten_keys(caplog: pytest.LogCaptureFixture) -> None:
    """A fixed scenario: another writer's `replace` compacts every file (and DV) away, then
    every key is updated or deleted; after a second compaction, late changes older than
    those deletes are still ignored. The index follows each replace by moving the keys of
    the new files, without rebuilding from the table."""
    config = Config("cdc", "bucket(4, id)", True)
    first = [[[Change(k, "c", seq=1, day=k % 3) for k in range(12)]], [[Change(k, "u", seq=2, day=1) for k in range(0, 12, 3)]]]
    second = [[[Change(k, "u" if k % 2 else "d", seq=3, day=2) for k in range(12)]]]
    late = [[[Change(k, "c", seq=2, day=0) for k in range(12)]]]  # older than every change of `second`
    labelled = label_batches(config, [first, second, late])
    with Harness(config) as harness:
        model = Model(config)
        for batch_id, batch in enumerate(labelled):
            if batch_id:
                caplog.clear()
                with caplog.at_level("INFO", logger="lakesink"):
                    assert compact(harness, lambda i: True).files > 0
                    harness.assert_matches(model.expected(), f"after the compaction before batch {batch_id}")
                    harness.run_batch(batch, batch_id)
                assert not any("rebuilt key index" in r.getMessage() for r in caplog.records), "the index was rebuilt"
            else:
                harness.run_batch(batch, batch_id)
            model.apply_batch(batch)
            harness.assert_matches(model.expected(), f"after batch {batch_id}")
        assert sorted(model.live) == list(range(1, 12, 2))


@pytest.mark.parametrize("then", ["retry", "older-plan"])
@pytest.mark.parametrize(("lineage", "point"), [(False, "index_file_done"), (True, "index_moves_recorded")], ids=["re-read", "moves"])
def test_a_catch_up_interrupted_between_two_files(
    then: str, lineage: bool, point: str, tmp_path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture  # type: ignore[no-untyped-def]
) -> None:
    """The task after a compaction moves the rewritten keys in the index without undo
    records (re-reading the new files, or recording the rewrite's move maps when it kept
    row lineage), and dies halfway: after the first rewritten file, or after the maps.
    Retried against the same snapshot it replays the catch-up (no rebuild; maps recorded
    twice are the same maps). A batch planned before the compaction (a concurrent
    writer's) must not see the half-moved keys: it rebuilds, and the deletes it commits are
    moved onto the compacted files. Either way every update and delete hides the right row."""
    config = Config("cdc", "bucket(4, id)", False)
    first = [[[Change(k, "c", day=k % 3) for k in range(40)]]]
    second = [[[Change(k, "u" if k % 3 else "d", day=1) for k in range(0, 40, 2)]]]
    labelled = label_batches(config, [first, second])
    faults = tmp_path / "faults.json"
    monkeypatch.setenv("LAKESINK_FAULTS", str(faults))
    with Harness(config) as harness:
        model = Model(config)
        harness.run_batch(labelled[0], 0)
        model.apply_batch(labelled[0])
        before_compaction = harness.plan()
        assert compact(harness, lambda i: True, lineage=lineage).files == 4  # one file per bucket, every position changed
        faults.write_text(json.dumps([{"point": point, "action": "raise", "once": True}]))
        with pytest.raises(InjectedFault):
            harness.run_batch(labelled[1], 1)
        assert json.loads(faults.read_text()) == [], "the fault never fired"
        caplog.clear()
        with caplog.at_level("INFO", logger="lakesink"):
            if then == "retry":
                harness.run_batch(labelled[1], 1)
            else:
                messages = [harness.write(before_compaction, task, 1, partition_id=i) for i, task in enumerate(labelled[1])]
                harness.commit(before_compaction, messages, 1)
        model.apply_batch(labelled[1])
        harness.assert_matches(model.expected(), f"after the interrupted catch-up ({then})")
        rebuilt = any("rebuilt key index" in r.getMessage() for r in caplog.records)
        assert rebuilt == (then == "older-plan"), caplog.text
        assert len(model.expected()) == 40 - len(range(0, 40, 6))


@pytest.mark.parametrize("step", ["state_set", "committed", "rolled_back"])
def test_a_sync_interrupted_between_two_shards(
    step: str, tmp_path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture  # type: ignore[no-untyped-def]
) -> None:
    """Steps that span the index's shards are not atomic: a task dies after the first shard
    moved its state (or committed / rolled back tokens) and before the others. The retried
    task must either finish the step (committing and rolling back are idempotent per shard)
    or, when the shards' states disagree, rebuild; either way the results stay exact."""
    config = Config("cdc", "bucket(4, id)", True)
    first = [[[Change(k, "c", seq=1) for k in range(60)]]]
    second = [[[Change(k, "u" if k % 2 else "d", seq=2) for k in range(0, 60, 3)]]]
    third = [[[Change(k, "u", seq=3) for k in range(0, 60, 4)]], [[Change(k, "c", seq=3) for k in range(60, 70)]]]
    labelled = label_batches(config, [first, second, third])
    faults = tmp_path / "faults.json"
    monkeypatch.setenv("LAKESINK_FAULTS", str(faults))
    with Harness(config) as harness:
        model = Model(config)
        for batch_id in (0, 1):
            harness.run_batch(labelled[batch_id], batch_id)
            model.apply_batch(labelled[batch_id])
        if step == "rolled_back":
            # A phantom attempt of batch 2 that never commits leaves tokens to roll back.
            plan = harness.plan()
            for i, task in enumerate(labelled[2]):
                harness.write(plan, task, 2, partition_id=i)
        faults.write_text(json.dumps([{"point": f"index_shard_{step}", "action": "raise", "once": True}]))
        with pytest.raises(InjectedFault):
            harness.run_batch(labelled[2], 2)
        assert json.loads(faults.read_text()) == [], "the fault never fired"
        caplog.clear()
        with caplog.at_level("INFO", logger="lakesink"):
            harness.run_batch(labelled[2], 2)
        model.apply_batch(labelled[2])
        harness.assert_matches(model.expected(), f"after a sync interrupted between shards ({step})")
        rebuilt = any("rebuilt key index" in r.getMessage() for r in caplog.records)
        assert rebuilt == (step == "state_set"), caplog.text


# ----------------------------------------------------------------- uncommitted batches


@pytest.mark.parametrize(("operation", "sequence"), [("cdc", True), ("upsert", False), ("dedupe", False)], ids=["cdc-seq", "upsert-noseq", "dedupe-noseq"])
@SETTINGS
@given(data=st.data())
def test_uncommitted_batch_is_undone_before_the_replanned_batch(operation: str, sequence: bool, data: st.DataObject) -> None:
    """Before some batches, a phantom attempt of the same batch id runs all its tasks but
    never commits (driver died before commit); the batch is then replanned (new write id)
    with different input. Nothing of the phantom may remain."""
    config = Config(operation, data.draw(PARTITIONS, label="partition_by"), sequence)
    batches = data.draw(micro_batches(operation, sequence), label="batches")
    phantoms = data.draw(
        st.lists(st.one_of(st.none(), micro_batches(operation, sequence, 1, 1)), min_size=len(batches), max_size=len(batches)),
        label="phantoms",
    )
    labelled = label_batches(config, batches)
    with Harness(config) as harness:
        model = Model(config)
        for batch_id, batch in enumerate(labelled):
            phantom = phantoms[batch_id]
            if phantom is not None:
                plan = harness.plan()
                for i, task in enumerate(label_batches(config, phantom, tag="phantom")[0]):
                    harness.write(plan, task, batch_id, partition_id=i)
                note(f"batch {batch_id}: an uncommitted attempt ran first")
            harness.run_batch(batch, batch_id)
            model.apply_batch(batch)
            harness.assert_matches(model.expected(), f"after batch {batch_id}")


# ----------------------------------------------------------------- retried task attempts


@pytest.mark.parametrize(("operation", "sequence"), [("cdc", True), ("upsert", False), ("dedupe", False)], ids=["cdc-seq", "upsert-noseq", "dedupe-noseq"])
@SETTINGS
@given(data=st.data())
def test_retried_task_attempt_applies_once(operation: str, sequence: bool, data: st.DataObject) -> None:
    """One task per batch fails after writing (its message is discarded) and is retried
    with the same plan and partition id as attempt 1, right away (the next task has not
    started yet). Only attempt 1's message is committed."""
    config = Config(operation, data.draw(PARTITIONS, label="partition_by"), sequence)
    batches = data.draw(micro_batches(operation, sequence), label="batches")
    retried = data.draw(st.lists(st.integers(0, 2), min_size=len(batches), max_size=len(batches)), label="retried")
    labelled = label_batches(config, batches)
    with Harness(config) as harness:
        model = Model(config)
        for batch_id, batch in enumerate(labelled):
            plan = harness.plan()
            r = retried[batch_id] % len(batch)
            messages = []
            for i, task in enumerate(batch):
                if i == r:
                    harness.write(plan, task, batch_id, partition_id=i, attempt=0)  # lost
                    messages.append(harness.write(plan, task, batch_id, partition_id=i, attempt=1))
                else:
                    messages.append(harness.write(plan, task, batch_id, partition_id=i))
            harness.commit(plan, messages, batch_id)
            model.apply_batch(batch)
            harness.assert_matches(model.expected(), f"after batch {batch_id} (task {r} retried)")


@pytest.mark.parametrize(("operation", "sequence"), [("cdc", True), ("upsert", False)], ids=["cdc-seq", "upsert-noseq"])
@SETTINGS
@given(data=st.data())
def test_late_retry_of_a_task_with_its_own_keys(operation: str, sequence: bool, data: st.DataObject) -> None:
    """The retry runs after the batch's other tasks, as in Spark when attempt 0 fails late.
    Input clustered by key (what several hosts require anyway): no other task of the
    batch touches the retried task's keys, so the order of tasks does not matter."""
    config = Config(operation, data.draw(PARTITIONS, label="partition_by"), sequence)
    batches = data.draw(micro_batches(operation, sequence), label="batches")
    # Cluster by key: task t of a batch keeps only keys with key % tasks == t.
    batches = [
        [[[c for c in rows if c.id % len(batch) == t] for rows in task] for t, task in enumerate(batch)] for batch in batches
    ]
    retried = data.draw(st.lists(st.integers(0, 2), min_size=len(batches), max_size=len(batches)), label="retried")
    labelled = label_batches(config, batches)
    with Harness(config) as harness:
        model = Model(config)
        for batch_id, batch in enumerate(labelled):
            plan = harness.plan()
            r = retried[batch_id] % len(batch)
            messages = {}
            for i, task in enumerate(batch):
                messages[i] = harness.write(plan, task, batch_id, partition_id=i, attempt=0)
            messages[r] = harness.write(plan, batch[r], batch_id, partition_id=r, attempt=1)  # attempt 0's is lost
            harness.commit(plan, list(messages.values()), batch_id)
            model.apply_batch(batch)
            harness.assert_matches(model.expected(), f"after batch {batch_id} (task {r} retried last)")


@pytest.mark.child
@pytest.mark.parametrize("operation", ["upsert", "cdc"])
def test_late_retry_after_another_task_changed_the_same_key(operation: str) -> None:
    """Task 0 attempt 0 updates key 1 and dies (a killed worker: its changes stay in the
    index); task 1 updates key 1 meanwhile (same host, so it sees attempt 0's row in the
    shared index and hides it); then task 0 is retried. The batch cannot be applied as is
    (key 1's committed row would stay live): its commit is refused and nothing changes;
    the replayed batch (a fresh plan, as a restarted query makes) applies it exactly once."""
    config = Config(operation, None, False)
    labelled = label_batches(config, [[[[Change(1, "c")]]], [[[Change(1, "u")]], [[Change(1, "u")]]]])
    with Harness(config) as harness:
        model = Model(config)
        harness.run_batch(labelled[0], 0)
        model.apply_batch(labelled[0])
        plan = harness.plan()
        task0, task1 = labelled[1]
        harness.write(plan, task0, 1, partition_id=0, attempt=0)  # lost
        m1 = harness.write(plan, task1, 1, partition_id=1)
        m0 = harness.write(plan, task0, 1, partition_id=0, attempt=1)
        with pytest.raises(CommitError, match="not in the table"):
            harness.commit(plan, [m0, m1], 1)
        harness.assert_matches(model.expected(), "after the refused batch")
        harness.run_batch(labelled[1], 1)  # the replay after a restart
        model.apply_batch(labelled[1])
        harness.assert_matches(model.expected(), "after the replayed batch")


# ----------------------------------------------------------------- several worker processes


@pytest.fixture(scope="module")
def workers() -> Iterator[list[ProcessPoolExecutor]]:
    """Two persistent Python processes standing in for a host's Spark Python workers:
    each keeps its own cached LMDB handle between tasks, and they share the index files."""
    context = multiprocessing.get_context("spawn")
    pool = [ProcessPoolExecutor(max_workers=1, mp_context=context) for _ in range(2)]
    yield pool
    for executor in pool:
        executor.shutdown(cancel_futures=True)


def _run_on_workers(harness: Harness, workers: list, batch: list, batch_id: int, placement: list[int]):  # type: ignore[no-untyped-def]
    plan = harness.plan()
    messages = [
        workers[placement[i % len(placement)]].submit(remote_write, plan, harness.config, task, batch_id, i).result()
        for i, task in enumerate(batch)
    ]
    return harness.commit(plan, messages, batch_id)


@pytest.mark.parametrize(("operation", "sequence"), [("cdc", True), ("upsert", False)], ids=["cdc-seq", "upsert-noseq"])
@settings(SETTINGS, max_examples=max(2, SETTINGS.max_examples // 2))
@given(data=st.data())
def test_tasks_on_two_worker_processes_share_one_index(workers: list, operation: str, sequence: bool, data: st.DataObject) -> None:
    """The normal deployment: the tasks of a batch land on either worker process; both
    use the same LMDB files under the host lock."""
    config = Config(operation, data.draw(PARTITIONS, label="partition_by"), sequence)
    labelled = label_batches(config, data.draw(micro_batches(operation, sequence), label="batches"))
    placements = data.draw(st.lists(st.lists(st.integers(0, 1), min_size=1, max_size=3), min_size=len(labelled), max_size=len(labelled)), label="placements")
    with Harness(config) as harness:
        model = Model(config)
        for batch_id, batch in enumerate(labelled):
            _run_on_workers(harness, workers, batch, batch_id, placements[batch_id])
            model.apply_batch(batch)
            harness.assert_matches(model.expected(), f"after batch {batch_id}")


def test_index_deleted_while_worker_processes_keep_it_open(workers: list) -> None:
    config = Config("upsert", None, False)
    # (worker, task) per batch; the index directory is deleted before batch 1.
    schedule = [
        [(0, [[Change(1)]])],
        [(0, [[Change(1)]]), (1, [[Change(2)]])],  # worker 0 moves key 1; worker 1 opens a fresh index
        [(1, [[Change(1)]])],  # worker 1's index still points key 1 at batch 0's row
    ]
    labelled = label_batches(config, [[task for _, task in batch] for batch in schedule])
    with Harness(config) as harness:
        model = Model(config)
        for batch_id, batch in enumerate(labelled):
            if batch_id == 1:
                harness.drop_index(new_process=False)  # rmtree only: the workers keep their handles
            _run_on_workers(harness, workers, batch, batch_id, [w for w, _ in schedule[batch_id]])
            model.apply_batch(batch)
            harness.assert_matches(model.expected(), f"after batch {batch_id}")


# ----------------------------------------------------------------- damaged index


def _run_batch_like_spark(harness: Harness, batch: list, batch_id: int) -> None:
    """Run a batch's tasks; a task that fails is retried once as attempt 1 (Spark's retry)."""
    plan = harness.plan()
    messages = []
    for i, task in enumerate(batch):
        try:
            messages.append(harness.write(plan, task, batch_id, partition_id=i))
        except lmdb.Error:
            messages.append(harness.write(plan, task, batch_id, partition_id=i, attempt=1))
    harness.commit(plan, messages, batch_id)


@pytest.mark.parametrize("kind", ["random-bytes", "truncated-while-open", "file-instead-of-directory", "file-table-deleted"])
def test_a_damaged_index_is_rebuilt_from_the_table_and_results_stay_exact(kind: str, caplog: pytest.LogCaptureFixture) -> None:
    config = Config("cdc", "bucket(4, id)", True)
    first = [[[Change(k, "c", seq=1) for k in range(0, 400)]]]
    second = [[[Change(k, "u", seq=2) for k in range(0, 400, 3)]]]
    third = [[[Change(k, "u" if k % 2 else "d", seq=3) for k in range(0, 400, 5)]], [[Change(k, "c", seq=3) for k in range(400, 420)]]]
    late = [[[Change(k, "u", seq=2) for k in range(0, 400, 10)]]]  # older than third's changes: ignored
    labelled = label_batches(config, [first, second, third, late])
    with Harness(config) as harness:
        model = Model(config)
        for batch_id, batch in enumerate(labelled[:2]):
            harness.run_batch(batch, batch_id)
            model.apply_batch(batch)
        path = harness.index_path()
        # The shard holding most keys (all shards are damaged alike; one is enough to need a rebuild).
        data = max(glob.glob(os.path.join(path, "shard-*", "data.mdb")), key=os.path.getsize)
        if kind == "random-bytes":
            for name, index in list(environment._CACHE.items()):
                if name.startswith(os.path.abspath(harness.index_dir)):
                    index.close()
            size = os.path.getsize(data)
            with open(data, "r+b") as f:
                f.seek(2 * 4096)
                f.write(np.random.default_rng(7).bytes(size - 2 * 4096))
        elif kind == "truncated-while-open":
            os.truncate(data, os.path.getsize(data) // 3)  # this process keeps its mapping
        elif kind == "file-table-deleted":
            # The shards keep their keys; the ordinals they point at are gone with the table.
            files = os.path.join(path, "files")
            environment._CACHE.pop(files).close()
            shutil.rmtree(files)
        else:
            for name, index in list(environment._CACHE.items()):
                if name.startswith(os.path.abspath(harness.index_dir)):
                    index.close()
            shutil.rmtree(path)
            with open(path, "w") as f:
                f.write("not an index")
        caplog.set_level("INFO", logger="lakesink")
        for batch_id, batch in enumerate(labelled[2:], start=2):
            _run_batch_like_spark(harness, batch, batch_id)
            model.apply_batch(batch)
            harness.assert_matches(model.expected(), f"after batch {batch_id} ({kind})")
        assert any("rebuilt key index" in r.getMessage() for r in caplog.records)
