"""What a pip user meets: a catalog driver that is not installed is named with the extra that
installs it, and the `lakesink` command runs the operator tools."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from lakesink_testing import load
from pyspark.sql import types as T

from lakesink_datasource.catalog.errors import CatalogError
from lakesink_datasource.commit.committer import commit_write
from lakesink_datasource.messages import decode_messages
from lakesink_datasource.options import parse_options
from lakesink_datasource.table.setup import plan_write
from lakesink_datasource.write.task import write_task

SCHEMA = T.StructType([T.StructField("id", T.LongType())])


def test_a_postgres_catalog_without_its_driver_names_the_extra_to_install(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "psycopg2", None)  # as if psycopg2 were not installed
    options = parse_options({"table": "db.t", "catalog": "pg", "catalog.type": "sql",
                             "catalog.uri": "postgresql://lakesink@127.0.0.1:9/none", "catalog.warehouse": f"file://{tmp_path}"})
    with pytest.raises(CatalogError, match=r"needs the PostgreSQL driver psycopg2, which is not installed: pip install 'lakesink-datasource\[postgres\]'"):
        plan_write(options, SCHEMA, overwrite=False)
    assert list(tmp_path.iterdir()) == []  # nothing written


def _lakesink(*args: str) -> subprocess.CompletedProcess[str]:
    command = Path(sys.executable).with_name("lakesink")
    return subprocess.run([str(command), *args], capture_output=True, text=True, timeout=120)


def test_the_lakesink_command_runs_check_locate_and_maintain(warehouse: str) -> None:
    options = parse_options({"table": "db.t", "warehouse": warehouse, "progress": "false"})
    for start in (0, 10):
        plan = plan_write(options, SCHEMA, overwrite=False)
        rows = pa.record_batch([pa.array(range(start, start + 10), pa.int64())], names=["id"])
        commit_write(plan, decode_messages([write_task(plan, iter([rows]))]), None)
    table = load(warehouse, "db.t")

    located = _lakesink("locate", "db.t", "--warehouse", warehouse)
    assert located.returncode == 0 and located.stdout.strip() == table.metadata_location
    checked = _lakesink("check", "db.t", "--warehouse", warehouse)
    assert checked.returncode == 0, checked.stderr
    compacted = _lakesink("maintain", "compact", "db.t", "--warehouse", warehouse)
    assert compacted.returncode == 0, compacted.stderr
    after = load(warehouse, "db.t")
    assert after.metadata.current_snapshot().summary.operation.value == "replace"  # type: ignore[union-attr]
    assert sorted(r["id"] for r in after.scan().to_arrow().to_pylist()) == list(range(20))
    unknown = _lakesink("compactify")
    assert unknown.returncode == 2 and "unknown command 'compactify'" in unknown.stderr
    assert "maintain" in _lakesink("--help").stdout
