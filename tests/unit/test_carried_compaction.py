"""Compaction carried by a write's tasks (maintenance=auto): the driver plans the groups with
the batch, the tasks rewrite them beside their rows, the commit lands the rewrite right
before the batch's snapshot.

Driven through the production path without Spark: plan_write -> write_task per partition ->
the sink's own commit (`datasource._commit`, what Spark calls). Rows are read back with
DuckDB and pyiceberg and compared with what was written.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import pyarrow as pa
import pytest
from lakesink_testing import assert_readers_see, expected_rows, load
from pyspark.sql import types as T

from lakesink_datasource.check import check_table
from lakesink_datasource.compaction.rewrite import COMPACTED_PREFIX
from lakesink_datasource.datasource import _commit
from lakesink_datasource.iceberg.live_files import live_data_files
from lakesink_datasource.iceberg.summary_keys import COMPACTION, EPOCH_ID, MOVED_DELETES
from lakesink_datasource.messages import LakeSinkCommitMessage, decode_messages
from lakesink_datasource.options import parse_options
from lakesink_datasource.table.plan import WritePlan
from lakesink_datasource.table.setup import plan_write
from lakesink_datasource.write.task import TaskIdentity, write_task

IDENT = "db.t"
SCHEMA = T.StructType([T.StructField("id", T.LongType()), T.StructField("v", T.StringType())])
ARROW = pa.schema([("id", pa.int64()), ("v", pa.string())])
COLUMNS = ["id", "v"]
QUERY = "query-carried"


def _rows(ids: Iterable[int], tag: str) -> list[dict]:
    return [{"id": i, "v": f"{tag}{i}"} for i in ids]


class _Stream:
    """One streaming query's micro-batches, each with `tasks` write tasks, as Spark runs them."""

    def __init__(self, warehouse: str, query: str = QUERY, **options: str) -> None:
        self.options = parse_options({"table": IDENT, "warehouse": warehouse, "progress": "false", **options})
        self.query = query

    def plan(self) -> WritePlan:
        return plan_write(self.options, SCHEMA, overwrite=False)

    def write(self, plan: WritePlan, batch_id: int, tasks: list[list[dict]]) -> list[LakeSinkCommitMessage]:
        return [
            write_task(plan, iter([pa.RecordBatch.from_pylist(rows, schema=ARROW)]),
                       TaskIdentity(partition_id=p, batch_id=batch_id, query_id=self.query))
            for p, rows in enumerate(tasks)
        ]

    def batch(self, batch_id: int, tasks: list[list[dict]]) -> list[LakeSinkCommitMessage]:
        plan = self.plan()
        messages = self.write(plan, batch_id, tasks)
        _commit(plan, list(messages), batch_id)
        return messages


def _summaries(warehouse: str) -> list[dict[str, str]]:
    metadata = load(warehouse, IDENT).metadata
    return [{"operation": s.summary.operation.value, **s.summary.additional_properties}  # type: ignore[union-attr]
            for s in sorted(metadata.snapshots, key=lambda s: s.sequence_number or 0)]


def _live_paths(warehouse: str) -> set[str]:
    table = load(warehouse, IDENT)
    return {e.data_file.file_path for e in live_data_files(table.io, table.metadata.current_snapshot())}


def _files_on_disk(warehouse: str) -> set[str]:
    return {str(p) for p in Path(warehouse).rglob("*.parquet") if "/data/" in str(p)}


def test_a_streams_tasks_rewrite_its_small_files_and_the_rewrite_lands_before_the_batch(warehouse: str) -> None:
    stream = _Stream(warehouse)
    written: list[dict] = []
    carried = 0
    for b in range(16):
        tasks = [_rows(range(b * 100 + 50 * p, b * 100 + 50 * (p + 1)), f"b{b}-") for p in range(2)]
        messages = stream.batch(b, tasks)
        written += [r for t in tasks for r in t]
        carried += sum(1 for r in decode_messages(messages) if r.compaction is not None and r.compaction.files)

    summaries = _summaries(warehouse)
    compactions = [i for i, s in enumerate(summaries) if s.get(COMPACTION) == "true"]
    assert carried >= 2 and len(compactions) >= 2  # the tasks rewrote groups, and they landed
    for i in compactions:  # each right before a batch of the stream, never after its last one
        assert summaries[i]["operation"] == "replace"
        assert EPOCH_ID in summaries[i + 1]
    live = _live_paths(warehouse)
    assert len(live) <= 12 < 32  # 32 files written by the batches; merged as they came
    assert any(COMPACTED_PREFIX in os.path.basename(p) for p in live)
    assert_readers_see(warehouse, IDENT, expected_rows(written, COLUMNS), COLUMNS)
    assert check_table(load(warehouse, IDENT)) == []


@pytest.mark.parametrize("version", [3, 2])
def test_keyed_batches_that_hide_rows_of_the_files_their_tasks_compact_land_exactly(warehouse: str, version: int) -> None:
    stream = _Stream(warehouse, operation="upsert", primary_key="id", index_dir=f"{warehouse}/index", format_version=str(version))
    expected: dict[int, dict] = {}
    for b in range(14):
        # Each batch rewrites keys of the last few batches, whose files are the small ones a
        # compaction merges: its deletes land on files that the compaction before it replaced.
        ids = sorted({*range(b * 40, b * 40 + 40), *range(max(0, b - 3) * 40 + 7, b * 40, 9)})
        tasks = [[r for r in _rows(ids, f"b{b}-") if r["id"] % 2 == p] for p in range(2)]
        stream.batch(b, tasks)
        expected.update({r["id"]: r for t in tasks for r in t})

    summaries = _summaries(warehouse)
    landed = [i for i, s in enumerate(summaries) if s.get(COMPACTION) == "true"]
    assert landed, "no compaction landed"
    # At least once a batch's deletes were moved onto the files its tasks' compaction wrote.
    assert any(MOVED_DELETES in summaries[i + 1] for i in landed if i + 1 < len(summaries))
    assert_readers_see(warehouse, IDENT, expected_rows(expected.values(), COLUMNS), COLUMNS)
    assert check_table(load(warehouse, IDENT)) == []


def test_a_group_whose_files_another_writer_changed_is_dropped_and_its_files_deleted(warehouse: str) -> None:
    keyed = {"operation": "upsert", "primary_key": "id", "index_dir": f"{warehouse}/index"}
    expected: dict[int, dict] = {}
    for b in range(8):  # eight small files, not compacted yet
        rows = _rows(range(b * 10, b * 10 + 10), f"b{b}-")
        _Stream(warehouse, **keyed, maintenance="off").batch(b, [rows])
        expected.update({r["id"]: r for r in rows})
    stream = _Stream(warehouse, **keyed)
    plan = stream.plan()
    assert plan.compaction is not None  # eight small files: the next batch carries their merge
    messages = stream.write(plan, 8, [_rows([1000], "b8-")])
    assert any(r.compaction is not None for r in decode_messages(messages))
    # Another writer upserts a key of the oldest file (a new DV on a file the tasks rewrote)...
    other = _Stream(warehouse, "another-query", **{**keyed, "index_dir": f"{warehouse}/other-index", "maintenance": "off"})
    other.batch(0, [_rows([3], "other-")])
    expected[3] = _rows([3], "other-")[0]
    before = sum(1 for s in _summaries(warehouse) if s.get(COMPACTION) == "true")
    # ... so the rewrite is out of date: it is dropped, its files deleted, the batch lands.
    _commit(plan, list(messages), 8)
    expected[1000] = _rows([1000], "b8-")[0]
    assert sum(1 for s in _summaries(warehouse) if s.get(COMPACTION) == "true") == before
    assert not any(COMPACTED_PREFIX in os.path.basename(p) for p in _files_on_disk(warehouse))
    assert_readers_see(warehouse, IDENT, expected_rows(expected.values(), COLUMNS), COLUMNS)
    assert check_table(load(warehouse, IDENT)) == []


def test_a_rewrite_failing_in_a_task_leaves_its_batch_whole(warehouse: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    written: list[dict] = []
    for b in range(8):
        rows = _rows(range(b * 10, b * 10 + 10), f"b{b}-")
        _Stream(warehouse, maintenance="off").batch(b, [rows])
        written += rows
    stream = _Stream(warehouse)
    faults = tmp_path / "faults.json"
    faults.write_text(json.dumps([{"point": "task_compaction_written", "action": "raise"}]))
    monkeypatch.setenv("LAKESINK_FAULTS", str(faults))
    plan = stream.plan()
    assert plan.compaction is not None
    messages = stream.batch(8, [_rows([1000], "b8-")])
    written += _rows([1000], "b8-")

    assert all(r.compaction is None for r in decode_messages(messages))
    assert not any(s.get(COMPACTION) == "true" for s in _summaries(warehouse))
    assert not any(COMPACTED_PREFIX in os.path.basename(p) for p in _files_on_disk(warehouse))  # deleted by the task
    assert_readers_see(warehouse, IDENT, expected_rows(written, COLUMNS), COLUMNS)


_CHILD = """
import sys
sys.path.insert(0, 'tests/unit'); sys.path.insert(0, 'tests')
from test_carried_compaction import _Stream, _rows
stream = _Stream({warehouse!r}, operation="upsert", primary_key="id", index_dir={index!r})
stream.batch(8, [_rows(range(0, 80, 3), "b8-")])
"""


@pytest.mark.child
def test_a_driver_killed_between_the_carried_compaction_and_the_batch_commits_the_batch_once_on_replay(
    warehouse: str, tmp_path: Path
) -> None:
    index = f"{warehouse}/index"
    stream = _Stream(warehouse, operation="upsert", primary_key="id", index_dir=index)
    expected: dict[int, dict] = {}
    for b in range(8):
        rows = _rows(range(b * 10, b * 10 + 10), f"b{b}-")
        _Stream(warehouse, operation="upsert", primary_key="id", index_dir=index, maintenance="off").batch(b, [rows])
        expected.update({r["id"]: r for r in rows})
    faults = tmp_path / "faults.json"
    faults.write_text(json.dumps([{"point": "after_compaction_commit", "batch": 8, "action": "kill"}]))
    child = subprocess.run([sys.executable, "-c", _CHILD.format(warehouse=warehouse, index=index)],
                           env={**os.environ, "LAKESINK_FAULTS": str(faults)}, start_new_session=True, check=False)
    assert child.returncode == -signal.SIGKILL
    summaries = _summaries(warehouse)
    assert summaries[-1].get(COMPACTION) == "true"  # the compaction landed, the batch did not
    assert_readers_see(warehouse, IDENT, expected_rows(expected.values(), COLUMNS), COLUMNS)

    stream.batch(8, [_rows(range(0, 80, 3), "b8-")])  # Spark replays the batch
    stream.batch(8, [_rows(range(0, 80, 3), "b8-")])  # and once more: already committed
    expected.update({r["id"]: r for r in _rows(range(0, 80, 3), "b8-")})
    assert sum(1 for s in _summaries(warehouse) if s.get(EPOCH_ID) == "8") == 1
    assert_readers_see(warehouse, IDENT, expected_rows(expected.values(), COLUMNS), COLUMNS)
    assert check_table(load(warehouse, IDENT)) == []


def test_one_task_takes_every_group_when_the_last_write_ran_one_task(warehouse: str) -> None:
    """A stream with one input partition into a table of many partitions: the one task of a
    batch rewrites the groups of every partition, so merging keeps up with what it adds."""
    options = {"partition_by": "bucket(4, id)"}
    written: list[dict] = []
    for b in range(8):  # eight files in each of the four buckets, from one task per batch
        rows = _rows(range(b * 40, b * 40 + 40), f"b{b}-")
        _Stream(warehouse, **options, maintenance="off").batch(b, [rows])
        written += rows
    assert len(_live_paths(warehouse)) == 32
    stream = _Stream(warehouse, **options)
    plan = stream.plan()
    assert plan.compaction is not None and len(plan.compaction.groups) == 4 and plan.compaction.tasks == 1
    rows = _rows(range(1000, 1040), "b8-")
    (message,) = stream.write(plan, 8, [rows])
    _commit(plan, [message], 8)
    written += rows

    (result,) = decode_messages([message])
    assert result.compaction is not None and len(result.compaction.rewritten) == 32 and len(result.compaction.files) == 4
    live = _live_paths(warehouse)
    assert len(live) == 8 and sum(COMPACTED_PREFIX in os.path.basename(p) for p in live) == 4  # one merged file per bucket
    assert_readers_see(warehouse, IDENT, expected_rows(written, COLUMNS), COLUMNS)
    assert check_table(load(warehouse, IDENT)) == []


def test_the_groups_are_shared_by_as_many_tasks_as_the_last_append_ran(warehouse: str) -> None:
    """An append whose batches run two tasks into a table of four partitions: the next
    batch's two tasks rewrite two partitions' files each, so the rewriting spreads over the
    executors instead of falling to one task."""
    options = {"partition_by": "bucket(4, id)"}
    written: list[dict] = []
    for b in range(4):  # two tasks a batch, each writing a file into each of the four buckets
        tasks = [_rows(range(b * 80 + 40 * p, b * 80 + 40 * (p + 1)), f"b{b}-") for p in range(2)]
        _Stream(warehouse, **options, maintenance="off").batch(b, tasks)
        written += [r for t in tasks for r in t]
    assert len(_live_paths(warehouse)) == 32
    stream = _Stream(warehouse, **options)
    plan = stream.plan()
    assert plan.compaction is not None and len(plan.compaction.groups) == 4 and plan.compaction.tasks == 2
    tasks = [_rows(range(1000 + 40 * p, 1040 + 40 * p), "b4-") for p in range(2)]
    messages = stream.write(plan, 4, tasks)
    _commit(plan, messages, 4)
    written += [r for t in tasks for r in t]

    results = decode_messages(messages)
    carried = [r.compaction for r in results]
    assert all(c is not None for c in carried)
    assert [(len(c.rewritten), len(c.files)) for c in carried if c is not None] == [(16, 2), (16, 2)]
    live = _live_paths(warehouse)
    assert len(live) == 12 and sum(COMPACTED_PREFIX in os.path.basename(p) for p in live) == 4  # 8 new, 4 merged
    assert_readers_see(warehouse, IDENT, expected_rows(written, COLUMNS), COLUMNS)
    assert check_table(load(warehouse, IDENT)) == []
