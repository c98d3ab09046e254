"""Keyed writes (upsert / cdc / dedupe) against a reference model, property-based.

Each example is a fresh warehouse + index directory and 2-5 micro-batches, each of 1-3
tasks with 1-2 Arrow batches, driven through the production path (plan_write ->
write_task per task -> commit_write, no Spark). The key space is tiny (0..15), so keys
repeat inside an Arrow batch, across tasks of one batch and across batches; sequences
(when used) are drawn from a small range, so late (older) changes and ties are common;
cdc deletes hit absent keys too and may carry only key + sequence.

After EVERY batch, DuckDB and pyiceberg must both return exactly the model's rows (id,
v, ts and seq, as multisets) and `check_table` must report nothing. The model lives in
`tests/keyed_model.py`; its docstring states the semantics.
"""

from __future__ import annotations

from collections.abc import Callable
from unittest.mock import patch

import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st
from hypothesis_profiles import examples
from keyed_model import Config, Harness, Model, label_batches, micro_batches
from lakesink_testing import duckdb_connection
from sort_model import is_sorted

from lakesink_datasource.iceberg.live_files import live_data_files
from lakesink_datasource.iceberg.summary_keys import MOVED_DELETES
from lakesink_datasource.maintenance.compaction import compact
from lakesink_datasource.write import task_writers as task_module

PARTITIONS = st.sampled_from([None, "bucket(4, id)", "days(ts)"])
SETTINGS = settings(
    # Modest by default (the file runs in under a minute); raise it locally to hunt for bugs.
    max_examples=examples(12),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def run_against_model(config: Config, batches: list, check: Callable[[Harness], None] | None = None) -> None:
    labelled = label_batches(config, batches)
    with Harness(config) as harness:
        model = Model(config)
        for batch_id, batch in enumerate(labelled):
            outcome = harness.run_batch(batch, batch_id)
            model.apply_batch(batch)
            note(f"batch {batch_id}: {outcome.skipped_reason or 'committed'}; model {sorted(model.live.items())}")
            harness.assert_matches(model.expected(), f"after batch {batch_id}")
            if check is not None:
                check(harness)


CASES = [
    ("upsert", False),
    ("upsert", True),
    ("cdc", False),
    ("cdc", True),
    ("dedupe", False),
]


@pytest.mark.parametrize(("operation", "sequence"), CASES, ids=[f"{op}-{'seq' if s else 'noseq'}" for op, s in CASES])
@SETTINGS
@given(data=st.data())
def test_keyed_writes_match_the_model(operation: str, sequence: bool, data: st.DataObject) -> None:
    partition_by = data.draw(PARTITIONS, label="partition_by")
    batches = data.draw(micro_batches(operation, sequence), label="batches")
    run_against_model(Config(operation, partition_by, sequence), batches)


def assert_every_file_sorted(harness: Harness) -> None:
    """Every live data file is one run in the table's sort order and labelled with it,
    hidden rows included (a file is sorted as written)."""
    table = harness.table()
    snapshot = table.metadata.current_snapshot()
    if snapshot is None:
        return
    order = table.metadata.sort_order()
    for entry in live_data_files(table.io, snapshot):
        assert entry.data_file.sort_order_id == order.order_id
        written = pq.read_table(entry.data_file.file_path.removeprefix("file://")).to_pylist()
        assert is_sorted(written, order, table.schema()), f"{entry.data_file.file_path} is not sorted by {order}"


SORTS = st.sampled_from(["id DESC", "v, id", "days(ts), id DESC NULLS LAST", "bucket(3, id), v DESC NULLS LAST"])
SORTED_CASES = [("upsert", False), ("cdc", True), ("dedupe", False)]


@pytest.mark.parametrize(("operation", "sequence"), SORTED_CASES, ids=[f"{op}-{'seq' if s else 'noseq'}" for op, s in SORTED_CASES])
@SETTINGS
@given(data=st.data())
def test_keyed_writes_into_a_sorted_table_match_the_model_in_sorted_files(operation: str, sequence: bool, data: st.DataObject) -> None:
    """Chunks of 1-6 rows: a task's rows arrive as several sorted runs, some continuing the
    file, some starting one; rows replaced, deleted or turned down (late changes, dedupe's
    duplicates) within the batch are hidden at their sorted positions."""
    partition_by = data.draw(PARTITIONS, label="partition_by")
    sort_by = data.draw(SORTS, label="sort_by")
    chunk_rows = data.draw(st.integers(1, 6), label="chunk_rows")
    batches = data.draw(micro_batches(operation, sequence), label="batches")
    with patch.object(task_module, "CHUNK_ROWS", chunk_rows):
        run_against_model(Config(operation, partition_by, sequence, sort_by=sort_by), batches, check=assert_every_file_sorted)


@pytest.mark.parametrize(("operation", "sequence"), [("cdc", True), ("upsert", False)], ids=["cdc-seq", "upsert-noseq"])
@SETTINGS
@given(data=st.data())
def test_keyed_writes_to_format_version_2_match_the_model(operation: str, sequence: bool, data: st.DataObject) -> None:
    """v2 hides rows with position-delete files (one per data file, merged as DVs are):
    DuckDB and pyiceberg read the model's rows after every batch."""
    partition_by = data.draw(PARTITIONS, label="partition_by")
    batches = data.draw(micro_batches(operation, sequence), label="batches")
    run_against_model(Config(operation, partition_by, sequence, format_version=2), batches)


@SETTINGS
@given(batches=micro_batches("cdc", True))
def test_cdc_with_sequence_moves_keys_between_day_partitions(batches: list) -> None:
    """The time transform on its own: an update with another day moves the key to another
    partition (the old row is hidden in its old partition's file), deletes and late
    changes on top."""
    run_against_model(Config("cdc", "days(ts)", True), batches)


def _dedupe_task(split: bool) -> list[list[dict]]:
    """One task whose input holds key 0 twice: first in a full chunk of CHUNK_ROWS rows,
    then once more, either as a second Arrow batch (split: the duplicate lands in the
    task's next chunk) or in the same Arrow batch (both in one chunk)."""
    from keyed_model import BASE_TS

    from lakesink_datasource.write.task_writers import CHUNK_ROWS

    first = [{"id": i, "v": "first" if i == 0 else None, "ts": BASE_TS} for i in range(CHUNK_ROWS)]
    again = [{"id": 0, "v": "again", "ts": BASE_TS}]
    return [first, again] if split else [first + again]


def test_dedupe_keeps_the_same_duplicate_however_a_task_input_is_split() -> None:
    config = Config("dedupe", None, False)
    for split in (False, True):
        task = _dedupe_task(split)
        with Harness(config) as harness:
            model = Model(config)
            harness.run_batch([task], 0)
            model.apply_batch([task])
            assert model.live[0]["v"] == "first"  # the model: dedupe inserts a key's first row
            harness.assert_matches(model.expected(), f"dedupe, task input split={split}")


def _lineage(harness: Harness) -> dict:
    """id -> (_row_id, _last_updated_sequence_number), as DuckDB reads the table."""
    table = harness.table()
    if table.metadata.current_snapshot() is None:
        return {}
    got = duckdb_connection().execute(
        f"SELECT id, _row_id, _last_updated_sequence_number FROM iceberg_scan('{table.metadata_location}')"
    ).fetchall()
    return {r[0]: (r[1], r[2]) for r in got}


@pytest.mark.parametrize(("operation", "sequence"), [("cdc", True), ("upsert", False)], ids=["cdc-seq", "upsert-noseq"])
@SETTINGS
@given(data=st.data())
def test_lakesink_compaction_between_keyed_batches_keeps_rows_and_row_ids(operation: str, sequence: bool, data: st.DataObject) -> None:
    """After some batches lakesink's own compaction rewrites the table's files: the rows stay
    the model's, every row keeps its `_row_id` and `_last_updated_sequence_number`, and the
    next batches (through the moved index) still match the model."""
    config = Config(operation, data.draw(PARTITIONS, label="partition_by"), sequence)
    labelled = label_batches(config, data.draw(micro_batches(operation, sequence, 2, 5), label="batches"))
    compact_after = data.draw(st.lists(st.booleans(), min_size=len(labelled), max_size=len(labelled)), label="compact_after")
    with Harness(config) as harness:
        model = Model(config)
        for batch_id, batch in enumerate(labelled):
            harness.run_batch(batch, batch_id)
            model.apply_batch(batch)
            harness.assert_matches(model.expected(), f"after batch {batch_id}")
            if compact_after[batch_id] and harness.table().metadata.current_snapshot() is not None:
                lineage = _lineage(harness)
                result = compact(harness.table(), budget_bytes=1 << 40, tiered=False)
                note(f"after batch {batch_id}: {result.describe()}")
                event("compacted" if result.snapshot_id is not None else "nothing to compact")
                harness.assert_matches(model.expected(), f"after compacting after batch {batch_id}")
                assert _lineage(harness) == lineage, "a compacted row changed its row id or last-updated sequence"


@pytest.mark.parametrize(("operation", "sequence"), [("cdc", True), ("upsert", False)], ids=["cdc-seq", "upsert-noseq"])
@SETTINGS
@given(data=st.data())
def test_lakesink_compaction_during_keyed_batches_never_fails_them(operation: str, sequence: bool, data: st.DataObject) -> None:
    """A compaction commits between a batch's tasks and its commit (as one running beside a
    stream would): the batch's deletes are moved onto the compacted files by row id, it
    commits, and every batch matches the model."""
    config = Config(operation, data.draw(PARTITIONS, label="partition_by"), sequence)
    labelled = label_batches(config, data.draw(micro_batches(operation, sequence, 2, 5), label="batches"))
    compact_during = data.draw(st.lists(st.booleans(), min_size=len(labelled), max_size=len(labelled)), label="compact_during")
    with Harness(config) as harness:
        model = Model(config)
        for batch_id, batch in enumerate(labelled):
            plan = harness.plan()
            messages = [harness.write(plan, task, batch_id, partition_id=i) for i, task in enumerate(batch)]
            if compact_during[batch_id] and harness.table().metadata.current_snapshot() is not None:
                result = compact(harness.table(), budget_bytes=1 << 40, tiered=False)
                event("compacted mid-batch" if result.snapshot_id is not None else "nothing to compact")
            outcome = harness.commit(plan, messages, batch_id)
            moved = outcome.table.metadata.current_snapshot().summary.additional_properties.get(MOVED_DELETES) if outcome.table else None
            if moved:
                event("deletes moved")
                assert moved.split(",")[1] == "0", f"lakesink's compaction keeps lineage, yet rows were found by key: {moved}"
            model.apply_batch(batch)
            harness.assert_matches(model.expected(), f"after batch {batch_id}")
