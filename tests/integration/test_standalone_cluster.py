"""Keyed writes on a real Spark standalone cluster: one master, two workers, each worker with
its own HOME and so its own key index, like two machines.

The cluster runs from pyspark's own launcher (bin/spark-class); the driver runs in a child
process (tests/integration/cluster_child.py) because this test session already has its one
local SparkSession.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from lakesink_testing import assert_readers_see, expected_rows, load, table_exists
from standalone_cluster import Cluster

from lakesink_datasource.check import check_table
from lakesink_datasource.iceberg.summary_keys import HOSTS

sys.path.insert(0, str(Path(__file__).parent))
from cluster_child import TABLE, cdc_batches

CHILD = str(Path(__file__).with_name("cluster_child.py"))
COLUMNS = ["id", "v", "seq"]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    cluster = Cluster(tmp_path_factory.mktemp("cluster"))
    try:
        cluster.start_master()
        cluster.start_worker()
        cluster.start_worker()
        yield cluster
    finally:
        cluster.stop()


def _drive(master: str, tmp_path: Path, scenario: str, on_pause: Callable[[], None] | None = None) -> dict:
    out, faults = tmp_path / f"{scenario}.json", tmp_path / "faults.json"
    faults.write_text("[]")
    env = {k: v for k, v in os.environ.items() if k != "LAKESINK_FAULTS"}
    with open(tmp_path / f"{scenario}.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, CHILD, master, str(tmp_path / "warehouse"), str(faults), scenario, str(out)],
                                env=env, stdout=log, stderr=subprocess.STDOUT)
        if on_pause is not None:
            paused = Path(f"{out}.paused")
            deadline = time.monotonic() + 600
            while not paused.exists():
                assert proc.poll() is None, (tmp_path / f"{scenario}.log").read_text()[-4000:]
                assert time.monotonic() < deadline, "the driver never paused"
                time.sleep(0.1)
            on_pause()
            Path(f"{out}.resume").touch()
        code = proc.wait(timeout=600)
    assert code == 0, (tmp_path / f"{scenario}.log").read_text()[-4000:]
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


def test_keyed_cdc_on_two_hosts_survives_a_lost_executor_and_refuses_a_key_on_both(cluster: Cluster, tmp_path: Path) -> None:
    homes = cluster.homes[:2]
    report = _drive(cluster.master, tmp_path, "cdc")
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


def test_speculation_is_refused_for_keyed_writes_before_anything_is_written(cluster: Cluster, tmp_path: Path) -> None:
    report = _drive(cluster.master, tmp_path, "speculation")
    warehouse = str(tmp_path / "warehouse")
    assert report["append"] is None  # appends are safe under speculation
    assert_readers_see(warehouse, "db.appended", expected_rows([{"id": 1, "v": "a"}, {"id": 2, "v": "b"}], ["id", "v"]), ["id", "v"])
    assert report["keyed"] is not None and "spark.speculation=true" in report["keyed"]
    assert not table_exists(warehouse, TABLE) or load(warehouse, TABLE).metadata.current_snapshot() is None
    assert not list((Path(warehouse) / "db" / "cdc").rglob("*.parquet"))


def test_a_keyed_stream_goes_on_exactly_when_a_worker_is_lost_and_a_fresh_one_joins(cluster: Cluster, tmp_path: Path) -> None:
    """Between micro-batches one worker dies with its executor and a new worker with an empty
    HOME (no key index) takes its place: the stream goes on, the new host builds its index
    from the table (or a published copy) and the table stays exactly the model's."""
    lost = len(cluster.homes) - 1

    def replace_a_worker() -> None:
        cluster.kill_worker(lost)
        cluster.start_worker()

    report = _drive(cluster.master, tmp_path, "replace", on_pause=replace_a_worker)
    assert report["done"]
    warehouse = str(tmp_path / "warehouse")
    model = _model(cdc_batches())
    assert_readers_see(warehouse, TABLE, expected_rows(list(model.values()), COLUMNS), COLUMNS)
    table = load(warehouse, TABLE)
    assert check_table(table) == []
    fresh = cluster.homes[-1]
    assert any((fresh / ".cache" / "lakesink" / "index").glob("*/shard-*/data.mdb")), "the new worker never indexed a key"
    hosts = {h for s in table.metadata.snapshots if s.summary for h in s.summary.additional_properties.get(HOSTS, "").split(",") if h}
    assert len(hosts) >= 3, hosts  # both first hosts, then the fresh one


def _shard_owners(home: Path, table_uuid: str, shards: int) -> dict[str, int]:
    """The host name of each key shard index on the worker with this HOME (the query's own,
    `<uuid>.query-<digest>.key-shard-...`)."""
    from lakesink_datasource.index.owner import index_owner

    base = home / ".cache" / "lakesink" / "index"
    return {
        index_owner(str(p)): int(p.name.split("key-shard-")[1][:5])
        for p in base.glob(f"{table_uuid}*.key-shard-*-of-{shards:05d}")
    }


def test_a_routed_keyed_stream_keeps_each_shard_on_its_worker(cluster: Cluster, tmp_path: Path) -> None:
    """cluster_by_key on two workers: each worker holds only the key shards its executor
    runs, a shard stays on its worker from batch to batch within a query run, an executor
    killed mid-batch and a worker replaced before a restart leave the table exact."""
    from lakesink_datasource.iceberg.summary_keys import COMPACTION, EPOCH_ID

    # The module's cluster: two live workers (an earlier test may have replaced one).
    alive = sorted(int(name.removeprefix("worker")) for name in cluster.processes if name.startswith("worker"))
    survivor, lost = alive

    def replace_a_worker() -> None:
        cluster.kill_worker(lost)
        cluster.start_worker()

    report = _drive(cluster.master, tmp_path, "routed", on_pause=replace_a_worker)
    assert report["done"] and report["fault_fired"]
    warehouse = str(tmp_path / "warehouse")
    model = _model(cdc_batches(8))
    assert_readers_see(warehouse, TABLE, expected_rows(list(model.values()), COLUMNS), COLUMNS)
    table = load(warehouse, TABLE)
    assert check_table(table) == []

    # Which worker held which shard in each batch, from the hosts each batch's snapshot lists.
    owners = {}
    for worker, home in enumerate(cluster.homes):
        owners.update({name: (worker, shard) for name, shard in _shard_owners(home, str(table.metadata.table_uuid), 2).items()})
    placement: dict[int, dict[int, int]] = {}
    for snapshot in table.metadata.snapshots:
        props = snapshot.summary.additional_properties
        if COMPACTION in props or EPOCH_ID not in props:
            continue
        held = [owners[h] for h in props[HOSTS].split(",")]
        placement[int(props[EPOCH_ID])] = {shard: worker for worker, shard in held}
    assert sorted(placement) == list(range(8))
    # cluster_by_key's default: one shard per task slot (spark.cores.max=2), not the 4 shuffle partitions.
    assert all(sorted(p) == [0, 1] for p in placement.values()), placement
    # Steady state: no shard moved between batch 0 and batch 1 (before the executor was lost).
    assert placement[0] == placement[1], placement
    assert set(placement[0].values()) <= set(alive), placement[0]
    # Shards move only where something happened: batch 2 lost an executor (its shards, and
    # batch 3 may settle), batch 4 is the first of a new query run on the replaced cluster
    # (Spark keeps state-store locations per run, so a restart places every shard anew).
    moved = [b for b in range(1, 8) if placement[b] != placement[b - 1]]
    assert set(moved) <= {2, 3, 4}, f"shards moved in steady state: {placement}"
    # The last batches ran on the two workers alive now (the survivor and the new one).
    alive_now = {int(name.removeprefix("worker")) for name in cluster.processes if name.startswith("worker")}
    assert survivor in alive_now and lost not in alive_now
    assert set(placement[7].values()) <= alive_now, placement
    # A worker holds the indexes of the shards it ran, and no other.
    for worker, home in enumerate(cluster.homes):
        ran = {s for p in placement.values() for s, w in p.items() if w == worker}
        held = {int(p.name.split("key-shard-")[1][:5]) for p in (home / ".cache" / "lakesink" / "index").glob("*.key-shard-*")}
        assert held == ran, f"worker {worker} holds shards {held}, ran {ran}"


def test_two_executors_on_one_worker_share_its_index_directory_exactly(tmp_path: Path) -> None:
    """One worker with two executors (one HOME, so one index directory for two processes): a
    routed cdc stream spreads its 2 key shards (one per slot) over both executors, then an unrouted keyed
    batch's tasks on both share the worker's whole index under its host locks. In each, an
    executor is killed after its task wrote: the map output it held is lost, Spark resubmits
    the stage and runs the task again on the same worker with its attempt number started
    over, where the dead attempt's index changes wait. Both land; the table is exact."""
    cluster = Cluster(tmp_path / "one-worker")
    try:
        cluster.start_master()
        home = cluster.start_worker(memory="2g", cores=2)
        report = _drive(cluster.master, tmp_path, "one-worker")
    finally:
        cluster.stop()
    assert report["done"] and report["after"] is None, report
    assert report["routed_fault_fired"] and report["unrouted_fault_fired"], "an executor kill never happened"
    # What the kills are for: Spark ran the killed tasks again in resubmitted stages.
    assert report["routed_resubmitted"] > 0 and report["unrouted_resubmitted"] > 0, report
    assert report["block_managers"] == 3  # the driver and two executors
    last = [(k, f"final-{k}", "u", 1000) for k in range(0, 200, 10)]
    model = _model([*cdc_batches(8), last])
    warehouse = str(tmp_path / "warehouse")
    assert_readers_see(warehouse, TABLE, expected_rows(list(model.values()), COLUMNS), COLUMNS)
    assert check_table(load(warehouse, TABLE)) == []
    index = home / ".cache" / "lakesink" / "index"
    shards = sorted(p.name[p.name.index("key-shard-"):] for p in index.glob("*.key-shard-*"))
    assert shards == [f"key-shard-{s:05d}-of-00002" for s in range(2)], shards  # one per slot (spark.cores.max=2)
    assert [p for p in index.iterdir() if "." not in p.name], "the unrouted batch's whole index is missing"
