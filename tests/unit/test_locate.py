"""`python -m lakesink_datasource.locate` prints what DuckDB needs to read a table."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow as pa
from lakesink_testing import duckdb_connection
from pyspark.sql import types as T

from lakesink_datasource.commit.committer import commit_write
from lakesink_datasource.locate import metadata_location
from lakesink_datasource.messages import decode_messages
from lakesink_datasource.options import parse_options
from lakesink_datasource.table.setup import plan_write
from lakesink_datasource.write.task import TaskIdentity, write_task

SCHEMA = T.StructType([T.StructField("id", T.LongType())])


def _append(warehouse: str, ids: list[int]) -> None:
    plan = plan_write(parse_options({"table": "db.t", "warehouse": warehouse}), SCHEMA, overwrite=False)
    batch = pa.record_batch({"id": pa.array(ids, pa.int64())})
    assert commit_write(plan, decode_messages([write_task(plan, iter([batch]), who=TaskIdentity())]), None).snapshot_id


def test_the_printed_location_reads_the_current_rows_in_duckdb(warehouse: str) -> None:
    _append(warehouse, [1, 2])
    _append(warehouse, [3])
    out = subprocess.run(
        [sys.executable, "-m", "lakesink_datasource.locate", "db.t", "--warehouse", warehouse], capture_output=True, text=True, check=True
    ).stdout
    location = out.strip()
    assert out.count("\n") == 1 and location == metadata_location("db.t", warehouse=warehouse)
    total = duckdb_connection().execute(f"SELECT sum(id) FROM iceberg_scan('{location}')").fetchone()
    assert total == (6,)


def test_an_unknown_table_is_reported_and_nothing_is_created(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "lakesink_datasource.locate", "db.nope", "--warehouse", str(tmp_path / "none")], capture_output=True, text=True
    )
    assert done.returncode == 1 and "cannot load table db.nope" in done.stderr
    assert not (tmp_path / "none").exists()
