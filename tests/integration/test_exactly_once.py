"""Exactly once across crashes: kill the job at each window that matters, restart, count rows.

Each scenario runs the streaming job in a child process (its own JVM and Python workers,
one process group) so a fault point can SIGKILL all of it, like a machine crash.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import sysconfig
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from lakesink_testing import PYSPARK_MINOR, assert_readers_see, expected_rows, load

from lakesink_datasource.iceberg.summary_keys import EPOCH_ID
from lakesink_datasource.spark_version import SUPPORTED_MINORS

CHILD = str(Path(__file__).with_name("stream_child.py"))
COLUMNS = ["id", "name"]
pytestmark = pytest.mark.slow


def make_source(folder: Path, batches: int, rows_per_batch: int) -> list[dict]:
    folder.mkdir(parents=True)
    everything = []
    for b in range(batches):
        rows = [{"id": b * 1000 + i, "name": f"b{b}-{i}"} for i in range(rows_per_batch)]
        path = folder / f"{b:03d}.parquet"
        pq.write_table(pa.Table.from_pylist(rows, schema=pa.schema([("id", pa.int64()), ("name", pa.string())])), path)
        # The file source orders files by modification time: make batch b = file b.
        os.utime(path, (1_700_000_000 + b * 10, 1_700_000_000 + b * 10))
        everything += rows
    return everything


def run_child(tmp_path: Path, warehouse: str, faults: list[dict] | None, extra: tuple[str, ...] = ()) -> int:
    return run_child_process(tmp_path, warehouse, faults, extra).returncode


def run_child_process(
    tmp_path: Path, warehouse: str, faults: list[dict] | None, extra: tuple[str, ...] = (), spark_conf: dict[str, str] | None = None,
    python: str | None = None,
) -> subprocess.CompletedProcess[bytes]:
    env = dict(os.environ)
    if spark_conf:
        env["STREAM_CHILD_SPARK_CONF"] = ";".join(f"{k}={v}" for k, v in spark_conf.items())
    if python:
        env["STREAM_CHILD_PYSPARK_PYTHON"] = python
    faults_file = tmp_path / "child-faults.json"
    if faults is None:
        env.pop("LAKESINK_FAULTS", None)
    else:
        faults_file.write_text(json.dumps(faults))
        env["LAKESINK_FAULTS"] = str(faults_file)
    proc = subprocess.run(
        [sys.executable, CHILD, str(tmp_path / "source"), str(tmp_path / "checkpoint"), warehouse, "db.stream", "partition_by=bucket(2, id)", *extra],
        env=env,
        start_new_session=True,  # its own process group: the fault kills the child's whole tree only
        capture_output=True,
        timeout=300,
    )
    return proc


def epochs(warehouse: str) -> list[str]:
    """The epochs of the batch snapshots, oldest first (compactions between them carry none)."""
    return [s.summary[EPOCH_ID] for s in load(warehouse, "db.stream").metadata.snapshots if EPOCH_ID in s.summary.additional_properties]


def rows_of_batches(everything: list[dict], batches: range) -> Counter:
    return expected_rows([r for r in everything if r["id"] // 1000 in batches], COLUMNS)


def test_a_stream_s_tasks_run_in_lakesink_s_executor_daemon(tmp_path: Path, warehouse: str) -> None:
    """spark.python.daemon.module=lakesink_datasource.worker_daemon (docs/performance.md,
    "Start-up"): Spark's executor daemon is lakesink's, which imports the task side before it
    forks; the stream's batches land once each, as with Spark's own daemon."""
    everything = make_source(tmp_path / "source", batches=3, rows_per_batch=200)
    proc = run_child_process(tmp_path, warehouse, None, spark_conf={"spark.python.daemon.module": "lakesink_datasource.worker_daemon"})
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    daemons = proc.stdout.decode().split("daemons:", 1)[1]
    assert "-m lakesink_datasource.worker_daemon" in daemons
    # The driver's daemons stay Spark's own, which import no lakesink before they fork (its
    # forked workers do): the contrast the lakesink-python test below relies on.
    own = [line for line in daemons.strip().splitlines() if "-m pyspark.daemon" in line]
    assert own and not any(line.endswith("| lakesink loaded") for line in own), daemons
    assert epochs(warehouse) == ["0", "1", "2"]
    assert_readers_see(warehouse, "db.stream", rows_of_batches(everything, range(3)), COLUMNS)


def test_every_python_daemon_of_a_stream_run_by_lakesink_python_imports_lakesink_before_it_forks(tmp_path: Path, warehouse: str) -> None:
    """PYSPARK_PYTHON=<venv>/bin/lakesink-python (docs/deploy.md): the daemons Spark starts for
    the executors' tasks, the write's planning and the streaming commit each have lakesink's
    modules loaded before they fork (msgspec's library mapped in the daemon itself), which
    Spark's own daemon never has (the test above); the stream's batches land once each."""
    everything = make_source(tmp_path / "source", batches=3, rows_per_batch=200)
    lakesink_python = Path(sysconfig.get_path("scripts")) / "lakesink-python"
    assert lakesink_python.exists(), "the package installs bin/lakesink-python (setup.cfg scripts)"
    proc = run_child_process(tmp_path, warehouse, None, python=str(lakesink_python))
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    daemons = proc.stdout.decode().split("daemons:", 1)[1].strip().splitlines()
    by_worker = {line.split(" | ")[0].split()[-1]: line for line in daemons if "lakesink-python -m pyspark.daemon" in line}
    roles = ("pyspark.worker", "pyspark.sql.worker.write_into_data_source", "pyspark.sql.worker.python_streaming_sink_runner")
    assert set(roles) <= set(by_worker), daemons
    assert all(by_worker[role].endswith("| lakesink loaded") for role in roles), daemons
    assert epochs(warehouse) == ["0", "1", "2"]
    assert_readers_see(warehouse, "db.stream", rows_of_batches(everything, range(3)), COLUMNS)


def test_kill_after_iceberg_commit_before_spark_commit_log_replays_without_duplicates(tmp_path: Path, warehouse: str) -> None:
    everything = make_source(tmp_path / "source", batches=4, rows_per_batch=25)
    code = run_child(tmp_path, warehouse, [{"point": "after_commit", "batch": 1, "action": "kill"}])
    assert code == -signal.SIGKILL
    # Batch 1 reached the table, but Spark never logged it: it will run it again.
    assert epochs(warehouse) == ["0", "1"]
    assert_readers_see(warehouse, "db.stream", rows_of_batches(everything, range(2)), COLUMNS)

    assert run_child(tmp_path, warehouse, None) == 0
    assert_readers_see(warehouse, "db.stream", expected_rows(everything, COLUMNS), COLUMNS)
    assert epochs(warehouse) == ["0", "1", "2", "3"]  # batch 1 replayed, not re-applied


def test_kill_while_tasks_write_leaves_nothing_visible_and_restart_completes(tmp_path: Path, warehouse: str) -> None:
    everything = make_source(tmp_path / "source", batches=3, rows_per_batch=25)
    code = run_child(tmp_path, warehouse, [{"point": "task_files_written", "batch": 1, "action": "kill"}])
    assert code == -signal.SIGKILL
    assert epochs(warehouse) == ["0"]
    assert_readers_see(warehouse, "db.stream", rows_of_batches(everything, range(1)), COLUMNS)

    assert run_child(tmp_path, warehouse, None) == 0
    assert_readers_see(warehouse, "db.stream", expected_rows(everything, COLUMNS), COLUMNS)
    assert epochs(warehouse) == ["0", "1", "2"]


def test_kill_before_commit_then_restart(tmp_path: Path, warehouse: str) -> None:
    everything = make_source(tmp_path / "source", batches=3, rows_per_batch=25)
    killed = run_child_process(tmp_path, warehouse, [{"point": "before_commit", "batch": 2, "action": "kill"}])
    assert killed.returncode == -signal.SIGKILL
    assert epochs(warehouse) == ["0", "1"]
    # The driver's console shows one line per committed batch, and none for the killed one.
    console = killed.stderr.decode()
    assert re.search(r"lakesink db\.stream batch 0: 25 rows in, 25 written, 0 old rows hidden \| 2 files, 0 DVs, .* \| snapshot \d+", console), console[-3000:]
    assert "lakesink db.stream batch 1: 25 rows in" in console
    assert "batch 2:" not in console
    restarted = run_child_process(tmp_path, warehouse, None)
    assert restarted.returncode == 0
    assert "lakesink db.stream batch 2: 25 rows in" in restarted.stderr.decode()
    make_source(tmp_path / "quiet" / "source", batches=1, rows_per_batch=5)
    quiet = run_child_process(tmp_path / "quiet", str(tmp_path / "quiet-warehouse"), None, ("progress=false",))
    assert quiet.returncode == 0 and "lakesink db.stream" not in quiet.stderr.decode()
    assert_readers_see(warehouse, "db.stream", expected_rows(everything, COLUMNS), COLUMNS)
    assert epochs(warehouse) == ["0", "1", "2"]


def test_failed_task_aborts_the_batch_and_deletes_its_files(tmp_path: Path, warehouse: str) -> None:
    everything = make_source(tmp_path / "source", batches=3, rows_per_batch=25)
    code = run_child(tmp_path, warehouse, [{"point": "task_files_written", "batch": 1, "action": "raise"}])
    assert code != 0
    assert epochs(warehouse) == ["0"]
    # Only batch 0's files remain: the failed batch's tasks and abort() removed theirs.
    committed = {f.file_path.removeprefix("file://") for f in load(warehouse, "db.stream").scan().plan_files() for f in [f.file]}
    on_disk = {str(p) for p in Path(warehouse).rglob("*.parquet")}
    assert on_disk == committed

    assert run_child(tmp_path, warehouse, None) == 0
    assert_readers_see(warehouse, "db.stream", expected_rows(everything, COLUMNS), COLUMNS)


# --- keyed batches -------------------------------------------------------------------------


def make_keyed_source(folder: Path, batches: int) -> list[list[dict]]:
    """Each batch overlaps the previous one by 15 keys, so most batches update rows."""
    folder.mkdir(parents=True)
    out = []
    for b in range(batches):
        rows = [{"id": i, "name": f"b{b}-{i}"} for i in range(b * 10, b * 10 + 25)]
        path = folder / f"{b:03d}.parquet"
        pq.write_table(pa.Table.from_pylist(rows, schema=pa.schema([("id", pa.int64()), ("name", pa.string())])), path)
        os.utime(path, (1_700_000_000 + b * 10, 1_700_000_000 + b * 10))
        out.append(rows)
    return out


def upsert_model(batches: list[list[dict]]) -> Counter:
    live: dict[int, dict] = {}
    for batch in batches:
        for row in batch:
            live[row["id"]] = row
    return expected_rows(list(live.values()), COLUMNS)


_CRASH_WINDOWS = {
    "kill-after-commit": ({"point": "after_commit", "batch": 1, "action": "kill"}, 2),
    "kill-during-task-writes": ({"point": "task_files_written", "batch": 1, "action": "kill"}, 1),
    "task-failure-abort": ({"point": "task_files_written", "batch": 1, "action": "raise"}, 1),
}
# Each crash window with and without cluster_by_key: six pairs. The older PySpark minors run
# one each (scripts/compat_tests.sh: 4.0 the first, 4.1 the second, 4.2 the third); the
# newest runs the other three, so a CI run covers all six once.
_RUN_ON_OLDER_MINORS = {"kill-after-commit-cluster_by_key", "kill-during-task-writes-unrouted", "task-failure-abort-cluster_by_key"}
_CRASH_PAIRS = [
    pytest.param(fault, visible, routed, id=f"{window}-{'cluster_by_key' if routed else 'unrouted'}")
    for window, (fault, visible) in _CRASH_WINDOWS.items() for routed in (False, True)
    if SUPPORTED_MINORS[-1] > PYSPARK_MINOR or f"{window}-{'cluster_by_key' if routed else 'unrouted'}" not in _RUN_ON_OLDER_MINORS
]


@pytest.mark.parametrize(("fault", "batches_visible_after_crash", "routed"), _CRASH_PAIRS)
def test_keyed_upserts_survive_crashes_and_the_index_recovers(
    tmp_path: Path, warehouse: str, fault: dict, batches_visible_after_crash: int, routed: bool
) -> None:
    """Also through cluster_by_key, whose keyed work runs inside Spark's stateful operator:
    a kill while it writes, a task failure, a kill after the Iceberg commit."""
    from lakesink_datasource.check import check_table

    batches = make_keyed_source(tmp_path / "source", batches=4)
    keyed: tuple[str, ...] = ("operation=upsert", "primary_key=id", f"index_dir={tmp_path / 'index'}")
    if routed:
        keyed += ("route=2",)
    code = run_child(tmp_path, warehouse, [fault], keyed)
    assert code != 0
    assert_readers_see(warehouse, "db.stream", upsert_model(batches[:batches_visible_after_crash]), COLUMNS)

    # Restart with the same checkpoint and index directory: no manual step.
    assert run_child(tmp_path, warehouse, None, keyed) == 0
    assert_readers_see(warehouse, "db.stream", upsert_model(batches), COLUMNS)
    assert epochs(warehouse) == ["0", "1", "2", "3"]
    assert check_table(load(warehouse, "db.stream")) == []


OTHER_UPSERT = """
import sys
import pyarrow as pa
from pyspark.sql import types as T
from lakesink_datasource.commit.committer import commit_write
from lakesink_datasource.messages import decode_messages
from lakesink_datasource.options import parse_options
from lakesink_datasource.table.setup import plan_write
from lakesink_datasource.write.task import write_task
warehouse, index_dir = sys.argv[1], sys.argv[2]
schema = T.StructType([T.StructField("id", T.LongType()), T.StructField("name", T.StringType())])
options = parse_options({"table": "db.stream", "warehouse": warehouse, "operation": "upsert", "primary_key": "id",
                         "index_dir": index_dir, "progress": "false"})
plan = plan_write(options, schema, overwrite=False)
rows = pa.RecordBatch.from_pylist([{"id": i, "name": f"other-{i}"} for i in range(20, 40)],
                                  schema=pa.schema([("id", pa.int64()), ("name", pa.string())]))
commit_write(plan, decode_messages([write_task(plan, iter([rows]))]), None)
"""


@pytest.mark.parametrize("killed", [False, True], ids=["lands", "killed-before-the-swap"])
def test_a_batch_job_upserting_a_slice_of_a_streams_keys_never_stops_it(tmp_path: Path, warehouse: str, killed: bool) -> None:
    """Right before batch 1's swap a batch job upserts keys 20..39 (batch 1 writes 10..34):
    the commit decides the 15 shared keys (this batch is later: its rows win) and lands.
    Killed between that decision and the swap, the restarted query replays batch 1 against
    the other write, lands it once, and the shared keys end the same way."""
    from lakesink_datasource.check import check_table
    from lakesink_datasource.iceberg.summary_keys import KEYS_REDECIDED

    batches = make_keyed_source(tmp_path / "source", batches=3)
    script = tmp_path / "other_upsert.py"
    script.write_text(OTHER_UPSERT)
    keyed: tuple[str, ...] = ("operation=upsert", "primary_key=id", f"index_dir={tmp_path / 'index'}")
    faults = [
        {"point": "before_commit", "batch": 1, "action": "run", "once": True,
         "command": [sys.executable, str(script), warehouse, str(tmp_path / "other-index")]},
        *([{"point": "keys_redecided", "batch": 1, "action": "kill"}] if killed else []),
    ]
    other = [{"id": i, "name": f"other-{i}"} for i in range(20, 40)]
    if killed:
        assert run_child(tmp_path, warehouse, faults, keyed) != 0
        # Batch 0 and the other writer's upsert; nothing of batch 1.
        assert_readers_see(warehouse, "db.stream", upsert_model([batches[0], other]), COLUMNS)
        assert run_child(tmp_path, warehouse, None, keyed) == 0
    else:
        assert run_child(tmp_path, warehouse, faults, keyed) == 0
    assert_readers_see(warehouse, "db.stream", upsert_model([batches[0], other, *batches[1:]]), COLUMNS)
    assert epochs(warehouse) == ["0", "1", "2"]
    table = load(warehouse, "db.stream")
    assert check_table(table) == []
    decided = [int(s.summary.additional_properties[KEYS_REDECIDED]) for s in table.metadata.snapshots
               if s.summary and KEYS_REDECIDED in s.summary.additional_properties]
    # Decided at commit (keys 20..34); a replay planned after the other write resolves them in its tasks.
    assert decided == ([] if killed else [15])
