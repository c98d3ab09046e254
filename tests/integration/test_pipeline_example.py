"""examples/pipeline, a Spark Declarative Pipeline (PySpark 4.1+) with an append sink, a keyed
sink and a stream routed to many tables, run with `spark-pipelines run` as a user would:
it exits 0, a second run with nothing new writes nothing, and (on the newest minor, where CI
runs the whole suite) `--full-refresh-all`, new checkpoints for every flow, leaves no row
twice. DuckDB and pyiceberg read the tables."""

from __future__ import annotations

import fcntl
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from lakesink_testing import assert_readers_see, expected_rows, load

from lakesink_datasource.spark_version import SUPPORTED_MINORS, pyspark_version
from lakesink_datasource.table.new_checkpoint import NEW_CHECKPOINT_SUMMARY

pytest.importorskip("pyspark.pipelines", reason="Spark Declarative Pipelines came with PySpark 4.1")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "pipeline"
TABLES = ("shop.events", "shop.customers", "replica.orders", "replica.payments")


def _project(tmp_path: Path) -> tuple[Path, Path]:
    """The example, copied, with its two absolute paths pointing under tmp_path."""
    project, root = tmp_path / "pipeline", tmp_path / "root"
    shutil.copytree(EXAMPLE, project)
    spec = project / "spark-pipeline.yml"
    text = spec.read_text()
    assert text.count("/tmp/lakesink-pipeline-example") == 2
    spec.write_text(text.replace("/tmp/lakesink-pipeline-example", str(root)))
    subprocess.run([sys.executable, str(project / "make_data.py"), str(root)], check=True, timeout=120)
    return project, root


def _run(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    started = time.monotonic()
    run = subprocess.run([str(Path(sys.executable).with_name("spark-pipelines")), "run", *args], cwd=project, env=env,
                         capture_output=True, text=True, timeout=600)
    print(f"spark-pipelines run {' '.join(args)}: exit {run.returncode} in {time.monotonic() - started:.1f} s")
    return run


def _expected() -> dict[str, tuple[list[str], list[dict]]]:
    """What make_data.py's input makes of each table."""
    events = [{"event_id": i, "kind": ("view", "cart", "buy")[i % 3]} for i in range(300)]
    customers = [{"customer_id": i, "tier": "gold" if i < 10 else "bronze", "version": 2 if i < 10 else 1} for i in range(50)]
    orders = [{"id": i, "total": 999 if i == 1 else i * 10, "lsn": 200 if i == 1 else i} for i in range(1, 21) if i != 2]
    payments = [{"id": i, "order_id": i + 1, "paid": True} for i in range(5)]
    return {
        "shop.events": (["event_id", "kind"], events), "shop.customers": (["customer_id", "tier", "version"], customers),
        "replica.orders": (["id", "total", "lsn"], orders), "replica.payments": (["id", "order_id", "paid"], payments),
    }


def _assert_tables(warehouse: str) -> None:
    for table, (columns, rows) in _expected().items():
        assert_readers_see(warehouse, table, expected_rows(rows, columns), columns)


def _newest_minor() -> bool:
    minor = tuple(int(p) for p in pyspark_version().split(".")[:2])
    return minor >= SUPPORTED_MINORS[-1]


def _port_in_use(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture
def connect_port() -> Iterator[None]:
    """spark-pipelines' local Connect server always takes port 15002 (PySpark 4.1 to 4.3):
    this test in another test session (`.ci/run` runs two older minors' sets at once) waits
    for that one's lock; any other holder of the port fails the test."""
    with open(Path(tempfile.gettempdir()) / "lakesink-tests-port-15002.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _port_in_use(15002):
            pytest.fail("port 15002 is in use (another Spark Connect server or pipeline run?): spark-pipelines run needs it")
        yield


@pytest.mark.child
def test_the_example_pipeline_runs_reruns_and_refreshes_without_a_row_twice(tmp_path: Path, connect_port: None) -> None:
    project, root = _project(tmp_path)
    warehouse = str(root / "warehouse")

    first = _run(project)
    # Exit 0 after a completed run (a Python source registered in the definitions exits 1).
    assert first.returncode == 0, first.stderr[-4000:]
    assert "Run is COMPLETED" in first.stderr + first.stdout
    _assert_tables(warehouse)
    snapshots = {t: [s.snapshot_id for s in load(warehouse, t).metadata.snapshots] for t in TABLES}

    again = _run(project)
    assert again.returncode == 0, again.stderr[-4000:]
    assert {t: [s.snapshot_id for s in load(warehouse, t).metadata.snapshots] for t in TABLES} == snapshots  # nothing new
    _assert_tables(warehouse)

    if not _newest_minor():
        # Older minors run this in CI's compatibility set, within its time: run and rerun. What
        # a full refresh meets (a new checkpoint's query id) is lakesink's code, the same on
        # every minor; test_new_checkpoint.py tests it in a session.
        return
    # New checkpoints for every flow: the sources are read again from the start.
    refreshed = _run(project, "--full-refresh-all")
    assert refreshed.returncode == 0, refreshed.stderr[-4000:]
    _assert_tables(warehouse)
    # The append and keyed sinks were recomputed (new_checkpoint=replace): emptied once each.
    for table in ("shop.events", "shop.customers"):
        snapshots_of = load(warehouse, table).metadata.snapshots
        emptied = [s for s in snapshots_of if s.summary is not None and NEW_CHECKPOINT_SUMMARY in s.summary.additional_properties]
        assert len(emptied) == 1, table
