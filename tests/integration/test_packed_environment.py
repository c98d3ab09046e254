"""lakesink on a cluster whose workers do not have it: the executors run Python from a packed
environment (scripts/pack_env.sh, venv-pack) shipped with `spark.archives`, as docs/deploy.md
says. A real standalone cluster (pyspark's bin/spark-class) of two workers whose default
Python is the bare base interpreter (no pyarrow, no pyiceberg, no lakesink); the driver runs
in a child process from a directory holding the same environment unpacked (`./environment`:
Spark starts the driver's own Python workers, where a Python data source plans and commits,
with the same PYSPARK_PYTHON as the executors').
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from lakesink_testing import assert_readers_see, expected_rows, load
from standalone_cluster import Cluster

from lakesink_datasource.check import check_table

ROOT = Path(__file__).resolve().parents[2]
CHILD = str(Path(__file__).with_name("packed_child.py"))
pytestmark = pytest.mark.slow


def _bare_python() -> str:
    """The interpreter the project's venv was made from: no site-packages of the venv."""
    base = getattr(sys, "_base_executable", sys.executable)
    found = subprocess.run([base, "-c", "import pyarrow"], cwd="/", capture_output=True)
    assert found.returncode != 0, f"{base} has pyarrow: not a bare Python, the test would prove nothing"
    return base


def test_workers_without_lakesink_run_it_from_a_packed_environment(tmp_path: Path) -> None:
    bare = _bare_python()
    # Pinned to the driver's versions (pip then takes its cache), as a user would with `pip freeze`.
    frozen = subprocess.run([sys.executable, "-m", "pip", "freeze", "--exclude-editable"], capture_output=True, text=True, check=True)
    constraints = tmp_path / "constraints.txt"
    constraints.write_text("\n".join(line for line in frozen.stdout.splitlines() if not line.startswith("lakesink")))
    archive = tmp_path / "lakesink-env.tar.gz"
    subprocess.run([str(ROOT / "scripts" / "pack_env.sh"), str(archive), bare], env={**os.environ, "PIP_CONSTRAINT": str(constraints)},
                   check=True, capture_output=True, timeout=900)
    driver_dir = tmp_path / "driver"
    (driver_dir / "environment").mkdir(parents=True)
    with tarfile.open(archive) as packed:
        packed.extractall(driver_dir / "environment", filter="tar")

    source = tmp_path / "source"
    source.mkdir()
    batches = [[{"id": i, "v": f"b{b}"} for i in range(b * 50, b * 50 + 100)] for b in range(3)]
    for b, rows in enumerate(batches):
        path = source / f"{b}.parquet"
        pq.write_table(pa.Table.from_pylist(rows, schema=pa.schema([("id", pa.int64()), ("v", pa.string())])), path)
        os.utime(path, (1_700_000_000 + b * 10, 1_700_000_000 + b * 10))

    cluster = Cluster(tmp_path / "cluster")
    cluster.env["PYSPARK_PYTHON"] = bare  # what the workers would run without the archive
    cluster.env.pop("VIRTUAL_ENV", None)
    warehouse, out = tmp_path / "warehouse", tmp_path / "out.json"
    try:
        cluster.start_master()
        cluster.start_worker()
        cluster.start_worker()
        env = {**{k: v for k, v in os.environ.items() if k not in ("LAKESINK_FAULTS", "PYSPARK_DRIVER_PYTHON")},
               "PYSPARK_PYTHON": "./environment/bin/python"}
        child = subprocess.run([sys.executable, CHILD, cluster.master, str(archive), str(warehouse), str(source), str(tmp_path / "ck"), str(out)],
                               env=env, cwd=driver_dir, capture_output=True, text=True, timeout=600)
        assert child.returncode == 0, child.stderr[-4000:]
    finally:
        cluster.stop()

    # Every executor ran the archive's Python, unpacked in its own work directory on a worker.
    pythons = json.loads(out.read_text())["executor_pythons"]
    assert pythons and all("/work/app-" in p and p.endswith("/environment/bin/python") for p in pythons), pythons
    assert_readers_see(str(warehouse), "db.batch", expected_rows([{"id": i, "v": f"v{i}"} for i in range(1000)], ["id", "v"]), ["id", "v"])
    live = {r["id"]: r for rows in batches for r in rows}
    assert_readers_see(str(warehouse), "db.keyed", expected_rows(live.values(), ["id", "v"]), ["id", "v"])
    assert check_table(load(str(warehouse), "db.keyed")) == []
