"""Keyed writes on a real Spark standalone cluster: one master, two workers, each worker with
its own HOME and so its own key index, like two machines.

The cluster runs from pyspark's own launcher (bin/spark-class); the driver runs in a child
process (tests/integration/cluster_child.py) because this test session already has its one
local SparkSession.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pyspark
import pytest
from lakesink_testing import assert_readers_see, expected_rows, load, table_exists

from lakesink_datasource.check import check_table
from lakesink_datasource.iceberg.summary_keys import HOSTS

sys.path.insert(0, str(Path(__file__).parent))
from cluster_child import TABLE, cdc_batches

CHILD = str(Path(__file__).with_name("cluster_child.py"))
SPARK_CLASS = str(Path(pyspark.__file__).parent / "bin" / "spark-class")
COLUMNS = ["id", "v", "seq"]
pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _alive_workers(ui_port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json", timeout=2) as response:
            return int(json.load(response).get("aliveworkers", 0))
    except (OSError, ValueError):  # not up yet, or a page that is not the JSON one
        return 0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, list[Path]]]:
    root = tmp_path_factory.mktemp("cluster")
    port, ui = _free_port(), _free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("XDG_CACHE_HOME", "LAKESINK_FAULTS")}
    env["PYSPARK_PYTHON"] = sys.executable
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    processes = []
    logs = []

    def start(name: str, args: list[str], home: Path) -> None:
        home.mkdir(parents=True, exist_ok=True)
        log = open(root / f"{name}.log", "wb")  # noqa: SIM115 (closed at teardown)
        logs.append(log)
        processes.append(subprocess.Popen([SPARK_CLASS, *args], env={**env, "HOME": str(home)}, stdout=log, stderr=log, start_new_session=True))

    start("master", ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port), "--webui-port", str(ui)], root / "master")
    homes = [root / f"worker{i}" for i in range(2)]
    for i, home in enumerate(homes):
        start(f"worker{i}", ["org.apache.spark.deploy.worker.Worker", f"spark://127.0.0.1:{port}", "--cores", "1", "--memory", "1g",
                             "--webui-port", str(_free_port()), "--work-dir", str(home / "work")], home)
    try:
        deadline = time.monotonic() + 120
        while _alive_workers(ui) < 2:
            assert time.monotonic() < deadline, "the standalone workers never registered: " + (root / "master.log").read_text()[-2000:]
            time.sleep(0.2)
        yield f"spark://127.0.0.1:{port}", homes
    finally:
        for p in processes:
            os.killpg(p.pid, signal.SIGTERM)
        for p in processes:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
        for log in logs:
            log.close()


def _drive(master: str, tmp_path: Path, scenario: str) -> dict:
    out, faults = tmp_path / f"{scenario}.json", tmp_path / "faults.json"
    faults.write_text("[]")
    env = {k: v for k, v in os.environ.items() if k != "LAKESINK_FAULTS"}
    proc = subprocess.run([sys.executable, CHILD, master, str(tmp_path / "warehouse"), str(faults), scenario, str(out)],
                          env=env, capture_output=True, timeout=600)
    assert proc.returncode == 0, proc.stderr.decode()[-4000:]
    return json.loads(out.read_text())


def _model(batches: list[list[tuple[int, str, str, int]]]) -> dict[int, dict]:
    """Key -> live row; a change applies only if its seq is above the key's last one (deletes too)."""
    live: dict[int, dict] = {}
    latest: dict[int, int] = {}
    for batch in batches:
        for key, v, op, seq in sorted(batch, key=lambda r: r[3]):
            if latest.get(key, -1) > seq:
                continue
            latest[key] = seq
            if op == "d":
                live.pop(key, None)
            else:
                live[key] = {"id": key, "v": v, "seq": seq}
    return live


def test_keyed_cdc_on_two_hosts_survives_a_lost_executor_and_refuses_a_key_on_both(cluster, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    master, homes = cluster
    report = _drive(master, tmp_path, "cdc")
    warehouse = str(tmp_path / "warehouse")

    # Every clustered batch landed, the one that lost an executor included (Spark reran its tasks).
    assert report["errors"] == [None, None, None, None]
    assert report["fault_fired"], "the executor kill never happened"
    # Key 7777 reached both hosts: refused, and it changed nothing.
    assert report["spread"] is not None and "reached more than one host" in report["spread"]
    assert "repartition" in report["spread"]
    assert report["after"] is None

    final = [(k, f"final-{k}", "u", 1000) for k in range(0, 200, 10)]
    model = _model([*cdc_batches(), final])
    assert 7777 not in model
    assert_readers_see(warehouse, TABLE, expected_rows(list(model.values()), COLUMNS), COLUMNS)
    table = load(warehouse, TABLE)
    assert check_table(table) == []
    # Both workers kept an index of their own (their own HOME), and both wrote keys.
    indexes = [h for h in homes if any((h / ".cache" / "lakesink" / "index").glob("*/shard-*/data.mdb"))]
    assert indexes == homes
    hosts = {h for s in table.metadata.snapshots if s.summary for h in s.summary.additional_properties.get(HOSTS, "").split(",") if h}
    assert len(hosts) == 2, hosts


def test_speculation_is_refused_for_keyed_writes_before_anything_is_written(cluster, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    master, _homes = cluster
    report = _drive(master, tmp_path, "speculation")
    warehouse = str(tmp_path / "warehouse")
    assert report["append"] is None  # appends are safe under speculation
    assert_readers_see(warehouse, "db.appended", expected_rows([{"id": 1, "v": "a"}, {"id": 2, "v": "b"}], ["id", "v"]), ["id", "v"])
    assert report["keyed"] is not None and "spark.speculation=true" in report["keyed"]
    assert not table_exists(warehouse, TABLE) or load(warehouse, TABLE).metadata.current_snapshot() is None
    assert not list((Path(warehouse) / "db" / "cdc").rglob("*.parquet"))
