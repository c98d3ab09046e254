"""Tables on an S3 store behind a catalog (issue 28), on a real SeaweedFS (`weed mini`):

- `rest`: its Iceberg REST catalog (OAuth client credentials) over its table bucket
  `warehouse`, which takes only Parquet, ORC and Avro under a table's data/;
- `sql`: pyiceberg's SQL catalog (SQLite) over the plain bucket `plain`.

Every table is read back by pyiceberg and DuckDB (httpfs) from S3 and compared with what
was written.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from lakesink_testing import expected_rows, rows
from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.table import Table
from pyspark.sql import types as T

from lakesink_datasource.check import check_table
from lakesink_datasource.datasource import _commit
from lakesink_datasource.duckdb_reader import connect as duckdb_connect
from lakesink_datasource.iceberg.summary_keys import EPOCH_ID
from lakesink_datasource.maintain import main as maintain_main
from lakesink_datasource.options import parse_options
from lakesink_datasource.table.setup import plan_write
from lakesink_datasource.write.task import TaskIdentity, write_task

CHILD = str(Path(__file__).with_name("stream_child.py"))
COLUMNS = ["id", "name"]


@dataclass
class Deployment:
    name: str  # rest | sql
    options: dict[str, str]  # the catalog (and S3) write options
    namespace: str
    s3: dict[str, str]

    def ident(self, table: str) -> str:
        return f"{self.namespace}.{table}"

    def catalog(self) -> Catalog:
        props = {k.removeprefix("catalog."): v for k, v in self.options.items() if k.startswith("catalog.")}
        return load_catalog(self.options["catalog"], **props)

    def load(self, table: str) -> Table:
        return self.catalog().load_table(self.ident(table))

    def readers(self, table: str, columns: list[str]) -> tuple[Counter, Counter]:
        loaded = self.load(table)
        cols = ", ".join(f'"{c}"' for c in columns)
        duck = duckdb_connect(self.s3).execute(f"SELECT {cols} FROM iceberg_scan('{loaded.metadata_location}')").to_arrow_table()
        return rows(loaded.scan().to_arrow(), columns), rows(duck, columns)

    def assert_readers_see(self, table: str, records: list[dict], columns: list[str] = COLUMNS) -> None:
        expected = expected_rows(records, columns)
        got_pyiceberg, got_duckdb = self.readers(table, columns)
        assert got_pyiceberg == expected, f"{self.name}: pyiceberg disagrees"
        assert got_duckdb == expected, f"{self.name}: DuckDB disagrees"


@pytest.fixture(params=["rest", "sql"])
def deployment(request, object_store, tmp_path: Path) -> Deployment:  # type: ignore[no-untyped-def]
    namespace = f"n{uuid.uuid4().hex[:10]}"  # the store and the REST catalog outlive the test
    return Deployment(request.param, object_store.options(request.param, tmp_path, namespace), namespace, object_store.s3)


def _write(spark, deployment: Deployment, table: str, rows: list[tuple], schema: str, mode: str = "append", **options: str) -> None:  # type: ignore[no-untyped-def]
    writer = spark.createDataFrame(rows, schema).write.format("lakesink").options(**deployment.options, **options)
    writer.mode(mode).save(deployment.ident(table))


# ----------------------------------------------------------------- exactly once


def test_a_streaming_append_is_exactly_once_across_a_sigkill(deployment: Deployment, tmp_path: Path) -> None:
    """The job is killed right after its batch 1 reached the table (before Spark logged it);
    the restarted query replays batch 1 and recognises it."""
    source = tmp_path / "source"
    source.mkdir()
    everything = []
    for b in range(3):
        part = [{"id": b * 100 + i, "name": f"b{b}-{i}"} for i in range(20)]
        path = source / f"{b:03d}.parquet"
        pq.write_table(pa.Table.from_pylist(part, schema=pa.schema([("id", pa.int64()), ("name", pa.string())])), path)
        os.utime(path, (1_700_000_000 + b * 10, 1_700_000_000 + b * 10))
        everything += part
    faults = tmp_path / "faults.json"

    def run(fault: list[dict]) -> int:
        faults.write_text(json.dumps(fault))
        extra = [f"{k}={v}" for k, v in deployment.options.items()]
        proc = subprocess.run(
            [sys.executable, CHILD, str(source), str(tmp_path / "checkpoint"), str(tmp_path / "unused"), deployment.ident("stream"), *extra],
            env={**os.environ, "LAKESINK_FAULTS": str(faults)}, start_new_session=True, capture_output=True, timeout=300,
        )
        assert proc.returncode in (0, -signal.SIGKILL), proc.stderr.decode()[-3000:]
        return proc.returncode

    assert run([{"point": "after_commit", "batch": 1, "action": "kill"}]) == -signal.SIGKILL
    assert run([]) == 0
    deployment.assert_readers_see("stream", everything)
    epochs = [s.summary[EPOCH_ID] for s in deployment.load("stream").metadata.snapshots if EPOCH_ID in s.summary.additional_properties]
    assert epochs == ["0", "1", "2"]


# ----------------------------------------------------------------- keyed writes


KEYED = "id long, name string, op string, seq long"


@pytest.mark.parametrize("format_version", ["3", "2"])
def test_upserts_and_cdc_read_back_from_the_store(spark, deployment: Deployment, format_version: str) -> None:
    upsert = {"operation": "upsert", "primary_key": "id", "format_version": format_version}
    cdc = {"operation": "cdc", "primary_key": "id", "op_column": "op", "sequence_column": "seq", "format_version": format_version}
    if deployment.name == "rest" and format_version == "3":
        # The table bucket refuses the batch's Puffin file of deletion vectors: said before
        # any row is written, with the way out, and the new (empty) table is taken back.
        with pytest.raises(Exception, match=r"the store refuses the deletion-vector files .*property\.write\.data\.path=.*/_data"):
            _write(spark, deployment, "u", [(1, "a")], "id long, name string", **upsert)
        assert deployment.ident("u") not in {".".join(t) for t in deployment.catalog().list_tables(deployment.namespace)}
        location = f"s3://warehouse/{deployment.namespace}"
        upsert["property.write.data.path"] = f"{location}/u/_data"
        cdc["property.write.data.path"] = f"{location}/c/_data"
    _write(spark, deployment, "u", [(i, f"a{i}") for i in range(10)], "id long, name string", **upsert)
    _write(spark, deployment, "u", [(i, f"b{i}") for i in range(5, 15)], "id long, name string", **upsert)
    deployment.assert_readers_see("u", [{"id": i, "name": f"a{i}" if i < 5 else f"b{i}"} for i in range(15)])

    _write(spark, deployment, "c", [(i, f"a{i}", "c", 1) for i in range(10)], KEYED, **cdc)
    _write(spark, deployment, "c", [(i, "", "d", 5) for i in range(0, 10, 3)] + [(1, "late", "u", 0), (2, "b2", "u", 6)], KEYED, **cdc)
    live = {i: f"a{i}" for i in range(10) if i % 3} | {2: "b2"}
    deployment.assert_readers_see("c", [{"id": i, "name": n} for i, n in live.items()])
    assert check_table(deployment.load("c")) == []


def test_the_reader_applies_deletion_vectors_on_the_store(spark, deployment: Deployment) -> None:
    upsert = {"operation": "upsert", "primary_key": "id"}
    if deployment.name == "rest":
        upsert["property.write.data.path"] = f"s3://warehouse/{deployment.namespace}/r/_data"
    _write(spark, deployment, "r", [(i, f"a{i}") for i in range(20)], "id long, name string", **upsert)
    _write(spark, deployment, "r", [(i, f"b{i}") for i in range(0, 20, 2)], "id long, name string", **upsert)
    read = spark.read.format("lakesink").options(**deployment.options).load(deployment.ident("r"))
    got = Counter((r["id"], r["name"]) for r in read.collect())
    assert got == Counter((i, f"b{i}" if i % 2 == 0 else f"a{i}") for i in range(20))


# ----------------------------------------------------------------- maintenance


SCHEMA = T.StructType([T.StructField("id", T.LongType()), T.StructField("name", T.StringType())])


def _batch(deployment: Deployment, table: str, ids: range, batch_id: int, **options: str) -> None:
    """One micro-batch through the production path (plan, task, the Spark writer's commit and
    the maintenance after it), in this process so its background work can be joined."""
    plan = plan_write(parse_options({"table": deployment.ident(table), **deployment.options, "progress": "false", **options}), SCHEMA, False)
    rows_ = pa.record_batch({"id": pa.array(list(ids), pa.int64()), "name": pa.array([f"n{i}" for i in ids])})
    message = write_task(plan, iter([rows_]), who=TaskIdentity(batch_id=batch_id, query_id="q"))
    _commit(plan, [message], batch_id)


def _join_orphan_scans() -> None:
    for thread in threading.enumerate():
        if thread.name == "lakesink-orphans":
            thread.join()


def test_maintenance_compacts_expires_and_removes_a_planted_orphan_on_the_store(deployment: Deployment) -> None:
    """Orphan removal used to list with a default S3 client that went to AWS (every scan
    failed, ~6 s). It lists through the table's FileIO now."""
    options = {
        "property.history.expire.max-snapshot-age-ms": "1",
        "property.lakesink.maintenance.orphan-min-age-ms": "0",
        "property.lakesink.maintenance.orphan-interval-ms": "0",
        "property.lakesink.maintenance.compaction-batches-per-run": "1",
        "property.lakesink.maintenance.compaction-fan-in": "4",  # six batches make a compaction
    }
    _batch(deployment, "m", range(0, 10), 0, **options)
    table = deployment.load("m")
    orphan = f"{table.metadata.location}/data/planted-orphan-{uuid.uuid4().hex}.parquet"
    with table.io.new_output(orphan).create() as out:
        pq.write_table(pa.table({"id": [1]}), out)
    _join_orphan_scans()
    for b in range(1, 6):
        _batch(deployment, "m", range(b * 10, b * 10 + 10), b, **options)
        _join_orphan_scans()
    table = deployment.load("m")
    assert not table.io.new_input(orphan).exists(), "the planted orphan is still there"
    snapshots = table.metadata.snapshots
    assert len(snapshots) <= 3, f"{len(snapshots)} snapshots retained"  # expired as the stream went
    assert any(s.summary and s.summary.additional_properties.get("lakesink.compaction") == "true" for s in snapshots) or \
        len(table.inspect.files()) < 6, "nothing was compacted"
    deployment.assert_readers_see("m", [{"id": i, "name": f"n{i}"} for i in range(60)])
    assert check_table(table) == []


def test_maintain_all_on_the_store(spark, deployment: Deployment, capsys: pytest.CaptureFixture[str]) -> None:
    for b in range(4):
        _write(spark, deployment, "t", [(b * 10 + i, f"n{b}-{i}") for i in range(10)], "id long, name string", maintenance="off")
    table = deployment.load("t")
    orphan = f"{table.metadata.location}/data/planted-orphan-{uuid.uuid4().hex}.parquet"
    with table.io.new_output(orphan).create() as out:
        pq.write_table(pa.table({"id": [1]}), out)
    args = ["all", deployment.ident("t"), "--catalog", deployment.options["catalog"], "--older-than-hours", "0", "--orphan-min-age-hours", "0"]
    for key, value in deployment.options.items():
        if key.startswith("catalog."):
            args += ["--catalog-prop", f"{key.removeprefix('catalog.')}={value}"]
    assert maintain_main(args) == 0
    out = capsys.readouterr().out
    assert "compaction: rewrote 8 data file(s)" in out and "orphans: removed 1 orphan file(s)" in out, out
    deployment.assert_readers_see("t", [{"id": b * 10 + i, "name": f"n{b}-{i}"} for b in range(4) for i in range(10)])
    assert len(deployment.load("t").metadata.snapshots) == 1


# ----------------------------------------------------------------- two applications


def test_two_applications_committing_at_once_both_land_after_a_retry(deployment: Deployment, arm_fault) -> None:  # type: ignore[no-untyped-def]
    """Right before the first write's commit, another application commits to the same table:
    the first one loses the compare-and-swap, retries on the new state and lands."""
    _batch(deployment, "two", range(0, 5), 0, maintenance="off")
    other = [sys.executable, "-c", _OTHER_APP, json.dumps({"table": deployment.ident("two"), **deployment.options})]
    arm_fault({"point": "before_commit", "action": "run", "once": True, "command": other})
    plan = plan_write(parse_options({"table": deployment.ident("two"), **deployment.options, "progress": "false", "maintenance": "off"}), SCHEMA, False)
    rows_ = pa.record_batch({"id": pa.array([10, 11], pa.int64()), "name": pa.array(["x10", "x11"])})
    from lakesink_datasource.commit.committer import commit_write
    from lakesink_datasource.messages import decode_messages

    outcome = commit_write(plan, decode_messages([write_task(plan, iter([rows_]), who=TaskIdentity())]), None)
    assert outcome.attempts == 2, "the commit did not meet the other application's"
    records = [{"id": i, "name": f"n{i}"} for i in range(5)] + [{"id": 100, "name": "other"}, {"id": 10, "name": "x10"}, {"id": 11, "name": "x11"}]
    deployment.assert_readers_see("two", records)


_OTHER_APP = """
import json, sys
import pyarrow as pa
from pyspark.sql import types as T
from lakesink_datasource.commit.committer import commit_write
from lakesink_datasource.messages import decode_messages
from lakesink_datasource.options import parse_options
from lakesink_datasource.table.setup import plan_write
from lakesink_datasource.write.task import TaskIdentity, write_task
options = {**json.loads(sys.argv[1]), "progress": "false", "maintenance": "off"}
schema = T.StructType([T.StructField("id", T.LongType()), T.StructField("name", T.StringType())])
plan = plan_write(parse_options(options), schema, False)
batch = pa.record_batch({"id": pa.array([100], pa.int64()), "name": pa.array(["other"])})
commit_write(plan, decode_messages([write_task(plan, iter([batch]), who=TaskIdentity())]), None)
"""


# ----------------------------------------------------------------- outages

SEAWEEDFS_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "start_seaweedfs.sh"


def _weed_pids() -> list[int]:
    """The running `weed mini` of the tests (started by .ci/run or the object_store fixture)."""
    data = os.path.join(os.environ.get("LAKESINK_SEAWEEDFS_DIR", "/tmp/lakesink-seaweedfs"), "data")
    found = subprocess.run(["pgrep", "-f", f"weed mini -dir={data}"], capture_output=True, text=True)
    return [int(p) for p in found.stdout.split()]


TAKE_THE_STORE_AWAY = """
import os, signal, subprocess, sys
for pid in map(int, sys.argv[3:]):
    os.kill(pid, signal.SIGKILL)
# Back on the same data after the outage, from a process of its own (this one returns now).
subprocess.Popen(["sh", "-c", f"sleep {sys.argv[2]}; {sys.argv[1]} > /dev/null 2>&1"], start_new_session=True)
"""


def test_a_keyed_stream_rides_out_the_store_and_its_catalog_going_away(deployment: Deployment, tmp_path: Path) -> None:
    """SeaweedFS (the S3 store, and for `rest` the REST catalog too) is killed once two batches
    have landed, stays down (`rest`: 60 seconds, a minute of catalog and store both away;
    `sql`: 20 seconds, far longer than the S3 client's own three attempts) and is started
    again on the same data: the query waits (whatever runs next retries within the outage
    budget, saying so) and never stops; the table is exact."""
    _ride_out_an_outage(deployment, tmp_path, fault=None, seconds=60 if deployment.name == "rest" else 20)


@pytest.mark.parametrize("deployment", ["sql"], indirect=True)
@pytest.mark.parametrize("fault", ["task_rows_written", "before_commit"], ids=["while-a-task-writes", "before-the-commit"])
def test_a_task_and_a_commit_wait_for_the_store_to_come_back(deployment: Deployment, tmp_path: Path, fault: str) -> None:
    """The same outage started right before a task of batch 2 puts its files (it waits on
    the data file's upload) or right before the driver commits batch 2 (it waits on the
    manifests), for 20 seconds: the query never stops, the table is exact."""
    _ride_out_an_outage(deployment, tmp_path, fault=fault, seconds=20)


def _ride_out_an_outage(deployment: Deployment, tmp_path: Path, fault: str | None, seconds: int) -> None:
    import time

    source = tmp_path / "source"
    source.mkdir()
    batches = [[{"id": (b * 7 + i) % 120, "name": f"b{b}-{i}"} for i in range(30)] for b in range(30)]
    for b, part in enumerate(batches):
        path = source / f"{b:03d}.parquet"
        pq.write_table(pa.Table.from_pylist(part, schema=pa.schema([("id", pa.int64()), ("name", pa.string())])), path)
        os.utime(path, (1_700_000_000 + b * 10, 1_700_000_000 + b * 10))
    keyed = {"operation": "upsert", "primary_key": "id", "format_version": "2", "index_dir": str(tmp_path / "index")}
    extra = [f"{k}={v}" for k, v in {**deployment.options, **keyed}.items()]
    checkpoint = tmp_path / "checkpoint"
    pids = _weed_pids()
    assert pids, "no SeaweedFS process to take away"
    script = tmp_path / "take_the_store_away.py"
    script.write_text(TAKE_THE_STORE_AWAY)
    take_away = [sys.executable, str(script), str(SEAWEEDFS_SCRIPT), str(seconds), *map(str, pids)]
    env = {k: v for k, v in os.environ.items() if k != "LAKESINK_FAULTS"}
    if fault is not None:
        faults = tmp_path / "faults.json"
        faults.write_text(json.dumps([{"point": fault, "batch": 2, "action": "run", "once": True, "command": take_away}]))
        env["LAKESINK_FAULTS"] = str(faults)
    log = open(tmp_path / "child.log", "wb")  # noqa: SIM115 (closed below)
    child = subprocess.Popen([sys.executable, CHILD, str(source), str(checkpoint), str(tmp_path / "unused"), deployment.ident("outage"), *extra],
                             env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        if fault is None:
            deadline = time.monotonic() + 300
            while not (checkpoint / "commits" / "1").exists():  # two batches landed: the stream is running
                assert child.poll() is None, (tmp_path / "child.log").read_text()[-3000:]
                assert time.monotonic() < deadline, "the stream never committed a batch"
                time.sleep(0.2)
            subprocess.run(take_away, check=True)
        code = child.wait(timeout=900)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
        log.close()
        # The store back for the tests after this one, whatever happened.
        subprocess.run([str(SEAWEEDFS_SCRIPT)], check=True, capture_output=True, timeout=180)
    output = (tmp_path / "child.log").read_text()
    assert code == 0, output[-4000:]
    assert "outage budget" in output  # it said it was waiting, and on what
    if fault is not None:
        assert json.loads((tmp_path / "faults.json").read_text()) == []  # the fault fired
    live: dict[int, dict] = {}
    for part in batches:
        live.update({r["id"]: r for r in part})
    deployment.assert_readers_see("outage", list(live.values()))
    assert check_table(deployment.load("outage")) == []
