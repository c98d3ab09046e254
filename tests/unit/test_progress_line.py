"""The line a user reads per batch names what happened in the table's own terms."""

from __future__ import annotations

import time

import msgspec
import pyarrow as pa
from lakesink_testing import load
from pyspark.sql import types as T

from lakesink_datasource.commit.committer import commit_write
from lakesink_datasource.messages import TaskResult, TaskStats, decode_messages
from lakesink_datasource.options import parse_options
from lakesink_datasource.progress import BatchTiming, describe_batch
from lakesink_datasource.table.setup import plan_write
from lakesink_datasource.write.task import TaskIdentity, write_task

SCHEMA = T.StructType([T.StructField("id", T.LongType()), T.StructField("p", T.StringType())])


def _write(warehouse: str, rows: list[tuple[int, str]], *, overwrite: bool = False, **options: str):  # type: ignore[no-untyped-def]
    plan = plan_write(parse_options({"table": "db.t", "warehouse": warehouse, "progress": "false", **options}), SCHEMA, overwrite)
    batch = pa.record_batch({"id": pa.array([r[0] for r in rows], pa.int64()), "p": pa.array([r[1] for r in rows])})
    results = decode_messages([write_task(plan, iter([batch]), who=TaskIdentity())])
    return commit_write(plan, results, None)


def test_a_format_2_table_reports_position_delete_files_not_dvs(warehouse: str) -> None:
    keyed = {"operation": "upsert", "primary_key": "id", "format_version": "2"}
    _write(warehouse, [(1, "a"), (2, "a")], **keyed)
    line = describe_batch("db.t", 3, _write(warehouse, [(1, "b")], **keyed), None)
    assert "1 old rows hidden | 1 files, 1 position-delete files" in line and "DVs" not in line


def test_an_overwrite_says_what_it_replaced(warehouse: str) -> None:
    _write(warehouse, [(i, f"p{i % 3}") for i in range(30)], partition_by="p")
    line = describe_batch("db.t", None, _write(warehouse, [(100, "p1")], overwrite=True), None)
    assert line.endswith("| replaced the whole table (30 rows; overwrite_mode=dynamic replaces only the partitions written)")
    line = describe_batch("db.t", None, _write(warehouse, [(200, "p1")], overwrite=True, overwrite_mode="dynamic"), None)
    assert line.endswith("| replaced 1 partition(s) (1 rows)")
    assert len(load(warehouse, "db.t").metadata.snapshots) == 3


def test_a_task_reports_how_long_it_waited_for_spark_s_rows(warehouse: str) -> None:
    plan = plan_write(parse_options({"table": "db.t", "warehouse": warehouse, "progress": "false"}), SCHEMA, False)

    def slow_source():  # type: ignore[no-untyped-def]
        yield pa.record_batch({"id": pa.array([1], pa.int64()), "p": pa.array(["a"])})
        time.sleep(0.3)  # Spark being slow to hand over the next rows
        yield pa.record_batch({"id": pa.array([2], pa.int64()), "p": pa.array(["b"])})

    stats = decode_messages([write_task(plan, slow_source(), who=TaskIdentity())])[0].stats
    assert 0.3 <= stats.input_wait_seconds <= stats.task_seconds
    assert stats.rows_in == 2


def test_the_batch_timing_accounts_for_the_whole_wall_time(warehouse: str) -> None:
    plan = plan_write(parse_options({"table": "db.t", "warehouse": warehouse}), SCHEMA, False)
    plan = msgspec.structs.replace(plan, planned_at=2000.0, plan_seconds=9.0)  # the commit's own plan: made later
    results = [
        _result(planned_at=1000.0, plan_seconds=0.1, task_seconds=0.5, waiting=0.1),
        _result(planned_at=1000.0, plan_seconds=0.1, task_seconds=0.8, waiting=0.3),
    ]
    timing = BatchTiming.of(plan, results, commit_started=1001.0, commit_ended=1001.25, ended=1001.5)
    assert (timing.total, timing.plan, timing.tasks, timing.waiting) == (1.5, 0.1, 0.8, 0.3)
    assert timing.describe() == (
        "batch 1.50 s: plan 0.10, tasks 0.80 (0.30 waiting for rows), commit 0.25, maintenance 0.25, Spark 0.10"
    )


def _result(*, planned_at: float, plan_seconds: float, task_seconds: float, waiting: float) -> TaskResult:
    return TaskResult(
        write_id="w", query_id=None, batch_id=0, partition_id=0, attempt=0, planned_metadata_location=None,
        planned_snapshot_id=None, stats=TaskStats(task_seconds=task_seconds, input_wait_seconds=waiting),
        planned_at=planned_at, plan_seconds=plan_seconds,
    )
