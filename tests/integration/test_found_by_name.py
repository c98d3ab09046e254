"""format("lakesink") with no register call: Spark imports pyspark_lakesink at session start
(SPARK-45917). A spark-submit job writes a batch, a stream and a SQL INSERT into a table
created with CREATE TABLE ... USING lakesink, reads it back, then registers lakesink
explicitly (still allowed) and writes once more."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyspark
import pytest
from lakesink_testing import PYSPARK_MINOR, assert_readers_see, expected_rows

SPARK_HOME = Path(pyspark.__file__).parent
CHILD = Path(__file__).with_name("found_by_name_child.py")


@pytest.mark.child
def test_a_spark_submit_job_finds_lakesink_without_registering_it(tmp_path: Path, warehouse: str) -> None:
    env = {**os.environ, "SPARK_HOME": str(SPARK_HOME), "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    run = subprocess.run(
        [str(SPARK_HOME / "bin" / "spark-submit"), "--master", "local[2]", "--conf", "spark.ui.enabled=false",
         "--conf", f"spark.sql.warehouse.dir={tmp_path / 'spark-warehouse'}", str(CHILD), warehouse, str(tmp_path / "work")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    found = [(i, f"b{i}") for i in range(3)] + [(10, "s10"), (11, "s11"), (20, "q")]
    assert seen["read"] == sorted([i, v] for i, v in found)
    if PYSPARK_MINOR >= (4, 1):  # a register replaces a source found by name (SPARK-51919)
        assert seen["registered"] == "yes"
    else:  # PySpark 4.0 (docs/deploy.md): the write after it still found lakesink by name
        assert "DATA_SOURCE_ALREADY_EXISTS" in seen["registered"]
    records = [{"id": i, "v": v} for i, v in [*found, (30, "r")]]
    assert_readers_see(warehouse, "db.found", expected_rows(records, ["id", "v"]), ["id", "v"])
