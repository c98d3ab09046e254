"""The line a user reads per batch names what happened in the table's own terms."""

from __future__ import annotations

import pyarrow as pa
from lakesink_testing import load
from pyspark.sql import types as T

from lakesink_datasource.commit.committer import commit_write
from lakesink_datasource.messages import decode_messages
from lakesink_datasource.options import parse_options
from lakesink_datasource.progress import describe_batch
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
